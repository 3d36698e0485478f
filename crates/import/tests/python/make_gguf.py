"""Tiny synthetic GGUF models for crates/import/tests, written with gguf-py (the `gguf` PyPI
package, 0.19.0) the way llama.cpp's convert_hf_to_gguf.py writes real ones.

usage: make_gguf.py VARIANT OUT.gguf

Variants (random weights, seed fixed per variant):
  llama    Q8_0 embedding tied as the head; Q4_0 / Q4_1 / Q8_0 projections; pre `smollm`
  mistral  Q4_1 embedding (no GatherBlockQuantized form) and a separate Q4_0 head; F32 and
           F16 projections; attention biases on q/k/v/o; sliding window 5; pre `gpt-2`
  qwen2    Q4_0 embedding tied; Q/K/V biases; no Q/K permutation; pre `qwen2`
  llama3   llama with pre `llama-bpe`
  qwen2-k  qwen2 in K-quants (hidden 256): Q4_K embedding (no GatherBlockQuantized form),
           Q6_K head, Q4_K / Q5_K / Q6_K projections, quantized by `k_quantize` below
  bad-arch, bad-pre, bad-shape, bad-type, extra-tensor
           llama with one defect each (see DEFECTS)

Q and K are generated in Hugging Face row order and permuted as convert_hf_to_gguf.py's
`LlamaModel.permute` does for llama and mistral (not for qwen2), biases included.
"""

import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool>"]
# Includes digit merges: a pre-tokenizer that splits digits one by one must never use them.
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("a", "t"),
    ("3", "4"), ("1", "2"), ("12", "3"), ("o", "n"), ("Ġ", "c"), ("Ġc", "at"), ("e", "r"),
]
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CONFIGS = {
    "llama": dict(
        arch="llama", pre="smollm", layers=2, hidden=64, heads=4, kv_heads=2, ff=96,
        context=64, base=10000.0, eps=1e-5, embd=T.Q8_0, head=None,
        proj=dict(q=T.Q4_0, k=T.Q4_1, v=T.Q8_0, o=T.Q4_1, gate=T.Q4_0, up=T.Q4_1, down=T.Q8_0),
        bias=(), window=None, seed=11,
    ),
    "mistral": dict(
        arch="mistral", pre="gpt-2", layers=2, hidden=64, heads=4, kv_heads=1, ff=64,
        context=64, base=1e6, eps=1e-5, embd=T.Q4_1, head=T.Q4_0,
        proj=dict(q=T.Q8_0, k=T.F32, v=T.F16, o=T.Q4_1, gate=T.Q4_1, up=T.F32, down=T.Q4_0),
        bias=("q", "k", "v", "o"), window=5, seed=12,
    ),
    "qwen2": dict(
        arch="qwen2", pre="qwen2", layers=3, hidden=64, heads=2, kv_heads=2, ff=128,
        context=64, base=1e6, eps=1e-6, embd=T.Q4_0, head=None,
        proj=dict(q=T.Q4_1, k=T.Q4_0, v=T.Q4_1, o=T.Q8_0, gate=T.Q4_1, up=T.Q4_1, down=T.Q4_1),
        bias=("q", "k", "v"), window=None, seed=13,
    ),
}

CONFIGS["qwen2-k"] = dict(
    arch="qwen2", pre="qwen2", layers=2, hidden=256, heads=4, kv_heads=2, ff=256,
    context=64, base=1e6, eps=1e-6, embd=T.Q4_K, head=T.Q6_K,
    proj=dict(q=T.Q4_K, k=T.Q5_K, v=T.Q6_K, o=T.Q4_K, gate=T.Q5_K, up=T.Q4_K, down=T.Q6_K),
    bias=("q", "k", "v"), window=None, seed=14,
)

DEFECTS = {"bad-arch", "bad-pre", "bad-shape", "bad-type", "extra-tensor"}


