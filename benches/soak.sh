#!/usr/bin/env bash
# Soak: the server under a steady mixed load for MINUTES (10) at half of its
# saturation: durable reports, deferrals and successes over TENANTS (1,000)
# tenants. Checks the RSS stays flat after warm-up, nothing fails, and p99
# holds steady.
#
#   benches/soak.sh [--minutes N] [--tenants N] [--attempts N] [--out DIR]
#
# 1. Saturation: a fresh release server (CPU 0, retry bucket too large to
#    defer) under the load generator's closed loop (CPU 1), `--scenario
#    mixed`, CONC (128) streams over CONN (4) connections, SAT_WARMUP (30 s)
#    of warm-up then SAT_SECONDS (60): its throughput of answered requests
#    is the saturation S. What the server can sustain, not what it takes in
#    a burst: the journal acknowledges saves faster than the checkpoints
#    write them into redb on some machines, and the difference waits in the
#    store's backlog (`store.backlog_bytes`, 24 MiB) until the backlog is
#    full and saves are refused (`store_backlogged`). The warm-up is long
#    enough to fill it, and the window long beside the backlog's swing
#    between refusing and taking saves again, so the window counts about
#    what checkpoints keep up with; a saturation run with refusals says so.
# 2. Soak: a second fresh server with `--retry-rate` RATE_SHARE (0.6) of
#    the open loop's request rate and as much burst, `--success-deposit 0.1`
#    and `--metrics-listen`, driven open loop at S / 2 requests a second for
#    MINUTES one-minute windows (one generator run each, back to back, so
#    each minute has its own exact p99). Each activity reports ATTEMPTS (3)
#    failures then its success, and retries the bucket defers wait out their
#    not_before: about a quarter of the requests are successes and some of
#    the reports are deferred.
# Every 10 s the server's VmRSS and VmHWM (/proc/PID/status) and its
# /metrics are saved into $OUT; `benches/summary.py soak` prints per minute
# the rate, p99, errors and RSS, the server's p99 each 10 s (from its
# histogram, so to a bucket's precision), the mix, and the verdict (RSS at
# the end within 10% of its value after the warm-up, the first 2 minutes;
# no error), and writes $OUT/summary.json. Exits 1 if the verdict fails.
set -euo pipefail

MINUTES=10
TENANTS=1000
ATTEMPTS=3
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift ;;
    --tenants) TENANTS=$2; shift ;;
    --attempts) ATTEMPTS=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h | --help) sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
CONC=${CONC:-128}
CONN=${CONN:-4}
SAT_WARMUP=${SAT_WARMUP:-30}
SAT_SECONDS=${SAT_SECONDS:-60}
RATE_SHARE=${RATE_SHARE:-0.6}
PORT=${SOAK_PORT:-21480}
METRICS_PORT=${SOAK_METRICS_PORT:-21481}

# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
SAMPLER=""
soak_cleanup() {
  if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; fi
  bench_cleanup
}
bench_setup soak
trap soak_cleanup EXIT

# serve LOG DATA FLAGS...: a fresh release server on CPU 0; sets PID.
serve() {
  local log=$1 data=$2
  shift 2
  "${PIN0[@]}" "$SERVER" --listen "127.0.0.1:$PORT" --data-dir "$data" --drain-delay 0s "$@" 2>"$log" &
  PID=$!
  for _ in $(seq 1 300); do
    grep -q 'serving' "$log" && return 0
    sleep 0.1
  done
  echo "soak.sh: the server did not start within 30 s (see $log)" >&2
  exit 1
}
stop() {
  kill -TERM "$PID"
  wait "$PID" || true
  PID=""
}
loadgen() {
  "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario mixed \
    --tenants "$TENANTS" --attempts "$ATTEMPTS" --concurrency "$CONC" --connections "$CONN" \
    --server-pid "$PID" "$@"
}

# --- 1. saturation ----------------------------------------------------------------
serve "$OUT/saturation-server.log" "$WORK/saturation" --retry-rate 1000000 --retry-burst 1000000
echo "saturation: closed loop, $CONC streams, ${SAT_WARMUP} s warm-up, ${SAT_SECONDS} s" >&2
loadgen --mode closed --warmup "${SAT_WARMUP}s" --duration "${SAT_SECONDS}s" --label soak/saturation >"$OUT/saturation.json"
stop
python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
if r["errors"]:
    print("saturation: %d requests refused (%s): the checkpoints bound it" % (r["errors"], r["error_codes"]), file=sys.stderr)' "$OUT/saturation.json"
SAT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput_rps"])' "$OUT/saturation.json")
RATE=$(python3 -c 'import sys; print(round(float(sys.argv[1]) / 2))' "$SAT")
RETRY_RATE=$(python3 -c 'import sys; print(round(float(sys.argv[1]) * float(sys.argv[2])))' "$RATE" "$RATE_SHARE")
echo "saturation $SAT requests/s: soak at $RATE/s, retry rate $RETRY_RATE/s, $MINUTES minutes" >&2

# --- 2. soak ------------------------------------------------------------------------
serve "$OUT/soak-server.log" "$WORK/soak" --retry-rate "$RETRY_RATE" --retry-burst "$RETRY_RATE" \
  --success-deposit 0.1 --metrics-listen "127.0.0.1:$METRICS_PORT"
mkdir -p "$OUT/metrics"
START=$SECONDS
printf 'seconds\tvm_rss_mib\tvm_hwm_mib\n' >"$OUT/rss.tsv"
(
  while kill -0 "$PID" 2>/dev/null; do
    t=$((SECONDS - START))
    awk -v t="$t" '$1 == "VmRSS:" { r = $2 } $1 == "VmHWM:" { h = $2 }
      END { printf "%d\t%.1f\t%.1f\n", t, r / 1024, h / 1024 }' "/proc/$PID/status" >>"$OUT/rss.tsv" || true
    curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$OUT/metrics/$(printf '%05d' "$t").txt" || true
    sleep 10
  done
) &
SAMPLER=$!
: >"$OUT/minutes.jsonl"
for m in $(seq 1 "$MINUTES"); do
  loadgen --mode open --rate "$RATE" --warmup 0s --duration 60s --run-id "soak$m" \
    --label "soak/minute-$m" >>"$OUT/minutes.jsonl"
  tail -1 "$OUT/minutes.jsonl" | python3 -c 'import json, sys
r = json.load(sys.stdin)
print("minute %s: %.0f/s p99 %s us errors %s" % (sys.argv[1], r["throughput_rps"], r["latency_us"]["p99"], r["errors"]), file=sys.stderr)' "$m"
done
sleep 10
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$OUT/metrics/final.txt"
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
SAMPLER=""
stop
cat >"$OUT/run.json" <<EOF
{"saturation_rps": $SAT, "rate": $RATE, "retry_rate": $RETRY_RATE, "minutes": $MINUTES, "tenants": $TENANTS, "attempts": $ATTEMPTS, "concurrency": $CONC, "connections": $CONN, "cpu": "$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"}
EOF
echo "results in $OUT" >&2
python3 "$(dirname "$0")/summary.py" soak "$OUT"
