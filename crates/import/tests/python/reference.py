"""An independent forward pass of a Llama-shaped GGUF model in NumPy (float64), on the
weights gguf-py dequantizes, for crates/import/tests.

usage: reference.py MODEL.gguf IDS OUT.f32
  IDS: comma-separated token ids of one sequence. Writes the logits of every position,
  [len(IDS), vocab], as little-endian float32.

The model is Hugging Face's LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM:
RMSNorm, rotate_half rotary on Q/K in Hugging Face row order, grouped-query attention
(causal, with Mistral's sliding window: a query sees the `window` latest keys), SiLU-gated
MLP, a head tied to the embedding when `output.weight` is absent. llama.cpp permuted the Q/K
rows of llama and mistral files for its interleaved rotary; they are un-permuted here
(the inverse of convert_hf_to_gguf.py's LlamaModel.permute).
"""

import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def unpermute(w, n_head):
    n = w.shape[0]
    return w.reshape(n_head, n // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    path, ids, out = sys.argv[1], [int(i) for i in sys.argv[2].split(",")], sys.argv[3]
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    key = lambda k: f"{arch}.{k}"
    layers = field(r, key("block_count"))
    heads = field(r, key("attention.head_count"))
    kv_heads = field(r, key("attention.head_count_kv"), heads)
    hidden = field(r, key("embedding_length"))
    hd = hidden // heads
    base = field(r, key("rope.freq_base"), 10000.0)
    eps = field(r, key("attention.layer_norm_rms_epsilon"))
    window = field(r, key("attention.sliding_window"))
    tensors = {}
    for t in r.tensors:
        tensors[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
            [int(d) for d in reversed(t.shape)])
    W = lambda name: tensors[name]
    B = lambda name: tensors.get(name)
    if arch in ("llama", "mistral"):
        for layer in range(layers):
            for name, n_head in (("attn_q", heads), ("attn_k", kv_heads)):
                for kind in ("weight", "bias"):
                    full = f"blk.{layer}.{name}.{kind}"
                    if full in tensors:
                        tensors[full] = unpermute(tensors[full], n_head)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def linear(x, name):
        y = x @ W(name + ".weight").T
        b = B(name + ".bias")
        return y if b is None else y + b

    s = len(ids)
    pos = np.arange(s, dtype=np.float64)
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    freqs = np.outer(pos, inv)
    cos = np.concatenate([np.cos(freqs)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(freqs)] * 2, -1)[:, None, :]

    def rotary(x):
        half = hd // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    x = W("token_embd.weight")[ids]
    for layer in range(layers):
        p = f"blk.{layer}"
        hn = rms(x, W(f"{p}.attn_norm.weight"))
        q = rotary(linear(hn, f"{p}.attn_q").reshape(s, heads, hd))
        k = rotary(linear(hn, f"{p}.attn_k").reshape(s, kv_heads, hd))
        v = linear(hn, f"{p}.attn_v").reshape(s, kv_heads, hd)
        group = heads // kv_heads
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd)
        scores = np.where(allowed[None], scores, -np.inf)
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hij,jhd->ihd", probs, v).reshape(s, heads * hd)
        x = x + linear(attn, f"{p}.attn_output")
        hn = rms(x, W(f"{p}.ffn_norm.weight"))
        gate = linear(hn, f"{p}.ffn_gate")
        mlp = (gate / (1 + np.exp(-gate))) * linear(hn, f"{p}.ffn_up")
        x = x + linear(mlp, f"{p}.ffn_down")
    x = rms(x, W("output_norm.weight"))
    head = W("output.weight") if "output.weight" in tensors else W("token_embd.weight")
    logits = x @ head.T
    logits.astype("<f4").tofile(out)


if __name__ == "__main__":
    main()
