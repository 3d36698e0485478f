#!/usr/bin/env python3
"""Soak and churn against `oxgen serve` (loopback only, bounded in time): concurrent clients
mix streamed and whole chat requests of random lengths over prompts that share system
prompts (the prefix cache), completions on token ids, disconnects (mid-stream, before the
first token, while queued), cancellations by timeout, and bursts over the queue limit.

At the end it checks that nothing was lost or leaked and prints what it measured:
- every request got a response or a clean error (OpenAI's envelope); `lost` counts the rest;
- KV blocks used and reserved are back to 0, nothing queued or running;
- RSS growth from the end of warm-up (the first fifth) to the end, and open file descriptors;
- p50/p99 inter-token latency seen by the streaming clients.
Exits 1 when a request was lost, KV leaked, RSS grew past --max-rss-growth-mb or file
descriptors grew past --max-fd-growth.

    bench/soak.py [--oxgen target/release/oxgen] [--model PKG] [--seconds 600] [--clients 16]
                  [--threads 2] [--seed 1] [--kv-memory 256] [--kv-disk-cache DIR]
                  [--kv-disk-budget MIB]

With --kv-disk-cache the prefix cache's disk tier is on: at the end the folder must hold no
more than the budget, no temporary file may be left once the server has stopped, and no
file may have failed its check (a torn or corrupt write).

It starts `oxgen serve MODEL --port 0` itself (the default model without --model) with
--max-batch 8 --max-queue 8 --kv-memory 256 (--kv-memory: a pool small enough to be touched
whole during warm-up), and stops it at the end. Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

SYSTEMS = [
    "You are a helpful assistant.",
    "You are a terse assistant who answers in one sentence.",
    "You are a pirate. Answer as a pirate would, briefly.",
]
QUESTIONS = [
    "Why is the sky blue?",
    "Name three fruits.",
    "Tell me a story about a lighthouse.",
    "What is 12 times 7?",
    "Write a haiku about rain.",
    "Explain what a CPU cache is.",
]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.gaps = []
        self.lost = []

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def lose(self, what):
        with self.lock:
            self.lost.append(what)


def serve(args):
    cmd = [args.oxgen, "serve", "--port", "0", "--threads", str(args.threads), "--max-batch", "8",
           "--max-queue", "8", "--request-timeout", "120", "--model-id", "m",
           # A pool small enough to be touched whole during warm-up, so RSS growth after it
           # is what leaks, not KV pages first written.
           "--kv-memory", str(args.kv_memory)]
    if args.kv_disk_cache:
        cmd += ["--kv-disk-cache", args.kv_disk_cache, "--kv-disk-budget",
                str(args.kv_disk_budget)]
    if args.model:
        cmd.insert(2, args.model)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            host, port = m.group(1).rsplit(":", 1)
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, host, int(port)
    raise SystemExit("oxgen serve exited before listening")


def get(host, port, path):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read().decode()


def wait_ready(host, port):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if get(host, port, "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server never became ready")


def clean_error(status, body):
    """A refusal in OpenAI's envelope (429 queue_full, 503, ...), not a lost request."""
    try:
        e = json.loads(body)["error"]
        return status >= 400 and isinstance(e.get("message"), str)
    except (ValueError, KeyError, TypeError):
        return False


def chat_body(rng, stream):
    return {
        "model": "m",
        "messages": [{"role": "system", "content": rng.choice(SYSTEMS)},
                     {"role": "user", "content": rng.choice(QUESTIONS)}],
        "max_tokens": rng.randint(4, 96),
        "temperature": rng.choice([0, 0.8]),
        "stream": stream,
    }


