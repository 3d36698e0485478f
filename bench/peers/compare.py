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
An oxgen system may name a KV cache element after a `+` (`oxgen-builder+int8`, `oxgen+f16`:
`oxgen bench --kv-dtype`); such a row's ratio columns divide it by the peer of its base row,
or by llama.cpp (named in the cell) when that peer is not in the run.

Also times `oxgen generate MODEL "Hello" --max-new-tokens 1 --json` from process start to exit
(start-to-first-token with the model already imported), per thread count.

Cases (--cases, comma-separated; default the one --prompt-len:--gen-len case):
  P:G     a P-token prompt, then G tokens: prefill tok/s at P and decode tok/s at depth P
  ppP     prefill of P tokens only (oxgen and onnxruntime-genai generate one token after it)
  tgG@D   G tokens decoded after a D-token prompt; decode tok/s only

Bigger-than-cache models (--big SHAPE, bench/peers/make_big.py's, made when missing): a random
checkpoint in a 1.5B or 3B shape as onnxruntime-genai's builder exports it (int4) and as
llama.cpp's converter and llama-quantize write it (Q4_0, Q4_K_M). Systems there:
  oxgen-builder, ort-genai-builder  the builder's int4 package
  oxgen           oxgen's import of the Q4_0 GGUF (same weights as the llama.cpp row)
  llama.cpp       the Q4_0 GGUF
  llama.cpp-Q4_K_M  the Q4_K_M GGUF (its ratio is against the oxgen Q4_0 row: similar size,
                  not the same weights)
With --big, each round also measures this machine's streaming read bandwidth at every thread
count (crates/kernels/examples/read_bandwidth.rs), and each row's decode is also given as a
fraction of the bandwidth bound: bandwidth ÷ (weight bytes read per step + KV bytes read at the
mean decode depth). oxgen counts its weight bytes; llama.cpp's are llama-bench's model size;
onnxruntime-genai's are taken as oxgen's on the same package; KV bytes are oxgen's per position
(f32), halved for llama.cpp's default f16 cache.

Prepares what is missing first: llama.cpp (bench/peers/build_llama_cpp.sh) and the int4 copy
(under .cache/peers/models). oxgen itself must be built: cargo build --release -p oxgen-cli.

Usage: compare.py [--quick] [--threads 1,2] [--runs 5] [--prompt-len 128] [--gen-len 128]
                  [--cases ...] [--big SHAPE] [--warmup 1] [--systems ...] [--model PKG]
                  [--gguf GGUF] [--oxgen BIN] [--json-out FILE]
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
           "oxgen-builder", "llama.cpp-Q4_K_M"]
# Every system but the one that needs --big's Q4_K_M file.
DEFAULT_SYSTEMS = [s for s in SYSTEMS if s != "llama.cpp-Q4_K_M"]
BIG_SYSTEMS = ["oxgen-builder", "ort-genai-builder", "oxgen", "llama.cpp", "llama.cpp-Q4_K_M"]
BIG_CASES = "tg64@128,pp512,2048:32"
# The oxgen row each peer's ratio is taken against: the one with the same weights.
BASELINE = {"llama.cpp": "oxgen", "ort-genai": "oxgen", "ort-genai-int4": "oxgen-int4",
            "ort-genai-builder": "oxgen-builder", "llama.cpp-Q4_K_M": "oxgen"}
WEIGHTS = {
    "oxgen": "GGUF Q4_1 → ONNX (oxgen import; float zero points)",
    "llama.cpp": "GGUF Q4_1",
    "ort-genai": "GGUF Q4_1 → ONNX (oxgen import; float zero points)",
    "ort-genai-int4": "ONNX int4, uint8 zero points (re-quantized)",
    "oxgen-int4": "ONNX int4, uint8 zero points (re-quantized)",
    "ort-genai-builder": "ONNX int4, symmetric, 4-bit lm_head (onnxruntime-genai's builder)",
    "oxgen-builder": "ONNX int4, symmetric, 4-bit lm_head (onnxruntime-genai's builder)",
    "llama.cpp-Q4_K_M": "GGUF Q4_K_M (llama-quantize)",
}
BIG_WEIGHTS = {
    "oxgen": "GGUF Q4_0 → ONNX (oxgen import; the Q6_K head as int8)",
    "llama.cpp": "GGUF Q4_0 (llama-quantize; Q6_K head)",
}


KV_DTYPES = ["f32", "f16", "bf16", "int8"]


def kv_split(system):
    """`oxgen-builder+int8` -> ("oxgen-builder", "int8"); a plain name -> (name, "")."""
    base, _, kv = system.partition("+")
    return base, kv


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


