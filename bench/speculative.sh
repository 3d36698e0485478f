#!/usr/bin/env bash
# Speculative decoding's speedup: plain greedy decoding against each proposer on three
# workloads (bench/speculative/*.txt: an edit of a paragraph, a rename in code, an open-ended
# story), interleaved round by round so machine noise hits every mode alike.
#
#   bench/speculative.sh [MODEL] [ROUNDS]
#
# MODEL: a package folder (default: the default model). Each round runs every workload under
# every mode once (`oxgen bench --runs 1 --warmup 1 --eos --gen-len 256`, 2 threads); the
# table gives medians over the rounds: decode tok/s, the ratio to plain decoding, accept
# rate and tokens per decode step. Greedy output is the same in every mode (tested in
# crates/oxgen/tests/speculative.rs), so the modes generate the same tokens.
#
# OXGEN: the binary (default target/release/oxgen); MODES: the modes to compare (default
# "prompt-lookup self:8 self:15 draft:MODEL"); THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
OXGEN="${OXGEN:-target/release/oxgen}"
MODEL="${1:-}"
ROUNDS="${2:-5}"
THREADS="${THREADS:-2}"
if [ -z "$MODEL" ]; then
  MODEL="$("$OXGEN" pull 2>/dev/null | tail -1)"
fi
MODES="${MODES:-prompt-lookup self:8 self:15 draft:$MODEL}"
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
lscpu | grep -m1 "Model name" >&2 || true
for round in $(seq "$ROUNDS"); do
  for workload in bench/speculative/*.txt; do
    for mode in plain $MODES; do
      spec=()
      [ "$mode" = plain ] || spec=(--speculative "$mode")
      json="$("$OXGEN" bench "$MODEL" --prompt-file "$workload" --eos --gen-len 256 \
        --runs 1 --warmup 1 --threads "$THREADS" --json "${spec[@]}" 2>/dev/null)"
      printf '%s\t%s\t%s\n' "$(basename "$workload" .txt)" "$mode" "$json" >>"$OUT"
    done
  done
  echo "round $round of $ROUNDS done" >&2
done
python3 - "$OUT" "$MODEL" <<'EOF'
import json, statistics, sys
from collections import defaultdict

rows = defaultdict(list)
for line in open(sys.argv[1]):
    workload, mode, report = line.rstrip("\n").split("\t", 2)
    rows[(workload, mode)].append(json.loads(report))
med = lambda xs: statistics.median(xs)
print(f"model {sys.argv[2]}")
print(f"{'workload':<8} {'mode':<28} {'tokens':>6} {'decode tok/s':>12} {'vs plain':>8} "
      f"{'accept':>7} {'tok/step':>8}")
for workload in sorted({w for w, _ in rows}):
    plain = med([r["decode_tok_s"]["median"] for r in rows[(workload, "plain")]])
    for (w, mode), reports in rows.items():
        if w != workload:
            continue
        decode = med([r["decode_tok_s"]["median"] for r in reports])
        tokens = med([r["generated_tokens"]["median"] for r in reports])
        accept = med([r["spec_accept_rate"]["median"] for r in reports])
        per_step = med([r["spec_tokens_per_step"]["median"] for r in reports])
        name = mode if len(mode) <= 28 else "draft:(the model itself)"
        print(f"{workload:<8} {name:<28} {tokens:>6.0f} {decode:>12.1f} {decode / plain:>7.2f}x "
              f"{100 * accept:>6.0f}% {per_step:>8.2f}")
EOF
