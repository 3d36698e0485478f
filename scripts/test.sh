#!/usr/bin/env bash
# The whole test suite, on a fresh machine: fetches the test data that comes from packages
# (the ONNX backend node tests inside the pinned onnx wheel) into a cache, then runs every
# crate's tests. The cache lives in $OXGEN_TEST_CACHE (default: .cache/ in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."

ONNX_VERSION=1.22.0
CACHE="${OXGEN_TEST_CACHE:-$PWD/.cache}"
NODE_TESTS="$CACHE/onnx-$ONNX_VERSION/node"

if [ ! -f "$NODE_TESTS/.complete" ]; then
    echo "fetching the ONNX node tests from the onnx==$ONNX_VERSION wheel into $CACHE" >&2
    mkdir -p "$CACHE/wheels"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$CACHE/wheels" "onnx==$ONNX_VERSION"
    rm -rf "$NODE_TESTS"
    python3 - "$CACHE/wheels" "$ONNX_VERSION" "$NODE_TESTS" <<'PY'
import glob, os, sys, zipfile
wheels, version, dest = sys.argv[1:]
(wheel,) = glob.glob(os.path.join(wheels, f"onnx-{version}-*.whl"))
prefix = "onnx/backend/test/data/node/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(dest, name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                out.write(src.read())
PY
    touch "$NODE_TESTS/.complete"
fi
export OXGEN_ONNX_NODE_TESTS="$NODE_TESTS"

# Conformance first, uncaptured, so its `conformance: N passed, M failed` line shows; then
# everything else.
cargo test --locked -p oxgen-testkit --test conformance -- --nocapture
cargo test --locked --workspace -- --skip onnx_node_tests
