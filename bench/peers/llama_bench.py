#!/usr/bin/env python3
"""llama.cpp's `llama-bench` on a GGUF, reported in `oxgen bench --json`'s shape.

oxgen bench's protocol is a P-token prompt, then G greedy tokens after it. llama-bench measures
prompt processing and generation as separate tests, so this runs two:
  - prefill: `-p P -n 0` (pp P: one P-token batch from an empty KV cache);
  - decode:  `-p 0 -n G -d P` (tg G at depth P: G single-token steps after a P-token context,
    which llama-bench fills, unmeasured, before the timed steps).
Each is its own process with llama-bench's own warm-up, and `-r RUNS` timed repetitions.
prefill tok/s and decode tok/s are llama-bench's per-repetition `samples_ts`; `ttft_ms` is the
prompt test's time per repetition (prompt only: llama-bench samples no token). Peak RSS is the
larger of the two processes' ru_maxrss (os.wait4, per child). llama-bench's prompt is random
token ids (std::rand), not oxgen's; throughput does not depend on the ids.

Everything else is llama-bench's default (batch 2048, ubatch 512, flash attention auto, f16 KV
cache, weights repacked for the CPU, poll 50: recorded under `settings`); threads are `-t N`
(0 here means llama-bench's default).

`--only prefill` or `--only decode` runs one of the two (the other is null in the report).

Usage:
  llama_bench.py GGUF [--bin DIR] [--prompt-len 128] [--gen-len 128] [--runs 5] [--threads N]
                 [--only prefill|decode] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.path.normpath(os.path.join(HERE, "..", "..", ".cache", "peers", "llama.cpp", "build", "bin"))


def stats(values):
    """Median, mean, population std and the runs, as oxgen bench's `stats`."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return {"median": statistics.median(values), "mean": mean, "std": var**0.5, "runs": values}


def run_measured(cmd):
    """Runs cmd; returns (exit code, stdout, stderr, peak RSS bytes of that child)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(), err.read().decode(), usage.ru_maxrss * 1024


def llama_bench(binary, gguf, threads, runs, extra):
    cmd = [binary, "-m", gguf, "-r", str(runs), "-o", "json"] + extra
    if threads:
        cmd += ["-t", str(threads)]
    code, out, err, rss = run_measured(cmd)
    if code != 0:
        sys.exit(f"llama-bench failed (exit {code}): {' '.join(cmd)}\n{err[-2000:]}")
    tests = json.loads(out)
    if len(tests) != 1:
        sys.exit(f"expected one llama-bench test, got {len(tests)}: {' '.join(cmd)}")
    return tests[0], rss, cmd


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf")
    parser.add_argument("--bin", default=os.environ.get("LLAMA_CPP_BIN", DEFAULT_BIN), help="folder with llama-bench")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--only", choices=["prefill", "decode"], help="run one of the two tests (the other reports null)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default prints a summary)")
    args = parser.parse_args()
    if args.prompt_len < 1 or args.gen_len < 1 or args.runs < 1:
        parser.error("--prompt-len, --gen-len and --runs must be at least 1")
    binary = os.path.join(args.bin, "llama-bench")
    if not os.access(binary, os.X_OK):
        sys.exit(f"no llama-bench at {binary}: run bench/peers/build_llama_cpp.sh first (or pass --bin)")

    skipped = ({}, 0, None)
    pp, pp_rss, pp_cmd = skipped if args.only == "decode" else llama_bench(
        binary, args.gguf, args.threads, args.runs, ["-p", str(args.prompt_len), "-n", "0"]
    )
    tg, tg_rss, tg_cmd = skipped if args.only == "prefill" else llama_bench(
        binary, args.gguf, args.threads, args.runs, ["-p", "0", "-n", str(args.gen_len), "-d", str(args.prompt_len)]
    )
    first = pp or tg
    measured = lambda test, key: stats(test[key]) if test else None  # noqa: E731
    report = {
        "system": "llama.cpp",
        "versions": {
            "llama.cpp": f"(build {first.get('build_number')}, commit {first.get('build_commit')}: "
            "the copy vendored in llama-cpp-python 0.3.36)",
        },
        "model": os.path.abspath(args.gguf),
        "model_type": first.get("model_type"),
        "threads": first.get("n_threads"),
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "runs": args.runs,
        "prefill_tok_s": measured(pp, "samples_ts"),
        "decode_tok_s": measured(tg, "samples_ts"),
        "ttft_ms": stats([ns / 1e6 for ns in pp["samples_ns"]]) if pp else None,
        "peak_rss_bytes": max(pp_rss, tg_rss),
        "peak_rss_bytes_prefill": pp_rss,
        "peak_rss_bytes_decode": tg_rss,
        "settings": {
            k: first.get(k)
            for k in ("n_batch", "n_ubatch", "flash_attn", "load_mode", "repack", "poll", "type_k", "type_v",
                      "model_size", "cpu_info")
        },
        "commands": [" ".join(c) for c in (pp_cmd, tg_cmd) if c],
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['model']} ({report['versions']['llama.cpp']})")
        print(f"prompt {args.prompt_len} tokens, {args.gen_len} generated, {args.runs} runs")
        for name, key, unit in (("prefill", "prefill_tok_s", "tok/s"), ("decode", "decode_tok_s", "tok/s"), ("prompt", "ttft_ms", "ms")):
            s = report[key]
            if s is None:
                continue
            print(f"{name:<8} median {s['median']:>8.1f} {unit}   mean {s['mean']:>8.1f} ± {s['std']:.1f}")
        print(f"peak RSS {report['peak_rss_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
