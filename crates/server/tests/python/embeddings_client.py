#!/usr/bin/env python3
"""Exercises `oxgen serve` of an encoder package with the official `openai` client and
plain HTTP.

Usage: python embeddings_client.py BASE_URL MODEL_ID
  BASE_URL  e.g. http://127.0.0.1:8123/v1
  MODEL_ID  the id the server serves, e.g. all-MiniLM-L6-v2

Checks that the client's `embeddings.create` works unchanged (floats, base64, token ids,
`dimensions`), that concurrent requests get the same vectors as lone ones, that a rerank
request returns the documents in score order, and that bad inputs are 400s naming the
field. Prints `ok NAME` per check; exits 1 at the first failure.
"""

import base64
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai

BASE_URL = sys.argv[1].rstrip("/")
MODEL = sys.argv[2]
ROOT = BASE_URL[: -len("/v1")]
client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0, timeout=60)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Berlin has a population of 3,520,031 registered inhabitants.",
    "Le café était délicieux.",
]


def post(path, body):
    request = urllib.request.Request(
        ROOT + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def floats(text_or_list, **kw):
    r = client.embeddings.create(model=MODEL, input=text_or_list, encoding_format="float", **kw)
    return np.array([d.embedding for d in r.data], dtype=np.float32), r


def check_floats_and_usage():
    vectors, r = floats(TEXTS)
    assert vectors.shape == (4, 384), vectors.shape
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert [d.index for d in r.data] == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == r.usage.total_tokens > 4 * 3, r.usage
    assert r.model == MODEL
    # Similar sentences are nearer than unrelated ones.
    a, _ = floats(["A man is eating a meal."])
    assert a[0] @ vectors[1] > a[0] @ vectors[2]


def check_base64_is_the_float_bits():
    want, _ = floats(TEXTS[:2])
    raw = client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="base64")
    for i, d in enumerate(raw.data):
        got = np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
        assert np.array_equal(got, want[i]), i
    # The client's default (it asks for base64 and decodes it itself).
    default = client.embeddings.create(model=MODEL, input=TEXTS[:2])
    assert np.array_equal(np.array(default.data[0].embedding, dtype=np.float32), want[0])


def check_token_ids_and_dimensions():
    status, tokenized = post("/v1/embeddings", {"model": MODEL, "input": "A man is eating food."})
    assert status == 200
    want, _ = floats("A man is eating food.")
    # [CLS] a man is eating food . [SEP] in bert-base-uncased's vocabulary.
    ids = [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]
    by_ids, _ = floats(ids)
    assert np.array_equal(by_ids[0], want[0])
    by_lists, _ = floats([ids, ids[:4] + [102]])
    assert np.array_equal(by_lists[0], want[0])
    short, _ = floats(TEXTS[0], dimensions=64)
    full, _ = floats(TEXTS[0])
    assert short.shape == (1, 64)
    assert abs(np.linalg.norm(short[0]) - 1) < 1e-5
    assert np.allclose(short[0], full[0][:64] / np.linalg.norm(full[0][:64]), atol=1e-6)


def check_concurrent_requests_get_the_lone_vectors():
    alone = [floats(t)[0][0] for t in TEXTS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: floats(TEXTS[i % 4])[0][0], range(16)))
    for i, v in enumerate(together):
        assert np.array_equal(v, alone[i % 4]), i


def check_rerank_orders_documents():
    docs = ["I like pizza.", "Berlin has 3.5 million inhabitants.", "Paris is in France."]
    for path in ["/v1/rerank", "/rerank", "/v2/rerank"]:
        status, r = post(path, {"model": MODEL, "query": "How many people live in Berlin?",
                                "documents": docs})
        assert status == 200, r
        scores = [x["relevance_score"] for x in r["results"]]
        assert scores == sorted(scores, reverse=True), scores
        assert r["results"][0]["index"] == 1, r
        assert r["results"][0]["document"]["text"] == docs[1]
    status, r = post("/v1/rerank", {"query": "Berlin", "documents": [{"text": d} for d in docs],
                                    "top_n": 1, "return_documents": False})
    assert status == 200 and len(r["results"]) == 1 and "document" not in r["results"][0], r


def check_bad_inputs_name_the_field():
    long = "word " * 400
    for body, param in [
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": ["ok", 7.5]}, "input[1]"),
        ({"model": MODEL, "input": ["ok", {"text": "x"}]}, "input[1]"),
        ({"model": MODEL, "input": [[101, 999999, 102]]}, "input[0]"),
        ({"model": MODEL, "input": ["ok", long]}, "input[1]"),
        ({"model": MODEL, "input": ["x"] * 2049}, "input"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": "x", "dimensions": 1000}, "dimensions"),
    ]:
        status, r = post("/v1/embeddings", body)
        assert status == 400, (body, r)
        assert r["error"]["param"] == param, (param, r)
    status, r = post("/v1/embeddings", {"model": MODEL, "input": long, "truncate": True})
    assert status == 200 and r["usage"]["prompt_tokens"] == 256, r
    for body, param in [
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", 3]}, "documents[1]"),
        ({"documents": ["a"]}, "query"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ]:
        status, r = post("/v1/rerank", body)
        assert status == 400 and r["error"]["param"] == param, (body, r)
    status, r = post("/v1/embeddings", {"model": "nope", "input": "x"})
    assert status == 404, r
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("a chat request to an encoder succeeded")
    except openai.BadRequestError as e:
        assert "embeddings" in str(e), e


for name, check in list(globals().items()):
    if name.startswith("check_"):
        try:
            check()
        except Exception as e:  # noqa: BLE001 - report any failure with its check's name
            print(f"FAILED {name[6:]}: {e!r}")
            raise
        print(f"ok {name[6:]}")
