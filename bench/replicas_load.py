#!/usr/bin/env python3
"""The load bench/replicas.sh drives through a load balancer: chat sessions, each with its own
long system prompt, sent by concurrent clients with an `x-session-id` header. Reports
aggregate tok/s, latency, how requests spread over the replicas, what every request came to,
and the prefix-cache hit rate summed over the replicas' /metrics.

    bench/replicas_load.py --url http://127.0.0.1:PORT --replica http://127.0.0.1:P1 ...
                           [--seconds 60] [--clients 4] [--sessions 24] [--max-tokens 16]
                           [--stream-share 0.5] [--kill-pid PID --kill-at SECONDS]
                           [--label NAME] [--json-out FILE]

A request ends as one of:
  ok            200, whole (a stream saw `data: [DONE]`), answered by one replica;
  retried_ok    200, whole, after the balancer moved it from a failed replica (X-Upstream
                names two);
  cut_stream    a stream that ended without `data: [DONE]` (its replica died mid-answer);
  http_NNN      an error status (e.g. 502 when no replica could answer, 429 queue full);
  conn_error    the balancer's connection failed;
  hung          no answer within --request-timeout seconds: this must stay 0.
With --kill-pid, the replica with that process id gets SIGKILL --kill-at seconds in.
Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import threading
import time
import urllib.parse
from collections import Counter

WORDS = (
    "ledger invoice harbor signal lantern orchard granite meadow circuit protocol quartz "
    "valley beacon cipher delta ember falcon glacier horizon island juniper kernel lattice "
    "mosaic nebula oracle prism quiver raven summit tundra umbra vector willow xenon yonder "
    "zephyr anchor bramble cobalt dune estuary fjord grove heron inlet jasper kelp lagoon"
).split()
QUESTIONS = [
    "Summarize your role in one sentence.",
    "What should I ask you first?",
    "Name three things you can help with.",
    "Give me a short greeting.",
    "What is the most important rule you follow?",
    "Describe your team in five words.",
]


def system_prompt(session):
    """A session's own system prompt, about 300 tokens: every session's prefix differs from
    its first words, so only the same session's requests share cached blocks."""
    rng = random.Random(session)
    sentences = [f"You are assistant {session} of the {rng.choice(WORDS)} desk."]
    for _ in range(22):
        words = " ".join(rng.choice(WORDS) for _ in range(8))
        sentences.append(f"Remember the {words}.")
    return " ".join(sentences)


def scrape(base):
    """The counters of one replica's /metrics, or None when it does not answer."""
    url = urllib.parse.urlparse(base)
    try:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    except OSError:
        return None
    values = {}
    for name in ["oxgen_prefix_cache_hits_total", "oxgen_prefix_cache_queries_total",
                 "oxgen_generation_tokens_total", "oxgen_prompt_tokens_total"]:
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        values[name] = float(m.group(1)) if m else 0.0
    return values


class Run:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.outcomes = Counter()
        self.latencies = []
        self.ttfts = []
        self.tokens = 0
        self.by_replica = Counter()
        self.stop_at = time.monotonic() + args.seconds

    def record(self, outcome, latency=None, ttft=None, tokens=0, upstream=""):
        with self.lock:
            self.outcomes[outcome] += 1
            if latency is not None:
                self.latencies.append(latency)
            if ttft is not None:
                self.ttfts.append(ttft)
            self.tokens += tokens
            if upstream:
                # The replica that answered: the last address X-Upstream names.
                self.by_replica[upstream.split(",")[-1].strip()] += 1


