#!/usr/bin/env bash
# The embedded-store benchmarks of BENCHMARKS.md, in one run, on this machine.
#
#   benches/run.sh [--quick] [--nice N] [--out FILE] [--port N] [--stored N]
#
# Against the release server on loopback (server on CPU 0, generator on CPU 1 when there
# are two; --nice N runs them at that niceness, -10 needs root):
#   the fsync latency of the data directory's disk (at the start and the end);
#   (1) health, (2) RetryDelay, (3) pure NextAction: closed loop A/B/C x REPS; open loop at
#       half the best health throughput x OPEN_REPS, with the generator's h2 client (each
#       request prepared once: it keeps its schedule where the tonic client fell behind);
#   (4) durable NextAction with group commit after pure NextAction on the same server, then
#       (5) with --max-batch 1, each on a fresh server and store, x REPS;
#   (6) durable NextAction on 1k and on --stored (1M; --quick 100k) activities preloaded
#       offline, x REPS.
# One JSON line a window to FILE (default target/bench-results/results-DATE.jsonl); server
# lines carry the peak RSS and the group commits logged at exit. Ends with
# `benches/summary.py run FILE`. Environment: CARGO_TARGET_DIR, BENCH_DIR (the data
# directories: the fsync probe measures that disk), BENCH_WARMUP, BENCH_DURATION,
# BENCH_REPS, BENCH_OPEN_REPS.
set -euo pipefail

# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
QUICK=0 OUT="" STORED_BIG="" BENCH_NICE=0
# Below the kernel's ephemeral ports (32768-60999), which a client of an earlier step may hold.
PORT=${BENCH_PORT:-21170}
bench_args --quick=QUICK=1 --out=OUT --port=PORT --stored=STORED_BIG --nice=BENCH_NICE -- "$@"
if [ "$QUICK" = 1 ]; then
  WARMUP=${BENCH_WARMUP:-1} DURATION=${BENCH_DURATION:-3} STORED_BIG=${STORED_BIG:-100000}
else
  WARMUP=${BENCH_WARMUP:-2} DURATION=${BENCH_DURATION:-6} STORED_BIG=${STORED_BIG:-1000000}
fi
# Three reps of 6 s: a ratio is judged on pairs of windows next to each other in time, and
# more pairs average out more of a shared machine's changes of speed. One more open-loop rep
# leaves pairs to judge when the generator falls behind in one.
REPS=${BENCH_REPS:-3}
OPEN_REPS=${BENCH_OPEN_REPS:-$((REPS + 1))}
CONNECTIONS=4 CONCURRENCY=128

command -v python3 >/dev/null || { echo "run.sh: python3 is needed" >&2; exit 1; }
bench_setup results file
log() { printf '%s\n' "$*" >&2; }
[ "$QUICK" = 1 ] && quick=true || quick=false
[ ${#PIN1[@]} -gt 0 ] && pinned=true || pinned=false
bench_machine quick=$quick pinned=$pinned nice="$BENCH_NICE" warmup_s="$WARMUP" duration_s="$DURATION" reps="$REPS" \
  open_reps="$OPEN_REPS" connections=$CONNECTIONS concurrency=$CONCURRENCY >>"$OUT"

LABEL=""
start_server() { # label data-dir [server flags...]
  LABEL=$1 PORT=$((PORT + 1))
  local dir=$2
  shift 2
  bench_serve "$WORK/server-$PORT.log" "$PORT" --data-dir "$dir" "${ROOMY[@]}" "$@"
}

stop_server() {
  local hwm commits saves log="$WORK/server-$PORT.log"
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$PID/status")
  bench_stop
  commits=$(grep -o 'commits=[0-9]*' "$log" | tail -1 | cut -d= -f2)
  saves=$(grep -o 'saves=[0-9]*' "$log" | tail -1 | cut -d= -f2)
  bench_json kind=server label="$LABEL" vm_hwm_kib="${hwm:-null}" commits="${commits:-null}" saves="${saves:-null}" >>"$OUT"
  log "  server $LABEL: peak RSS ${hwm:-?} KiB, ${saves:-?} decisions in ${commits:-?} commits"
}

loadgen() { # label scenario [loadgen flags...]
  local label=$1 scenario=$2
  shift 2
  "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --connections $CONNECTIONS \
    --concurrency $CONCURRENCY --warmup "${WARMUP}s" --duration "${DURATION}s" \
    --server-pid "$PID" --label "$label" --scenario "$scenario" "$@" >>"$OUT"
  log "  $label: $(tail -1 "$OUT" | python3 "$ROOT/benches/summary.py" line)"
}

fsync_probe() {
  "$LOADGEN" --scenario fsync --data-dir "$WORK" --label fsync >>"$OUT"
  log "  fsync: median $(tail -1 "$OUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["latency_us"]["p50"])') us"
}

log "results: $OUT"
fsync_probe
log "(1)-(3) closed loop: health, RetryDelay, pure NextAction (x$REPS)"
start_server stateless "$WORK/stateless"
for _ in $(seq 1 "$REPS"); do
  for s in health retry-delay pure-next-action; do loadgen "closed/$s" "$s"; done
done
HALF_RATE=$(python3 - "$OUT" <<'PY'
import json, sys
print(round(max(r["throughput_rps"] for r in map(json.loads, open(sys.argv[1])) if r.get("label") == "closed/health") / 2))
PY
)
log "(1)-(3) open loop at $HALF_RATE req/s, half the best health throughput (x$OPEN_REPS)"
for _ in $(seq 1 "$OPEN_REPS"); do
  for s in health retry-delay pure-next-action; do loadgen "open/$s" "$s" --mode open --rate "$HALF_RATE" --client h2; done
done
stop_server

# Durable is judged against pure NextAction on the same server just before it: minutes
# apart, a shared VM's speed can move by more than the difference measured.
log "(4)-(5) durable NextAction after pure on its server, group commit vs --max-batch 1 (x$REPS)"
for rep in $(seq 1 "$REPS"); do
  start_server durable/group-commit "$WORK/gc-$rep"
  loadgen durable/pure-next-action pure-next-action
  loadgen durable/group-commit durable-next-action
  stop_server
  start_server durable/max-batch-1 "$WORK/mb1-$rep" --max-batch 1
  loadgen durable/max-batch-1 durable-next-action
  stop_server
done

log "(6) preloading 1,000 and $STORED_BIG activities offline"
"${PIN1[@]}" "$LOADGEN" --scenario preload --activities 1000 --data-dir "$WORK/stored-1k" --label preload/1k >>"$OUT"
"$LOADGEN" --scenario preload --activities "$STORED_BIG" --data-dir "$WORK/stored-big" --threads 2 \
  --label preload/big >>"$OUT"
log "(6) durable NextAction on 1k vs $STORED_BIG stored activities (x$REPS)"
for _ in $(seq 1 "$REPS"); do
  for size in 1k big; do
    start_server "durable/stored-$size" "$WORK/stored-$size"
    loadgen "durable/stored-$size" durable-next-action
    stop_server
  done
done
fsync_probe
bench_json kind=end date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" loadavg="$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"
python3 "$ROOT/benches/summary.py" run "$OUT"
