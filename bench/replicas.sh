#!/usr/bin/env bash
# Several `oxgen serve` replicas on loopback behind nginx (the Debian package), configured by
# deploy/nginx/oxgen.conf, driven by bench/replicas_load.py. Three runs, each on freshly
# started replicas (cold prefix caches):
#   round_robin  the config without its `hash` line;
#   affinity     the config as written: consistent hashing on the x-session-id header;
#   failover     affinity again, and one replica gets SIGKILL halfway through.
# Prints one JSON line per run (tok/s, latency, prefix-cache hit rate over all replicas, how
# the requests spread and what each came to) and a table of them.
#
#   bench/replicas.sh [--oxgen target/release/oxgen] [--model PKG] [--replicas 2]
#                     [--threads 1] [--seconds 60] [--clients 4] [--sessions 24]
#                     [--kv-memory 256] [--max-tokens 16] [--json-out FILE]
#
# The KV pool is deliberately small (--kv-memory MiB per replica): the sessions' prefixes
# together overflow one replica's cache, which is where affinity pays (each replica then
# holds its own share of the sessions). Without --model it serves the default model, which
# must have been pulled (`oxgen pull`).
set -euo pipefail
cd "$(dirname "$0")/.."

OXGEN=target/release/oxgen MODEL="" REPLICAS=2 THREADS=1 SECONDS_PER_RUN=60 CLIENTS=4
SESSIONS=24 KV_MEMORY=256 MAX_TOKENS=16 JSON_OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --oxgen) OXGEN="$2"; shift 2 ;;
        --model) MODEL="$2"; shift 2 ;;
        --replicas) REPLICAS="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
        --clients) CLIENTS="$2"; shift 2 ;;
        --sessions) SESSIONS="$2"; shift 2 ;;
        --kv-memory) KV_MEMORY="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --json-out) JSON_OUT="$2"; shift 2 ;;
        *) echo "replicas.sh: unknown argument $1 (see the header of bench/replicas.sh)" >&2; exit 2 ;;
    esac
done
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[ -x "$NGINX" ] || { echo "replicas.sh: nginx is missing (apt-get install nginx-light)" >&2; exit 1; }
[ -x "$OXGEN" ] || { echo "replicas.sh: no $OXGEN (cargo build --release -p oxgen-cli)" >&2; exit 1; }
PY="${OXGEN_PYTHON:-python3}"
WORK="$(mktemp -d)"
RESULTS="$WORK/results.jsonl"
PIDS=()

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

stop_all() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT

# Starts the replicas; sets PORTS and SERVER_PIDS.
start_replicas() {
    PORTS=() SERVER_PIDS=()
    for i in $(seq 1 "$REPLICAS"); do
        local port
        port="$(free_port)"
        # shellcheck disable=SC2086
        "$OXGEN" serve $MODEL --port "$port" --model-id smollm2 --threads "$THREADS" \
            --kv-memory "$KV_MEMORY" --max-batch 8 --max-queue 64 \
            > "$WORK/replica-$i.log" 2>&1 &
        PIDS+=($!) SERVER_PIDS+=($!) PORTS+=("$port")
    done
    for port in "${PORTS[@]}"; do
        for _ in $(seq 1 600); do
            curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
            sleep 0.1
        done
        curl -fs "http://127.0.0.1:$port/health" >/dev/null \
            || { echo "replicas.sh: replica on $port did not come up:" >&2; cat "$WORK"/replica-*.log >&2; exit 1; }
    done
}

# nginx with deploy/nginx/oxgen.conf, its example servers replaced by the replicas; $1 is
# round_robin (the hash line removed) or affinity. Sets LB_PORT.
start_nginx() {
    LB_PORT="$(free_port)"
    local servers="" port
    for port in "${PORTS[@]}"; do
        servers+="    server 127.0.0.1:$port max_fails=1 fail_timeout=10s;\n"
    done
    local drop='^$'
    [ "$1" = round_robin ] && drop='^\s*hash \$oxgen_affinity'
    sed -e "/$drop/d" -e '/^\s*server 10\.0\.0\.[0-9]*:8080/d' \
        -e "s|^\(\s*keepalive 32;\)|$servers\1|" -e "s|listen 8080;|listen 127.0.0.1:$LB_PORT;|" \
        deploy/nginx/oxgen.conf > "$WORK/oxgen.conf"
    cat > "$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    include $WORK/oxgen.conf;
}
EOF
    "$NGINX" -t -q -p "$WORK" -c "$WORK/nginx.conf"
    "$NGINX" -p "$WORK" -c "$WORK/nginx.conf" &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $LB_PORT), 1)" 2>/dev/null && return
        sleep 0.05
    done
    echo "replicas.sh: nginx did not start:" >&2
    cat "$WORK/nginx-error.log" >&2
    exit 1
}

for mode in round_robin affinity failover; do
    start_replicas
    start_nginx "$([ "$mode" = round_robin ] && echo round_robin || echo affinity)"
    replica_args=()
    for port in "${PORTS[@]}"; do replica_args+=(--replica "http://127.0.0.1:$port"); done
    kill_args=()
    if [ "$mode" = failover ]; then
        kill_args=(--kill-pid "${SERVER_PIDS[-1]}" --kill-at "$((SECONDS_PER_RUN / 2))")
    fi
    rss=()
    "$PY" bench/replicas_load.py --url "http://127.0.0.1:$LB_PORT" "${replica_args[@]}" \
        --seconds "$SECONDS_PER_RUN" --clients "$CLIENTS" --sessions "$SESSIONS" \
        --max-tokens "$MAX_TOKENS" --label "$mode" --json-out "$RESULTS" "${kill_args[@]}"
    for pid in "${SERVER_PIDS[@]}"; do
        rss+=("$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status" 2>/dev/null || echo -)")
    done
    echo "peak RSS per replica (MiB): ${rss[*]}"
    stop_all
done

"$PY" - "$RESULTS" "$REPLICAS" "$THREADS" "$KV_MEMORY" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"\n{sys.argv[2]} replicas x {sys.argv[3]} threads, --kv-memory {sys.argv[4]} MiB each\n")
print("| run | requests | tok/s | p50 latency s | prefix hit rate | by replica | outcomes |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    spread = " / ".join(str(n) for n in r["by_replica"].values())
    outcomes = ", ".join(f"{k} {v}" for k, v in r["outcomes"].items())
    print(f"| {r['label']} | {r['requests']} | {r['tok_per_s']} | {r['latency_p50_s']} | "
          f"{r['prefix_hit_rate']} | {spread} | {outcomes} |")
EOF
[ -z "$JSON_OUT" ] || cp "$RESULTS" "$JSON_OUT"
