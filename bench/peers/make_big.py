"""Bigger-than-cache benchmark models, made reproducibly: a random-weight checkpoint in the shape of
a real 1.5B or 3B model, and the same weights as each system runs them:

  - OUT/NAME/NAME-int4: onnxruntime-genai's builder export for CPU, int4 (`MatMulNBits` of
    symmetric 4-bit blocks of 32, accuracy level 4, the builder's CPU defaults; 4-bit tied
    embedding and lm_head);
  - OUT/NAME/NAME.f16.gguf: llama.cpp's own converter (`convert_hf_to_gguf.py` from the
    llama-cpp-python sdist that bench/peers/build_llama_cpp.sh builds llama.cpp from), then its
    `llama-quantize`: OUT/NAME/NAME.Q4_0.gguf and OUT/NAME/NAME.Q4_K_M.gguf. oxgen runs the
    Q4_0 file too, through `oxgen import` (bench/compare.sh --big does it).

Shapes (--shape, repeatable):
  qwen2.5-1.5b  Qwen2.5-1.5B: hidden 1536, 28 layers, 12 query / 2 KV heads of 128, MLP 8960,
                vocab 151936, tied embeddings, q/k/v biases, rope theta 1e6
  llama-3b      Llama 3.2 3B: hidden 3072, 28 layers, 24 query / 8 KV heads of 128, MLP 8192,
                vocab 128256, tied embeddings, llama3 rope scaling

The weights are random (transformers' init, std 0.02; seeded): fine for speed, meaningless text.
The tokenizer is the default model's (SmolLM2's 49152 ids, from `oxgen pull`); the vocabulary
rows past it exist in every file (the embedding and the output head have the shape's full size)
but no text maps to them. Each step is skipped when its output exists (--force redoes them); the
Hugging Face folder and the f16 GGUF are deleted at the end unless --keep.

Needs torch, transformers and onnxruntime-genai (make_families.py's venv; see its docstring),
sentencepiece (llama.cpp's converter imports it) and llama.cpp's tools (bench/peers/build_llama_cpp.sh, run here when missing):

  .cache/tpvenv/bin/python bench/peers/make_big.py [--shape qwen2.5-1.5b] [--out .cache/peers/big]

Time and space on 2 cores (AMD EPYC Zen 4 slice): qwen2.5-1.5b 95 s, about 9 GB of disk while
it runs and 2.7 GB kept; llama-3b 393 s, about 17 GB while it runs and 5.6 GB kept.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
PEERS = os.environ.get("OXGEN_PEERS", os.path.join(REPO, ".cache", "peers"))
LLAMA_SRC = os.path.join(PEERS, "src", "llama_cpp_python-0.3.36", "vendor", "llama.cpp")
LLAMA_BIN = os.environ.get("LLAMA_CPP_BIN", os.path.join(PEERS, "llama.cpp", "build", "bin"))
TOKENIZER_MODEL = "SmolLM2-135M-Instruct"
BOS, EOS = 1, 2  # the tokenizer's <|im_start|> and <|im_end|>

SHAPES = {
    "qwen2.5-1.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )),
    "llama-3b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
        head_dim=128, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
        max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    )),
}


def log(msg):
    print(f"[make_big] {msg}", flush=True)


def run(cmd, **kwargs):
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)


def tokenizer_dir():
    """The default model's package (its tokenizer.json and tokenizer_config.json)."""
    candidates = [os.environ.get("OXGEN_CACHE"),
                  os.environ.get("XDG_CACHE_HOME") and os.path.join(os.environ["XDG_CACHE_HOME"], "oxgen"),
                  os.environ.get("HOME") and os.path.join(os.environ["HOME"], ".cache", "oxgen"),
                  os.path.join(REPO, ".cache", "oxgen")]
    for cache in filter(None, candidates):
        path = os.path.join(cache, "models", TOKENIZER_MODEL)
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return path
    sys.exit(f"no {TOKENIZER_MODEL} package: run `oxgen pull` first (its tokenizer is borrowed)")


