"""oxgen and llama.cpp on the same weights beside N busy-loop processes (bench/hog.sh), in the
same run, interleaved: decode tok/s at 0, 1 and 2 busy processes for oxgen at 2 threads, at
its default thread count and at 1 thread, and llama.cpp (llama-bench) at 2 threads. Medians
of the rounds, and each as a share of its own quiet figure.

  python3 bench/hog_compare.py [--rounds 3] [--model PACKAGE] [--gguf FILE]

Defaults: the default model (OXGEN_DEFAULT_MODEL) and the GGUF it is imported from
(OXGEN_DEFAULT_GGUF), as scripts/test.sh sets them; target/release/oxgen and llama.cpp built
by bench/peers/build_llama_cpp.sh.
"""

import argparse
import json
import os
import statistics
import subprocess

SYSTEMS = {
    "oxgen, 2 threads": lambda a: ["target/release/oxgen", "bench", a.model, "--threads", "2"],
    "oxgen, default threads": lambda a: ["target/release/oxgen", "bench", a.model],
    "oxgen, 1 thread": lambda a: ["target/release/oxgen", "bench", a.model, "--threads", "1"],
    "llama.cpp, 2 threads": lambda a: ["python3", "bench/peers/llama_bench.py", a.gguf,
                                       "--threads", "2", "--only", "decode"],
}


def decode(cmd, hogs):
    cmd = ["bench/hog.sh", str(hogs)] + cmd + ["--prompt-len", "128", "--gen-len", "64",
                                               "--runs", "1", "--json"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True).stdout
    return json.loads(out[out.index("{"):])["decode_tok_s"]["median"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=os.environ.get("OXGEN_DEFAULT_MODEL"))
    ap.add_argument("--gguf", default=os.environ.get("OXGEN_DEFAULT_GGUF"))
    args = ap.parse_args()
    results = {}
    for _ in range(args.rounds):
        for hogs in (0, 1, 2):
            for name, cmd in SYSTEMS.items():
                results.setdefault((name, hogs), []).append(decode(cmd(args), hogs))
    print(f"decode tok/s, medians of {args.rounds} rounds (share of the same system's quiet figure)")
    print("| system | quiet | 1 busy process | 2 busy processes |")
    print("|---|---|---|---|")
    for name in SYSTEMS:
        med = [statistics.median(results[(name, h)]) for h in (0, 1, 2)]
        cells = [f"{med[0]:.1f}"] + [f"{m:.1f} ({m / med[0]:.0%})" for m in med[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
