"""Writes a tiny random ModernBERT folder and transformers' outputs on it, for oxgen's tests.

transformers needs torch, which CI never installs, so this runs once by hand and its
output (this folder's config.json, model.safetensors, tokenizer.json, modules.json,
1_Pooling/config.json and reference.json) is committed:

    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch transformers
    /tmp/st/bin/python make_fixture.py OUT_DIR

The model has 4 layers with global attention every third (layers 0 and 3; the others see
8 tokens each side, local_attention 16), rotary theta 160000 (global) and 10000 (local),
LayerNorm without bias, a GeGLU MLP, head size 16. Its weights are random, stored as
bfloat16; the reference runs them in float32, each sequence alone (no padding), and
records `last_hidden_state` for sequences of 5, 23 and 61 tokens, longer than the window.
"""

import base64
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import ModernBertConfig, ModernBertModel

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(7)

# The config as ModernBERT checkpoints spell it (transformers 4.48's keys).
config_json = {
    "architectures": ["ModernBertModel"],
    "model_type": "modernbert",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "hidden_activation": "gelu",
    "max_position_embeddings": 512,
    "norm_eps": 1e-05,
    "norm_bias": False,
    "global_attn_every_n_layers": 3,
    "local_attention": 16,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
    "classifier_pooling": "mean",
    "torch_dtype": "float32",
}
config = ModernBertConfig(**{k: v for k, v in config_json.items() if k not in ("architectures", "model_type")})
config._attn_implementation = "eager"
model = ModernBertModel(config).eval()
with torch.no_grad():
    for p in model.parameters():
        # Wider than the initializer's 0.02, so every layer moves the states.
        p.copy_((torch.randn_like(p) * 0.3).to(torch.bfloat16).float())
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_((1 + torch.randn_like(p) * 0.1).to(torch.bfloat16).float())

from safetensors.torch import save_file
save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
          str(out / "model.safetensors"), metadata={"format": "pt"})
(out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")

vocab = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3}
for i in range(4, 128):
    vocab[f"w{i}"] = i
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(str(out / "tokenizer.json"))
(out / "modules.json").write_text(json.dumps([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
], indent=2) + "\n")
(out / "1_Pooling").mkdir(exist_ok=True)
(out / "1_Pooling" / "config.json").write_text(json.dumps({
    "word_embedding_dimension": 32, "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
}, indent=2) + "\n")

gen = np.random.default_rng(3)
sequences = [[1] + gen.integers(4, 128, n - 2).tolist() + [2] for n in (5, 23, 61)]
states = []
with torch.no_grad():
    for ids in sequences:
        x = torch.tensor([ids])
        y = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
        states.append(y.numpy().astype(np.float32))
blob = np.concatenate([s.reshape(-1) for s in states]).astype("<f4").tobytes()
(out / "reference.json").write_text(json.dumps({
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "hidden": 32,
    "sequences": sequences,
    "last_hidden_state_f32_base64": base64.b64encode(blob).decode(),
}) + "\n")
