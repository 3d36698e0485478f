#!/usr/bin/env bash
# Makes onnxruntime-genai's OWN int4 CPU package of SmolLM2-135M-Instruct, with its model builder
# (`python -m onnxruntime_genai.models.builder -p int4 -e cpu`), from the same GGUF weights oxgen
# runs, into $PEERS/models/SmolLM2-135M-Instruct-ort-builder-int4.
#
# Why (the issue's recipe): the peer benchmark should also measure onnxruntime-genai running a
# package made by its own builder, in the layout it emits for int4 CPU models, rather than only
# oxgen's import (float zero points) or make_ort_int4.py's re-quantized copy of it.
#
# Steps, each skipped when its output is already there:
#   1. a Python venv at $PEERS/builder-venv with torch, transformers, onnxruntime-genai, onnx_ir
#      and onnxscript (the builder imports both but does not declare them), gguf (transformers
#      reads GGUF with it), accelerate (transformers requires it for gguf_file=) and safetensors.
#      torch is first tried without its CUDA wheels (--no-deps plus its small CPU deps); on Linux
#      x86-64 the PyPI build cannot import without them, so it falls back to a plain install
#      (about 5 GiB in the venv).
#   2. GGUF -> Hugging Face folder at $PEERS/hf/SmolLM2-135M-Instruct (bench/peers/gguf_to_hf.py:
#      float32 weights dequantized by transformers, config with architectures and without the
#      gguf quantization_config, tokenizer with the original's Digits pre-tokenizer step).
#   3. the builder, offline, int4 CPU with its defaults (block_size 32, accuracy_level 4,
#      symmetric: no zero points; lm_head int4, sharing its weights with the 4-bit
#      GatherBlockQuantized embedding since the model ties them).
# Note: the builder re-quantizes weights that were already Q4_1, so they are close to, not equal
# to, the GGUF's.
#
# Environment:
#   OXGEN_PEERS  where the venv, the HF folder and the package go (default: .cache/peers here)
#   GGUF         the GGUF (default: SmolLM2-135M-Instruct.Q4_1.gguf under downloads/ in oxgen's
#                cache: $OXGEN_CACHE, $XDG_CACHE_HOME/oxgen, ~/.cache/oxgen, .cache/oxgen;
#                `oxgen pull` puts it there)
#   PYTHON       the Python that makes the venv (default: python3)
#   THREADS      OMP/MKL threads for the conversion and the builder (default: 2)
#   FORCE=1      redo steps 2 and 3 even when their outputs exist
set -euo pipefail
cd "$(dirname "$0")/../.."

PEERS="${OXGEN_PEERS:-$PWD/.cache/peers}"
VENV="$PEERS/builder-venv"
HF_DIR="$PEERS/hf/SmolLM2-135M-Instruct"
OUT="$PEERS/models/SmolLM2-135M-Instruct-ort-builder-int4"
PYTHON="${PYTHON:-python3}"
THREADS="${THREADS:-2}"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"

# Versions this was made and checked with (pinned, so a rerun gets the same builder and weights).
TORCH_PIN="torch==2.15.0"
PIN_PKGS=(
  "onnxruntime-genai==0.18.0" "onnxruntime==1.32.0" "transformers==5.24.0" "onnx_ir==1.1.0"
  "onnxscript==0.7.2" "gguf==0.19.0" "safetensors==0.8.0" "accelerate==1.15.0"
)
TORCH_CPU_DEPS=(filelock typing-extensions sympy networkx jinja2 fsspec "setuptools>=77.0.3")

