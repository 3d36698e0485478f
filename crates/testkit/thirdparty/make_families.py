"""Builds one tiny onnxruntime-genai package per model family, with onnxruntime-genai's own
greedy ids, for oxgen's family tests (see README.md next to this file).

Each family is a random-weight checkpoint made with transformers (hidden 64, 2-4 layers, the
fixture tokenizer's 291 ids, weights spread by initializer_range 0.2 so greedy decoding has no
near-ties), saved in the Hugging Face format, and exported by onnxruntime-genai's model builder
(`python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32|int4 -e cpu`). Then
onnxruntime-genai itself decodes a fixed prompt greedily; its ids go into `families.json`
beside the packages, and oxgen's test (`crates/cli/tests/families.rs`) must reproduce them.

Tool versions used to make the committed packages (Python 3.11.7, CPU only):

  torch 2.15.0   transformers 5.24.0   onnxruntime-genai 0.18.0   onnxruntime 1.32.0
  onnx_ir 1.1.0  onnxscript 0.7.2      safetensors 0.8.0      gguf 0.19.0

Rerun (from the repository root; torch is several GB, so CI does not do this):

  python3 -m venv /tmp/famvenv && /tmp/famvenv/bin/pip install torch==2.15.0 \\
      transformers==5.24.0 onnxruntime-genai==0.18.0 onnxruntime==1.32.0 onnx_ir==1.1.0 \\
      onnxscript==0.7.2 safetensors==0.8.0 gguf==0.19.0
  /tmp/famvenv/bin/python crates/testkit/thirdparty/make_families.py [--only NAME,...]

`--gguf-from-package NAME` writes only NAME's GGUF, from the committed fp32 package's tensors
(numpy, onnx and gguf suffice; no torch): Phi-4-mini's was added so, after its checkpoint was
gone.

`--hf-from-packages` writes families/<name>-hf/ for every family in HF_FOLDERS: the Hugging
Face checkpoint rebuilt from the committed fp32 package (numpy, onnx and gguf; no torch), as
`save_pretrained` lays it out (`config.json`, `generation_config.json`, `model.safetensors`,
the tokenizer files), which `oxgen import` must turn back into the package's ids.

It rewrites families/<name>-<precision>/ and families/families.json, and for the families whose
llama.cpp architecture oxgen imports, families/<name>.gguf (F32, the same checkpoint as
llama.cpp's converter lays it out); the checkpoints and the builder's raw output stay in the
work folder (--work, default /tmp/oxgen-families).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "families")
sys.path.insert(0, HERE)
from make_packages import BOS, EOS, VOCAB_SIZE, keep_runtime_files, write_tokenizer  # noqa: E402

# A prompt of N ids: BOS, then a fixed walk over byte and merge ids (no specials after BOS).
def prompt(n):
    return [BOS] + [3 + (17 * i + 5) % (VOCAB_SIZE - 3) for i in range(n - 1)]


COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=256,
    initializer_range=0.2,
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=EOS,
    tie_word_embeddings=False,
)

DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def longrope(rotary_dim):
    half = rotary_dim // 2
    # Factors as Phi-3.5-mini's are shaped: near 1 for the short cache, growing for the long.
    short = [1.0 + 0.05 * i for i in range(half)]
    long = [1.0 + 0.9 * i for i in range(half)]
    # `type` as well as `rope_type`: Phi-3.5's config.json spells it so, and the builder reads it.
    return {"rope_type": "longrope", "type": "longrope", "rope_theta": 10000.0,
            "short_factor": short, "long_factor": long}


# name -> (transformers config class, model class, config kwargs, prompt length, new tokens,
#          precisions). The prompt and the number of new tokens are chosen per family so the
#          decode crosses what the family must get right (LongRoPE's switch, the window's edge).
FAMILIES = {
    # Phi-3.5-mini's layout: LongRoPE with original context 64 here, so a 40-id prompt starts on
    # the short factors and decoding crosses to the long ones at total length 65.
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM", dict(
        COMMON, original_max_position_embeddings=64, rope_parameters=longrope(16),
        rms_norm_eps=1e-5, hidden_act="silu"), 40, 40, ("fp32", "int4")),
    # Phi-4-mini's: LongRoPE on 3/4 of each head, tied embeddings. Heads of 64 here, since
    # onnxruntime wants the rotary half-width (24) a multiple of 8.
    "phi4-mini": ("Phi3Config", "Phi3ForCausalLM", dict(
        COMMON, hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
        original_max_position_embeddings=64, tie_word_embeddings=True,
        rope_parameters=dict(longrope(48), partial_rotary_factor=0.75),
        rms_norm_eps=1e-5, hidden_act="silu"), 40, 40, ("fp32", "int4")),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        COMMON, rms_norm_eps=1e-5, hidden_act="silu",
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}), 12, 24, ("fp32", "int4")),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        COMMON, rms_norm_eps=1e-5, hidden_act="silu", sliding_window=None,
        rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        COMMON, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False,
        rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        COMMON, head_dim=16, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False,
        rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        COMMON, rms_norm_eps=1e-5, hidden_act="silu", embedding_multiplier=6.0,
        residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=2.0,
        rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(
        COMMON, hidden_act="silu", clip_qkv=None, rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    # SmolLM3: four layers, the last without rotary (`no_rope_layers`, every fourth as in the
    # real models and llama.cpp); the builder runs with one bug mended (BUILDER_SHIM).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(
        COMMON, num_hidden_layers=4, rms_norm_eps=1e-6, hidden_act="silu",
        no_rope_layers=[1, 1, 1, 0],
        use_sliding_window=False, rope_parameters=DEFAULT_ROPE), 16, 24, ("fp32", "int4")),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(
        COMMON, head_dim=32, norm_eps=1e-5, hidden_act="relu2",
        rope_parameters=dict(DEFAULT_ROPE, partial_rotary_factor=0.5)), 12, 24, ("fp32", "int4")),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(
        COMMON, head_dim=16, rms_norm_eps=1e-5, hidden_act="silu", use_bias=False,
        rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    # Gemma 2: windowed and global layers alternate (window 8: a 12-id prompt and 24 new ids
    # cross it), softcaps, `(1 + w)` norms, GELU-tanh, an embedding scale of sqrt(hidden); a
    # narrower initializer, since that scale and the softcaps saturate the logits at 0.2.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        COMMON, initializer_range=0.05, head_dim=16, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=16, sliding_window=8, final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0, tie_word_embeddings=True,
        rope_parameters=DEFAULT_ROPE), 12, 24, ("fp32", "int4")),
    # Gemma 3 (text): as Gemma 2 plus q/k norms and a separate rotary base for windowed layers.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        COMMON, initializer_range=0.05, head_dim=16, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=16, sliding_window=8, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention"]), 12, 24, ("fp32", "int4")),
    # gpt-oss: attention sinks, windowed and global layers alternating (window 8), YaRN rotary,
    # biased projections, 4 experts of which each token takes 2, SwiGLU clamped at 7 (as the
    # real models, and llama.cpp, which has no key for it). The experts are written as the real
    # checkpoints store them, in MXFP4 (`mxfp4_experts`), which the builder's int4 export and
    # the GGUF read.
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        COMMON, head_dim=16, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=8, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096}), 12, 24, ("fp32", "int4")),
}


def mxfp4_experts(model):
    """gpt-oss's experts as its checkpoints store them: random MXFP4 blocks (e2m1 codes, two
    per byte, the even element in the low nibble) and e8m0 scales (2^(s - 127)) per 32 inputs,
    `<proj>_blocks` [E, N, K/32, 16] and `<proj>_scales` [E, N, K/32]; the model's dense
    weights ([E, K, N]) are set to exactly their decoded values. Returns the tensors to save
    beside the dense ones."""
    import torch

    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    gen = torch.Generator().manual_seed(1)
    extra = {}
    for i, layer in enumerate(model.model.layers):
        for proj in ("gate_up_proj", "down_proj"):
            dense = getattr(layer.mlp.experts, proj)
            e, k, n = dense.shape
            blocks = torch.randint(0, 256, (e, n, k // 32, 16), dtype=torch.uint8, generator=gen)
            # Magnitudes up to 6 * 2^-5, about the other weights' spread.
            scales = torch.randint(120, 123, (e, n, k // 32), dtype=torch.uint8, generator=gen)
            codes = torch.empty((e, n, k // 32, 32), dtype=torch.long)
            codes[..., 0::2] = (blocks & 0x0F).long()
            codes[..., 1::2] = (blocks >> 4).long()
            values = lut[codes] * torch.pow(2.0, scales.float() - 127.0).unsqueeze(-1)
            with torch.no_grad():
                dense.copy_(values.reshape(e, n, k).transpose(1, 2))
            extra[f"model.layers.{i}.mlp.experts.{proj}_blocks"] = blocks
            extra[f"model.layers.{i}.mlp.experts.{proj}_scales"] = scales
    return extra


# The builder 0.18.0 reads Gemma 3's rotary settings as transformers 4 spelled them (a flat
# `rope_parameters` for the global layers, `rope_local_base_freq` for the windowed ones), while
# transformers 5 nests both under the layer types: the builder runs with its config loader
# giving the older spelling too (same values). It also mends a builder bug (SmolLM3, below).
BUILDER_SHIM = """
import runpy, sys, transformers
load = transformers.AutoConfig.from_pretrained
def from_pretrained(*args, **kwargs):
    config = load(*args, **kwargs)
    rope = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in rope and "sliding_attention" in rope:
        config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
        config.rope_parameters = dict(rope["full_attention"])
    return config
