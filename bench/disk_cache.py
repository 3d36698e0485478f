#!/usr/bin/env python3
"""Measures the prefix cache's disk tier: time to first token for a long prompt computed
cold, served from memory (the pool's prefix cache), read back from disk after another prompt
evicted it from memory, and read back from disk after the server restarted. Each round uses
prompts of its own (so cold is cold) and runs the four cases in that order; the figures are
medians over the rounds.

With --drop-caches (root: writes /proc/sys/vm/drop_caches) a fifth case restarts the server
again and empties the page cache once it is ready, so the blocks come from the device.

Usage: python bench/disk_cache.py OXGEN MODEL [--tokens N] [--rounds N] [--threads N]
                                  [--drop-caches]
  OXGEN  the oxgen binary (target/release/oxgen)
  MODEL  a package folder

The server gets a KV pool of --tokens / 16 + 8 blocks, so one other prompt of the same
length evicts the first from memory. Prints one JSON object.
"""

import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import tempfile
import time

parser = argparse.ArgumentParser()
parser.add_argument("oxgen")
parser.add_argument("model")
parser.add_argument("--tokens", type=int, default=4000)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--drop-caches", action="store_true")
args = parser.parse_args()

WORDS = (
    "river stone cloud market engine garden letter window silver harbor planet lantern "
    "forest signal bridge copper meadow winter canvas orbit pepper violin desert anchor"
).split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, cache_dir):
        self.port = free_port()
        blocks = args.tokens // 16 + 8
        self.proc = subprocess.Popen(
            [args.oxgen, "serve", args.model, "--port", str(self.port),
             "--threads", str(args.threads), "--kv-blocks", str(blocks),
             "--max-batch", "1", "--kv-disk-cache", cache_dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("the server did not start")

    def model(self):
        return json.loads(self.get("/v1/models")[1])["data"][0]["id"]

    def get(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()

    def metric(self, name):
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return float("nan")

    def ttft(self, prompt):
        """Seconds to the first streamed token of a one-token completion, and cached ids."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        body = {"model": self.model(), "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"content-type": "application/json"})
        first, cached = None, None
        response = conn.getresponse()
        if response.status != 200:
            raise SystemExit(f"{response.status}: {response.read().decode()}")
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event.get("choices"):
                first = time.perf_counter() - start
            if event.get("usage"):
                cached = event["usage"]["prompt_tokens_details"]["cached_tokens"]
        return first, cached

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def prompt(seed):
    """About --tokens tokens: common words, one token each with their space."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(args.tokens))


cases = {"cold": [], "memory": [], "disk_after_eviction": [], "disk_after_restart": []}
if args.drop_caches:
    cases["disk_after_restart_uncached"] = []
cached = {k: [] for k in cases}
with tempfile.TemporaryDirectory() as cache_dir:
    for r in range(args.rounds):
        first, other = prompt(2 * r), prompt(2 * r + 1)
        server = Server(cache_dir)
        for case, text in [("cold", first), ("memory", first), (None, other),
                           ("disk_after_eviction", first)]:
            t, c = server.ttft(text)
            if case:
                cases[case].append(t)
                cached[case].append(c)
        read = server.metric("oxgen_kv_disk_read_bytes_total")
        server.stop()
        server = Server(cache_dir)
        t, c = server.ttft(first)
        cases["disk_after_restart"].append(t)
        cached["disk_after_restart"].append(c)
        server.stop()
        if args.drop_caches:
            server = Server(cache_dir)
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            t, c = server.ttft(first)
            cases["disk_after_restart_uncached"].append(t)
            cached["disk_after_restart_uncached"].append(c)
            server.stop()

median = {k: statistics.median(v) for k, v in cases.items()}
print(json.dumps({
    "tokens": args.tokens,
    "rounds": args.rounds,
    "ttft_s": {k: [round(x, 3) for x in v] for k, v in cases.items()},
    "median_s": {k: round(v, 3) for k, v in median.items()},
    "cached_tokens": cached,
    "speedup_vs_cold": {k: round(median["cold"] / v, 1) for k, v in median.items()},
    "disk_read_bytes_per_round": read,
}, indent=2))
