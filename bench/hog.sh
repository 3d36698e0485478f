#!/usr/bin/env bash
# Runs a command beside N busy-loop processes, as on a shared machine (a CI runner, a
# container under a CPU quota, a busy laptop):
#
#   bench/hog.sh N COMMAND [ARGS...]
#   bench/hog.sh 1 target/release/oxgen bench --gen-len 64 --threads 2
#
# The busy loops are plain shell processes at the same priority as the command; they stop
# when it ends. docs/PERFORMANCE.md ("Shared machines") has the figures.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: bench/hog.sh N COMMAND [ARGS...]" >&2
  exit 2
fi
hogs="$1"
shift
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "$hogs"); do
  (while :; do :; done) &
  pids+=($!)
done
"$@"