def make_hf(shape, hf_dir):
    import torch
    import transformers
    from transformers import GenerationConfig

    config_cls, model_cls, kwargs = SHAPES[shape]
    config = getattr(transformers, config_cls)(
        **kwargs, initializer_range=0.02, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    config.architectures = [model_cls]
    torch.manual_seed(0)
    # Built in bf16: a 3B model's float32 copy alone would be 13 GB.
    torch.set_default_dtype(torch.bfloat16)
    model = getattr(transformers, model_cls)(config).eval()
    torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    log(f"{shape}: {params / 1e9:.2f}B parameters (random)")
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS,
                                               do_sample=False)
    model.save_pretrained(hf_dir, safe_serialization=True)
    tok = tokenizer_dir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), os.path.join(hf_dir, f))
    del model


def builder_int4(hf_dir, out, work):
    raw = os.path.join(work, "builder-out")
    shutil.rmtree(raw, ignore_errors=True)
    cache = os.path.join(work, "builder-cache")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf_dir, "-o", raw, "-p", "int4",
         "-e", "cpu", "-c", cache], env=env)
    shutil.rmtree(cache, ignore_errors=True)
    os.replace(raw, out)


# llama.cpp's converter names the tokenizer's pre-tokenizer by hashing how it splits a test text,
# and knows SmolLM2's only as the hub ships it; the default model's tokenizer.json (rebuilt by
# `oxgen import` from the GGUF) hashes differently. It is SmolLM's pre-tokenizer, so the converter
# is told so; nothing else in it changes.
CONVERT = """
import runpy, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv = [sys.argv[1] + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def gguf_f16(hf_dir, path):
    run([sys.executable, "-c", CONVERT, LLAMA_SRC, hf_dir, "--outtype", "f16", "--outfile", path + ".part"])
    os.replace(path + ".part", path)


def quantize(f16, path, kind):
    run([os.path.join(LLAMA_BIN, "llama-quantize"), f16, path + ".part", kind, str(os.cpu_count() or 2)],
        stdout=subprocess.DEVNULL)
    os.replace(path + ".part", path)


def make(shape, out_root, force, keep):
    out = os.path.join(out_root, shape)
    work = os.path.join(out, "work")
    hf_dir = os.path.join(work, "hf")
    f16 = os.path.join(work, f"{shape}.f16.gguf")
    int4 = os.path.join(out, f"{shape}-int4")
    ggufs = {kind: os.path.join(out, f"{shape}.{kind}.gguf") for kind in ("Q4_0", "Q4_K_M")}
    if force:
        shutil.rmtree(out, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    started = time.time()
    needs_hf = not os.path.isfile(os.path.join(int4, "model.onnx")) or not all(map(os.path.isfile, ggufs.values()))
    if needs_hf and not glob.glob(os.path.join(hf_dir, "*.safetensors")):
        shutil.rmtree(hf_dir, ignore_errors=True)
        make_hf(shape, hf_dir)
    if not os.path.isfile(os.path.join(int4, "model.onnx")):
        builder_int4(hf_dir, int4, work)
    for kind, path in ggufs.items():
        if not os.path.isfile(path):
            if not os.path.isfile(f16):
                gguf_f16(hf_dir, f16)
            quantize(f16, path, kind)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    log(f"{shape} ready in {time.time() - started:.0f} s (random weights: for speed only): {out}")
    for path in [int4, *ggufs.values()]:
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) \
            if os.path.isdir(path) else os.path.getsize(path)
        log(f"  {path}: {size / 2**20:.0f} MiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES),
                        help="repeatable; default qwen2.5-1.5b")
    parser.add_argument("--out", default=os.path.join(PEERS, "big"))
    parser.add_argument("--force", action="store_true", help="redo every step")
    parser.add_argument("--keep", action="store_true", help="keep the Hugging Face folder and the f16 GGUF")
    args = parser.parse_args()
    if not os.access(os.path.join(LLAMA_BIN, "llama-quantize"), os.X_OK) or not os.path.isdir(LLAMA_SRC):
        run([os.path.join(HERE, "build_llama_cpp.sh")])
    for shape in args.shape or ["qwen2.5-1.5b"]:
        make(shape, os.path.abspath(args.out), args.force, args.keep)


if __name__ == "__main__":
    main()
