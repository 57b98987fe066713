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
# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
bench_options 19 "$@"
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(health retry-delay pure-next-action durable-next-action)
command -v valgrind >/dev/null || { echo "profile.sh: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

bench_setup profile
PORT=${PROFILE_PORT:-21270}

for s in "${SCENARIOS[@]}"; do
  PORT=$((PORT + 1))
  echo "profiling $s (port $PORT, ${WARMUP}s warm-up, ${SECONDS_WINDOW}s window)" >&2
  bench_serve "$OUT/$s.server.log" "$PORT" "$WORK/data-$s" \
    valgrind --tool=callgrind --callgrind-out-file="$WORK/$s.%p"
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