transformers.AutoConfig.from_pretrained = from_pretrained
# SmolLM3's layers without rotary: the builder turns rotary inside attention off for them but
# then asks for a separate rotary op on position_ids, an input it removed (KeyError). Those
# layers get no rotary at all, as in transformers. (builder.py imports its builders as the
# top-level package `builders`, from its own folder.)
import os, onnxruntime_genai.models as models
sys.path.insert(0, os.path.dirname(models.__file__))
from builders import smollm
make_attention = smollm.SmolLM3Model.make_attention
def smollm3_attention(self, layer_id, attention, root_input, **kwargs):
    rope = self.attention_attrs["rope"]
    self.attention_attrs["rope"] = bool(self.no_rope_layers[layer_id])
    make_attention(self, layer_id, attention, root_input, **kwargs)
    self.attention_attrs["rope"] = rope
smollm.SmolLM3Model.make_attention = smollm3_attention
sys.argv = ["onnxruntime_genai.models.builder"] + sys.argv[1:]
runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
"""


def make_hf(name, hf_dir, tok_dir):
    import torch
    import transformers
    from transformers import GenerationConfig

    config_cls, model_cls, kwargs, _, _, _ = FAMILIES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs)
    config.architectures = [model_cls]
    model = getattr(transformers, model_cls)(config).eval().to(torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or "layernorm" in pname and pname.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    extra = mxfp4_experts(model) if name.startswith("gpt-oss") else {}
    # The GGUF writer takes gpt-oss's experts from these blocks, as llama.cpp's converter does.
    model.oxgen_mxfp4 = extra
    model.generation_config = GenerationConfig(
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS, do_sample=False, max_length=256
    )
    if os.path.exists(hf_dir):
        shutil.rmtree(hf_dir)
    model.save_pretrained(hf_dir, safe_serialization=True)
    if extra:
        from safetensors.torch import load_file, save_file

        path = os.path.join(hf_dir, "model.safetensors")
        tensors = load_file(path)
        tensors.update(extra)
        save_file(tensors, path, metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(hf_dir, f))
    return model


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def export(hf_dir, work, name, precision):
    raw = os.path.join(work, f"{name}-{precision}")
    if os.path.exists(raw):
        shutil.rmtree(raw)
    cache = os.path.join(work, f"cache-{name}-{precision}")
    run([sys.executable, "-c", BUILDER_SHIM, "-i", hf_dir, "-o", raw,
         "-p", precision, "-e", "cpu", "-c", cache])
    dest = os.path.join(OUT, f"{name}-{precision}")
    keep_runtime_files(raw, dest)
    return dest


# Families llama.cpp's converter maps to an architecture oxgen imports: the GGUF written from
# the same checkpoint must give the builder package's ids once imported.
GGUF_ARCH = {
    "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama", "granite": "granite",
    "phi3-longrope": "phi3", "gemma2": "gemma2", "gemma3": "gemma3", "smollm3": "smollm3",
    "llama3": "llama", "gpt-oss": "gpt-oss", "phi4-mini": "phi3",
}


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: Q and K rows reordered for ggml's
    interleaved rotary (the importer undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(name, model, tok_dir, path=None):
    """families/<name>.gguf (F32) from the checkpoint, named and laid out as llama.cpp's
    convert_hf_to_gguf.py writes it (Q/K rows permuted for the `llama` architecture, not for
    Qwen), with the fixture tokenizer as a `gpt2` BPE vocabulary."""
    import gguf
    import numpy as np

    arch = GGUF_ARCH[name]
    cfg = model.config
    path = path or os.path.join(OUT, f"{name}.gguf")
    w = gguf.GGUFWriter(path, arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = cfg.rope_parameters
    # As convert_hf_to_gguf.py's Phi3MiniModel: Phi-4-mini rotates 3/4 of each head.
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if "full_attention" in rope:  # Gemma 3: a base per layer type
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    else:
        w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "phi3":
        # As convert_hf_to_gguf.py's Phi3MiniModel: the original context, the cos/sin scale
        # sqrt(1 + ln(context / original) / ln(original)) and both factor lists as tensors.
        original = cfg.original_max_position_embeddings
        scale = cfg.max_position_embeddings / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(original))))
        for kind in ("short", "long"):
            factors = np.asarray(cfg.rope_parameters[f"{kind}_factor"], dtype=np.float32)
            w.add_tensor(f"rope_factors_{kind}.weight", factors)
    if arch in ("gemma2", "gemma3"):
        if cfg.attn_logit_softcapping is not None:
            w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        if cfg.final_logit_softcapping is not None:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    if rope.get("rope_type") == "llama3":
        # As convert_hf_to_gguf.py's LlamaModel: Llama 3's scaling as one divisor per
        # frequency, the tensor `rope_freqs`.
        base, dim = rope["rope_theta"], head_dim
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        factors = []
        for freq in freqs:
            wavelen = 2 * np.pi / freq
            if wavelen < high_wavelen:
                factors.append(1.0)
            elif wavelen > low_wavelen:
                factors.append(factor)
            else:
                smooth = (old_len / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    if arch == "gpt-oss":
        # As convert_hf_to_gguf.py's GptOssModel: the experts' counts and width, the window
        # (llama.cpp windows the even layers), YaRN's factor and original context.
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_sliding_window(cfg.sliding_window)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        write_gpt_oss_experts(w, model)
    if arch == "granite":
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    tok = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {a["content"] for a in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in specials else 1 for t, _ in vocab])
    # tokenizers writes merges as "a b" or, since 0.20, as ["a", "b"]; GGUF keeps "a b".
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    names = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "self_attn.qkv_proj": "attn_qkv",
        "mlp.gate_up_proj": "ffn_up", "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    }
    if arch in ("gemma2", "gemma3", "gpt-oss"):
        names["post_attention_layernorm"] = "post_attention_norm"
    names.update({"self_attn.sinks": "attn_sinks", "mlp.router": "ffn_gate_inp"})
    for hf, t in model.state_dict().items():
        data = t if isinstance(t, np.ndarray) else t.detach().to("cpu").float().numpy()
        data = data.astype(np.float32)
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if ".mlp.experts." in hf:
            continue  # gpt-oss's experts: write_gpt_oss_experts
        if hf.endswith(".self_attn.sinks"):
            hf += ".weight"
        if arch in ("gemma2", "gemma3") and hf.endswith("norm.weight"):
            data = data + 1  # Gemma's (1 + w), stored with the 1 added as llama.cpp does
        if hf == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif hf == "model.norm.weight":
            out = "output_norm.weight"
        elif hf == "lm_head.weight":
            out = "output.weight"
        else:
            layer, rest = hf.removeprefix("model.layers.").split(".", 1)
            module, kind = rest.rsplit(".", 1)
            out = f"blk.{layer}.{names[module]}.{kind}"
            if arch in ("llama", "granite", "smollm3") and module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = cfg.num_attention_heads if module.endswith("q_proj") else cfg.num_key_value_heads
                data = permute(data, heads)
        w.add_tensor(out, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes")


def write_gpt_oss_experts(w, model):
    """gpt-oss's experts as convert_hf_to_gguf.py's GptOssModel writes them: each 32-value
    block of the checkpoint's MXFP4 (`*_blocks`, two codes per byte with the even element in
    the low nibble; `*_scales`) as ggml's `block_mxfp4` (the exponent byte, then byte j holding
    element j low and j + 16 high), the fused gate_up rows split into gate (even rows) and up
    (odd rows), biases likewise, as f32."""
    import gguf
    import numpy as np

    def ggml_blocks(blocks, scales):
        blocks, scales = blocks.numpy(), scales.numpy()
        codes = np.empty(blocks.shape[:-1] + (32,), dtype=np.uint8)
        codes[..., 0::2] = blocks & 0x0F
        codes[..., 1::2] = blocks >> 4
        qs = codes[..., :16] | (codes[..., 16:] << 4)
        out = np.concatenate([scales[..., None], qs], axis=-1)  # [E, N, K/32, 17]
        return out.reshape(out.shape[0], out.shape[1], -1)

    mx = gguf.GGMLQuantizationType.MXFP4
    for i, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
        prefix = f"model.layers.{i}.mlp.experts"
        blocks = {p: model.oxgen_mxfp4[f"{prefix}.{p}_blocks"] for p in ("gate_up_proj", "down_proj")}
        scales = {p: model.oxgen_mxfp4[f"{prefix}.{p}_scales"] for p in ("gate_up_proj", "down_proj")}
        gate_up = ggml_blocks(blocks["gate_up_proj"], scales["gate_up_proj"])
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, 0::2]), raw_dtype=mx)
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 1::2]), raw_dtype=mx)
        down = ggml_blocks(blocks["down_proj"], scales["down_proj"])
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", np.ascontiguousarray(down), raw_dtype=mx)
        bias = ex.gate_up_proj_bias.detach().float().numpy()
        w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(bias[:, 0::2]))
        w.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(bias[:, 1::2]))
        w.add_tensor(f"blk.{i}.ffn_down_exps.bias", ex.down_proj_bias.detach().float().numpy())


def greedy_genai(package, ids, new_tokens):
    import onnxruntime_genai as og

    model = og.Model(package)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens, min_length=0)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def greedy_transformers(model, ids, new_tokens):
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        )
    return out[0, len(ids):].tolist()


class PackageCheckpoint:
    """The checkpoint of a family, rebuilt from its fp32 builder package without torch (for a
    GGUF added after the committed packages were made): the builder stores every projection
    transposed as a `MatMul` weight, gate and up apart, and the output head as the embedding
    when they are tied; everything else is the checkpoint's own tensors."""

    def __init__(self, name):
        import types

        import onnx
        from onnx import numpy_helper

        _, _, kwargs, *_ = FAMILIES[name]
        cfg = dict(COMMON, **kwargs)
        self.config = types.SimpleNamespace(**cfg)
        model = onnx.load(os.path.join(OUT, f"{name}-fp32", "model.onnx"))
        t = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        layers = cfg["num_hidden_layers"]
        sd = {"model.embed_tokens.weight": t["lm_head.MatMul.weight"].T}
        if not cfg["tie_word_embeddings"]:
            raise SystemExit(f"{name}: only tied packages are rebuilt (the embedding is the head)")
        for l in range(layers):
            p = f"model.layers.{l}"
            sd[f"{p}.input_layernorm.weight"] = t[f"{p}.input_layernorm.weight"]
            sd[f"{p}.self_attn.qkv_proj.weight"] = t[f"{p}.attn.qkv_proj.MatMul.weight"].T
            sd[f"{p}.self_attn.o_proj.weight"] = t[f"{p}.attn.o_proj.MatMul.weight"].T
            sd[f"{p}.post_attention_layernorm.weight"] = t[f"{p}.post_attention_layernorm.weight"]
            gate, up = t[f"{p}.mlp.gate_proj.MatMul.weight"].T, t[f"{p}.mlp.up_proj.MatMul.weight"].T
            sd[f"{p}.mlp.gate_up_proj.weight"] = __import__("numpy").concatenate([gate, up])
            sd[f"{p}.mlp.down_proj.weight"] = t[f"{p}.mlp.down_proj.MatMul.weight"].T
        sd["model.norm.weight"] = t[f"model.layers.{layers}.final_norm_layernorm.weight"]
        self._state = sd

    def state_dict(self):
        return self._state


