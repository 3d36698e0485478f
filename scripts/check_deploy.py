"""Checks the deployment files against each other and against the server they deploy.

    python scripts/check_deploy.py OXGEN_BINARY

The Kubernetes schema check (kubernetes-validate) and the Dockerfile lint (hadolint) run
beside this in scripts/check-deploy.sh; this script checks what neither can know:

- every OXGEN_* variable the Dockerfile, the manifests and the systemd unit set is one
  `oxgen serve` reads (a renamed flag would otherwise be ignored in silence);
- the ports agree: the Dockerfile's EXPOSE and OXGEN_PORT, the container port, the probes'
  named port, the Prometheus annotation;
- the probes ask /health, and the HPA's metric is one /metrics exports;
- the image's user is the numeric one the pod's security context runs as;
- the stop timeouts (the pod's terminationGracePeriodSeconds, the unit's TimeoutStopSec) cover
  the longest shutdown: preStop, then --shutdown-timeout plus the server's engine and
  connection graces, read from its source.
"""

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy/k8s"
UNIT = ROOT / "deploy/systemd/oxgen.service"
DOCKERFILE = ROOT / "Dockerfile"
# Read by the binary outside `serve`'s flags: where models are cached (oxgen pull).
NOT_FLAGS = {"OXGEN_CACHE"}

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)


def server_secs(name):
    """A `const NAME: Duration = Duration::from_secs(N)` of the server crate."""
    source = (ROOT / "crates/server/src/lib.rs").read_text()
    m = re.search(rf"const {name}: Duration = Duration::from_secs\((\d+)\)", source)
    if not m:
        sys.exit(f"check_deploy: no `const {name}` in crates/server/src/lib.rs; update this script")
    return int(m.group(1))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    help_text = subprocess.run(
        [sys.argv[1], "serve", "--help"], check=True, capture_output=True, text=True
    ).stdout
    known = set(re.findall(r"\[env: (OXGEN_[A-Z_]+)=", help_text)) | NOT_FLAGS
    check(len(known) > 10, f"`oxgen serve --help` lists only {sorted(known)}")

    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc:
                docs[doc["kind"]] = (path.name, doc)
    _, deployment = docs["Deployment"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", [])}

    dockerfile = DOCKERFILE.read_text()
    docker_env = dict(re.findall(r"\b(OXGEN_[A-Z_]+)=(\S+)", dockerfile))
    unit = UNIT.read_text()
    unit_env = dict(re.findall(r"^Environment=(OXGEN_[A-Z_]+)=(\S+)", unit, re.M))
    for where, names in [
        ("deploy/k8s/deployment.yaml", env),
        ("Dockerfile", docker_env),
        ("deploy/systemd/oxgen.service", unit_env),
    ]:
        for name in names:
            check(name in known, f"{where}: {name} is not a variable `oxgen serve` reads")

    # Ports.
    port = int(env.get("OXGEN_PORT", docker_env.get("OXGEN_PORT")))
    exposed = [int(p) for p in re.findall(r"^EXPOSE (\d+)", dockerfile, re.M)]
    check(exposed == [port], f"Dockerfile EXPOSE {exposed}, OXGEN_PORT {port}")
    check(int(docker_env["OXGEN_PORT"]) == port, "Dockerfile's OXGEN_PORT differs from the pod's")
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    check(named.get("http") == port, f"container port 'http' is {named.get('http')}, not {port}")
    annotations = pod["metadata"].get("annotations", {})
    check(
        annotations.get("prometheus.io/port") == str(port),
        "the prometheus.io/port annotation is not the server's port",
    )
    check(annotations.get("prometheus.io/path") == "/metrics", "prometheus.io/path is not /metrics")
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
        get = container.get(probe, {}).get("httpGet", {})
        check(get.get("path") == "/health", f"{probe} does not ask /health")
        check(get.get("port") in ("http", port), f"{probe} asks port {get.get('port')}")
    _, service = docs["Service"]
    check(
        all(p["targetPort"] in ("http", port) for p in service["spec"]["ports"]),
        "the Service does not target the server's port",
    )

    # The HPA scales on metrics the server exports.
    _, hpa = docs["HorizontalPodAutoscaler"]
    metrics_source = (ROOT / "crates/server/src/metrics.rs").read_text()
    for m in hpa["spec"]["metrics"]:
        if m["type"] == "Pods":
            name = m["pods"]["metric"]["name"]
            check(f'"{name}"' in metrics_source, f"the HPA's metric {name} is not in /metrics")
    check(
        hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"],
        "the HPA targets another Deployment",
    )

    # The user.
    users = re.findall(r"^USER (\d+):(\d+)", dockerfile, re.M)
    security = pod["spec"]["securityContext"]
    check(users, "the Dockerfile's USER is not numeric (runAsNonRoot cannot check a name)")
    for uid, gid in users:
        check(
            (int(uid), int(gid)) == (security["runAsUser"], security["runAsGroup"]),
            f"the image runs as {uid}:{gid}, the pod as {security['runAsUser']}:{security['runAsGroup']}",
        )

    # Stop timeouts.
    graces = server_secs("ENGINE_STOP_GRACE") + server_secs("CONNECTION_GRACE")
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_stop_secs = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
    pod_drain = int(env["OXGEN_SHUTDOWN_TIMEOUT"])
    need = pre_stop_secs + pod_drain + graces
    have = pod["spec"]["terminationGracePeriodSeconds"]
    check(have > need, f"terminationGracePeriodSeconds {have} <= preStop + drain + graces = {need}")
    unit_drain = int(unit_env["OXGEN_SHUTDOWN_TIMEOUT"])
    stop = int(re.search(r"^TimeoutStopSec=(\d+)", unit, re.M).group(1))
    check(stop > unit_drain + graces, f"TimeoutStopSec {stop} <= drain + graces = {unit_drain + graces}")

    if failures:
        print("check_deploy: the deployment files disagree:", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        sys.exit(1)
    print(f"check_deploy: {len(docs)} Kubernetes files, the Dockerfile and the unit agree with the server")


if __name__ == "__main__":
    main()
