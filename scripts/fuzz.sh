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
# OXGEN_FUZZ_DEV=1 builds the targets unoptimized (cargo fuzz --dev): the instrumented build
# takes under half as long (3.5 min against 8 on 2 cores), each execution is slower. The
# suite's short smoke run (scripts/test.sh) uses it; long runs should not. It starts from the
# seeds alone, in a scratch corpus: replaying a grown fuzz/corpus unoptimized takes minutes,
# and libFuzzer's time budget only starts after that replay.
#
# cargo-fuzz is installed with cargo when missing. Nightly comes from rustup; without it,
# RUSTC_BOOTSTRAP=1 lets the stable toolchain take the sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(onnx_model gguf_file tokenizer_json chat_template request_json grammar hf_checkpoint)
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

profile=()
if [ "${OXGEN_FUZZ_DEV:-0}" = 1 ]; then
    profile=(--dev)
fi
for t in "${targets[@]}"; do
    "${fuzz[@]}" build "${profile[@]}" --fuzz-dir fuzz "$t" >/dev/null
done
for t in "${targets[@]}"; do
    corpus="fuzz/corpus/$t"
    if [ ${#profile[@]} -gt 0 ]; then
        corpus=$(mktemp -d)
    fi
    mkdir -p "$corpus"
    log=$(mktemp)
    status=0
    "${fuzz[@]}" run "${profile[@]}" --fuzz-dir fuzz "$t" "$corpus" "fuzz/seeds/$t" -- \
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
    if [ ${#profile[@]} -gt 0 ]; then
        rm -rf "$corpus"
    fi
done
