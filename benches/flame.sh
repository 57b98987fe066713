#!/usr/bin/env bash
# Flame graphs of the server under load, one per scenario, and a
# differential one of each scenario against the first: where the time of a
# request goes, kernel and waits on memory included (what the instruction
# counts of benches/profile.sh leave out).
#
#   benches/flame.sh [--seconds N] [--out DIR] [SCENARIO...]
#
# Scenarios default to: pure-next-action durable-next-action. For each, a
# fresh release server runs on CPU 0 (fresh data directory) and the load
# generator drives it in closed loop from CPU 1 (128 streams over 4
# connections, as in run.sh's durable scenarios); after 2 s of warm-up,
# `perf record` samples every server thread (cpu-clock, 999 Hz, DWARF call
# graphs) for N seconds (default 4). Written to DIR (default
# target/bench-results/flame-DATE):
#   SCENARIO.svg          the flame graph (open it in a browser: it zooms)
#   SCENARIO.folded       the folded stacks, with the request count beside
#   SCENARIO-vs-FIRST.svg differential: red where SCENARIO spends more of
#                         its samples than the first scenario, blue less
# and the CPU a request of each server thread, in microseconds, on stdout,
# then for each scenario after the first where its extra CPU goes
# (benches/flame_split.py, which can be rerun on DIR alone).
#
# Needs perf (Debian: linux-perf) and inferno (`cargo install inferno`),
# root or kernel.perf_event_paranoid <= 1, and python3.
set -euo pipefail

SECONDS_WINDOW=4
# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
bench_options 23 "$@"
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(pure-next-action durable-next-action)
for tool in perf inferno-collapse-perf inferno-flamegraph inferno-diff-folded; do
  command -v "$tool" >/dev/null || {
    echo "flame.sh: $tool is needed (perf: apt-get install linux-perf; the rest: cargo install inferno)" >&2
    exit 1
  }
done

bench_setup flame
PORT=${FLAME_PORT:-21290}
WARMUP=2

for s in "${SCENARIOS[@]}"; do
  PORT=$((PORT + 1))
  echo "sampling $s (port $PORT, ${WARMUP}s warm-up, ${SECONDS_WINDOW}s window)" >&2
  bench_serve "$WORK/$s.server.log" "$PORT" "$WORK/data-$s"
  # The generator's window is the samples' window: warm-up, then perf.
  "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario "$s" \
    --connections 4 --concurrency 128 --warmup "${WARMUP}s" --duration "${SECONDS_WINDOW}s" \
    --label "flame/$s" >"$OUT/$s.json" &
  GEN=$!
  sleep "$WARMUP"
  perf record -q -F 999 --call-graph dwarf,16384 -p "$PID" -o "$WORK/$s.perf" \
    -- sleep "$SECONDS_WINDOW" 2>/dev/null
  wait "$GEN"
  kill -TERM "$PID"
  wait "$PID" || true
  PID=""
  perf script -i "$WORK/$s.perf" 2>/dev/null | inferno-collapse-perf --all >"$OUT/$s.folded"
  requests=$(python3 -c "import json; print(json.load(open('$OUT/$s.json'))['requests'])")
  inferno-flamegraph --title "$s: server CPU, $requests requests in ${SECONDS_WINDOW}s (cpu-clock, 999 Hz)" \
    <"$OUT/$s.folded" >"$OUT/$s.svg"
  # CPU a request by thread (the folded stack's first frame).
  python3 "$(dirname "$0")/flame_split.py" --threads "$OUT" "$s"
done

first=${SCENARIOS[0]}
for s in "${SCENARIOS[@]:1}"; do
  inferno-diff-folded --normalize "$OUT/$first.folded" "$OUT/$s.folded" |
    inferno-flamegraph --title "$s against $first: red more, blue less (share of samples)" \
      >"$OUT/$s-vs-$first.svg"
  # Where the extra CPU goes, in us a request (the split of a durable
  # decision's extra CPU in BENCHMARKS.md).
  python3 "$(dirname "$0")/flame_split.py" "$OUT" "$first" "$s"
done
echo "flame graphs in $OUT" >&2
