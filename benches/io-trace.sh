#!/usr/bin/env bash
# The disk and the scheduler under a durable load: how long the journal's
# and the checkpoint's fsyncs take while requests run, whether the slow ones
# coincide, and why the server's core is idle when it is.
#
#   benches/io-trace.sh [--seconds N] [--out DIR] [SCENARIO]
#
# The scenario defaults to durable-next-action. A fresh release server runs
# on CPU 0 (fresh data directory, nice -10) and the load generator drives
# it in closed loop from CPU 1 (128 streams over 4 connections, as in
# run.sh); after 2 s of warm-up, `perf record` takes, for N seconds
# (default 3; the generator runs on past them), the `fdatasync`/`fsync`
# entries and exits of every thread, their wakeups, and the context
# switches of CPU 0 (kernel tracepoints: the syscalls are not slowed the
# way strace slows them). benches/io_trace.py then prints:
#   - each thread's fsyncs: how many, and their latency from entry to
#     return (p50, p90, p99, max), split into the disk's part (entry to the
#     thread's wakeup) and the wait for the CPU after it (wakeup to return:
#     on a busy core the woken thread waits its turn);
#   - how many of the journal's slow fsyncs (over 4x its median) overlap
#     one of the checkpoint's;
#   - CPU 0's idle time, split by what the server was in at the time: a
#     journal fsync, a checkpoint fsync, both, or neither (waiting for the
#     network, the generator, or the commit window);
#   - each server thread's voluntary and involuntary context switches a
#     request, over the same window (from /proc).
# The perf data and the generator's JSON are kept in DIR (default
# target/bench-results/io-trace-DATE).
#
# Needs perf (Debian: linux-perf), root or kernel.perf_event_paranoid <= 1
# with tracefs readable, and python3.
set -euo pipefail

SECONDS_WINDOW=3
# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
bench_options 31 "$@"
SCENARIO=${SCENARIOS[0]:-durable-next-action}
command -v perf >/dev/null || { echo "io-trace.sh: perf is needed (apt-get install linux-perf)" >&2; exit 1; }

bench_setup io-trace
PORT=${IO_TRACE_PORT:-21390}
WARMUP=2
NICE=(nice -n -10)
[ "$(id -u)" -eq 0 ] || NICE=()

bench_serve "$WORK/server.log" "$PORT" "$WORK/data" "${NICE[@]}"
switches() {
  for t in /proc/"$PID"/task/*; do
    echo "$(cat "$t"/comm) $(awk '/^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {n = $2} END {print v, n}' "$t"/status)"
  done | awk '{v[$1] += $2; n[$1] += $3} END {for (k in v) print k, v[k], n[k]}' | sort
}
"${NICE[@]}" "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario "$SCENARIO" \
  --connections 4 --concurrency 128 --warmup "${WARMUP}s" --duration "$((SECONDS_WINDOW + 4))s" \
  --server-pid "$PID" --label "io-trace/$SCENARIO" >"$OUT/loadgen.json" &
GEN=$!
sleep "$((WARMUP + 1))"
switches >"$WORK/switches.before"
started=$(date +%s.%N)
# Wakeups are recorded on the CPU that issues them (a disk interrupt may
# land on either), so they take a second, system-wide perf, filtered on
# wakeups of CPU 0's threads. Both run on CPU 1, beside the generator: on
# CPU 0 they took turns of milliseconds from the server.
"${PIN1[@]}" perf record -q -o "$OUT/wakeups.perf" -a -e sched:sched_wakeup --filter 'target_cpu == 0' \
  -- sleep "$SECONDS_WINDOW" 2>/dev/null &
WAKEUPS=$!
"${PIN1[@]}" perf record -q -o "$OUT/trace.perf" \
  -e syscalls:sys_enter_fdatasync -e syscalls:sys_exit_fdatasync \
  -e syscalls:sys_enter_fsync -e syscalls:sys_exit_fsync \
  -e sched:sched_switch -C 0 -- sleep "$SECONDS_WINDOW" 2>/dev/null
wait "$WAKEUPS"
ended=$(date +%s.%N)
switches >"$WORK/switches.after"
wait "$GEN"
kill -TERM "$PID"
wait "$PID" || true
PID=""
{
  perf script -i "$OUT/trace.perf" -F comm,tid,time,event,trace 2>/dev/null
  perf script -i "$OUT/wakeups.perf" -F comm,tid,time,event,trace 2>/dev/null
} >"$OUT/trace.txt"
python3 "$(dirname "$0")/io_trace.py" "$OUT/trace.txt" "$OUT/loadgen.json" \
  "$WORK/switches.before" "$WORK/switches.after" "$started" "$ended"
echo "trace and generator output in $OUT" >&2
