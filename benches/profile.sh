#!/usr/bin/env bash
# Instruction profiles of the server, one per scenario, with callgrind.
#
#   benches/profile.sh [--seconds N] [--out DIR] [SCENARIO...]
#
# Scenarios default to: health retry-delay pure-next-action durable-next-action.
# For each, the release server runs under `valgrind --tool=callgrind` (CPU 0),
# the load generator drives it in closed loop (CPU 1, 32 streams over 4
# connections); the counters are zeroed when the warm-up ends and dumped
# when the window ends, so the dump and the generator's request count cover
# the same window. benches/callgrind_summary.py then prints instructions per
# request, by crate and for the functions that matter. As in run.sh, the
# retry bucket is too large to defer: the profile is of decisions, with the
# cost of taking a token included.
#
# Instructions, not time: the counts do not depend on what else the machine
# runs, which makes them the figures to trust on a shared 2-core box. They
# leave out the kernel (syscalls, loopback TCP, fsync) and cache effects;
# `perf record -e cpu-clock` (see BENCHMARKS.md) covers those.
set -euo pipefail

SECONDS_WINDOW=8
WARMUP=4
OUT=""
SCENARIOS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_WINDOW=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) SCENARIOS+=("$1") ;;
  esac
  shift
done
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(health retry-delay pure-next-action durable-next-action)
command -v valgrind >/dev/null || { echo "profile.sh: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$ROOT/target/bench-results/profile-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/retry-budget-profile.XXXXXX")
PID=""
cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -TERM "$PID"; wait "$PID" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

PIN0=(); PIN1=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN0=(taskset -c 0); PIN1=(taskset -c 1); fi

(cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release --bins --quiet)
SERVER="$TARGET_DIR/release/retry-budget"
LOADGEN="$TARGET_DIR/release/retry-budget-loadgen"
PORT=${PROFILE_PORT:-21270}

for s in "${SCENARIOS[@]}"; do
  PORT=$((PORT + 1))
  echo "profiling $s (port $PORT, ${WARMUP}s warm-up, ${SECONDS_WINDOW}s window)" >&2
  "${PIN0[@]}" valgrind --tool=callgrind --callgrind-out-file="$WORK/$s.%p" \
    "$SERVER" --listen "127.0.0.1:$PORT" --data-dir "$WORK/data-$s" --drain-delay 0s \
    --retry-rate 1000000 --retry-burst 1000000 2>"$OUT/$s.server.log" &
  PID=$!
  for _ in $(seq 1 300); do
    grep -q 'serving' "$OUT/$s.server.log" && break
    sleep 0.1
  done
  (
    sleep "$WARMUP"
    callgrind_control -z "$PID" >/dev/null
    sleep "$SECONDS_WINDOW"
    callgrind_control -d "$PID" >/dev/null
  ) &
  CONTROL=$!
  "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario "$s" \
    --connections 4 --concurrency 32 --warmup "${WARMUP}s" --duration "${SECONDS_WINDOW}s" \
    --server-pid "$PID" --label "profile/$s" >"$OUT/$s.json"
  wait "$CONTROL"
  kill -TERM "$PID"
  wait "$PID" || true
  PID=""
  dump=$(ls "$WORK/$s".*.1 2>/dev/null | head -1)
  [ -n "$dump" ] || { echo "profile.sh: no callgrind dump for $s" >&2; exit 1; }
  mv "$dump" "$OUT/$s.callgrind"
done

python3 "$ROOT/benches/callgrind_summary.py" "$OUT" | tee "$OUT/summary.txt"
echo "callgrind dumps, loadgen reports and summary in $OUT" >&2
