"""Writes a tiny ModernBERT cross-encoder (`ModernBertForSequenceClassification`) and
transformers' logits on it, for oxgen's tests.

Its encoder is this folder's random checkpoint (`make_fixture.py`), read back from
`model.safetensors`; the head (`head.dense` with a bias, GELU, `head.norm` without a bias,
`classifier` to one logit) is random, stored as bfloat16. Like `make_fixture.py` it needs
torch, so it runs once by hand and its output (`classifier/`: config.json,
model.safetensors, tokenizer.json, reference.json) is committed:

    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch transformers
    /tmp/st/bin/python make_classifier.py

The reference runs float32, each sequence alone, with the head over the mean of the tokens'
states (the config's `classifier_pooling`) and over the first token's (`cls`), and
records both logits for sequences of 5, 23 and 61 tokens.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import ModernBertConfig, ModernBertForSequenceClassification

here = Path(__file__).parent
out = here / "classifier"
out.mkdir(exist_ok=True)
torch.manual_seed(11)

config_json = json.loads((here / "config.json").read_text())
config_json.update({
    "architectures": ["ModernBertForSequenceClassification"],
    "num_labels": 1,
    "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0},
    "classifier_pooling": "mean",
    "classifier_activation": "gelu",
    "classifier_bias": True,
})
skip = ("architectures", "model_type", "id2label", "label2id")
config = ModernBertConfig(**{k: v for k, v in config_json.items() if k not in skip})
config._attn_implementation = "eager"
model = ModernBertForSequenceClassification(config).eval()

encoder = {f"model.{k}": v.float() for k, v in load_file(str(here / "model.safetensors")).items()}
with torch.no_grad():
    for name, p in model.named_parameters():
        if name in encoder:
            p.copy_(encoder[name])
        elif "norm" in name:
            p.copy_((1 + torch.randn_like(p) * 0.1).to(torch.bfloat16).float())
        else:
            p.copy_((torch.randn_like(p) * 0.3).to(torch.bfloat16).float())
missing = set(encoder) - {n for n, _ in model.named_parameters()}
assert not missing, missing

save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
          str(out / "model.safetensors"), metadata={"format": "pt"})
(out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
shutil.copy(here / "tokenizer.json", out / "tokenizer.json")

sequences = json.loads((here / "reference.json").read_text())["sequences"]
logits = {}
for pooling in ("mean", "cls"):
    model.config.classifier_pooling = pooling
    with torch.no_grad():
        logits[pooling] = [
            float(model(input_ids=torch.tensor([ids]),
                        attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits[0, 0])
            for ids in sequences
        ]
(out / "reference.json").write_text(json.dumps({
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "sequences": sequences,
    "logits_mean": logits["mean"],
    "logits_cls": logits["cls"],
}, indent=1) + "\n")
print(logits)
