"""The weight budget's expert cache, measured: decode speed, hit rate, bytes read and page
faults on a mixture-of-experts package at budgets of 100%, 50%, 25% and 0% of its expert
bytes, under each policy (`--expert-cache lru|frequency`), warm (the file in the page cache)
or cold (`--cold`: every file of the package dropped from the page cache with
`posix_fadvise(POSIX_FADV_DONTNEED)` before each run, so first reads come from the disk).

Each round runs every (budget, policy) once, interleaved; the table gives medians over the
rounds. The expert bytes come from an unbounded run's peak.

  python3 bench/expert_cache.py PACKAGE [--rounds 3] [--cold] [--threads 2]
      [--prompt-len 128] [--gen-len 64] [--oxgen target/release/oxgen]
"""

import argparse
import json
import os
import statistics
import subprocess


def drop_page_cache(package):
    for name in os.listdir(package):
        path = os.path.join(package, name)
        if os.path.isfile(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bench(args, budget_mib, policy):
    if args.cold:
        drop_page_cache(args.package)
    cmd = [args.oxgen, "bench", args.package, "--threads", str(args.threads), "--prompt-len",
           str(args.prompt_len), "--gen-len", str(args.gen_len), "--runs", "1", "--warmup", "0",
           "--json", "--expert-cache", policy]
    if budget_mib is not None:
        cmd += ["--weight-budget", str(budget_mib)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True).stdout
    r = json.loads(out)
    moe = r["moe"] or {}
    return {
        "decode": r["decode_tok_s"]["median"],
        "hit_rate": moe.get("expert_hit_rate", 0.0),
        "read_mb": moe.get("expert_bytes_read", 0) / 1e6,
        "evictions": moe.get("expert_evictions", 0),
        "peak_mb": moe.get("expert_peak_bytes", 0) / 1e6,
        "major": (moe.get("page_faults") or {}).get("major", 0),
        "minor": (moe.get("page_faults") or {}).get("minor", 0),
        "rss_file_mib": (moe.get("rss_file_bytes") or 0) / 2**20,
        "peak_rss_mib": r.get("peak_rss_bytes", 0) / 2**20,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--oxgen", default="target/release/oxgen")
    args = ap.parse_args()
    full = bench(args, None, "lru")["peak_mb"] * 1e6 / 2**20
    budgets = [("none", None), ("100%", int(full) + 1), ("50%", int(full * 0.5)),
               ("25%", int(full * 0.25)), ("0%", 0)]
    cases = [(label, mib, policy) for label, mib in budgets
             for policy in (["lru"] if mib is None else ["lru", "frequency"])]
    results = {c: [] for c in cases}
    for _ in range(args.rounds):
        for c in cases:
            results[c].append(bench(args, c[1], c[2]))
    print(f"expert bytes {full:.0f} MiB; {'cold' if args.cold else 'warm'} page cache; "
          f"medians of {args.rounds} rounds")
    keys = ["decode", "hit_rate", "read_mb", "evictions", "peak_mb", "major", "minor",
            "rss_file_mib", "peak_rss_mib"]
    print("| budget | policy | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for (label, mib, policy), runs in results.items():
        med = [statistics.median(r[k] for r in runs) for k in keys]
        cells = [f"{v:.3f}" if k == "hit_rate" else f"{v:.1f}" for k, v in zip(keys, med)]
        budget = label if mib is None else f"{label} ({mib} MiB)"
        print(f"| {budget} | {policy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
