"""Writes a tiny random XLM-RoBERTa (an E5-multilingual-style embedder and a BGE-reranker-style
cross-encoder sharing its encoder) and transformers' outputs on it, for oxgen's tests.

transformers needs torch, which CI never installs, so this runs once by hand and its output
is committed (`embedder/`: config.json, model.safetensors, tokenizer.json, modules.json,
1_Pooling/config.json; `reranker/`: config.json, model.safetensors, tokenizer.json;
`reference.json`):

    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch transformers
    /tmp/st/bin/python make_fixture.py

The tokenizer is a SentencePiece-style Unigram model (NFKC, Metaspace, XLM-R's ids for
`<s>`, `<pad>`, `</s>`, `<unk>` and its single and pair templates) trained here on the
sentences below, so the texts go through the tokenizer kind XLM-R checkpoints use. The model
has 2 layers, 4 heads of 8, positions from `pad_token_id + 1` (RoBERTa's), one token type,
weights stored as float16. The reference records, per text, the tokenizer's ids, the mean
of transformers' `last_hidden_state` over the tokens (E5's pooling, before normalizing),
and, per (query, document) pair, the pair's ids and the reranker's logit; the model runs
float32, each sequence alone.
"""

import json
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel

here = Path(__file__).parent
torch.manual_seed(5)

TEXTS = [
    "query: How many people live in Berlin?",
    "passage: Berlin has a population of 3,520,031 registered inhabitants.",
    "passage: Paris is the capital and most populous city of France.",
    "Das Wetter in München ist heute überraschend warm.",
    "Le café était délicieux, mais la pâtisserie était un peu sèche.",
    "東京は日本の首都です。",
    "El perro corre por el parque todas las mañanas.",
    "Москва — столица России.",
    "I love pizza 🍕 and ice cream on hot summer days!",
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all; "
    "it sleeps through the afternoon while the fox runs circles around the barn.",
]
QUERY = "How many people live in Berlin?"
DOCUMENTS = [
    "Berlin has a population of 3,520,031 registered inhabitants.",
    "Paris is the capital and most populous city of France.",
    "Das Wetter in München ist heute überraschend warm.",
]

# A Unigram tokenizer as XLM-R's tokenizer.json spells one.
special = ["<s>", "<pad>", "</s>", "<unk>"]
tok = Tokenizer(models.Unigram())
tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" {2,}", " ")])
tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
corpus = TEXTS + DOCUMENTS + [QUERY] * 3
tok.train_from_iterator(
    corpus,
    trainers.UnigramTrainer(vocab_size=400, special_tokens=special, unk_token="<unk>"),
)
assert [tok.token_to_id(t) for t in special] == [0, 1, 2, 3]
tok.post_processor = processors.TemplateProcessing(
    single="<s> $A </s>",
    pair="<s> $A </s> </s> $B </s>",
    special_tokens=[("<s>", 0), ("</s>", 2)],
)
vocab = tok.get_vocab_size()

config_json = {
    "model_type": "xlm-roberta",
    "vocab_size": vocab,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 130,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-05,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "position_embedding_type": "absolute",
    "torch_dtype": "float16",
}
config = XLMRobertaConfig(**{k: v for k, v in config_json.items() if k != "model_type"},
                          num_labels=1)
config._attn_implementation = "eager"


def randomize(model):
    """Wider than the initializer's 0.02, so every layer moves the states; float16 values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) * 0.3)
            p.copy_(p.half().float())


embedder = XLMRobertaModel(config, add_pooling_layer=False).eval()
randomize(embedder)
reranker = XLMRobertaForSequenceClassification(config).eval()
randomize(reranker)
# The reranker's encoder is the embedder's, as a fine-tuned cross-encoder's would start.
reranker.roberta.load_state_dict(embedder.state_dict(), strict=False)


def save(model, folder, architecture, prefix=""):
    out = here / folder
    out.mkdir(exist_ok=True)
    weights = {prefix + k: v.half().contiguous() for k, v in model.state_dict().items()
               if "position_ids" not in k}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(
        {"architectures": [architecture], **config_json}, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    return out


emb = save(embedder, "embedder", "XLMRobertaModel")
(emb / "modules.json").write_text(json.dumps([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
], indent=2) + "\n")
(emb / "1_Pooling").mkdir(exist_ok=True)
(emb / "1_Pooling" / "config.json").write_text(json.dumps({
    "word_embedding_dimension": 32, "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
}, indent=2) + "\n")
save(reranker, "reranker", "XLMRobertaForSequenceClassification")
config_path = here / "reranker" / "config.json"
rerank_config = json.loads(config_path.read_text())
rerank_config.update({"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}})
config_path.write_text(json.dumps(rerank_config, indent=2) + "\n")

texts, pairs = [], []
with torch.no_grad():
    for text in TEXTS:
        ids = tok.encode(text).ids
        x = torch.tensor([ids])
        states = embedder(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
        texts.append({"text": text, "ids": ids,
                      "mean": states.mean(0).numpy().astype(np.float32).tolist()})
    for doc in DOCUMENTS:
        ids = tok.encode(QUERY, doc).ids
        x = torch.tensor([ids])
        logit = reranker(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, 0]
        pairs.append({"document": doc, "ids": ids, "logit": float(logit)})
(here / "reference.json").write_text(json.dumps({
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "texts": texts,
    "query": QUERY,
    "pairs": pairs,
}, indent=1, ensure_ascii=False) + "\n")
print(vocab, [len(t["ids"]) for t in texts], [p["logit"] for p in pairs])
