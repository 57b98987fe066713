#!/usr/bin/env bash
# A/B of two server builds with h2load as the client: alternates fresh
# servers of build A and build B; on each, h2load drives the health check,
# then pure NextAction (the bodies of run.sh), 4 s each after 1 s of
# warm-up, and the line printed gives the server CPU a request of both and
# their ratio (health / pure: the "capacity" ratio of run.sh's summary).
#
#   benches/ab-h2load.sh SERVER_A SERVER_B
#
# Environment: ROUNDS (pairs; 3). Server on CPU 0, h2load on CPU 1, at
# nice -10 (root). Needs h2load (Debian nghttp2-client) and python3.
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
A=$1; B=$2
PORT=${BENCH_PORT:-21192}
WORK=$(mktemp -d)
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

python3 "$(dirname "$0")/grpc_bodies.py" "$WORK"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
per_request() { # path body: server CPU (us) per request succeeded
  local a b text ok
  a=$(cpu_ticks "$PID")
  text=$(nice -n -10 taskset -c 1 h2load -D 4 --warm-up-time 1 -c 4 -m 32 -t 1 -d "$2" \
    -H 'content-type: application/grpc' -H 'te: trailers' "http://127.0.0.1:$PORT$1")
  b=$(cpu_ticks "$PID")
  ok=$(printf '%s\n' "$text" | sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p')
  # The ticks include h2load's warm-up second, which its count of requests
  # leaves out: both figures run high by about the same factor (5/4), and
  # their ratio holds.
  python3 -c "print('%.1f' % (($b - $a) * 1e6 / $(getconf CLK_TCK) / max(1, ${ok:-0})))"
}

for _ in $(seq 1 "${ROUNDS:-3}"); do
  for server in "$A" "$B"; do
    mkdir -p "$WORK/data"
    nice -n -10 taskset -c 0 "$server" --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" \
      --drain-delay 0s --retry-rate 1000000 --retry-burst 1000000 2>/dev/null &
    PID=$!
    sleep 0.7
    health=$(per_request /grpc.health.v1.Health/Check "$WORK/health.bin")
    pure=$(per_request /retrybudget.v1.RetryBudget/NextAction "$WORK/pure-next-action.bin")
    echo "$server: health $health us, pure NextAction $pure us a request, health / pure $(python3 -c "print('%.2f' % ($health / $pure))")"
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
    rm -rf "$WORK/data"
  done
done
