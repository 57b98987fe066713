#!/usr/bin/env bash
# What group commit buys on a slower disk than this machine's. The server's
# fsyncs are made slower by a shim, benches/slow_fsync.c, preloaded into it:
# fdatasync and fsync return DELAY microseconds after the real call does,
# the thread asleep meanwhile, as on a network volume whose flush takes a
# millisecond or so. The real call still runs, so what is durable does not
# change and neither does the kernel's work for it; only the wait grows.
#
# For each DELAY, ROUNDS times (default 3): a group-commit server (a pure
# NextAction window, then a durable one, as run.sh pairs them) and a
# --max-batch 1 server (a durable window), each on a fresh store; first the
# fsync probe under the shim, to show the flush the server sees. Prints a
# line a window, then per DELAY the medians: group commit / one fsync a
# decision, durable / pure NextAction, decisions an fsync, the flush.
#
#   benches/slow-disk.sh [--seconds N] [--out DIR] [DELAY_US...]
#
# DELAY_US defaults to 0 500 1000 2000; --seconds is each window (default
# 5, after a 1 s warm-up); CONC the streams (default 128, as in run.sh),
# over 4 connections. The JSON lines go to DIR/slow-disk.jsonl (default
# target/bench-results/slow-disk-DATE/); python3 benches/slow_disk.py FILE
# prints the summary again. The server runs on CPU 0 and the generator on
# CPU 1, as in run.sh; both at nice -10 when run as root. Needs cc, python3.
set -euo pipefail
. "$(dirname "$0")/common.sh"
bench_options 23 "$@"
DELAYS=("${SCENARIOS[@]}")
[ ${#DELAYS[@]} -gt 0 ] || DELAYS=(0 500 1000 2000)
for d in "${DELAYS[@]}"; do
  [[ "$d" =~ ^[0-9]+$ ]] || { echo "slow-disk.sh: DELAY_US must be whole microseconds, not '$d'" >&2; exit 2; }
done
SECONDS_WINDOW=${SECONDS_WINDOW:-5}
bench_setup slow-disk
SHIM="$WORK/slow_fsync.so"
cc -O2 -shared -fPIC -o "$SHIM" "$ROOT/benches/slow_fsync.c" -ldl
NICE=()
[ "$(id -u)" != 0 ] || NICE=(nice -n -10)
JSONL="$OUT/slow-disk.jsonl"
: >"$JSONL"
PORT=${BENCH_PORT:-21291}

window() { # label scenario
  "${NICE[@]}" "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --connections 4 --concurrency "${CONC:-128}" \
    --warmup 1s --duration "${SECONDS_WINDOW}s" --server-pid "$PID" --scenario "$2" --label "$1" >>"$JSONL"
  python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print("  {:<16} {:>9,.0f} req/s  server {:5.1f} us a request, busy {:.2f}, p99 {} us".format(r["label"], r["throughput_rps"],
      r["server_cpu_us_per_request"], r.get("server_cpu_cores") or 0, r["latency_us"]["p99"]))' "$JSONL"
}

stop() { # label
  local hwm
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$PID/status")
  kill -TERM "$PID"
  wait "$PID" || true
  PID=""
  python3 -c 'import json, re, sys
m = re.findall(r"commits=(\d+) saves=(\d+)", open(sys.argv[2]).read())
c, s = (int(m[-1][0]), int(m[-1][1])) if m else (None, None)
print(json.dumps({"kind": "server", "label": sys.argv[1], "vm_hwm_kib": int(sys.argv[3] or 0) or None, "commits": c, "saves": s}))' \
    "$1" "$LOG" "${hwm:-}" >>"$JSONL"
}

for delay in "${DELAYS[@]}"; do
  SLOW=(env "LD_PRELOAD=$SHIM" "SLOW_FSYNC_US=$delay")
  echo "flush + $delay us"
  "${SLOW[@]}" "$LOADGEN" --scenario fsync --data-dir "$WORK" --fsyncs 100 --label "$delay/fsync" >>"$JSONL"
  for rep in $(seq 1 "${ROUNDS:-3}"); do
    for batch in gc mb1; do
      PORT=$((PORT + 1))
      LOG="$WORK/server-$PORT.log"
      SERVER_ARGS=()
      [ "$batch" = gc ] || SERVER_ARGS=(--max-batch 1)
      bench_serve "$LOG" "$PORT" "$WORK/data-$PORT" "${NICE[@]}" "${SLOW[@]}"
      [ "$batch" = mb1 ] || window "$delay/pure/$rep" pure-next-action
      window "$delay/$batch/$rep" durable-next-action
      stop "$delay/$batch/$rep"
      rm -rf "$WORK/data-$PORT"
    done
  done
done
echo
python3 "$ROOT/benches/slow_disk.py" "$JSONL"
echo "results: $JSONL"
