#!/usr/bin/env python3
"""Measures a server of several models (`oxgen serve --models DIR`): time to first token for
a cold model (unloaded first through the admin endpoint) and a warm one, the server's
resident memory before and after unloads, and decode throughput of one model alone against
two models generating at once (how the shared cores split).

Usage: python bench/several_models.py BASE_URL PID MODEL_A MODEL_B [--rounds N] [--tokens N]
  BASE_URL  e.g. http://127.0.0.1:8080 (no /v1)
  PID       the server's process id (its VmRSS is read from /proc)

Prints one JSON object: medians over the rounds (memory is read 0.5 s after each unload).
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("base_url")
parser.add_argument("pid", type=int)
parser.add_argument("model_a")
parser.add_argument("model_b")
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--tokens", type=int, default=64)
args = parser.parse_args()
url = urllib.parse.urlparse(args.base_url)


def post(path, body=None):
    req = urllib.request.Request(
        args.base_url + path,
        data=json.dumps(body or {}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def rss_mib():
    with open(f"/proc/{args.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def settle():
    """Lets an unloaded model's thread finish freeing it before memory is read."""
    time.sleep(0.5)


def stream(model, tokens):
    """Streams a greedy chat reply; (seconds to the first token, decode tok/s after it)."""
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = None
    chunks = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        delta = json.loads(line[6:])["choices"]
        if delta and delta[0]["delta"].get("content"):
            chunks += 1
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    conn.close()
    return first - start, (chunks - 1) / (end - first)


cold, warm, alone, together_a, together_b, rss = [], [], [], [], [], []
for _ in range(args.rounds):
    for m in (args.model_a, args.model_b):
        post(f"/admin/models/{m}/unload")
    settle()
    before = rss_mib()
    cold.append(stream(args.model_a, 4)[0])
    loaded = rss_mib()
    warm.append(stream(args.model_a, 4)[0])
    alone.append(stream(args.model_a, args.tokens)[1])
    stream(args.model_b, 4)
    results = {}
    threads = [
        threading.Thread(target=lambda m=m: results.__setitem__(m, stream(m, args.tokens)[1]))
        for m in (args.model_a, args.model_b)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    together_a.append(results[args.model_a])
    together_b.append(results[args.model_b])
    both = rss_mib()
    post(f"/admin/models/{args.model_b}/unload")
    settle()
    one_left = rss_mib()
    post(f"/admin/models/{args.model_a}/unload")
    settle()
    rss.append((before, loaded, both, one_left, rss_mib()))

med = statistics.median
print(
    json.dumps(
        {
            "ttft_cold_s": med(cold),
            "ttft_warm_s": med(warm),
            "decode_alone_tok_s": med(alone),
            "decode_together_tok_s": [med(together_a), med(together_b)],
            "rss_mib": {
                "before": med(r[0] for r in rss),
                "a_loaded": med(r[1] for r in rss),
                "both_loaded": med(r[2] for r in rss),
                "b_unloaded": med(r[3] for r in rss),
                "both_unloaded": med(r[4] for r in rss),
            },
        },
        indent=1,
    )
)