def post(host, port, path, body, timeout=180):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def one(rng, host, port, stats):
    """One random client action; records its outcome."""
    action = rng.choices(
        ["stream", "whole", "leave_mid", "leave_early", "completion", "burst"],
        weights=[45, 20, 12, 8, 10, 5],
    )[0]
    try:
        if action == "stream" or action == "leave_mid":
            conn, r = post(host, port, "/v1/chat/completions", chat_body(rng, True))
            if r.status != 200:
                body = r.read().decode()
                stats.count(f"{r.status}") if clean_error(r.status, body) else stats.lose(body[:200])
                return
            leave_after = rng.randint(1, 6) if action == "leave_mid" else None
            chunks, last, done = 0, time.perf_counter(), False
            for raw in r:
                if raw.startswith(b"data: [DONE]"):
                    done = True
                    break
                if raw.startswith(b"data: "):
                    now = time.perf_counter()
                    if chunks > 1:
                        with stats.lock:
                            stats.gaps.append(now - last)
                    last = now
                    chunks += 1
                    if leave_after and chunks >= leave_after:
                        conn.close()
                        stats.count("left mid-stream")
                        return
            if done:
                stats.count("stream done")
            else:
                stats.lose("a stream ended without [DONE]")
        elif action == "whole":
            _, r = post(host, port, "/v1/chat/completions", chat_body(rng, False))
            body = r.read().decode()
            if r.status == 200 and json.loads(body)["choices"][0]["finish_reason"]:
                stats.count("whole done")
            elif clean_error(r.status, body):
                stats.count(f"{r.status}")
            else:
                stats.lose(body[:200])
        elif action == "leave_early":
            # Sent, then gone before the first token (maybe while queued).
            s = socket.create_connection((host, port), timeout=10)
            body = json.dumps(chat_body(rng, rng.random() < 0.5)).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
            time.sleep(rng.random() * 0.05)
            s.close()
            stats.count("left early")
        elif action == "completion":
            _, r = post(host, port, "/v1/completions", {
                "model": "m", "prompt": [rng.randint(10, 40000) for _ in range(rng.randint(1, 64))],
                "max_tokens": rng.randint(1, 32), "logprobs": rng.choice([None, 2]),
            })
            body = r.read().decode()
            if r.status == 200 or clean_error(r.status, body):
                stats.count(f"completion {r.status}")
            else:
                stats.lose(body[:200])
        else:
            # A burst over the queue limit: some get 429, every one gets an answer.
            results = []

            def fire():
                try:
                    _, r = post(host, port, "/v1/chat/completions",
                                dict(chat_body(rng, False), max_tokens=2))
                    body = r.read().decode()
                    results.append(r.status == 200 or clean_error(r.status, body))
                except OSError as e:
                    results.append(False)
                    stats.lose(f"burst: {e}")

            threads = [threading.Thread(target=fire) for _ in range(24)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            stats.count("burst")
            if not all(results):
                stats.lose("a burst request got no clean answer")
    except (OSError, http.client.HTTPException, ValueError) as e:
        stats.lose(f"{action}: {type(e).__name__}: {e}")


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric(text, series):
    m = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oxgen", default="target/release/oxgen")
    ap.add_argument("--model")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kv-memory", type=int, default=256, help="the server's KV pool, MiB")
    ap.add_argument("--kv-disk-cache", help="the disk tier's folder (off without it)")
    ap.add_argument("--kv-disk-budget", type=int, default=16, help="its budget, MiB")
    ap.add_argument("--max-rss-growth-mb", type=float, default=64)
    ap.add_argument("--max-fd-growth", type=int, default=16)
    args = ap.parse_args()

    proc, host, port = serve(args)
    try:
        wait_ready(host, port)
        stats = Stats()
        started = time.monotonic()
        stop = started + args.seconds
        samples = []

        def client(i):
            rng = random.Random(args.seed * 1000 + i)
            while time.monotonic() < stop:
                one(rng, host, port, stats)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        [w.start() for w in workers]
        warm = started + args.seconds / 5
        while time.monotonic() < stop:
            time.sleep(min(2.0, max(0.1, stop - time.monotonic())))
            samples.append((time.monotonic(), rss_kb(proc.pid), fds(proc.pid)))
        [w.join() for w in workers]

        # Idle: every block back, nothing queued or running.
        deadline = time.monotonic() + 60
        while True:
            health = json.loads(get(host, port, "/health")[1])
            live = health["requests"]
            if live == {"queued": 0, "running": 0, "kv_sequences": live["kv_sequences"]} or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.2)
        metrics = get(host, port, "/metrics")[1]
        used = metric(metrics, 'oxgen_kv_blocks{state="used"}')
        reserved = metric(metrics, 'oxgen_kv_blocks{state="reserved"}')
        after_warm = [s for s in samples if s[0] >= warm] or samples
        rss_growth_mb = (samples[-1][1] - after_warm[0][1]) / 1024
        fd_growth = samples[-1][2] - after_warm[0][2]
        gaps = sorted(stats.gaps)
        p = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3 if gaps else float("nan")
        total = sum(stats.counts.values())
        print(f"soak: {args.seconds:.0f} s, {args.clients} clients, {total} actions: "
              + ", ".join(f"{k} {v}" for k, v in sorted(stats.counts.items())))
        print(f"soak: lost {len(stats.lost)}; KV blocks used {used} reserved {reserved}; "
              f"queued {live['queued']} running {live['running']}")
        print(f"soak: RSS {after_warm[0][1] / 1024:.0f} MiB after warm-up -> "
              f"{samples[-1][1] / 1024:.0f} MiB (growth {rss_growth_mb:+.1f} MiB, peak "
              f"{max(s[1] for s in samples) / 1024:.0f} MiB); open fds {after_warm[0][2]} -> "
              f"{samples[-1][2]}")
        print(f"soak: inter-token latency p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms "
              f"over {len(gaps)} gaps")
        for what in stats.lost[:10]:
            print(f"soak: LOST {what}")
        failed = (stats.lost or used != 0 or reserved != 0 or live["queued"] or live["running"]
                  or rss_growth_mb > args.max_rss_growth_mb or fd_growth > args.max_fd_growth)
        disk = None
        if args.kv_disk_cache:
            disk = {k: metric(metrics, f"oxgen_kv_disk_{k}") for k in
                    ("writes_total", "bytes", "evictions_total", "rejected_total",
                     "dropped_total", "writable")}
            disk["hits"] = metric(metrics, "oxgen_prefix_cache_disk_hits_total")
            print("soak: disk tier " + ", ".join(f"{k} {v:.0f}" for k, v in disk.items()))
            failed = failed or disk["rejected_total"] or not disk["writable"]
        return 1 if failed else 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if args.kv_disk_cache:
            failed_disk = disk_left(args)
            if failed_disk:
                print(f"soak: disk tier: {failed_disk}")
                sys.exit(1)


def disk_left(args):
    """What is wrong with the disk tier's folder once the server has stopped: more than the
    budget held, or temporary files left."""
    total, tmp = 0, []
    for root, _, files in os.walk(args.kv_disk_cache):
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".tmp"):
                tmp.append(path)
            elif f.endswith(".kvb"):
                total += os.path.getsize(path)
    print(f"soak: disk tier holds {total / 2**20:.1f} MiB in its folder")
    if tmp:
        return f"{len(tmp)} temporary files left: {tmp[:3]}"
    if total > args.kv_disk_budget * 2**20:
        return f"{total} bytes held, over the {args.kv_disk_budget} MiB budget"
    return None


if __name__ == "__main__":
    sys.exit(main())
