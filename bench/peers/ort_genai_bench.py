#!/usr/bin/env python3
"""onnxruntime-genai on an onnxruntime-genai package, with `oxgen bench`'s protocol.

Same prompt (the exact token ids `oxgen bench --prompt random --seed S` uses: splitmix64 seeded
with S, modulo the tokenizer's vocabulary size, skipping the eos and bos ids), greedy, exactly
--gen-len tokens (min_length = max_length, so end-of-sequence cannot stop it), from an empty KV
cache each run. Prints one JSON object shaped like `oxgen bench --json`'s.

Timing, as oxgen defines it (crates/oxgen/src/stream.rs):
  - TTFT: from `append_tokens(prompt)` (which runs the prompt through the model) to the first
    token chosen by `generate_next_token()`. Creating the Generator (allocating its KV buffer)
    happens before the clock starts.
  - prefill tok/s = prompt_len / TTFT.
  - decode tok/s = (gen_len - 1) / (time from the first token to the last): gen_len - 1 model
    steps, each followed by greedy selection.

Each measured run is a fresh child process (load, --warmup unmeasured generations, one measured
generation), so peak RSS (getrusage ru_maxrss of the child) is per run and not shared. The RSS
includes the Python interpreter and the onnxruntime-genai module; `rss_after_import_bytes` says
how much of it was there before the model was loaded.

Threads: the decoder session's `intra_op_num_threads`, set through `og.Config.overlay` (0 keeps
onnxruntime's default, one thread per physical core). Everything else is the package's
genai_config.json as is.

Usage:
  ort_genai_bench.py MODEL_DIR [--prompt-len 128] [--gen-len 128] [--runs 5] [--warmup 1]
                     [--threads N] [--seed 0] [--json]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

MASK64 = (1 << 64) - 1


def splitmix(state):
    """One splitmix64 step: returns (new state, output), as crates/cli/src/bench.rs."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def vocab_size(model_dir):
    """The tokenizer's vocabulary with added tokens, as `tokenizers`' get_vocab_size(true)."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    names = set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}
    names |= {t["content"] for t in tok.get("added_tokens", [])}
    return max(len(names), 1)


def special_ids(model_dir):
    """The eos and bos ids of genai_config.json, which oxgen's random prompt skips."""
    with open(os.path.join(model_dir, "genai_config.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    ids = set()
    for key in ("eos_token_id", "bos_token_id"):
        value = model.get(key)
        if isinstance(value, list):
            ids.update(value)
        elif value is not None:
            ids.add(value)
    return ids


def random_prompt(model_dir, length, seed):
    """The token ids of `oxgen bench --prompt random --seed SEED --prompt-len LENGTH`."""
    vocab = vocab_size(model_dir)
    special = special_ids(model_dir)
    state, ids = seed & MASK64, []
    while len(ids) < length:
        state, out = splitmix(state)
        token = out % vocab
        if token not in special:
            ids.append(token)
    return ids


def stats(values):
    """Median, mean, population std and the runs, as oxgen bench's `stats`."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return {"median": statistics.median(values), "mean": mean, "std": var**0.5, "runs": values}


def child(args):
    """Loads the model, runs the warm-ups and one measured generation; prints its numbers."""
    import numpy as np
    import onnxruntime_genai as og

    rss_after_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ids = np.array(random_prompt(args.model, args.prompt_len, args.seed), dtype=np.int32)
    total = args.prompt_len + args.gen_len

    t = time.perf_counter()
    config = og.Config(args.model)
    if args.threads:
        overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": args.threads}}}}
        config.overlay(json.dumps(overlay))
    model = og.Model(config)
    load_ms = (time.perf_counter() - t) * 1e3

    def generate():
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=total, min_length=total)
        generator = og.Generator(model, params)
        t0 = time.perf_counter()
        generator.append_tokens(ids)
        generator.generate_next_token()
        t1 = time.perf_counter()
        for _ in range(args.gen_len - 1):
            generator.generate_next_token()
        t2 = time.perf_counter()
        n = len(generator.get_sequence(0))
        if n != total:
            raise RuntimeError(f"generated a sequence of {n} tokens, expected {total}")
        return t1 - t0, t2 - t1, generator.get_sequence(0)[args.prompt_len :].tolist()

    for _ in range(args.warmup):
        generate()
    ttft, decode, tokens = generate()
    print(
        json.dumps(
            {
                "prefill_tok_s": args.prompt_len / ttft,
                "decode_tok_s": (args.gen_len - 1) / decode if args.gen_len > 1 and decode > 0 else 0.0,
                "ttft_ms": ttft * 1e3,
                "load_ms": load_ms,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "rss_after_import_bytes": rss_after_import,
                "first_tokens": tokens[:8],
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="an onnxruntime-genai package folder")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default prints a summary)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prompt_len < 1 or args.gen_len < 1 or args.runs < 1 or args.warmup < 0:
        parser.error("--prompt-len, --gen-len and --runs must be at least 1, --warmup at least 0")
    if args.child:
        child(args)
        return

    import onnxruntime
    import onnxruntime_genai

    runs = []
    for i in range(args.runs):
        cmd = [sys.executable, os.path.abspath(__file__), "--child"] + sys.argv[1:]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"run {i + 1} failed (exit {proc.returncode}): {' '.join(cmd)}")
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append(run)
        if not args.json:
            print(
                f"run {i + 1}: prefill {run['prefill_tok_s']:.1f} tok/s, decode {run['decode_tok_s']:.1f} tok/s, "
                f"TTFT {run['ttft_ms']:.1f} ms, peak RSS {run['peak_rss_bytes'] / 2**20:.1f} MiB",
                file=sys.stderr,
            )
    series = lambda key: [r[key] for r in runs]  # noqa: E731
    report = {
        "system": "onnxruntime-genai",
        "versions": {"onnxruntime-genai": onnxruntime_genai.__version__, "onnxruntime": onnxruntime.__version__},
        "model": os.path.abspath(args.model),
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "runs": args.runs,
        "warmup": args.warmup,
        "prefill_tok_s": stats(series("prefill_tok_s")),
        "decode_tok_s": stats(series("decode_tok_s")),
        "ttft_ms": stats(series("ttft_ms")),
        "load_ms": statistics.median(series("load_ms")),
        # Each run is its own process: the largest of their peaks.
        "peak_rss_bytes": max(series("peak_rss_bytes")),
        "peak_rss_bytes_runs": series("peak_rss_bytes"),
        "rss_after_import_bytes": max(series("rss_after_import_bytes")),
        "first_tokens": runs[-1]["first_tokens"],
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['model']} (onnxruntime-genai {onnxruntime_genai.__version__})")
        print(f"prompt {args.prompt_len} tokens, {args.gen_len} generated, {args.runs} runs after {args.warmup} warm-up")
        for name, key, unit in (("prefill", "prefill_tok_s", "tok/s"), ("decode", "decode_tok_s", "tok/s"), ("TTFT", "ttft_ms", "ms")):
            s = report[key]
            print(f"{name:<8} median {s['median']:>8.1f} {unit}   mean {s['mean']:>8.1f} ± {s['std']:.1f}")
        print(f"peak RSS {report['peak_rss_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
