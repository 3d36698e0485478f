#!/usr/bin/env bash
# Checks the deployment files offline (no container engine, registry or API server is
# reachable here, so nothing is built or applied):
#   - the Dockerfile with hadolint (settings in .hadolint.yaml);
#   - every Kubernetes manifest in deploy/k8s against the Kubernetes OpenAPI schemas that the
#     kubernetes-validate package carries, strictly (unknown fields fail);
#   - the systemd unit with systemd-analyze verify;
#   - that all of them agree with each other and with the server (scripts/check_deploy.py).
# Usage: scripts/check-deploy.sh OXGEN_BINARY, with hadolint, kubernetes-validate and PyYAML
# in $OXGEN_PYTHON's environment (scripts/test.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
OXGEN="$(realpath "${1:?usage: scripts/check-deploy.sh OXGEN_BINARY}")"
PY="${OXGEN_PYTHON:-python3}"
BIN="$(dirname "$PY")"

"$BIN/hadolint" Dockerfile
echo "check-deploy: hadolint found nothing in the Dockerfile"

manifests=()
for f in deploy/k8s/*.yaml; do
    # kustomization.yaml configures kustomize; it is not a Kubernetes resource.
    [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
"$BIN/kubernetes-validate" --strict --quiet "${manifests[@]}"
echo "check-deploy: ${#manifests[@]} manifests match the Kubernetes schema"

if ! command -v systemd-analyze >/dev/null; then
    echo "check-deploy: systemd-analyze is missing; install the systemd package" >&2
    exit 1
fi
# verify wants the ExecStart binary to exist: point the unit at the one under test.
unit_dir="$(mktemp -d)"
trap 'rm -rf "$unit_dir"' EXIT
sed "s|^ExecStart=/usr/local/bin/oxgen |ExecStart=$OXGEN |" deploy/systemd/oxgen.service \
    > "$unit_dir/oxgen.service"
# It warns about unknown keys without failing: any output fails here.
verify="$(systemd-analyze verify "$unit_dir/oxgen.service" 2>&1)" || true
if [ -n "$verify" ]; then
    echo "check-deploy: deploy/systemd/oxgen.service: $verify" >&2
    exit 1
fi
echo "check-deploy: systemd-analyze accepts the unit"

"$PY" scripts/check_deploy.py "$OXGEN"
