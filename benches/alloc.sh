#!/usr/bin/env bash
# What a request allocates in the server, one scenario at a time, with
# valgrind's DHAT.
#
#   benches/alloc.sh [--seconds N] [--out DIR] [SCENARIO...]
#
# Scenarios default to: health pure-next-action durable-next-action. DHAT
# sees only malloc, so the server is built a second time with the
# `system-allocator` feature (mimalloc left out; into $TARGET_DIR/alloc, so
# the release binary the other scripts use keeps mimalloc). For each
# scenario the server runs under `valgrind --tool=dhat` (CPU 0) twice, the
# load generator driving it in closed loop (CPU 1, 128 streams over 4
# connections unless CONC says otherwise; a 1 s warm-up) for N seconds and
# then for 3N. benches/dhat_summary.py then takes the difference between the
# two profiles over the difference in requests: allocations and bytes a
# request, and the sites that make them, with the server's start, warm-up
# and shutdown left out. Counts, not time: they do not depend on what else
# the machine runs, so a change of a few percent shows here where pairs of
# timed windows on a shared VM cannot show it.
set -euo pipefail

SECONDS_WINDOW=5
# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
bench_options 19 "$@"
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(health pure-next-action durable-next-action)
command -v valgrind >/dev/null || { echo "alloc.sh: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }

bench_setup alloc
(cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_DIR/alloc" cargo build --release --bin retry-budget \
  --features system-allocator --quiet)
SERVER="$TARGET_DIR/alloc/release/retry-budget"
PORT=${ALLOC_PORT:-21370}
CONC=${CONC:-128}

for s in "${SCENARIOS[@]}"; do
  for window in short long; do
    seconds=$SECONDS_WINDOW
    [ "$window" = long ] && seconds=$((SECONDS_WINDOW * 3))
    PORT=$((PORT + 1))
    echo "counting $s, ${seconds}s window (port $PORT)" >&2
    bench_serve "$OUT/$s.$window.server.log" "$PORT" "$WORK/data-$s-$window" \
      valgrind --tool=dhat "--dhat-out-file=$OUT/$s.$window.dhat"
    "${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario "$s" \
      --connections 4 --concurrency "$CONC" --warmup 1s --duration "${seconds}s" \
      --server-pid "$PID" --label "alloc/$s/$window" >"$OUT/$s.$window.json"
    kill -TERM "$PID"
    wait "$PID" || true
    PID=""
    [ -s "$OUT/$s.$window.dhat" ] || { echo "alloc.sh: no DHAT profile for $s ($window)" >&2; exit 1; }
  done
done

python3 "$ROOT/benches/dhat_summary.py" "$OUT" | tee "$OUT/summary.txt"
echo "DHAT profiles (open them in valgrind's dh_view.html), loadgen reports and summary in $OUT" >&2
