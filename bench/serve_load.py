#!/usr/bin/env python3
"""Concurrent streaming clients against `oxgen serve`: aggregate decode tok/s, TTFT and
inter-token latency percentiles per concurrency level, and a check that every stream's greedy
text is byte-identical to the single-stream text.

Aggregate decode tok/s counts the tokens after each stream's first (the first is TTFT's) over
the time from the first stream's first token to the last stream's last; end-to-end tok/s counts
every token over the time from the first request sent to the last stream's end (prefill
included). Each level runs `--rounds` times: the table gives the median round's throughputs and
the latency percentiles over all rounds.

    bench/serve_load.py [--oxgen target/release/oxgen] [--model PKG] [--url URL]
                        [--streams 1,2,4,8,16] [--gen-len 128] [--rounds 3] [--threads 2]
                        [--json-out F]

Without --url it starts `oxgen serve MODEL --port 0` itself (the default model when --model is
not given) and stops it at the end. Standard library only.
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

PROMPT = "Write a long story about a lighthouse keeper and a storm."


def stream_once(base, model, gen_len, out, index, barrier):
    """One streaming chat request; records send time, chunk arrival times and the text."""
    url = urllib.parse.urlparse(base)
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": gen_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    barrier.wait()
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        out[index] = {"error": f"status {resp.status}: {resp.read()[:200]!r}"}
        return
    # Only timestamps and raw lines while the stream runs; JSON is parsed after it ends, so
    # the client (on the same cores as the server) takes as little CPU as it can meanwhile.
    arrivals = []
    for raw in resp:
        if raw.startswith(b"data: "):
            if raw.startswith(b"data: [DONE]"):
                break
            arrivals.append((time.perf_counter(), raw))
    end = time.perf_counter()
    times, text, tokens = [], [], None
    for at, raw in arrivals:
        chunk = json.loads(raw[len(b"data: "):])
        if "error" in chunk:
            out[index] = {"error": chunk["error"]["message"]}
            return
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk["choices"]:
            content = choice.get("delta", {}).get("content")
            if content:
                times.append(at)
                text.append(content)
    out[index] = {"start": start, "times": times, "text": "".join(text), "tokens": tokens,
                  "end": end}


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * len(values) + 0.5)) - 1))]


def run_level(base, model, n, gen_len, rounds):
    """`rounds` runs of `n` concurrent streams: the median round's throughputs, latency
    percentiles over every round's samples, and every stream's text."""
    runs = [run_once(base, model, n, gen_len) for _ in range(rounds)]
    ttft = [v for r in runs for v in r["ttft"]]
    itl = [v for r in runs for v in r["itl"]]
    return {
        "streams": n,
        "rounds": rounds,
        "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
        "end_to_end_tok_s": statistics.median(r["end_to_end_tok_s"] for r in runs),
        "ttft_p50_ms": 1e3 * percentile(ttft, 0.5),
        "ttft_p99_ms": 1e3 * percentile(ttft, 0.99),
        "itl_p50_ms": 1e3 * percentile(itl, 0.5),
        "itl_p99_ms": 1e3 * percentile(itl, 0.99),
        "texts": [t for r in runs for t in r["texts"]],
    }


def run_once(base, model, n, gen_len):
    out = [None] * n
    barrier = threading.Barrier(n)
    threads = [threading.Thread(target=stream_once, args=(base, model, gen_len, out, i, barrier))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o["error"] for o in out if "error" in o]
    if errors:
        raise SystemExit(f"{n} streams: {errors[0]}")
    first = min(o["start"] for o in out)
    last = max(o["end"] for o in out)
    tokens = sum(o["tokens"] for o in out)
    first_token = min(o["times"][0] for o in out)
    last_token = max(o["times"][-1] for o in out)
    decoded = sum(o["tokens"] - 1 for o in out)
    return {
        "decode_tok_s": decoded / (last_token - first_token),
        "end_to_end_tok_s": tokens / (last - first),
        "ttft": [o["times"][0] - o["start"] for o in out],
        "itl": [b - a for o in out for a, b in zip(o["times"], o["times"][1:])],
        "texts": [o["text"] for o in out],
    }


def start_server(oxgen, model, threads, max_batch):
    cmd = [oxgen, "serve", "--port", "0", "--threads", str(threads),
           "--max-batch", str(max_batch), "--max-queue", "1024"]
    if model:
        cmd.insert(2, model)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "listening on http://" in line:
            addr = line.split("listening on http://")[1].split()[0]
            break
    else:
        raise SystemExit("oxgen serve exited before listening")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    base = f"http://{addr}"
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection(*addr.split(":"), timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, base
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server never became ready")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--oxgen", default="target/release/oxgen")
    ap.add_argument("--model", help="package folder (default: oxgen's default model)")
    ap.add_argument("--url", help="an already running server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs per level; the table gives the median round's throughput")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    levels = [int(s) for s in args.streams.split(",")]
    proc = None
    if args.url:
        base = args.url.rstrip("/")
    else:
        proc, base = start_server(args.oxgen, args.model, args.threads, max(levels))
    try:
        url = urllib.parse.urlparse(base)
        conn = http.client.HTTPConnection(url.hostname, url.port)
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
        run_once(base, model, 1, 8)  # warm-up
        rows = [run_level(base, model, n, args.gen_len, args.rounds) for n in levels]
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
    reference = rows[0]["texts"][0]
    single = rows[0]["decode_tok_s"]
    print("| streams | aggregate decode tok/s | x single | end-to-end tok/s | TTFT p50 / p99 ms "
          "| inter-token p50 / p99 ms | identical text |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        same = all(t == reference for t in r["texts"])
        r["identical"] = same
        print(f"| {r['streams']} | {r['decode_tok_s']:.1f} | {r['decode_tok_s'] / single:.2f} "
              f"| {r['end_to_end_tok_s']:.1f} "
              f"| {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
              f"| {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | {'yes' if same else 'NO'} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "texts"} for r in rows], f, indent=1)
    if not all(r["identical"] for r in rows):
        sys.exit("outputs differ between concurrency levels")


if __name__ == "__main__":
    main()
