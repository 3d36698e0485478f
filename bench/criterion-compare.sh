#!/usr/bin/env bash
# Runs the criterion microbenches of two revisions in one job and prints, per scenario, the base
# time, the head time and the change, flagged when the head is ≥ 15% or ≥ 30% slower (or
# faster).
#
#   bench/criterion-compare.sh BASE [HEAD] [--filter REGEX] [--benches LIST]
#
# BASE and HEAD are git revisions (HEAD defaults to HEAD). Each is checked out in its own
# worktree under .cache/criterion-compare/ and built with its own target folder there (kept, so
# a second comparison rebuilds only what changed); then every bench of BASE runs, then every
# bench of HEAD, back to back on the same machine. --filter is criterion's (a regex over bench
# names, e.g. 'q4_gemv|gqa/decode'); --benches picks bench targets as CRATE:BENCH, comma-
# separated (default: all of them below). A bench target missing from one revision is skipped
# there and its scenarios show as new or gone.
#
# Run it on a quiet machine: with 2 threads on 2 busy cores the 2-thread scenarios collapse.
set -euo pipefail

ALL_BENCHES="oxgen-kernels:matmul_nbits,oxgen-kernels:layers,oxgen-kernels:baseline,oxgen-generate:generate,oxgen-runtime:kv_cache"
# The machine's noise, measured once with BASE = HEAD (docs/PERFORMANCE.md has the run).
NOISE="on 2026-11-30 at 4a986f7, 119 scenarios: median |change| 2.2%, 90th percentile 8.8%
(1 thread 7.1%, 2 threads 10.4%), largest 21.0%; 3 of 119 flagged ≥ 15% slower (f32 and bf16
reference matmuls, base and head of one commit), none ≥ 30%."

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-2}"
}

base="" head="HEAD" filter="" benches="$ALL_BENCHES"
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        --filter) filter="${2:?--filter needs a regex}"; shift 2 ;;
        --benches) benches="${2:?--benches needs CRATE:BENCH,...}"; shift 2 ;;
        -h|--help) usage 0 ;;
        -*) echo "criterion-compare: unknown option $1" >&2; usage ;;
        *) positional+=("$1"); shift ;;
    esac
done
[ ${#positional[@]} -ge 1 ] && [ ${#positional[@]} -le 2 ] || usage
base="${positional[0]}"
[ ${#positional[@]} -eq 2 ] && head="${positional[1]}"

repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
work="${OXGEN_CRITERION_COMPARE_DIR:-$repo/.cache/criterion-compare}"
mkdir -p "$work"

# One worktree per side, at the revision's commit (detached).
checkout() {
    local side="$1" rev="$2" commit
    commit="$(git -C "$repo" rev-parse --verify "$rev^{commit}")" || {
        echo "criterion-compare: $rev is not a revision of $repo" >&2
        exit 1
    }
    local dir="$work/$side"
    if [ -d "$dir" ]; then
        git -C "$dir" checkout -q --detach "$commit"
    else
        git -C "$repo" worktree add -q --detach "$dir" "$commit"
    fi
    echo "$commit"
}

# Runs each bench target present in the worktree `side`; criterion writes its estimates under
# that side's target folder.
run_side() {
    local side="$1" dir="$work/$1" target="$work/target-$1"
    rm -rf "$target/criterion"
    local IFS=,
    for b in $benches; do
        local krate="${b%%:*}" name="${b#*:}"
        local file
        # (A revision without the bench finds no file: not an error, it is skipped below.)
        file="$(cd "$dir" && for f in crates/*/benches/"$name".rs; do
            [ -f "$f" ] && grep -q "^name = \"$krate\"" "${f%/benches/*}/Cargo.toml" && echo "$f"
        done || true)"
        if [ -z "$file" ]; then
            echo "[$side] $krate has no bench $name at this revision: skipped" >&2
            continue
        fi
        echo "[$side] cargo bench -p $krate --bench $name ${filter:+-- '$filter'}" >&2
        (cd "$dir" && CARGO_TARGET_DIR="$target" cargo bench -q -p "$krate" --bench "$name" \
            -- ${filter:+"$filter"} >"$work/$side-$name.log" 2>&1) || {
            echo "criterion-compare: the $side bench $krate:$name failed; its output:" >&2
            tail -30 "$work/$side-$name.log" >&2
            exit 1
        }
    done
}

base_commit="$(checkout base "$base")"
head_commit="$(checkout head "$head")"
echo "base $base = ${base_commit:0:10}, head $head = ${head_commit:0:10}" >&2
for side in base head; do
    echo "[$side] building the benches" >&2
    (cd "$work/$side" && CARGO_TARGET_DIR="$work/target-$side" cargo bench -q --no-run \
        -p oxgen-kernels -p oxgen-generate -p oxgen-runtime 2>&1 | tail -3) >&2
done
run_side base
run_side head

python3 - "$work/target-base/criterion" "$work/target-head/criterion" \
    "$base ${base_commit:0:10}" "$head ${head_commit:0:10}" <<'EOF'
import json, os, sys
from collections import defaultdict

def estimates(root):
    """full_id → median ns, from criterion's benchmark.json / estimates.json pairs."""
    out = {}
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "benchmark.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            full_id = json.load(f)["full_id"]
        with open(os.path.join(dirpath, "estimates.json")) as f:
            out[full_id] = json.load(f)["median"]["point_estimate"]
    return out

def fmt(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"

base, head = estimates(sys.argv[1]), estimates(sys.argv[2])
print(f"# criterion: base {sys.argv[3]} → head {sys.argv[4]} (medians)\n")
scenarios = defaultdict(list)
for full_id in sorted(set(base) | set(head)):
    scenarios[full_id.split("/")[0]].append(full_id)
counts = defaultdict(int)
for scenario, ids in scenarios.items():
    print(f"## {scenario}\n")
    print("| bench | base | head | change | |")
    print("|---|---:|---:|---:|---|")
    for full_id in ids:
        b, h = base.get(full_id), head.get(full_id)
        if b is None or h is None:
            flag = "new" if b is None else "gone"
            counts[flag] += 1
            print(f"| {full_id} | {fmt(b) if b else '—'} | {fmt(h) if h else '—'} | | {flag} |")
            continue
        change = (h - b) / b * 100
        flag = ""
        if change >= 30: flag = "**≥ 30% slower**"
        elif change >= 15: flag = "≥ 15% slower"
        elif change <= -30: flag = "≥ 30% faster"
        elif change <= -15: flag = "≥ 15% faster"
        counts[flag or "within 15%"] += 1
        print(f"| {full_id} | {fmt(b)} | {fmt(h)} | {change:+.1f}% | {flag} |")
    print()
print("Summary: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
EOF
cat <<EOF

What this cannot catch: end-to-end decode and prefill speed (the executor, the graph passes,
threading across a whole forward: use \`oxgen bench\` and bench/peers/compare.py), and changes
smaller than the machine's noise. Noise measured with base = head (the same commit on both
sides, every scenario, a 2-core Xeon slice, quiet) $NOISE
Single-threaded scenarios vary less than 2-thread ones; treat a lone flag near 15% as noise
until a rerun repeats it.
EOF