def one_request(run, rng, base):
    args = run.args
    session = rng.randrange(args.sessions)
    stream = rng.random() < args.stream_share
    request = {
        "model": args.model,
        "messages": [
            {"role": "system", "content": system_prompt(session)},
            {"role": "user", "content": rng.choice(QUESTIONS)},
        ],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        request["stream_options"] = {"include_usage": True}
    body = json.dumps(request)
    headers = {"Content-Type": "application/json", "x-session-id": f"session-{session}"}
    url = urllib.parse.urlparse(base)
    start = time.monotonic()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=args.request_timeout)
    answering = False
    try:
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        answering = True
        upstream = resp.getheader("X-Upstream", "")
        outcome = "retried_ok" if "," in upstream else "ok"
        if resp.status != 200:
            resp.read()
            run.record(f"http_{resp.status}", upstream=upstream)
            return
        if not stream:
            usage = json.loads(resp.read())["usage"]
            run.record(outcome, time.monotonic() - start, None, usage["completion_tokens"],
                       upstream)
            return
        ttft, tokens, done = None, 0, False
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.monotonic() - start
        if done:
            run.record(outcome, time.monotonic() - start, ttft, tokens, upstream)
        else:
            run.record("cut_stream", upstream=upstream)
    except TimeoutError:
        run.record("hung")
    except (OSError, http.client.HTTPException, ValueError):
        # Mid-stream, a reset shows here: the replica died after the answer began.
        run.record("cut_stream" if stream and answering else "conn_error")
    finally:
        conn.close()


def client(run, seed):
    rng = random.Random(seed)
    while time.monotonic() < run.stop_at:
        one_request(run, rng, run.args.url)


def percentile(values, q):
    """The q-quantile of `values` in seconds, rounded; None when there are none."""
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the load balancer")
    ap.add_argument("--replica", action="append", default=[],
                    help="a replica's own address, for its /metrics (repeat per replica)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--stream-share", type=float, default=0.5)
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--kill-pid", type=int)
    ap.add_argument("--kill-at", type=float)
    ap.add_argument("--label", default="run")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    # The last answer of each replica's /metrics: a killed replica keeps its last one.
    first = {r: scrape(r) for r in args.replica}
    last = dict(first)
    run = Run(args)
    scraping = threading.Event()

    def scraper():
        while not scraping.wait(0.5):
            for r in args.replica:
                m = scrape(r)
                if m is not None:
                    last[r] = m

    def killer():
        time.sleep(args.kill_at)
        for r in args.replica:  # what the victim counted up to its death
            m = scrape(r)
            if m is not None:
                last[r] = m
        os.kill(args.kill_pid, signal.SIGKILL)

    threads = [threading.Thread(target=scraper, daemon=True)]
    if args.kill_pid:
        threads.append(threading.Thread(target=killer, daemon=True))
    clients = [threading.Thread(target=client, args=(run, i)) for i in range(args.clients)]
    started = time.monotonic()
    for t in threads + clients:
        t.start()
    for t in clients:
        t.join()
    elapsed = time.monotonic() - started
    scraping.set()
    for r in args.replica:
        m = scrape(r)
        if m is not None:
            last[r] = m

    def delta(name):
        return sum(last[r][name] - first[r][name] for r in args.replica if first[r] and last[r])

    queries = delta("oxgen_prefix_cache_queries_total")
    result = {
        "label": args.label,
        "seconds": round(elapsed, 1),
        "requests": sum(run.outcomes.values()),
        "outcomes": dict(sorted(run.outcomes.items())),
        "completion_tokens": run.tokens,
        "tok_per_s": round(run.tokens / elapsed, 1),
        "latency_p50_s": percentile(run.latencies, 0.5),
        "latency_p90_s": percentile(run.latencies, 0.9),
        "ttft_p50_s": percentile(run.ttfts, 0.5),
        "prefix_hit_rate": round(delta("oxgen_prefix_cache_hits_total") / queries, 3)
        if queries else None,
        "prompt_tokens": int(delta("oxgen_prompt_tokens_total")),
        "by_replica": dict(sorted(run.by_replica.items())),
    }
    print(json.dumps(result))
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(result) + "\n")
    if run.outcomes["hung"]:
        raise SystemExit(f"{run.outcomes['hung']} requests hung")


if __name__ == "__main__":
    main()
