#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench`, `llama-completion` and `llama-quantize` (CPU only, Release,
# static, OpenMP, -march=native: AVX2/FMA and whatever else the machine has) into
# $PEERS/llama.cpp/build/bin, for the peer benchmark in bench/peers/compare.py and the big
# models of bench/peers/make_big.py. Idempotent: does nothing when the binaries are already there.
#
# Versions (pinned):
#   - llama.cpp: the copy vendored in the llama-cpp-python 0.3.36 source distribution
#     (`vendor/llama.cpp`; its ggml reports version 0.25.3). The sdist carries no git history,
#     so the binaries report build number 0 / commit "unknown"; the pin is the sdist version.
#   - cmake and ninja: the `cmake` and `ninja` Python wheels, installed into a private virtual
#     environment under $PEERS when the machine has no cmake of its own.
#
# `llama-cli` is not built: in this llama.cpp it links the whole server (llama-server-impl);
# `llama-completion` is the plain prompt-in, tokens-out tool and shares everything else.
#
# Environment:
#   OXGEN_PEERS   where peers are fetched and built (default: .cache/peers in the repository)
#   PYTHON        the Python used to fetch the sdist and make the tool venv (default: python3)
#   JOBS          parallel compile jobs (default: nproc)
#   LLAMA_CPP_ISA native (default): -march=native, so AVX-512/VNNI too where the CPU has them,
#                 but never AMX: ggml's AMX matmul segfaults on the first prompt batch here
#                 (Sapphire Rapids class Xeon; ggml_backend_amx_mul_mat, llama.cpp issue 20824),
#                 and neither oxgen nor onnxruntime's MLAS int4 path uses AMX;
#                 avx2: AVX2/FMA/F16C only (the ISA oxgen's kernels target), built into
#                 $PEERS/llama.cpp-avx2 instead; point llama_bench.py --bin (or LLAMA_CPP_BIN
#                 for compare.py) at its build/bin.
#   LLAMA_CPP_SERVER=1  also build `llama-server` (for bench/embed.py --llama-server: its
#                 /embedding endpoint on a GGUF of a sentence encoder); it adds the server's
#                 sources to the build.
set -euo pipefail
cd "$(dirname "$0")/../.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
PEERS="${OXGEN_PEERS:-$PWD/.cache/peers}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
SRC_ROOT="$PEERS/src"
SRC="$SRC_ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
ISA="${LLAMA_CPP_ISA:-native}"
case "$ISA" in
    native) OUT="$PEERS/llama.cpp"
        NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        ISA_FLAGS=(-DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX") ;;
    avx2) OUT="$PEERS/llama.cpp-avx2"
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
            -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
    *) echo "LLAMA_CPP_ISA must be native or avx2, not $ISA" >&2; exit 2 ;;
esac
BUILD="$OUT/build"
BIN="$BUILD/bin"
TARGETS=(llama-bench llama-completion llama-quantize)
SERVER=OFF
if [ "${LLAMA_CPP_SERVER:-0}" = 1 ]; then
    TARGETS+=(llama-server)
    SERVER=ON
fi
# What the binaries were built from and with; a different one rebuilds.
CONFIG="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION; ${ISA_FLAGS[*]}"
STAMP="$OUT/built-with"

built=1
for t in "${TARGETS[@]}"; do
    [ -x "$BIN/$t" ] || built=0
done
if [ $built = 1 ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$CONFIG" ]; then
    echo "llama.cpp already built: $BIN" >&2
    exit 0
fi
mkdir -p "$SRC_ROOT"

# cmake and ninja: the machine's, else the pip wheels in a private venv.
TOOLS="$PEERS/tools-venv"
if command -v cmake >/dev/null 2>&1; then
    CMAKE=cmake
else
    if [ ! -x "$TOOLS/bin/cmake" ]; then
        echo "no cmake on PATH: installing the cmake and ninja wheels into $TOOLS" >&2
        "$PYTHON" -m venv "$TOOLS"
        "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check cmake ninja
    fi
    CMAKE="$TOOLS/bin/cmake"
    export PATH="$TOOLS/bin:$PATH"
fi
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then
    GENERATOR=(-G Ninja)
fi

# The source: llama-cpp-python's sdist (only llama-cpp-python itself is forced to source; its
# build requirements come as wheels, just to prepare the metadata pip download insists on).
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    SDIST="$SRC_ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if [ ! -f "$SDIST" ]; then
        echo "fetching the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist" >&2
        PIP_PYTHON="$PYTHON"
        [ -x "$TOOLS/bin/python" ] && PIP_PYTHON="$TOOLS/bin/python"
        "$PIP_PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
            --no-binary llama-cpp-python -d "$SRC_ROOT" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    fi
    tar -xzf "$SDIST" -C "$SRC_ROOT" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
fi

mkdir -p "$BUILD"
rm -f "$STAMP"
echo "building llama.cpp from $SRC into $BUILD ($JOBS jobs)" >&2
start=$(date +%s)
"$CMAKE" -S "$SRC" -B "$BUILD" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    "${ISA_FLAGS[@]}" \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$SERVER \
    >"$OUT/cmake-configure.log"
nice -n 19 "$CMAKE" --build "$BUILD" --config Release -j "$JOBS" \
    --target "${TARGETS[@]}"
echo "$CONFIG" >"$STAMP"
echo "llama.cpp built in $(($(date +%s) - start)) s: $BIN" >&2
