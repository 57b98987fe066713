#!/usr/bin/env bash
# Soak: the server under a steady mixed load for MINUTES (10) at half its saturation, over
# TENANTS (1,000) tenants: RSS flat after warm-up, no error, p99 steady.
#
#   benches/soak.sh [--minutes N] [--tenants N] [--attempts N] [--out DIR]
#
# 1. Saturation: a fresh server (CPU 0, retry bucket too large to defer) under the closed
#    loop (CPU 1) of `--scenario mixed`, CONC (128) streams over CONN (4) connections,
#    SAT_WARMUP (30 s) then SAT_SECONDS (60): its answered requests a second are S. The
#    window is long beside the swings of fjall's background work (memtable flushes,
#    compactions), so S is what the store keeps up with, that work included.
# 2. Soak: a fresh server with `--retry-rate` RATE_SHARE (0.6) of the open loop's rate (as
#    much burst), `--success-deposit 0.1` and metrics, driven open loop at S / 2 a second in
#    MINUTES one-minute runs; each activity reports ATTEMPTS (3) failures then its success,
#    deferred retries wait out their not_before.
# Every 10 s the server's VmRSS and VmHWM go into DIR, its /metrics at the end (the
# server's p99 each 10 s from them is in history, 06d317b); then `benches/summary.py soak
# DIR` (exits 1 if the verdict fails).
set -euo pipefail

# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
MINUTES=10 TENANTS=1000 ATTEMPTS=3 OUT=""
bench_args --minutes=MINUTES --tenants=TENANTS --attempts=ATTEMPTS --out=OUT -- "$@"
CONC=${CONC:-128} CONN=${CONN:-4} SAT_WARMUP=${SAT_WARMUP:-30} SAT_SECONDS=${SAT_SECONDS:-60}
RATE_SHARE=${RATE_SHARE:-0.6} PORT=${SOAK_PORT:-21480} METRICS_PORT=${SOAK_METRICS_PORT:-21481}

bench_setup soak
loadgen() {
  "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario mixed --tenants "$TENANTS" \
    --attempts "$ATTEMPTS" --concurrency "$CONC" --connections "$CONN" --server-pid "$PID" "$@"
}
field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

bench_serve "$OUT/saturation-server.log" "$PORT" --data-dir "$WORK/saturation" "${ROOMY[@]}"
echo "saturation: closed loop, $CONC streams, ${SAT_WARMUP} s warm-up, ${SAT_SECONDS} s" >&2
loadgen --mode closed --warmup "${SAT_WARMUP}s" --duration "${SAT_SECONDS}s" --label soak/saturation >"$OUT/saturation.json"
bench_stop
if [ "$(field "$OUT/saturation.json" errors)" != 0 ]; then
  echo "saturation: refusals $(field "$OUT/saturation.json" error_codes): S counts the answered requests only" >&2
fi
SAT=$(field "$OUT/saturation.json" throughput_rps)
RATE=$(python3 -c "print(round($SAT / 2))")
RETRY_RATE=$(python3 -c "print(round($RATE * $RATE_SHARE))")
echo "saturation $SAT requests/s: soak at $RATE/s, retry rate $RETRY_RATE/s, $MINUTES minutes" >&2

bench_serve "$OUT/soak-server.log" "$PORT" --data-dir "$WORK/soak" --retry-rate "$RETRY_RATE" \
  --retry-burst "$RETRY_RATE" "${ROOMY_DEPS[@]}" --success-deposit 0.1 --metrics-listen "127.0.0.1:$METRICS_PORT"
bench_rss 10
: >"$OUT/minutes.jsonl"
for m in $(seq 1 "$MINUTES"); do
  loadgen --mode open --rate "$RATE" --warmup 0s --duration 60s --run-id "soak$m" --label "soak/minute-$m" \
    >>"$OUT/minutes.jsonl"
  echo "minute $m: $(tail -1 "$OUT/minutes.jsonl" | python3 "$ROOT/benches/summary.py" line)" >&2
done
sleep 10
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" >"$OUT/final-metrics.txt"
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
SAMPLER=""
bench_stop
cat >"$OUT/run.json" <<EOF
{"saturation_rps": $SAT, "rate": $RATE, "retry_rate": $RETRY_RATE, "minutes": $MINUTES, "tenants": $TENANTS, "attempts": $ATTEMPTS, "concurrency": $CONC, "connections": $CONN, "cpu": "$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"}
EOF
echo "results in $OUT" >&2
python3 "$ROOT/benches/summary.py" soak "$OUT"
