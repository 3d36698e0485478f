#!/usr/bin/env python3
"""What an enforced tool call costs end to end: a `tool_choice: "required"` chat request
against `/v1/completions` on the very same prompt ids (from `/tokenize` with the tools) for
the same number of tokens, unconstrained (`ignore_eos`). The pairs run interleaved; the
medians and their ratio are printed. The difference is the template render, the grammar mask
per token and the reply parser.

    bench/tool_calls.py [--url http://127.0.0.1:8080] [--model SmolLM2-135M-Instruct] [--pairs 15]

Start `oxgen serve` first (e.g. `target/release/oxgen serve --threads 2`). Standard library
only.
"""

import argparse
import json
import statistics
import time
import urllib.request

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()

    def post(path, body):
        req = urllib.request.Request(
            args.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        started = time.perf_counter()
        with urllib.request.urlopen(req) as r:
            reply = json.loads(r.read())
        return time.perf_counter() - started, reply

    _, counted = post("/tokenize", {"messages": MESSAGES, "tools": [TOOL], "tool_choice": "required"})
    ids = counted["tokens"]
    tool, plain = [], []
    for _ in range(args.pairs):
        t, r = post("/v1/chat/completions", {
            "model": args.model, "messages": MESSAGES, "tools": [TOOL], "tool_choice": "required",
            "parallel_tool_calls": False, "temperature": 0, "max_tokens": 200,
        })
        n = r["usage"]["completion_tokens"]
        assert r["usage"]["prompt_tokens"] == len(ids), (r["usage"], len(ids))
        assert r["choices"][0]["finish_reason"] == "tool_calls", r
        tool.append(t)
        t, r = post("/v1/completions", {
            "model": args.model, "prompt": ids, "temperature": 0, "max_tokens": n, "ignore_eos": True,
        })
        assert r["usage"]["completion_tokens"] == n, r["usage"]
        plain.append(t)
    mt, mp = statistics.median(tool), statistics.median(plain)
    print(f"{args.pairs} interleaved pairs, {n} tokens after {len(ids)} prompt tokens: "
          f"required call median {mt * 1e3:.0f} ms, unconstrained {mp * 1e3:.0f} ms, "
          f"unconstrained/required time {mp / mt:.3f}")


if __name__ == "__main__":
    main()
