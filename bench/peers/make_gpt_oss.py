"""A gpt-oss-shaped benchmark model of a few hundred MB, made reproducibly: a random-weight
checkpoint (hidden 768, 6 layers, 12 query heads and 4 KV heads of 64, 32 experts of width 768
of which each token takes 4, window 128 on the even layers, YaRN; the fixture tokenizer's 291
ids) whose experts are stored in MXFP4 as gpt-oss's checkpoints store them, then

  - onnxruntime-genai's builder export for CPU, int4 (`QMoE` of 4-bit blocks of 32, requantized
    by the builder from the MXFP4 experts; `MatMulNBits` elsewhere): OUT/gpt-oss-bench-int4;
  - the same checkpoint as a GGUF laid out as llama.cpp's converter writes gpt-oss (MXFP4
    experts, f32 elsewhere): OUT/gpt-oss-bench.gguf.

The experts are 86% of the weights, so a decode step reads about 4/32 of them per layer.
Random weights: fine for speed, meaningless text. Uses make_families.py's checkpoint and GGUF
writers (crates/testkit/thirdparty/); run with its venv (torch, transformers,
onnxruntime-genai; see its docstring):

  .cache/tpvenv/bin/python bench/peers/make_gpt_oss.py [--out .cache/peers/gpt-oss-bench]
"""

import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../../crates/testkit/thirdparty"))
import make_families as mf  # noqa: E402

NAME = "gpt-oss-bench"
CONFIG = dict(
    mf.COMMON, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
    num_key_value_heads=4, head_dim=64, intermediate_size=768, num_local_experts=32,
    num_experts_per_tok=4, sliding_window=128, max_position_embeddings=4096,
    initializer_range=0.02, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "../../.cache/peers/gpt-oss-bench"))
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    mf.FAMILIES[NAME] = ("GptOssConfig", "GptOssForCausalLM", CONFIG, 0, 0, ("int4",))
    mf.GGUF_ARCH[NAME] = "gpt-oss"
    tok_dir = os.path.join(work, "tokenizer")
    mf.write_tokenizer(tok_dir)
    hf_dir = os.path.join(work, "hf")
    model = mf.make_hf(NAME, hf_dir, tok_dir)
    mf.write_gguf(NAME, model, tok_dir, path=os.path.join(out, f"{NAME}.gguf"))
    raw = os.path.join(work, "int4")
    if os.path.exists(raw):
        shutil.rmtree(raw)
    mf.run([sys.executable, "-c", mf.BUILDER_SHIM, "-i", hf_dir, "-o", raw, "-p", "int4",
            "-e", "cpu", "-c", os.path.join(work, "cache")])
    mf.keep_runtime_files(raw, os.path.join(out, f"{NAME}-int4"))
    shutil.rmtree(hf_dir)
    print(f"wrote {out}/{NAME}-int4 and {out}/{NAME}.gguf")


if __name__ == "__main__":
    main()
