#!/usr/bin/env python3
"""Turns a GGUF into a Hugging Face model folder that onnxruntime-genai's model builder can read.

transformers dequantizes the GGUF's weights to float on load (`gguf_file=`), but refuses to
`save_pretrained` a GGUF-loaded model, so this script writes `model.safetensors` itself from the
state dict (dropping `lm_head.weight` when the config ties it to the embedding, and cloning every
tensor so none shares memory), then saves config.json and the tokenizer.

config.json gets `architectures` (the builder picks its model class from it; a GGUF-loaded config
has none) and loses `quantization_config` (which says "gguf", and would make the builder treat the
float weights as a prequantized checkpoint).

The tokenizer transformers builds from GGUF metadata lacks the pre-tokenizer step that splits
digits one by one (`Digits(individual_digits=true)`), which the original SmolLM2 tokenizer.json has
before its ByteLevel step; without it numbers tokenize differently. The pre-tokenizer is rewritten
as Sequence[Digits(individual_digits=true), <the existing one>] unless a Digits step is already there.
The decoder and post-processor are set to the pre-tokenizer's ByteLevel step and the BPE model's
unk_token to the tokenizer's, as in the original tokenizer.json (no change to the token ids).

Usage: gguf_to_hf.py GGUF_FILE OUT_DIR   (run with HF_HUB_OFFLINE=1; needs torch, transformers,
gguf, safetensors)
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def fix_tokenizer(out_dir, unk_token):
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    pre = tok.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else ([pre] if pre else [])
    if any(s.get("type") == "Digits" for s in steps):
        print("  pre_tokenizer already splits digits")
    else:
        digits = {"type": "Digits", "individual_digits": True}
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [digits] + steps}
        print("  pre_tokenizer ->", json.dumps(tok["pre_tokenizer"]))
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if byte_level:
        tok["decoder"] = dict(byte_level[0])
        tok["post_processor"] = dict(byte_level[0])
        print("  decoder, post_processor ->", json.dumps(byte_level[0]))
    if tok.get("model", {}).get("type") == "BPE" and unk_token and not tok["model"].get("unk_token"):
        tok["model"]["unk_token"] = unk_token
        print("  model.unk_token ->", unk_token)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    gguf_dir, gguf_file = os.path.split(os.path.abspath(gguf_path))
    os.makedirs(out_dir, exist_ok=True)

    print(f"  loading {gguf_file} with transformers (dequantizes to float32)")
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)

    state = model.state_dict()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied and "lm_head.weight" in state:
        del state["lm_head.weight"]
        print("  tie_word_embeddings: dropped lm_head.weight (shares embed_tokens)")
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    print(f"  wrote model.safetensors: {len(state)} tensors, {sum(v.numel() for v in state.values())} params")

    config = model.config
    if not getattr(config, "architectures", None):
        config.architectures = [type(model).__name__]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "config.json"), encoding="utf-8") as f:
        saved = json.load(f)
    assert "quantization_config" not in saved, "config.json still has quantization_config"
    print(f"  wrote config.json: architectures={saved.get('architectures')}")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    fix_tokenizer(out_dir, tokenizer.unk_token)


if __name__ == "__main__":
    main()
