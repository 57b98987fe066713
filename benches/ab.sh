#!/usr/bin/env bash
# Quick A/B on one server: runs scenarios one after another against a single
# server process and prints, after each, the throughput, the server CPU per
# request, and the CPU each server thread has used so far (from
# /proc/PID/task/*/schedstat), so that the journal writer and the checkpoint
# thread can be told apart from the request worker. For quick experiments on
# one server; benches/run.sh is the full benchmark.
#
#   SCEN="pure-next-action durable-next-action" DUR=3 benches/ab.sh [server flags...]
#
# The server runs on CPU 0 and the generator on CPU 1, at nice -10 (root),
# on a fresh data directory; extra arguments go to the server (for example
# --commit-window 0s or --max-batch 1). Needs release binaries
# (cargo build --release --workspace --bins) and python3.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
S=$TARGET_DIR/release/retry-budget
L=$TARGET_DIR/release/retry-budget-loadgen
PORT=${BENCH_PORT:-21190}
PID=""
DATA=$(mktemp -d)
LOG=$DATA.log
trap '[ -n "$PID" ] && { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }; rm -rf "$DATA" "$LOG"' EXIT

nice -n -10 taskset -c 0 "$S" --listen "127.0.0.1:$PORT" --data-dir "$DATA" --drain-delay 0s \
  --retry-rate 1000000 --retry-burst 1000000 "$@" 2>"$LOG" &
PID=$!
sleep 1

threads() {
  for t in /proc/"$PID"/task/*; do
    echo "$(cat "$t"/comm) $(cut -d' ' -f1 "$t"/schedstat)"
  done | awk '{ns[$1] += $2} END {for (k in ns) printf "%s=%.0fms ", k, ns[k] / 1e6; print ""}'
}

for scenario in ${SCEN:-pure-next-action durable-next-action pure-next-action durable-next-action}; do
  nice -n -10 taskset -c 1 "$L" --target "http://127.0.0.1:$PORT" --connections 4 --concurrency 128 \
    --warmup 1s --duration "${DUR:-3}s" --server-pid "$PID" --scenario "$scenario" |
    python3 -c 'import json, sys
d = json.load(sys.stdin)
print("%-20s %8.0f req/s  %5.1f us/req  p99 %6d us" % (d["scenario"], d["throughput_rps"],
      d["server_cpu_us_per_request"], d["latency_us"]["p99"]))'
  echo "  thread CPU so far: $(threads)"
done
kill "$PID"
wait "$PID" 2>/dev/null || true
grep -o 'group commit totals.*' "$LOG" || true
