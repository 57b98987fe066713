#!/usr/bin/env bash
# A/B of two (or more) server builds: alternates fresh servers of build A
# and build B (A/B/A/B...), each on a fresh data directory, one closed-loop
# window each, and prints a line a window: throughput, server CPU a
# request, how busy the server was, p99, decisions an fsync (from the
# server's `group commit totals` line), the server's peak RSS (VmHWM), the
# CPU a request of each server thread, and the cores the hypervisor stole
# from the guest meanwhile (a window with much steal is not comparable).
# BENCHMARKS.md's "tried, and not enough" figures come from such A/Bs.
#
#   benches/ab-builds.sh SERVER_A SERVER_B [SERVER_C ...] [server flags...]
#
# More than two builds are alternated the same way (A/B/C/A/B/C...), so
# that several variants share each phase of the machine's speed. The builds
# are the arguments before the first one that starts with "-". A build may
# be a wrapper script that sets the environment and `exec`s a binary (the
# process id stays the server's), such as a scratch variant of the journal
# that skips its fsync or its checkpoint.
#
# Environment: SCEN (default durable-next-action), ROUNDS (3), DUR (window,
# seconds; 4), CONC (streams; 128), CONN (connections; 4), B_BATCH (thread
# names, such as "redb-writer": server B's threads of those names are moved
# to SCHED_BATCH with chrt once it listens, so A and B may be one binary
# and the A/B is of that scheduling alone), B_CPU1 (thread names, such as
# "redb-writer redb-checkpoint": server B's threads of those names are moved
# to CPU 1, the generator's, with taskset once it listens: what sharing the
# server's core costs). To build an older commit beside the current one:
#   git worktree add /tmp/old COMMIT && cargo build --release --bin retry-budget \
#     --manifest-path /tmp/old/Cargo.toml --target-dir /tmp/old-target
# The server runs on CPU 0 and the generator on CPU 1, at nice -10 (root).
# Needs release binaries of this checkout (for the generator) and python3.
set -euo pipefail
BUILDS=()
while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do BUILDS+=("$1"); shift; done
[ ${#BUILDS[@]} -ge 2 ] || { sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
L=${CARGO_TARGET_DIR:-$ROOT/target}/release/retry-budget-loadgen
PORT=${BENCH_PORT:-21191}
PID=""; DATA=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  [ -z "$DATA" ] || rm -rf "$DATA" "$DATA.log" "$DATA.json"
}
trap cleanup EXIT

# on_threads PID "NAME..." CMD...: runs CMD TID for each of PID's threads
# whose name is one of NAMES.
on_threads() {
  local pid=$1 names=$2 task name
  shift 2
  for task in /proc/"$pid"/task/*; do
    for name in $names; do
      if [ "$(cat "$task/comm" 2>/dev/null)" = "$name" ]; then
        "$@" "$(basename "$task")" >/dev/null
      fi
    done
  done
}

for _ in $(seq 1 "${ROUNDS:-3}"); do
  for i in "${!BUILDS[@]}"; do
    server=${BUILDS[$i]}
    DATA=$(mktemp -d)
    nice -n -10 taskset -c 0 "$server" --listen "127.0.0.1:$PORT" --data-dir "$DATA" --drain-delay 0s \
      --retry-rate 1000000 --retry-burst 1000000 "$@" 2>"$DATA.log" &
    PID=$!
    sleep 0.7
    label=$server
    # B_BATCH and B_CPU1 apply to the second build (index 1) alone.
    if [ "$i" = 1 ] && [ -n "${B_BATCH:-}" ]; then
      label="$label (SCHED_BATCH: $B_BATCH)"
      on_threads "$PID" "$B_BATCH" chrt -b -p 0
    fi
    if [ "$i" = 1 ] && [ -n "${B_CPU1:-}" ]; then
      label="$label (on CPU 1: $B_CPU1)"
      on_threads "$PID" "$B_CPU1" taskset -p -c 1
    fi
    nice -n -10 taskset -c 1 "$L" --target "http://127.0.0.1:$PORT" --connections "${CONN:-4}" \
      --concurrency "${CONC:-128}" --warmup 1s --duration "${DUR:-4}s" --server-pid "$PID" \
      --scenario "${SCEN:-durable-next-action}" >"$DATA.json"
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$PID/status")
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
    python3 - "$label" "$DATA.json" "$DATA.log" "${hwm:-0}" <<'PY'
import json, re, sys
server, report, log = sys.argv[1], json.load(open(sys.argv[2])), open(sys.argv[3]).read()
hwm_mib = int(sys.argv[4]) / 1024
m = re.search(r"commits=(\d+) saves=(\d+)", log)
per_fsync = f"{int(m.group(2)) / max(1, int(m.group(1))):6.1f}" if m else "   n/a"
threads = " ".join(f"{k}={v:.1f}" for k, v in sorted(report.get("server_thread_cpu_us_per_request", {}).items()))
print(f"{server:<44} {report['throughput_rps']:>8.0f} req/s {report['server_cpu_us_per_request']:>6.1f} us/req "
      f"busy {report.get('server_cpu_cores', 0):.2f} p99 {report['latency_us']['p99']:>6} us "
      f"decisions/fsync {per_fsync} peak RSS {hwm_mib:.0f} MiB  {threads}"
      f"  steal {report.get('steal_cores') or 0.0:.2f}")
PY
    rm -rf "$DATA" "$DATA.log" "$DATA.json"; DATA=""
  done
done