def byte_chars():
    """GPT-2's bytes_to_unicode, in byte order."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = 0
    out = []
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            extra += 1
            out.append(chr(255 + extra))
    return out


def vocab():
    tokens = SPECIALS + USER_DEFINED + byte_chars() + [a + b for a, b in MERGES]
    types = [3] * len(SPECIALS) + [4] * len(USER_DEFINED) + [1] * (len(tokens) - 4)
    return tokens, types


def permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute (n_head already the K/V head count for K)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def k_quantize(data, qtype):
    """A plain (not llama.cpp's error-minimizing) K-quantizer: gguf-py 0.19.0 only dequantizes
    the K-quants. Rows of `data` are cut into super-blocks of 256; the blocks follow ggml's
    layouts (`oxgen_gguf::blocks`), so whatever the codes, gguf-py's dequantization is the
    model the reference runs."""
    rows, k = data.shape
    x = data.reshape(-1, 256).astype(np.float64)
    n = x.shape[0]

    def f16(v):
        return np.asarray(v, np.float16)

    if qtype == T.Q6_K:
        sub = x.reshape(n, 16, 16)
        scale = np.abs(sub).max(axis=2) / 31.5
        d = f16(scale.max(axis=1) / 127)
        sc = np.clip(np.round(scale / np.maximum(d.astype(np.float64), 1e-30)[:, None]), -127, 127).astype(np.int8)
        step = d.astype(np.float64)[:, None] * sc
        q = np.clip(np.round(sub / np.where(step == 0, 1, step)[:, :, None]) + 32, 0, 63).astype(np.uint8)
        q = q.reshape(n, 256)
        ql = np.zeros((n, 128), np.uint8)
        qh = np.zeros((n, 64), np.uint8)
        for t in range(256):
            h, r = t // 128, t % 128
            ql[:, 64 * h + r % 64] |= (q[:, t] & 15) << (4 * (r // 64))
            qh[:, 32 * h + t % 32] |= (q[:, t] >> 4) << (2 * (r // 32))
        blocks = np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(n, 1).view(np.uint8)], axis=1)
    else:
        levels = 15 if qtype == T.Q4_K else 31
        sub = x.reshape(n, 8, 32)
        lo = np.minimum(sub.min(axis=2), 0)
        scale = (sub.max(axis=2) - lo) / levels
        d = f16(scale.max(axis=1) / 63)
        dmin = f16((-lo).max(axis=1) / 63)
        sc = np.clip(np.round(scale / np.maximum(d.astype(np.float64), 1e-30)[:, None]), 0, 63).astype(np.uint8)
        m = np.clip(np.round(-lo / np.maximum(dmin.astype(np.float64), 1e-30)[:, None]), 0, 63).astype(np.uint8)
        step = d.astype(np.float64)[:, None] * sc
        offset = dmin.astype(np.float64)[:, None] * m
        q = np.round((sub + offset[:, :, None]) / np.where(step == 0, 1, step)[:, :, None])
        q = np.clip(q, 0, levels).astype(np.uint8)
        scales = np.zeros((n, 12), np.uint8)
        for j in range(4):
            scales[:, j] = sc[:, j] | (sc[:, j + 4] >> 4) << 6
            scales[:, j + 4] = m[:, j] | (m[:, j + 4] >> 4) << 6
            scales[:, j + 8] = (sc[:, j + 4] & 15) | (m[:, j + 4] & 15) << 4
        qs = np.zeros((n, 128), np.uint8)
        for g in range(4):
            qs[:, 32 * g:32 * g + 32] = (q[:, 2 * g] & 15) | (q[:, 2 * g + 1] & 15) << 4
        parts = [d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8), scales]
        if qtype == T.Q5_K:
            qh = np.zeros((n, 32), np.uint8)
            for j in range(8):
                qh |= (q[:, j] >> 4) << j
            parts.append(qh)
        blocks = np.concatenate(parts + [qs], axis=1)
    return blocks.reshape(rows, -1)


def add(writer, name, data, qtype):
    data = data.astype(np.float32)
    if qtype == T.F32:
        writer.add_tensor(name, data)
    elif qtype == T.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        writer.add_tensor(name, k_quantize(data, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def main():
    variant, out = sys.argv[1], sys.argv[2]
    c = dict(CONFIGS["llama" if variant in DEFECTS | {"llama3"} else variant])
    if variant == "llama3":
        c["pre"] = "llama-bpe"
    rng = np.random.default_rng(c["seed"])
    tokens, types = vocab()
    arch = "gptx" if variant == "bad-arch" else c["arch"]
    w = gguf.GGUFWriter(out, arch)
    h, heads, kvh, ff = c["hidden"], c["heads"], c["kv_heads"], c["ff"]
    hd = h // heads
    w.add_block_count(c["layers"])
    w.add_context_length(c["context"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kvh)
    w.add_rope_freq_base(c["base"])
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(c["eps"])
    if c["window"]:
        w.add_sliding_window(c["window"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("mystery" if variant == "bad-pre" else c["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    def normal(*shape, scale=1.0):
        return rng.standard_normal(shape).astype(np.float32) * scale

    vocab_n = len(tokens)
    add(w, "token_embd.weight", normal(vocab_n, h), c["embd"])
    if c["head"] is not None:
        add(w, "output.weight", normal(vocab_n, h, scale=1 / np.sqrt(h)), c["head"])
    add(w, "output_norm.weight", 1 + normal(h, scale=0.1), T.F32)
    permuted = c["arch"] in ("llama", "mistral")
    shapes = dict(q=(heads * hd, h), k=(kvh * hd, h), v=(kvh * hd, h), o=(h, heads * hd),
                  gate=(ff, h), up=(ff, h), down=(h, ff))
    names = dict(q="attn_q", k="attn_k", v="attn_v", o="attn_output",
                 gate="ffn_gate", up="ffn_up", down="ffn_down")
    for layer in range(c["layers"]):
        p = f"blk.{layer}"
        add(w, f"{p}.attn_norm.weight", 1 + normal(h, scale=0.1), T.F32)
        add(w, f"{p}.ffn_norm.weight", 1 + normal(h, scale=0.1), T.F32)
        for key, (n, k) in shapes.items():
            if variant == "bad-shape" and layer == 1 and key == "q":
                n -= hd
            weight = normal(n, k, scale=1 / np.sqrt(k))
            bias = normal(n, scale=0.1) if key in c["bias"] else None
            if permuted and key in ("q", "k"):
                n_head = heads if key == "q" else kvh
                weight = permute(weight, n_head)
                bias = permute(bias, n_head) if bias is not None else None
            qtype = c["proj"][key]
            if variant == "bad-type" and layer == 0 and key == "up":
                qtype = T.Q5_0
            add(w, f"{p}.{names[key]}.weight", weight, qtype)
            if bias is not None:
                add(w, f"{p}.{names[key]}.bias", bias, T.F32)
    if variant == "extra-tensor":
        add(w, "blk.0.attn_q_norm.weight", np.ones(hd, np.float32), T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
