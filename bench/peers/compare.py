#!/usr/bin/env python3
"""oxgen against llama.cpp and onnxruntime-genai on the same model, as one Markdown table.

Protocol (oxgen bench's): a --prompt-len token prompt, then --gen-len greedy tokens with
end-of-sequence ignored, from an empty KV cache. Every measurement is a fresh process that loads
the model, runs one unmeasured warm-up and one measured generation; rounds are interleaved
(round 1 of every system at every thread count, then round 2, ...) so machine noise spreads over
all systems alike; the table shows medians over the rounds. See bench/README.md.

Systems (--systems, comma-separated):
  oxgen           `oxgen bench` on the package oxgen imported from the GGUF (Q4_1 blocks as
                  MatMulNBits with float zero points, accuracy_level 4)
  llama.cpp       llama-bench on the GGUF itself (bench/peers/llama_bench.py)
  ort-genai       onnxruntime-genai on oxgen's package (bench/peers/ort_genai_bench.py); its
                  MatMulNBits fall back to dequantize + f32 GEMM on float zero points
  ort-genai-int4  onnxruntime-genai on a copy re-quantized to uint8 zero points
                  (bench/peers/make_ort_int4.py), which takes onnxruntime's int4 kernels
  oxgen-int4      `oxgen bench` on that copy (the like-for-like row for ort-genai-int4)
  ort-genai-builder  onnxruntime-genai on the package its own model builder makes from the same
                  GGUF (bench/peers/make_builder_int4.sh: int4, symmetric, 4-bit lm_head)
  oxgen-builder   `oxgen bench` on that package (the like-for-like row for ort-genai-builder)
Each peer's ratio column divides the oxgen row with the same weights by the peer's number.

Also times `oxgen generate MODEL "Hello" --max-new-tokens 1 --json` from process start to exit
(start-to-first-token with the model already imported), per thread count.

Prepares what is missing first: llama.cpp (bench/peers/build_llama_cpp.sh) and the int4 copy
(under .cache/peers/models). oxgen itself must be built: cargo build --release -p oxgen-cli.

Usage: compare.py [--quick] [--threads 1,2] [--runs 5] [--prompt-len 128] [--gen-len 128]
                  [--systems ...] [--model PKG] [--gguf GGUF] [--oxgen BIN] [--json-out FILE]
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
PEERS = os.environ.get("OXGEN_PEERS", os.path.join(REPO, ".cache", "peers"))
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEMS = ["oxgen", "llama.cpp", "ort-genai", "ort-genai-int4", "oxgen-int4", "ort-genai-builder",
           "oxgen-builder"]
# The oxgen row each peer's ratio is taken against: the one with the same weights.
BASELINE = {"llama.cpp": "oxgen", "ort-genai": "oxgen", "ort-genai-int4": "oxgen-int4",
            "ort-genai-builder": "oxgen-builder"}
WEIGHTS = {
    "oxgen": "GGUF Q4_1 → ONNX (oxgen import; float zero points)",
    "llama.cpp": "GGUF Q4_1",
    "ort-genai": "GGUF Q4_1 → ONNX (oxgen import; float zero points)",
    "ort-genai-int4": "ONNX int4, uint8 zero points (re-quantized)",
    "oxgen-int4": "ONNX int4, uint8 zero points (re-quantized)",
    "ort-genai-builder": "ONNX int4, symmetric, 4-bit lm_head (onnxruntime-genai's builder)",
    "oxgen-builder": "ONNX int4, symmetric, 4-bit lm_head (onnxruntime-genai's builder)",
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cache_candidates():
    """oxgen's cache folders in its own order (crates/cli/src/pull.rs), then scripts/test.sh's."""
    if os.environ.get("OXGEN_CACHE"):
        yield os.environ["OXGEN_CACHE"]
    if os.environ.get("XDG_CACHE_HOME"):
        yield os.path.join(os.environ["XDG_CACHE_HOME"], "oxgen")
    if os.environ.get("HOME"):
        yield os.path.join(os.environ["HOME"], ".cache", "oxgen")
    yield os.path.join(REPO, ".cache", "oxgen")


def find_in_cache(*parts):
    for cache in cache_candidates():
        path = os.path.join(cache, *parts)
        if os.path.exists(path):
            return path
    return None


def run_json(cmd, env=None):
    """Runs cmd, returns the JSON object on its last stdout line; exits on failure."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed (exit {proc.returncode}): {shlex.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def oxgen_env():
    # oxgen reads its options from OXGEN_* variables too: keep the caller's from leaking in
    # (the cache folder aside).
    return {k: v for k, v in os.environ.items() if not k.startswith("OXGEN_") or k == "OXGEN_CACHE"}