def parse_case(text):
    """`P:G`, `ppP` or `tgG@D` as {name, prompt, gen, prefill, decode}."""
    try:
        if text.startswith("pp"):
            return {"name": text, "prompt": int(text[2:]), "gen": 1, "prefill": True, "decode": False}
        if text.startswith("tg"):
            gen, depth = text[2:].split("@")
            return {"name": text, "prompt": int(depth), "gen": int(gen), "prefill": False, "decode": True}
        prompt, gen = text.split(":")
        return {"name": text, "prompt": int(prompt), "gen": int(gen), "prefill": True, "decode": True}
    except ValueError:
        sys.exit(f"bad case {text!r}: write P:G (prompt P, then G tokens), ppP (prefill only) or tgG@D "
                 "(G tokens decoded at depth D)")


def read_bandwidth(threads):
    """GB/s of a streaming read at this many threads (crates/kernels/examples/read_bandwidth.rs)."""
    binary = os.path.join(REPO, "target", "release", "examples", "read_bandwidth")
    if not os.access(binary, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "--locked", "-q", "-p", "oxgen-kernels", "--example",
                        "read_bandwidth"], cwd=REPO, check=True)
    return run_json([binary, str(threads)])["gb_s"]["median"]


def fmt(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke test: prompt 16, gen 8, one round")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--runs", type=int, help="interleaved rounds (medians over them; default 5, 3 with --big)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--cases", help=f"comma-separated P:G, ppP, tgG@D (default --prompt-len:--gen-len; "
                        f"with --big {BIG_CASES})")
    parser.add_argument("--big", choices=["qwen2.5-1.5b", "llama-3b"], help="bench/peers/make_big.py's model")
    parser.add_argument("--warmup", type=int, help="unmeasured generations per oxgen and onnxruntime-genai "
                        "process (default 1, 0 with --big: a long prompt would run twice)")
    parser.add_argument("--systems", help=f"default: {','.join(DEFAULT_SYSTEMS)}; with --big {','.join(BIG_SYSTEMS)}")
    parser.add_argument("--no-ttft", action="store_true", help="skip the `oxgen generate` start-to-exit timing")
    parser.add_argument("--model", help=f"oxgen's package of the model (default: the cache's {DEFAULT_MODEL})")
    parser.add_argument("--gguf", help=f"the GGUF it was imported from (default: the cache's {DEFAULT_GGUF})")
    parser.add_argument("--oxgen", default=os.path.join(REPO, "target", "release", "oxgen"))
    parser.add_argument("--python", help="a Python with onnxruntime-genai (default: .cache/venv's, else this one)")
    parser.add_argument("--json-out", help="also write every measurement here")
    args = parser.parse_args()
    big = args.big
    runs = args.runs or (3 if big else 5)
    warmup = args.warmup if args.warmup is not None else (0 if big else 1)
    cases_text = args.cases or (BIG_CASES if big else f"{args.prompt_len}:{args.gen_len}")
    if args.quick:
        cases_text, runs = "16:8", 1
    cases = [parse_case(c) for c in cases_text.split(",") if c]
    threads = [int(t) for t in args.threads.split(",") if t]
    systems = [s for s in (args.systems or ",".join(BIG_SYSTEMS if big else DEFAULT_SYSTEMS)).split(",") if s]
    for s in systems:
        base, kv = kv_split(s)
        if base not in SYSTEMS:
            parser.error(f"unknown system {s!r} (known: {', '.join(SYSTEMS)})")
        if kv and (not base.startswith("oxgen") or kv not in KV_DTYPES):
            parser.error(f"{s!r}: only an oxgen system takes a KV cache element, one of {', '.join(KV_DTYPES)}")
    bases = {kv_split(s)[0] for s in systems}
    if not os.access(args.oxgen, os.X_OK):
        sys.exit(f"no oxgen binary at {args.oxgen}: cargo build --release -p oxgen-cli (or pass --oxgen)")
    venv_python = os.path.join(REPO, ".cache", "venv", "bin", "python")
    python = args.python or (venv_python if os.access(venv_python, os.X_OK) else sys.executable)
    llama_bin = os.environ.get("LLAMA_CPP_BIN", os.path.join(PEERS, "llama.cpp", "build", "bin"))
    weights = dict(WEIGHTS)

    if big:
        folder = os.path.join(PEERS, "big", big)
        ggufs = {k: os.path.join(folder, f"{big}.{k}.gguf") for k in ("Q4_0", "Q4_K_M")}
        builder = os.path.join(folder, f"{big}-int4")
        if not os.path.isfile(os.path.join(builder, "model.onnx")) or not all(map(os.path.isfile, ggufs.values())):
            tp = os.path.join(REPO, ".cache", "tpvenv", "bin", "python")
            log(f"making the {big} model (bench/peers/make_big.py)")
            subprocess.run([tp if os.access(tp, os.X_OK) else sys.executable, os.path.join(HERE, "make_big.py"),
                            "--shape", big], check=True)
        model, gguf = os.path.join(folder, f"{big}.Q4_0-oxgen"), ggufs["Q4_0"]
        if "oxgen" in bases and not os.path.isfile(os.path.join(model, "model.onnx")):
            subprocess.run([args.oxgen, "import", gguf, model], check=True, env=oxgen_env())
        weights.update(BIG_WEIGHTS)
    else:
        model = args.model or find_in_cache("models", DEFAULT_MODEL)
        gguf = args.gguf or find_in_cache("downloads", DEFAULT_GGUF)
        ggufs = {"Q4_K_M": None}
        builder = os.path.join(PEERS, "models", os.path.basename(os.path.normpath(model or "")) + "-ort-builder-int4")
        if not model or not os.path.isdir(model):
            sys.exit("no model package: run `oxgen pull` (or pass --model)")
        if "llama.cpp-Q4_K_M" in bases:
            parser.error("llama.cpp-Q4_K_M runs only with --big")
    if "llama.cpp" in systems and (not gguf or not os.path.isfile(gguf)):
        sys.exit("no GGUF: run `oxgen pull`, which keeps it under downloads/ in oxgen's cache (or pass --gguf)")

    # Prepare the peers.
    if any(s.startswith("llama.cpp") for s in systems) and not os.access(os.path.join(llama_bin, "llama-bench"), os.X_OK):
        log("building llama.cpp (bench/peers/build_llama_cpp.sh)")
        subprocess.run([os.path.join(HERE, "build_llama_cpp.sh")], check=True)
    int4 = os.path.join(PEERS, "models", os.path.basename(os.path.normpath(model)) + "-ort-int4")
    if {"ort-genai-int4", "oxgen-int4"} & bases:
        subprocess.run([python, os.path.join(HERE, "make_ort_int4.py"), model, int4], check=True)
    if {"ort-genai-builder", "oxgen-builder"} & bases and not os.path.isfile(os.path.join(builder, "model.onnx")):
        log("making onnxruntime-genai's own int4 package (bench/peers/make_builder_int4.sh)")
        subprocess.run([os.path.join(HERE, "make_builder_int4.sh")], check=True,
                       env={**os.environ, "GGUF": gguf or "", "OXGEN_PEERS": PEERS})
    packages = {"oxgen": model, "ort-genai": model, "oxgen-int4": int4, "ort-genai-int4": int4,
                "oxgen-builder": builder, "ort-genai-builder": builder, "llama.cpp": gguf,
                "llama.cpp-Q4_K_M": ggufs["Q4_K_M"]}

    def command(system, case, t):
        system, kv = kv_split(system)
        pkg = packages.get(system)
        common = ["--prompt-len", str(case["prompt"]), "--gen-len", str(case["gen"]), "--runs", "1"]
        if system.startswith("oxgen"):
            kv_arg = ["--kv-dtype", kv] if kv else []
            return [args.oxgen, "bench", pkg, *common, *kv_arg, "--warmup", str(warmup), "--threads", str(t), "--json"]
        if system.startswith("llama.cpp"):
            only = [] if case["prefill"] and case["decode"] else ["--only", "prefill" if case["prefill"] else "decode"]
            return [python, os.path.join(HERE, "llama_bench.py"), pkg, *common, *only, "--threads", str(t),
                    "--bin", llama_bin, "--json"]
        return [python, os.path.join(HERE, "ort_genai_bench.py"), pkg, *common, "--warmup", str(warmup),
                "--threads", str(t), "--json"]

    ttft_cmd = lambda t: [args.oxgen, "generate", model, "Hello", "--max-new-tokens", "1", "--threads", str(t), "--json"]  # noqa: E731

    results = {(c["name"], s, t): [] for c in cases for s in systems for t in threads}
    ttft = {t: [] for t in threads}
    bandwidth = {t: [] for t in threads}
    started = time.time()
    load_before = loadavg()
    for r in range(runs):
        for t in threads:
            if big:
                bandwidth[t].append(read_bandwidth(t))
            for case in cases:
                for s in systems:
                    log(f"round {r + 1}/{runs}, {t} thread(s), {case['name']}: {s}")
                    env = oxgen_env() if s.startswith("oxgen") else None
                    results[(case["name"], s, t)].append(run_json(command(s, case, t), env=env))
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
        versions.update(results[(cases[0]["name"], s, threads[0])][0].get("versions", {}))

    def med(c, s, t, key):
        values = [r[key]["median"] for r in results.get((c, s, t), []) if r.get(key)]
        return statistics.median(values) if values else None

    def rss(c, s, t):
        return max(r["peak_rss_bytes"] for r in results[(c, s, t)]) / 2**20

    def bytes_per_step(case, s, t):
        """Weight bytes read per decode step plus KV bytes at the mean decode depth, or None."""
        oxgen_row = s if s.startswith("oxgen") else ("oxgen-builder" if s.startswith("ort-genai") else "oxgen")
        runs_ = results.get((case["name"], oxgen_row, t)) or results.get((case["name"], "oxgen-builder", t))
        if not runs_ or not runs_[0].get("weight_bytes_per_decode_step") or not runs_[0].get("kv_cache_bytes"):
            return None
        kv_per_position = runs_[0]["kv_cache_bytes"] / (case["prompt"] + case["gen"])
        weights_ = runs_[0]["weight_bytes_per_decode_step"]
        if s.startswith("llama.cpp"):
            weights_ = results[(case["name"], s, t)][0]["settings"]["model_size"]
            kv_per_position /= 2
        return weights_ + kv_per_position * (case["prompt"] + case["gen"] / 2)

    out = []
    title = f"{big} (random weights)" if big else os.path.basename(os.path.normpath(model))
    out.append(f"### oxgen vs peers: {title}")
    out.append("")
    out.append(
        f"Cases {', '.join(c['name'] for c in cases)} (P:G a P-token prompt then G tokens; ppP prefill only; tgG@D G "
        f"tokens after a D-token prompt; greedy, EOS ignored); each cell the median of {runs} interleaved rounds, "
        f"each a fresh process with {warmup} warm-up and 1 measured run (llama-bench: its own warm-up). "
        f"{cpu_name()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
        f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}, {time.time() - started:.0f} s; "
        f"1-minute load average {load_before} before, {loadavg()} after (a busy machine skews every row)."
    )
    if big:
        out.append("")
        out.append("Streaming read bandwidth, same run (median of the rounds): " + ", ".join(
            f"{t} thread(s) {statistics.median(bandwidth[t]):.1f} GB/s" for t in threads) + ".")
    out.append("")
    bound_head = " decode ÷ bound |" if big else ""
    out.append(f"| case | system | weights | threads | prefill tok/s | decode tok/s | peak RSS MiB | oxgen ÷ peer prefill "
               f"| oxgen ÷ peer decode |{bound_head}")
    out.append("|---|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if big else ""))
    for case in cases:
        c = case["name"]
        for t in threads:
            for s in systems:
                # The ratio's oxgen row, its peer, and a note when the weights may differ.
                mine, kv = kv_split(s)
                if kv:
                    # A KV variant of an oxgen row: over the peer of its base row, else llama.cpp.
                    same = [p for p, b in BASELINE.items() if b == mine]
                    peer = next((p for p in [*same, "llama.cpp"] if p in systems), None)
                    pair = peer and (s, peer, "" if peer in same else f" (÷ {peer})")
                else:
                    pair = BASELINE.get(s) and (BASELINE[s], s, "")

                def ratio(key):
                    num, den, note = pair
                    if num in systems and med(c, num, t, key) and med(c, den, t, key):
                        return fmt(med(c, num, t, key) / med(c, den, t, key), 2) + note
                    return "–"
                prefill = med(c, s, t, "prefill_tok_s") if case["prefill"] else None
                decode = med(c, s, t, "decode_tok_s") if case["decode"] else None
                row = (f"| {c} | {s} | {weights[mine]} | {t} | {fmt(prefill)} | {fmt(decode)} | {fmt(rss(c, s, t))} "
                       f"| {ratio('prefill_tok_s') if pair and case['prefill'] else ''} "
                       f"| {ratio('decode_tok_s') if pair and case['decode'] else ''} |")
                if big:
                    per_step = bytes_per_step(case, s, t) if case["decode"] else None
                    bound = statistics.median(bandwidth[t]) * 1e9 / per_step if per_step else None
                    row += f" {fmt(decode / bound, 2) if decode and bound else ''} |"
                out.append(row)
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
    out.append("Commands (one round, threads N, the first case):")
    out.append("")
    out.append("```")
    out.append(shlex.join([sys.executable, os.path.abspath(__file__), *sys.argv[1:]]))
    for s in systems:
        out.append(shlex.join(command(s, cases[0], "N")))
    for s in systems:
        if s.startswith("llama.cpp"):
            out.extend(f"#   llama_bench.py runs: {c}" for c in results[(cases[0]["name"], s, threads[0])][0].get("commands", []))
    if not args.no_ttft:
        out.append(shlex.join(ttft_cmd("N")))
    out.append("```")
    print("\n".join(out))

    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "cases": cases,
                    "runs": runs,
                    "versions": versions,
                    "read_bandwidth_gb_s": {str(t): v for t, v in bandwidth.items()},
                    "results": [{"case": c, "system": s, "threads": t, "runs": results[(c, s, t)]}
                                for (c, s, t) in results],
                    "oxgen_generate": {str(t): v for t, v in ttft.items()},
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
