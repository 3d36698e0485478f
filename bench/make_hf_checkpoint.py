"""A random-weight Hugging Face checkpoint in the shape of a real model, with numpy alone (no
torch): BF16 safetensors in shards of at most 2 GB with their index, config.json, and the default
model's tokenizer files. For timing `oxgen import` of a checkpoint and its peak memory
(docs/PERFORMANCE.md, "Importing a Hugging Face checkpoint"); the text it generates is
meaningless.

  python bench/make_hf_checkpoint.py OUT_DIR [--shape qwen2.5-1.5b] [--tokenizer PACKAGE_DIR]

Shapes: qwen2.5-1.5b (hidden 1536, 28 layers, 12 query / 2 KV heads of 128, MLP 8960, vocab
151936, tied embeddings, q/k/v biases, rope theta 1e6).
"""

import argparse
import json
import os
import shutil

import numpy as np

SHAPES = {
    "qwen2.5-1.5b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
        use_sliding_window=False, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16"),
}
SHARD_BYTES = 2 << 30


def bf16(a):
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def tensors(cfg):
    """(name, shape, has_values) in the order transformers saves them; biases and norms too."""
    h, ff, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        yield f"{p}.input_layernorm.weight", (h,)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            yield f"{p}.self_attn.{proj}_proj.weight", (rows, h)
            yield f"{p}.self_attn.{proj}_proj.bias", (rows,)
        yield f"{p}.self_attn.o_proj.weight", (h, q)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        yield f"{p}.mlp.gate_proj.weight", (ff, h)
        yield f"{p}.mlp.up_proj.weight", (ff, h)
        yield f"{p}.mlp.down_proj.weight", (h, ff)
    yield "model.norm.weight", (h,)


def write_shard(path, items):
    header, offset = {}, 0
    for name, a in items:
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, a in items:
            f.write(a.tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", default=".cache/oxgen/models/SmolLM2-135M-Instruct")
    args = parser.parse_args()
    cfg = SHAPES[args.shape]
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    shards, current, size = [], [], 0
    for name, shape in tensors(cfg):
        if name.endswith("norm.weight"):
            a = bf16(1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32))
        else:
            a = bf16(0.02 * rng.standard_normal(shape, dtype=np.float32))
        if size + a.nbytes > SHARD_BYTES and current:
            shards.append(current)
            current, size = [], 0
        current.append((name, a))
        size += a.nbytes
    shards.append(current)
    weight_map = {}
    for i, items in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(args.out, file), items)
        weight_map.update({name: file for name, _ in items})
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))


if __name__ == "__main__":
    main()
