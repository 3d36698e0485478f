#!/usr/bin/env bash
# The KV cache's element (`--kv-dtype`) against context depth: prefill and decode tok/s and
# KV bytes per token for f32, f16 and int8 caches, at several prompt lengths, interleaved
# round by round so machine noise hits every dtype alike.
#
#   bench/kv_dtype.sh [MODEL] [ROUNDS]
#
# MODEL: a package folder (default: the default model). Each round runs, for every depth and
# dtype, `oxgen bench --prompt-len DEPTH --gen-len 64 --runs 1 --warmup 0` (2 threads); the
# table gives medians over the rounds and each dtype's ratio to the f32 cache at that depth.
# Decode at depth D attends over D to D + 64 positions. Accuracy is not measured here:
# crates/oxgen/tests/kv_dtype.rs teacher-forces a long text through each cache.
#
# OXGEN: the binary (default target/release/oxgen); DEPTHS (default "128 2048 7000");
# DTYPES (default "f32 f16 int8"); THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
OXGEN="${OXGEN:-target/release/oxgen}"
MODEL="${1:-}"
ROUNDS="${2:-3}"
THREADS="${THREADS:-2}"
DEPTHS="${DEPTHS:-128 2048 7000}"
DTYPES="${DTYPES:-f32 f16 int8}"
if [ -z "$MODEL" ]; then
  MODEL="$("$OXGEN" pull 2>/dev/null | tail -1)"
fi
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
lscpu | grep -m1 "Model name" >&2 || true
for round in $(seq "$ROUNDS"); do
  for depth in $DEPTHS; do
    for kv in $DTYPES; do
      json="$("$OXGEN" bench "$MODEL" --prompt-len "$depth" --gen-len 64 --runs 1 --warmup 0 \
        --threads "$THREADS" --kv-dtype "$kv" --json 2>/dev/null)"
      printf '%s\t%s\t%s\n' "$depth" "$kv" "$json" >>"$OUT"
    done
  done
  echo "round $round of $ROUNDS done" >&2
done
python3 - "$OUT" "$MODEL" <<'PY'
import json, statistics, sys
from collections import defaultdict

rows = defaultdict(list)
for line in open(sys.argv[1]):
    depth, kv, report = line.rstrip("\n").split("\t", 2)
    rows[(int(depth), kv)].append(json.loads(report))
med = lambda key, reports: statistics.median(r[key]["median"] for r in reports)
print(f"model {sys.argv[2]}")
print(f"{'depth':>5} {'kv':<5} {'KV B/token':>10} {'prefill tok/s':>13} {'vs f32':>6} "
      f"{'decode tok/s':>12} {'vs f32':>6}")
for depth in sorted({d for d, _ in rows}):
    base = rows.get((depth, "f32"))
    for (d, kv), reports in rows.items():
        if d != depth:
            continue
        per_token = reports[0]["kv_cache_bytes"] // (depth + 64)
        prefill, decode = med("prefill_tok_s", reports), med("decode_tok_s", reports)
        ratio = lambda key, x: f"{x / med(key, base):6.2f}" if base else "     -"
        print(f"{depth:>5} {kv:<5} {per_token:>10} {prefill:>13.1f} "
              f"{ratio('prefill_tok_s', prefill)} {decode:>12.1f} {ratio('decode_tok_s', decode)}")
PY
