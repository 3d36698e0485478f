#!/usr/bin/env python3
"""What the Python package costs over the Rust CLI: `import oxgen` time, and greedy decode
tok/s of `Model.generate` against `oxgen generate --json` (the command the wheel installed)
on the same raw prompt, 128 new tokens, `--runs` each; medians and their ratio.

    python bench/python_overhead.py MODEL_DIR [--runs 5] [--threads 2]

Run it with the Python of a venv the wheel is installed in.
"""

import argparse
import json
import statistics
import subprocess
import time

started = time.perf_counter()
import oxgen  # noqa: E402 - timed

IMPORT_S = time.perf_counter() - started
PROMPT = "Write a story about a lighthouse."


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = oxgen.Model(args.model, threads=args.threads)
    py, cli = [], []
    for _ in range(args.runs):
        out = model.generate(PROMPT, max_new_tokens=128, temperature=0, ignore_eos=True)
        py.append(out.timings["decode_tok_s"])
        done = subprocess.run(
            [oxgen.cli(), "generate", args.model, PROMPT, "--raw", "--max-new-tokens", "128",
             "--temperature", "0", "--ignore-eos", "--threads", str(args.threads), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True,
        )
        cli.append(json.loads(done.stdout)["timings"]["decode_tok_s"])
    p, c = statistics.median(py), statistics.median(cli)
    print(f"import oxgen: {IMPORT_S * 1e3:.0f} ms; decode tok/s, medians of {args.runs}: "
          f"Model.generate {p:.1f}, oxgen generate {c:.1f}; Python/CLI {p / c:.3f}")


if __name__ == "__main__":
    main()