# The families whose checkpoints `--hf-from-packages` rebuilds (those `oxgen import` of a
# Hugging Face folder must read), with the transformers model_type of each.
HF_FOLDERS = {
    "llama3": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "granite": "granite", "phi3-longrope": "phi3", "phi4-mini": "phi3", "gemma2": "gemma2",
    "gemma3": "gemma3_text", "smollm3": "smollm3", "gpt-oss": "gpt_oss", "ernie4_5": "ernie4_5",
}


def write_safetensors(path, tensors):
    """A safetensors file of float32 and uint8 numpy arrays (the format's header, then the
    data in order), as the `safetensors` package writes it."""
    import numpy as np

    header, offset = {}, 0
    for name, a in tensors.items():
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.uint8): "U8"}[a.dtype]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def hf_from_package(name):
    """families/<name>-hf/: the checkpoint the fp32 package was exported from. The builder
    stores each projection transposed (`MatMul` weights), Q, K and V packed in one, zero biases
    left out, Gemma's norms with their 1 added, the head as the embedding when tied; gpt-oss's
    experts come from its GGUF, which holds the checkpoint's MXFP4 blocks as they were."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    _, model_cls, kwargs, *_ = FAMILIES[name]
    cfg = dict(COMMON, **kwargs)
    model = onnx.load(os.path.join(OUT, f"{name}-fp32", "model.onnx"))
    t = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    gemma = name.startswith("gemma")
    norm = (lambda w: (w - 1).astype(np.float32)) if gemma else (lambda w: w)
    layers, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q_out, kv_out = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    sd = {}
    if cfg["tie_word_embeddings"]:
        sd["model.embed_tokens.weight"] = t["lm_head.MatMul.weight"].T
    else:
        sd["model.embed_tokens.weight"] = t["model.embed_tokens.weight"]
        sd["lm_head.weight"] = t["lm_head.MatMul.weight"].T
    for l in range(layers):
        p, a = f"model.layers.{l}", f"model.layers.{l}.attn"
        sd[f"{p}.input_layernorm.weight"] = norm(t[f"{p}.input_layernorm.weight"])
        qkv = t[f"{a}.qkv_proj.MatMul.weight"].T
        if name.startswith("phi"):
            sd[f"{p}.self_attn.qkv_proj.weight"] = qkv
        else:
            for proj, rows in zip("qkv", np.split(qkv, [q_out, q_out + kv_out])):
                sd[f"{p}.self_attn.{proj}_proj.weight"] = rows
                if name in ("qwen2", "gpt-oss"):  # biased projections, zero here
                    sd[f"{p}.self_attn.{proj}_proj.bias"] = np.zeros(rows.shape[0], np.float32)
        for which in ("q_norm", "k_norm"):
            if f"{a}.{which}.layernorm.weight" in t:
                sd[f"{p}.self_attn.{which}.weight"] = norm(t[f"{a}.{which}.layernorm.weight"])
        sd[f"{p}.self_attn.o_proj.weight"] = t[f"{a}.o_proj.MatMul.weight"].T
        if f"{a}.o_proj.Add.bias" in t:
            sd[f"{p}.self_attn.o_proj.bias"] = t[f"{a}.o_proj.Add.bias"]
        if f"{a}.sinks" in t:
            sd[f"{p}.self_attn.sinks"] = t[f"{a}.sinks"]
        for n in ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            if f"{p}.{n}.weight" in t:
                sd[f"{p}.{n}.weight"] = norm(t[f"{p}.{n}.weight"])
        if name == "gpt-oss":
            sd[f"{p}.mlp.router.weight"] = t[f"{p}.moe.router.MatMul.weight"].T
            sd[f"{p}.mlp.router.bias"] = t[f"{p}.moe.router.Add.bias"]
            continue
        gate, up = t[f"{p}.mlp.gate_proj.MatMul.weight"].T, t[f"{p}.mlp.up_proj.MatMul.weight"].T
        if name.startswith("phi"):
            sd[f"{p}.mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
        else:
            sd[f"{p}.mlp.gate_proj.weight"], sd[f"{p}.mlp.up_proj.weight"] = gate, up
        sd[f"{p}.mlp.down_proj.weight"] = t[f"{p}.mlp.down_proj.MatMul.weight"].T
    sd["model.norm.weight"] = norm(t[f"model.layers.{layers}.final_norm_layernorm.weight"])
    if name == "gpt-oss":
        sd.update(gpt_oss_experts_from_gguf(layers))
    sd = {k: np.ascontiguousarray(v, dtype=v.dtype) for k, v in sorted(sd.items())}

    dest = os.path.join(OUT, f"{name}-hf")
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    config = dict(cfg, architectures=[model_cls], model_type=HF_FOLDERS[name], torch_dtype="float32")
    config.pop("initializer_range")
    if name == "gemma3":  # transformers 5's defaults for Gemma 3, one base per layer type
        config["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    if name == "phi4-mini":  # transformers 4's spelling, which the importer reads too
        rope = dict(config.pop("rope_parameters"))
        config["rope_theta"] = rope.pop("rope_theta")
        config["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
        config["rope_scaling"] = rope
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(dest, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS,
                   "do_sample": False, "max_length": 256}, f, indent=2)
        f.write("\n")
    if name == "llama3":  # sharded, as large checkpoints are
        names = list(sd)
        shards = [names[: len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for i, part in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(dest, file), {k: sd[k] for k in part})
            weight_map.update({k: file for k in part})
        with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(v.nbytes for v in sd.values())},
                       "weight_map": weight_map}, f, indent=2)
            f.write("\n")
    else:
        write_safetensors(os.path.join(dest, "model.safetensors"), sd)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(OUT, f"{name}-fp32", f), os.path.join(dest, f))
    print(f"{dest}: {sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest))} bytes")


def gpt_oss_experts_from_gguf(layers):
    """gpt-oss's experts as its checkpoint stores them, from the family's GGUF (the inverse of
    `write_gpt_oss_experts`): `*_blocks` [E, rows, K/32, 16] with element 2i in byte i's low
    nibble, `*_scales` [E, rows, K/32], gate and up rows interleaved, biases likewise."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(os.path.join(OUT, "gpt-oss.gguf"))
    tensors = {t.name: t for t in r.tensors}

    def blocks(name):
        t = tensors[name]
        raw = np.asarray(t.data, dtype=np.uint8)
        e, rows = int(t.shape[2]), int(t.shape[1])
        raw = raw.reshape(e, rows, -1, 17)
        scales, qs = raw[..., 0], raw[..., 1:]
        codes = np.empty(qs.shape[:-1] + (32,), np.uint8)
        codes[..., :16], codes[..., 16:] = qs & 0x0F, qs >> 4
        return codes[..., 0::2] | (codes[..., 1::2] << 4), scales

    def interleave(a, b):
        out = np.empty((a.shape[0], 2 * a.shape[1]) + a.shape[2:], a.dtype)
        out[:, 0::2], out[:, 1::2] = a, b
        return out

    sd = {}
    for l in range(layers):
        p, g = f"model.layers.{l}.mlp.experts", f"blk.{l}"
        (gb, gs), (ub, us) = blocks(f"{g}.ffn_gate_exps.weight"), blocks(f"{g}.ffn_up_exps.weight")
        db, ds = blocks(f"{g}.ffn_down_exps.weight")
        bias = lambda n: np.asarray(tensors[n].data, dtype=np.float32)
        sd[f"{p}.gate_up_proj_blocks"] = interleave(gb, ub)
        sd[f"{p}.gate_up_proj_scales"] = interleave(gs, us)
        sd[f"{p}.gate_up_proj_bias"] = interleave(bias(f"{g}.ffn_gate_exps.bias"), bias(f"{g}.ffn_up_exps.bias"))
        sd[f"{p}.down_proj_blocks"], sd[f"{p}.down_proj_scales"] = db, ds
        sd[f"{p}.down_proj_bias"] = bias(f"{g}.ffn_down_exps.bias")
    return sd


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/oxgen-families")
    parser.add_argument("--only", help="comma-separated family names (default: all)")
    parser.add_argument("--gguf-from-package", metavar="NAME",
                        help="only write NAME's GGUF, its checkpoint rebuilt from the committed "
                             "fp32 package (numpy, onnx and gguf; no torch), and name it in "
                             "families.json")
    parser.add_argument("--hf-from-packages", action="store_true",
                        help="only write each HF_FOLDERS family's Hugging Face folder, rebuilt "
                             "from its committed fp32 package (numpy, onnx and gguf; no torch)")
    args = parser.parse_args()
    if args.hf_from_packages:
        for name in HF_FOLDERS:
            hf_from_package(name)
        return
    if args.gguf_from_package:
        name = args.gguf_from_package
        write_gguf(name, PackageCheckpoint(name), os.path.join(OUT, f"{name}-fp32"))
        manifest_path = os.path.join(OUT, "families.json")
        manifest = json.load(open(manifest_path))
        manifest[name]["gguf"] = {"file": f"{name}.gguf", "architecture": GGUF_ARCH[name]}
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.write("\n")
        return
    names = args.only.split(",") if args.only else list(FAMILIES)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)

    import importlib.metadata as md

    versions = {p: md.version(p) for p in ("torch", "transformers", "onnxruntime-genai", "onnxruntime", "onnx-ir")}
    print(versions)
    tok_dir = os.path.join(args.work, "tokenizer")
    write_tokenizer(tok_dir)

    manifest_path = os.path.join(OUT, "families.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    for name in names:
        _, model_cls, _, n_prompt, new_tokens, precisions = FAMILIES[name]
        hf_dir = os.path.join(args.work, "hf", name)
        model = make_hf(name, hf_dir, tok_dir)
        ids = prompt(n_prompt)
        reference = greedy_transformers(model, ids, new_tokens)
        entry = {"architecture": model_cls, "prompt": ids, "transformers": reference, "packages": {}}
        for precision in precisions:
            package = export(hf_dir, args.work, name, precision)
            genai = greedy_genai(package, ids, new_tokens)
            agree = sum(a == b for a, b in zip(genai, reference))
            print(f"{name}-{precision}: onnxruntime-genai {genai}\n  transformers agrees on {agree}/{len(genai)}")
            entry["packages"][f"{name}-{precision}"] = {"precision": precision, "genai": genai}
        if name in GGUF_ARCH:
            write_gguf(name, model, tok_dir)
            entry["gguf"] = {"file": f"{name}.gguf", "architecture": GGUF_ARCH[name]}
        manifest[name] = entry
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
