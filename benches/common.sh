# Set-up shared by the bench scripts that run the release server under
# the load generator (profile.sh, rss.sh, soak.sh); sourced, not run.
#
#   bench_options LAST_HELP_LINE "$@"
#
# reads the options both take: --seconds N (SECONDS_WINDOW), --out DIR
# (OUT), -h/--help (prints the script's header, lines 2 to LAST_HELP_LINE),
# and the scenarios (SCENARIOS).
#
#   bench_setup NAME
#
# after the script has read its options: sets ROOT, TARGET_DIR (honouring
# CARGO_TARGET_DIR), OUT (target/bench-results/NAME-DATE unless the script
# set it), WORK (a temporary directory, removed at exit together with the
# server whose PID is in PID, if one still runs), PIN0 and PIN1 (taskset to
# CPU 0 and CPU 1 when there are two), builds the release binaries, and sets
# SERVER and LOADGEN.
#
#   bench_serve LOG PORT DATA [WRAPPER...]
#
# starts the release server on CPU 0 on PORT, its data in DATA, under
# WRAPPER if given (valgrind ...), its log in LOG, with the retry bucket too
# large to defer (as in run.sh) and the flags in the array SERVER_ARGS, if
# set; sets PID and returns once it serves.

bench_options() {
  local help=$1
  shift
  OUT=""
  SCENARIOS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --seconds) SECONDS_WINDOW=$2; shift ;;
      --out) OUT=$2; shift ;;
      -h | --help) sed -n "2,${help}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) SCENARIOS+=("$1") ;;
    esac
    shift
  done
}

bench_cleanup() {
  if [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null; then kill -TERM "$PID"; wait "$PID" || true; fi
  rm -rf "$WORK"
}

bench_setup() {
  ROOT=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
  TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  OUT=${OUT:-$ROOT/target/bench-results/$1-$(date -u +%Y%m%dT%H%M%SZ)}
  mkdir -p "$OUT"
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/retry-budget-$1.XXXXXX")
  PID=""
  trap bench_cleanup EXIT
  PIN0=(); PIN1=()
  if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN0=(taskset -c 0); PIN1=(taskset -c 1); fi
  (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release --workspace --bins --quiet)
  # SERVER_BIN profiles or measures another build of the server (an older
  # commit's release binary) with this checkout's load generator.
  SERVER=${SERVER_BIN:-$TARGET_DIR/release/retry-budget}
  LOADGEN="$TARGET_DIR/release/retry-budget-loadgen"
}

# SERVER_FLAGS (environment, space-separated) fills SERVER_ARGS for a
# script that does not set it, e.g. SERVER_FLAGS="--metrics-listen
# 127.0.0.1:0" benches/profile.sh health to profile with metrics on.
if [ -z "${SERVER_ARGS+set}" ] && [ -n "${SERVER_FLAGS:-}" ]; then
  read -ra SERVER_ARGS <<<"$SERVER_FLAGS"
fi

bench_serve() {
  local log=$1 port=$2 data=$3
  shift 3
  # Every dependency's budget as roomy as the global one, so that a
  # benchmark measures decisions and never a deferral (a build from before
  # dependencies had budgets has no such flag).
  local DEPENDENCY_ARGS=()
  if "$SERVER" serve --help 2>/dev/null | grep -q -- '--dependency-rate'; then
    DEPENDENCY_ARGS=(--dependency-rate 1000000)
  fi
  "${PIN0[@]}" "$@" "$SERVER" --listen "127.0.0.1:$port" --data-dir "$data" --drain-delay 0s \
    --retry-rate 1000000 --retry-burst 1000000 ${DEPENDENCY_ARGS[@]+"${DEPENDENCY_ARGS[@]}"} ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"} 2>"$log" &
  PID=$!
  for _ in $(seq 1 300); do
    grep -q 'serving' "$log" && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): the server did not start within 30 s (see $log)" >&2
  exit 1
}
