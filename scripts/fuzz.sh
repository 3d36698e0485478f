#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for SECONDS each (default 60) with cargo-fuzz
# (libFuzzer, nightly), starting from the committed seeds (fuzz/seeds/TARGET) and the corpus
# grown by earlier runs (fuzz/corpus/TARGET, not committed). Prints each target's executions
# and coverage (libFuzzer's last `cov:`/`ft:` line); exits non-zero on the first crash, whose
# input libFuzzer leaves in fuzz/artifacts/TARGET (turn it into a regression test). An input
# slower than 20 s is reported and kept there too, without failing the run.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# cargo-fuzz is installed with cargo when missing. Nightly comes from rustup; without it,
# RUSTC_BOOTSTRAP=1 lets the stable toolchain take the sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(onnx_model gguf_file tokenizer_json chat_template request_json grammar)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz@0.13.2
fi
if rustup toolchain list 2>/dev/null | grep -q nightly; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

for t in "${targets[@]}"; do
    "${fuzz[@]}" build --fuzz-dir fuzz "$t" >/dev/null
done
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    log=$(mktemp)
    status=0
    "${fuzz[@]}" run --fuzz-dir fuzz "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 -timeout=20 \
        >"$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ] && grep -q 'ERROR: libFuzzer: timeout' "$log"; then
        # An input slower than 20 s: reported (its file is in fuzz/artifacts), not a crash.
        echo "fuzz: $t found a SLOW input (over 20 s); see fuzz/artifacts/$t" >&2
    elif [ "$status" -ne 0 ]; then
        tail -40 "$log"
        echo "fuzz: $t CRASHED; the input is in fuzz/artifacts/$t" >&2
        exit 1
    fi
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    echo "fuzz: $t ${seconds}s: ${last:-no progress line}"
    rm -f "$log"
done
