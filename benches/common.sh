# Shared by the bench scripts; sourced, not run.
#
#   bench_args --FLAG=VAR... [--FLAG=VAR=VALUE...] [REST] -- "$@"
#     Each `--FLAG X` of the script's arguments sets VAR to X, each `--FLAG` of the second
#     form sets VAR to VALUE; with REST the other arguments go into the array REST. -h prints
#     the script's header comment.
#   bench_setup NAME [file]
#     ROOT; WORK, a temporary directory (in BENCH_DIR, else TMPDIR) removed at exit with the
#     server in PID and the process in SAMPLER; OUT, if the script left it empty,
#     target/bench-results/NAME-DATE (a directory, or with `file` an empty .jsonl file);
#     PIN0 and PIN1, taskset to CPU 0 and CPU 1 when there are two, under `nice -n
#     BENCH_NICE` if set (run.sh --nice); ROOMY_DEPS, the flag that makes every dependency's
#     budget too large to defer (none for a build from before those budgets), and ROOMY,
#     that and the retry bucket's. Builds the release binaries: SERVER (SERVER_BIN measures
#     another build with this checkout's load generator) and LOADGEN.
#   bench_serve LOG PORT [FLAGS...]
#     The server on 127.0.0.1:PORT under PIN0 and, if set, the command in the array WRAP
#     (valgrind), with FLAGS and SERVER_FLAGS (environment, space-separated, e.g.
#     SERVER_FLAGS="--metrics-listen 127.0.0.1:0"); sets PID once it serves.
#   bench_stop: stops it. bench_json K=V...: one JSON line (values are JSON literals, else
#   strings). bench_machine K=V...: the machine's record (CPU, kernel, commit, load) and K=V.
#   bench_cleanup_hook, if the script defines it, runs first at exit.
#   bench_rss EVERY: while the server runs, every EVERY seconds its VmRSS and VmHWM (MiB,
#     `status_mib`) into OUT/rss.tsv; in SAMPLER.

bench_args() {
  local -A var=()
  while [ "$1" != -- ]; do var[${1%%=*}]=${1#*=}; shift; done
  shift
  REST=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -h | --help) sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      -*) [ -n "${var[$1]:-}" ] || { echo "$(basename "$0"): unknown argument $1" >&2; exit 2; }
        if [[ ${var[$1]} == *=* ]]; then printf -v "${var[$1]%%=*}" %s "${var[$1]#*=}"
        else printf -v "${var[$1]}" %s "$2"; shift; fi ;;
      *) [ -n "${var[REST]:-}" ] || { echo "$(basename "$0"): unknown argument $1" >&2; exit 2; }
        REST+=("$1") ;;
    esac
    shift
  done
}

bench_setup() {
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local target=${CARGO_TARGET_DIR:-$ROOT/target} stamp
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  if [ "${2:-}" = file ]; then
    OUT=${OUT:-$ROOT/target/bench-results/$1-$stamp.jsonl}
    mkdir -p "$(dirname "$OUT")" && : >"$OUT"
  else
    OUT=${OUT:-$ROOT/target/bench-results/$1-$stamp}
    mkdir -p "$OUT"
  fi
  WORK=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/retry-budget-$1.XXXXXX")
  PID="" SAMPLER=""
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  PIN0=() PIN1=()
  if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    PIN0=(taskset -c 0) PIN1=(taskset -c 1)
  else
    echo "$(basename "$0"): not pinning (needs taskset and 2 CPUs)" >&2
  fi
  if [ "${BENCH_NICE:-0}" != 0 ]; then
    PIN0=(nice -n "$BENCH_NICE" "${PIN0[@]}") PIN1=(nice -n "$BENCH_NICE" "${PIN1[@]}")
  fi
  (cd "$ROOT" && CARGO_TARGET_DIR="$target" cargo build --release --workspace --bins --quiet)
  SERVER=${SERVER_BIN:-$target/release/retry-budget}
  LOADGEN=$target/release/retry-budget-loadgen
  ROOMY_DEPS=()
  # DEPENDENCY_BUDGET=default leaves every dependency at its default budget.
  if [ "${DEPENDENCY_BUDGET:-roomy}" = roomy ] && "$SERVER" serve --help 2>/dev/null | grep -q -- '--dependency-rate'; then
    ROOMY_DEPS=(--dependency-rate 1000000)
  fi
  ROOMY=(--retry-rate 1000000 --retry-burst 1000000 "${ROOMY_DEPS[@]}")
  read -ra SERVER_ARGS <<<"${SERVER_FLAGS:-}"
}

bench_cleanup() {
  if declare -F bench_cleanup_hook >/dev/null; then bench_cleanup_hook; fi
  if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; fi
  bench_stop
  rm -rf "$WORK"
}

bench_serve() {
  local log=$1 port=$2
  shift 2
  RUST_LOG=${RUST_LOG:-info} "${PIN0[@]}" ${WRAP[@]+"${WRAP[@]}"} "$SERVER" --listen "127.0.0.1:$port" \
    --drain-delay 0s "$@" ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"} 2>"$log" &
  PID=$!
  for _ in $(seq 1 300); do
    kill -0 "$PID" 2>/dev/null || { echo "the server failed to start:" >&2; cat "$log" >&2; exit 1; }
    if grep -qs 'serving' "$log" && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "$(basename "$0"): the server did not serve on $port within 30 s (see $log)" >&2
  exit 1
}

bench_stop() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -TERM "$PID"; wait "$PID" || true; fi
  PID=""
}

status_mib() { awk -v f="$1:" '$1 == f { printf "%.1f", $2 / 1024 }' "/proc/$PID/status"; }

bench_rss() {
  local every=$1 start=$SECONDS
  printf 'seconds\tvm_rss_mib\tvm_hwm_mib\n' >"$OUT/rss.tsv"
  (
    while kill -0 "$PID" 2>/dev/null; do
      printf '%s\t%s\t%s\n' "$((SECONDS - start))" "$(status_mib VmRSS)" "$(status_mib VmHWM)" >>"$OUT/rss.tsv"
      sleep "$every"
    done
  ) &
  SAMPLER=$!
}

bench_json() {
  python3 - "$@" <<'PY'
import json, sys
# Always strings: a short commit hash such as 8e44031 reads as a float otherwise.
TEXT = {"commit", "label", "path", "date", "cpu", "kernel", "loadavg", "work_dir", "l2_cache", "postgres"}
rec = {}
for arg in sys.argv[1:]:
    k, _, v = arg.partition("=")
    try:
        rec[k] = v if k in TEXT else json.loads(v)
    except ValueError:
        rec[k] = v
print(json.dumps(rec))
PY
}

bench_machine() {
  bench_json kind=machine date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" nproc="$(nproc)" \
    cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | sed -n 1p)" kernel="$(uname -r)" \
    cpu_family="$(sed -n '/^cpu family[[:space:]]*:[[:space:]]*/{s///p;q}' /proc/cpuinfo)" \
    cpu_model="$(sed -n '/^model[[:space:]]*:[[:space:]]*/{s///p;q}' /proc/cpuinfo)" \
    l2_cache="$(lscpu | sed -n -E 's/^(L2 cache|[[:space:]]*L2):[[:space:]]*//p' | sed -n 1p)" \
    commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    loadavg="$(cut -d' ' -f1-3 /proc/loadavg)" work_dir="$WORK" "$@"
}
