#!/usr/bin/env bash
# One measurement round of bench/README.md's summary table (issue 18): every benchmark behind a row,
# one after the other, each alone on the machine, at one commit. Each output goes to its own file
# in OUT (default: bench-round-<UTC time>/); the summary's "latest" column is read from them.
#
#   make bench-round                    # ~25 min on 2 cores
#   bash bench/round.sh /tmp/my-round   # the same, into a directory of your choice
#
# Run it on an otherwise idle machine: another tenant's load moves every rate (the ratios less).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-round-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
export PYTHONPATH=.

step() {
    local name=$1
    shift
    echo "[round $(date -u +%H:%M:%S)] $name: $* (load $(cut -d' ' -f1 /proc/loadavg)) -> $OUT/$name.txt"
    "$PY" "$@" >"$OUT/$name.txt" 2>&1 || { echo "[round] $name failed; see $OUT/$name.txt" >&2; exit 1; }
}

echo "[round] main at $(git rev-parse --short HEAD) ($(git status --porcelain | wc -l) uncommitted paths); outputs in $OUT/"
step delivery-40x5 bench/delivery.py --topologies single,split-1
step delivery-100x10 bench/delivery.py --topologies single --groups 100 --subscribers 10 --events 3000
step delivery-100x10-raw bench/delivery.py --topologies single --groups 100 --subscribers 10 --events 3000 --client raw --no-nats
step lifecycles-unary bench/work_lifecycle.py
step lifecycles-stream bench/work_lifecycle.py --publish stream
step lifecycles-stream-split-1 bench/work_lifecycle.py --publish stream --shards 1
for run in 1 2 3; do
    step "growth-$run" bench/work_lifecycle.py --publish stream --groups 1 --growth 10000 --max-seconds 240
done
step artifacts-1m bench/artifacts.py --sizes 1M --reps 100
step replay bench/replay.py --sizes 10000,100000,1000000 --groups "" --subscriptions ""
step console bench/console.py
step console-usage bench/console.py --runs 3 --live-kind usage
echo "[round $(date -u +%H:%M:%S)] done: $OUT/"