say() { printf '[make_builder_int4] %s\n' "$*"; }
run() { printf '[make_builder_int4] $ %s\n' "$*"; "$@"; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

if [[ -z "${GGUF:-}" ]]; then
  for cache in ${OXGEN_CACHE:+"$OXGEN_CACHE"} ${XDG_CACHE_HOME:+"$XDG_CACHE_HOME/oxgen"} \
    ${HOME:+"$HOME/.cache/oxgen"} "$PWD/.cache/oxgen"; do
    if [[ -f "$cache/downloads/$GGUF_NAME" ]]; then GGUF="$cache/downloads/$GGUF_NAME"; break; fi
  done
fi
if [[ -z "${GGUF:-}" || ! -f "$GGUF" ]]; then
  echo "no GGUF: run \`oxgen pull\` (it keeps $GGUF_NAME under downloads/ in oxgen's cache) or set GGUF" >&2
  exit 1
fi
say "GGUF: $GGUF"
say "output: $OUT"

# 1. venv
VPY="$VENV/bin/python"
if [[ -x "$VPY" ]] && "$VPY" -c "import torch, transformers, onnxruntime_genai, onnx_ir, onnxscript, gguf, safetensors, accelerate" 2>/dev/null; then
  say "1/3 venv $VENV ready (skipped)"
else
  say "1/3 venv $VENV"
  [[ -x "$VPY" ]] || run "$PYTHON" -m venv "$VENV"
  run "$VPY" -m pip install --quiet --upgrade pip
  torch_ok() { "$VPY" -c "import torch; torch.ones(2) + 1" 2>/dev/null; }
  if ! torch_ok && ! "$VPY" -m pip show --quiet torch >/dev/null 2>&1; then
    say "torch without its CUDA wheels first (--no-deps + CPU deps)"
    run "$VPY" -m pip install --quiet --no-deps "$TORCH_PIN"
    run "$VPY" -m pip install --quiet "${TORCH_CPU_DEPS[@]}"
  fi
  if torch_ok; then
    say "torch imports"
  else
    say "torch cannot import without its CUDA libraries: full install (large nvidia-* wheels)"
    df -h "$PEERS" | tail -1
    run "$VPY" -m pip install --quiet "$TORCH_PIN"
  fi
  run "$VPY" -m pip install --quiet "${PIN_PKGS[@]}"
  run "$VPY" -c "import torch; print('torch', torch.__version__, torch.ones(2) + 1)"
  du -sh "$VENV"
fi

# 2. GGUF -> Hugging Face folder
if [[ "${FORCE:-0}" != 1 && -f "$HF_DIR/model.safetensors" && -f "$HF_DIR/config.json" && -f "$HF_DIR/tokenizer.json" ]]; then
  say "2/3 HF folder $HF_DIR ready (skipped)"
else
  say "2/3 GGUF -> HF folder $HF_DIR"
  rm -rf "$HF_DIR"
  mkdir -p "$(dirname "$HF_DIR")"
  run "$VPY" bench/peers/gguf_to_hf.py "$GGUF" "$HF_DIR"
fi

# 3. the builder
if [[ "${FORCE:-0}" != 1 && -f "$OUT/model.onnx" && -f "$OUT/genai_config.json" && -f "$OUT/tokenizer.json" ]]; then
  say "3/3 package $OUT ready (skipped)"
else
  say "3/3 onnxruntime-genai model builder: int4, cpu"
  rm -rf "$OUT"
  mkdir -p "$(dirname "$OUT")"
  CACHE_DIR="$(mktemp -d "$PEERS/builder-cache.XXXXXX")"
  trap 'rm -rf "$CACHE_DIR"' EXIT
  LOG="$PEERS/builder-int4.log"
  # (0.18.0's `--help` itself fails: a bare % in its help text trips argparse.)
  run "$VPY" -m onnxruntime_genai.models.builder -i "$HF_DIR" -o "$OUT" -p int4 -e cpu -c "$CACHE_DIR" \
    >"$LOG" 2>&1 || { tail -40 "$LOG" >&2; say "builder failed; full log: $LOG"; exit 1; }
  grep -v 'matmul_nbits_quantizer\|it/s\]$' "$LOG" | tail -5
  say "builder log: $LOG"
fi

ls -la "$OUT"
say "done: $OUT"
