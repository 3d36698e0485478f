#!/usr/bin/env python3
"""Structured output before and after closing, on the real-world schema corpus.

Usage: python bench/structured_compare.py SERVER MODEL CORPUS.jsonl [PER_SOURCE]
  SERVER       e.g. http://127.0.0.1:8123 (an `oxgen serve` of MODEL)
  CORPUS.jsonl what `crates/server/tests/python/schema_corpus.py extract` writes
  PER_SOURCE   schemas per source, evenly spread (default 10)

Asks for "an example instance as JSON" under each schema, greedy, at max_tokens 256 and 384,
two ways: "open" as before closing existed (close_structured_output and close_objects
false, not strict) and "closed" as a strict request is answered now; validates each reply
against the original schema with jsonschema and prints the counts per source, way and
limit (valid, cut by the limit, unparsable, invalid, refused at compile). The figures in
docs/STRUCTURED.md come from it.
"""

import collections
import json
import sys
import urllib.error
import urllib.request

import jsonschema


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    server, model, corpus = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    per_source = int(sys.argv[4]) if len(sys.argv) == 5 else 10
    by_source = collections.defaultdict(list)
    for line in open(corpus):
        entry = json.loads(line)
        by_source[entry["source"]].append(entry)
    counts = collections.defaultdict(collections.Counter)
    for source, entries in by_source.items():
        stride = max(1, len(entries) // (per_source * 3))
        for entry in entries[::stride][:per_source]:
            for way in ("open", "closed"):
                for limit in (256, 384):
                    counts[(source, way, limit)][ask(server, model, entry["schema"], way, limit)] += 1
    for key in sorted(counts):
        print(*key, dict(counts[key]))


def ask(server, model, schema, way, limit):
    body = {
        "model": model,
        "max_tokens": limit,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Write an example instance as JSON."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema, "strict": way == "closed"},
        },
    }
    if way == "open":
        body.update(close_structured_output=False, close_objects=False)
    request = urllib.request.Request(
        f"{server}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            reply = json.load(r)
    except urllib.error.HTTPError:
        return "refused"
    choice = reply["choices"][0]
    try:
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        return "valid"
    except json.JSONDecodeError:
        return "cut" if choice["finish_reason"] == "length" else "unparsable"
    except jsonschema.ValidationError:
        return "invalid"


if __name__ == "__main__":
    main()