def version(cmd):
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout.strip()
    except OSError as e:
        return f"unavailable ({e})"


def cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg():
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def fmt(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke test: prompt 16, gen 8, one round")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--runs", type=int, default=5, help="interleaved rounds (medians over them)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--no-ttft", action="store_true", help="skip the `oxgen generate` start-to-exit timing")
    parser.add_argument("--model", help=f"oxgen's package of the model (default: the cache's {DEFAULT_MODEL})")
    parser.add_argument("--gguf", help=f"the GGUF it was imported from (default: the cache's {DEFAULT_GGUF})")
    parser.add_argument("--oxgen", default=os.path.join(REPO, "target", "release", "oxgen"))
    parser.add_argument("--python", help="a Python with onnxruntime-genai (default: .cache/venv's, else this one)")
    parser.add_argument("--json-out", help="also write every measurement here")
    args = parser.parse_args()
    if args.quick:
        args.prompt_len, args.gen_len, args.runs = 16, 8, 1
    threads = [int(t) for t in args.threads.split(",") if t]
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"unknown system {s!r} (known: {', '.join(SYSTEMS)})")

    model = args.model or find_in_cache("models", DEFAULT_MODEL)
    gguf = args.gguf or find_in_cache("downloads", DEFAULT_GGUF)
    if not model or not os.path.isdir(model):
        sys.exit("no model package: run `oxgen pull` (or pass --model)")
    if "llama.cpp" in systems and (not gguf or not os.path.isfile(gguf)):
        sys.exit("no GGUF: run `oxgen pull`, which keeps it under downloads/ in oxgen's cache (or pass --gguf)")
    if not os.access(args.oxgen, os.X_OK):
        sys.exit(f"no oxgen binary at {args.oxgen}: cargo build --release -p oxgen-cli (or pass --oxgen)")
    venv_python = os.path.join(REPO, ".cache", "venv", "bin", "python")
    python = args.python or (venv_python if os.access(venv_python, os.X_OK) else sys.executable)

    # Prepare the peers.
    llama_bin = os.environ.get("LLAMA_CPP_BIN", os.path.join(PEERS, "llama.cpp", "build", "bin"))
    if "llama.cpp" in systems and not os.access(os.path.join(llama_bin, "llama-bench"), os.X_OK):
        log("building llama.cpp (bench/peers/build_llama_cpp.sh)")
        subprocess.run([os.path.join(HERE, "build_llama_cpp.sh")], check=True)
    int4 = os.path.join(PEERS, "models", os.path.basename(os.path.normpath(model)) + "-ort-int4")
    if {"ort-genai-int4", "oxgen-int4"} & set(systems):
        subprocess.run([python, os.path.join(HERE, "make_ort_int4.py"), model, int4], check=True)

    common = ["--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len), "--runs", "1"]

    builder = os.path.join(PEERS, "models", os.path.basename(os.path.normpath(model)) + "-ort-builder-int4")
    if {"ort-genai-builder", "oxgen-builder"} & set(systems) and not os.path.isfile(os.path.join(builder, "model.onnx")):
        log("making onnxruntime-genai's own int4 package (bench/peers/make_builder_int4.sh)")
        subprocess.run([os.path.join(HERE, "make_builder_int4.sh")], check=True,
                       env={**os.environ, "GGUF": gguf or "", "OXGEN_PEERS": PEERS})
    packages = {"oxgen": model, "ort-genai": model, "oxgen-int4": int4, "ort-genai-int4": int4,
                "oxgen-builder": builder, "ort-genai-builder": builder}

    def command(system, t):
        pkg = packages.get(system)
        if system.startswith("oxgen"):
            return [args.oxgen, "bench", pkg, *common, "--warmup", "1", "--threads", str(t), "--json"]
        if system == "llama.cpp":
            return [python, os.path.join(HERE, "llama_bench.py"), gguf, *common, "--threads", str(t),
                    "--bin", llama_bin, "--json"]
        return [python, os.path.join(HERE, "ort_genai_bench.py"), pkg, *common, "--warmup", "1",
                "--threads", str(t), "--json"]

    ttft_cmd = lambda t: [args.oxgen, "generate", model, "Hello", "--max-new-tokens", "1", "--threads", str(t), "--json"]  # noqa: E731

    results = {(s, t): [] for s in systems for t in threads}
    ttft = {t: [] for t in threads}
    started = time.time()
    load_before = loadavg()
    for r in range(args.runs):
        for t in threads:
            for s in systems:
                log(f"round {r + 1}/{args.runs}, {t} thread(s): {s}")
                results[(s, t)].append(run_json(command(s, t), env=oxgen_env() if s.startswith("oxgen") else None))
            if not args.no_ttft:
                t0 = time.perf_counter()
                out = run_json(ttft_cmd(t), env=oxgen_env())
                timings = out.get("timings", {})
                ttft[t].append({"wall_ms": (time.perf_counter() - t0) * 1e3, "load_ms": timings.get("load_ms"),
                                "ttft_ms": timings.get("ttft_ms")})

    # Versions.
    head = version(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    dirty = version(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"])
    oxgen_version = version([args.oxgen, "--version"]).removeprefix("oxgen ")
    versions = {"oxgen": f"{oxgen_version} (git {head}{', uncommitted changes' if dirty else ''})"}
    for s in systems:
        versions.update(results[(s, threads[0])][0].get("versions", {}))

    def med(s, t, key):
        runs = results[(s, t)]
        return statistics.median(r[key]["median"] for r in runs) if runs else None

    def rss(s, t):
        return max(r["peak_rss_bytes"] for r in results[(s, t)]) / 2**20

    out = []
    out.append(f"### oxgen vs peers: {os.path.basename(os.path.normpath(model))}")
    out.append("")
    out.append(
        f"Prompt {args.prompt_len} tokens, then {args.gen_len} generated (greedy, EOS ignored); each cell the median "
        f"of {args.runs} interleaved rounds, each a fresh process with 1 warm-up and 1 measured run. "
        f"{cpu_name()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
        f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}, {time.time() - started:.0f} s; "
        f"1-minute load average {load_before} before, {loadavg()} after (a busy machine skews every row)."
    )
    out.append("")
    out.append("| system | weights | threads | prefill tok/s | decode tok/s | peak RSS MiB | oxgen ÷ peer prefill | oxgen ÷ peer decode |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for t in threads:
        for s in systems:
            base = BASELINE.get(s)
            ratio = lambda key: (  # noqa: E731
                fmt(med(base, t, key) / med(s, t, key), 2) if base in systems and med(s, t, key) else "–"
            )
            out.append(
                f"| {s} | {WEIGHTS[s]} | {t} | {fmt(med(s, t, 'prefill_tok_s'))} | {fmt(med(s, t, 'decode_tok_s'))} "
                f"| {fmt(rss(s, t))} | {ratio('prefill_tok_s') if base else ''} | {ratio('decode_tok_s') if base else ''} |"
            )
    if not args.no_ttft:
        out.append("")
        out.append(
            "`oxgen generate` from process start to exit, one new token after the chat-templated prompt "
            f"(`{shlex.join(ttft_cmd('N'))}`), medians over the rounds:"
        )
        out.append("")
        out.append("| threads | process wall ms (median) | of which load ms | TTFT ms |")
        out.append("|---:|---:|---:|---:|")
        for t in threads:
            m = lambda key: statistics.median(x[key] for x in ttft[t] if x[key] is not None)  # noqa: E731
            out.append(f"| {t} | {fmt(m('wall_ms'))} | {fmt(m('load_ms'))} | {fmt(m('ttft_ms'))} |")
    out.append("")
    out.append("Versions: " + "; ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    out.append("")
    out.append("Commands (one round, threads N):")
    out.append("")
    out.append("```")
    out.append(shlex.join([sys.executable, os.path.abspath(__file__), *sys.argv[1:]]))
    for s in systems:
        out.append(shlex.join(command(s, "N")))
    if "llama.cpp" in systems:
        out.extend(f"#   llama_bench.py runs: {c}" for c in results[("llama.cpp", threads[0])][0].get("commands", []))
    if not args.no_ttft:
        out.append(shlex.join(ttft_cmd("N")))
    out.append("```")
    print("\n".join(out))

    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "prompt_len": args.prompt_len,
                    "gen_len": args.gen_len,
                    "runs": args.runs,
                    "versions": versions,
                    "results": [{"system": s, "threads": t, "runs": results[(s, t)]} for (s, t) in results],
                    "oxgen_generate": {str(t): v for t, v in ttft.items()},
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
