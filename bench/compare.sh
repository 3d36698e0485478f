#!/usr/bin/env bash
# oxgen side by side with onnxruntime-genai and llama.cpp on the same model, from a fresh
# machine: installs what is missing, builds oxgen, then runs bench/peers/compare.py (systems
# interleaved, medians, ratios; see bench/README.md). Everything it fetches or builds is cached
# outside git (.cache/), so later runs start at once. Never runs in CI.
#
#   bench/compare.sh [compare.py options]     e.g. --quick, --runs 5 --threads 1,2
#
# Installs, once: a Python venv with onnxruntime-genai (.cache/venv, the test suite's, when
# scripts/test.sh made it; else .cache/peers/venv); the default model and its GGUF
# (`oxgen pull`); llama.cpp's llama-bench from the llama-cpp-python sdist (compare.py runs
# bench/peers/build_llama_cpp.sh, ~10-20 min on 2 cores; cmake and ninja from the machine, else
# from their pip wheels); onnxruntime-genai's own int4 package of the model
# (bench/peers/make_builder_int4.sh) when the chosen systems include it.
set -euo pipefail
cd "$(dirname "$0")/.."

python=.cache/venv/bin/python
if ! { [ -x "$python" ] && "$python" -c 'import onnxruntime_genai' 2>/dev/null; }; then
    python=.cache/peers/venv/bin/python
    if ! { [ -x "$python" ] && "$python" -c 'import onnxruntime_genai' 2>/dev/null; }; then
        echo "installing onnxruntime-genai into .cache/peers/venv" >&2
        python3 -m venv .cache/peers/venv
        "$python" -m pip install --quiet --disable-pip-version-check \
            onnxruntime-genai==0.18.0 onnxruntime==1.32.0
    fi
fi

echo "building oxgen (cargo build --release -p oxgen-cli)" >&2
cargo build --release --locked -q -p oxgen-cli
# `oxgen pull` fetches the default model's GGUF with pip and imports it (a no-op once cached).
PATH="$(dirname "$python"):$PATH" target/release/oxgen pull >/dev/null

exec "$python" bench/peers/compare.py --python "$python" --oxgen target/release/oxgen "$@"
