"""Writes a Hugging Face checkpoint folder from a `llama`-architecture GGUF, with numpy and
gguf-py only (no torch): the form a user downloads (`config.json`, `generation_config.json`,
BF16 `model.safetensors`, the tokenizer files), so `oxgen import FOLDER` can be tested on a
real model. oxgen's test command makes the default model's (SmolLM2-135M-Instruct) from its
Q4_1 GGUF, its weights dequantized, and takes the tokenizer files from the package oxgen
imported from the same GGUF.

    python hf_from_gguf.py MODEL.gguf TOKENIZER_DIR OUT_DIR

llama.cpp's converter permuted each head's Q and K rows for its interleaved rotary
(`LlamaModel.permute`); the rows are put back in Hugging Face's order here.
"""

import json
import os
import shutil
import sys

import gguf
import numpy as np

NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def field(reader, key):
    return reader.fields[key].contents()


def unpermute(w, n_head):
    """The inverse of convert_hf_to_gguf.py's `permute`."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bf16_bytes(a):
    """float32 -> bfloat16 bytes, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        data = bf16_bytes(a)
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def main():
    gguf_path, tokenizer_dir, out = sys.argv[1:4]
    r = gguf.GGUFReader(gguf_path)
    if field(r, "general.architecture") != "llama":
        raise SystemExit(f"{gguf_path}: only the llama architecture is written")
    heads, kv_heads = field(r, "llama.attention.head_count"), field(r, "llama.attention.head_count_kv")
    tensors = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, layer, kind, _ = t.name.split(".")
            name = f"model.layers.{layer}.{NAMES[kind]}.weight"
            if kind in ("attn_q", "attn_k"):
                w = unpermute(w, heads if kind == "attn_q" else kv_heads)
        tensors[name] = w
    tied = "lm_head.weight" not in tensors
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), dict(sorted(tensors.items())))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "num_hidden_layers": field(r, "llama.block_count"),
        "hidden_size": field(r, "llama.embedding_length"),
        "intermediate_size": field(r, "llama.feed_forward_length"),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "max_position_embeddings": field(r, "llama.context_length"),
        "rms_norm_eps": field(r, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": field(r, "llama.rope.freq_base"), "rope_scaling": None,
        "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
        "hidden_act": "silu", "tie_word_embeddings": tied,
        "bos_token_id": field(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(r, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": field(r, "tokenizer.ggml.padding_token_id"),
    }
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out, name))
    # Last: a folder with config.json is complete.
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    main()
