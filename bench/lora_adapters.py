#!/usr/bin/env python3
"""Random LoRA adapters for a Hugging Face checkpoint's shapes, as PEFT folders
(`adapter_config.json` + `adapter_model.safetensors`), for `oxgen bench --lora`: the cost of
the low-rank products in a batch whose sequences run under different adapters.

Usage: python bench/lora_adapters.py CONFIG_JSON OUT_DIR [--count 4] [--rank 16]
           [--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]

CONFIG_JSON is the checkpoint's `config.json` (hidden_size, intermediate_size, heads, layers);
OUT_DIR/lora-0 .. lora-{count-1} are written (numpy only, seeded). Then, e.g.:

    oxgen bench MODEL --batch 8 --threads 2 --prompt-len 128 --gen-len 64 \\
        --lora a=OUT_DIR/lora-0 --lora b=OUT_DIR/lora-1 --lora c=OUT_DIR/lora-2 \\
        --lora d=OUT_DIR/lora-3
"""

import argparse
import json
import os
import struct

import numpy as np


def shapes(cfg):
    """(module suffix, in, out) of one layer's projections."""
    h, ff = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    return {
        "q_proj": ("self_attn", h, heads * hd),
        "k_proj": ("self_attn", h, kv * hd),
        "v_proj": ("self_attn", h, kv * hd),
        "o_proj": ("self_attn", heads * hd, h),
        "gate_proj": ("mlp", h, ff),
        "up_proj": ("mlp", h, ff),
        "down_proj": ("mlp", ff, h),
    }


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors:
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("out")
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    args = p.parse_args()
    cfg = json.load(open(args.config))
    layer_shapes = shapes(cfg)
    targets = args.targets.split(",")
    r = args.rank
    for k in range(args.count):
        rng = np.random.default_rng(k)
        tensors = []
        for layer in range(cfg["num_hidden_layers"]):
            for t in targets:
                part, n_in, n_out = layer_shapes[t]
                module = f"base_model.model.model.layers.{layer}.{part}.{t}"
                tensors.append((f"{module}.lora_A.weight",
                                rng.normal(0, 1 / np.sqrt(n_in), (r, n_in))))
                tensors.append((f"{module}.lora_B.weight", rng.normal(0, 0.01, (n_out, r))))
        out = os.path.join(args.out, f"lora-{k}")
        os.makedirs(out, exist_ok=True)
        write_safetensors(os.path.join(out, "adapter_model.safetensors"), tensors)
        config = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": targets,
                  "base_model_name_or_path": os.path.dirname(os.path.abspath(args.config))}
        json.dump(config, open(os.path.join(out, "adapter_config.json"), "w"), indent=1)
        print(out)


if __name__ == "__main__":
    main()
