#!/usr/bin/env bash
# The PostgreSQL targets of BENCHMARKS.md, and the embedded store's
# stored-size target beside them, in one run, on this machine.
#
#   benches/pg.sh [--quick] [--out FILE] [--rounds N] [--big N] [--small N]
#                 [--embedded-big N] [--only pgbench|pg-stored|embedded-stored]
#
# (a) pgbench against the service: a pgbench script with ONE single-row
#     upsert a transaction into a table made by the service's own migration
#     (so shaped and indexed as retry_budget_activities), the record a real
#     encoded one taken from the service's table, at 1, 2, 4, 8, 16, 32 and
#     64 clients (-j 2, -M prepared), each for the window's length; then
#     durable NextAction (each client walks its activities through
#     attempts 1 to 5) against the server on PostgreSQL at 128 streams.
#     Alternated --rounds times (default 2); the ratio is the service's
#     decisions a second over the best pgbench tps of the same round.
# (b) durable reports over stored activities on PostgreSQL: --small (10k)
#     against --big (10M) preloaded activities, each request the next
#     attempt of one drawn uniformly among them (stored-next-action),
#     alternated small/big --rounds times, a fresh server each window.
#     The big database is preloaded once (PgStore::import, several
#     connections), vacuumed, analysed and checkpointed; the small one is
#     preloaded again before each of its windows, so that its records do not
#     grow to dozens of events over the run (each window reports its mean
#     attempt).
# (c) the same on the embedded store: --small against --embedded-big (1M)
#     preloaded offline, server on CPU 0 and generator on CPU 1.
# In (a) and (b) nothing is pinned: the server, PostgreSQL and the generator
# share both cores, as they must. Every window carries the CPU the server
# and every postgres process used (`benches/summary.py cpu`) beside the
# generator's own (client_cpu_cores); `summary.py pg` gives them a decision. The databases are
# rb_bench_*_PID on 127.0.0.1:5432 (user postgres), dropped at the end.
# One JSON line a window to the results file (default
# target/bench-results/pg-DATE.jsonl); the summary: `benches/summary.py pg`.
#
# Environment: PGHOST, PGPORT, PGUSER (127.0.0.1, 5432, postgres),
# CARGO_TARGET_DIR, BENCH_DIR, BENCH_WARMUP / BENCH_DURATION.
set -euo pipefail

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }

QUICK=0
OUT=""
ROUNDS=2
BIG=10000000
SMALL=10000
EMBEDDED_BIG=1000000
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --big) BIG=$2; shift ;;
    --small) SMALL=$2; shift ;;
    --embedded-big) EMBEDDED_BIG=$2; shift ;;
    --only) ONLY=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "pg.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$QUICK" = 1 ]; then
  WARMUP=${BENCH_WARMUP:-1}; DURATION=${BENCH_DURATION:-3}
else
  WARMUP=${BENCH_WARMUP:-2}; DURATION=${BENCH_DURATION:-6}
fi
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
CONNECTIONS=4
CONCURRENCY=128
PORT=${BENCH_PORT:-21370}
PGBENCH_CLIENTS=(1 2 4 8 16 32 64)

for tool in psql pgbench python3; do
  command -v "$tool" >/dev/null || { echo "pg.sh: $tool is needed" >&2; exit 1; }
done
pg_isready -q || { echo "pg.sh: no PostgreSQL answers on $PGHOST:$PGPORT" >&2; exit 1; }

if [ -z "$OUT" ]; then
  mkdir -p "$ROOT/target/bench-results"
  OUT="$ROOT/target/bench-results/pg-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
fi
: >"$OUT"
WORK=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/retry-budget-pg.XXXXXX")
DB_SVC=rb_bench_svc_$$
DB_PGBENCH=rb_bench_pgbench_$$
DB_SMALL=rb_bench_small_$$
DB_BIG=rb_bench_big_$$
url() { echo "host=$PGHOST port=$PGPORT user=$PGUSER dbname=$1"; }

SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  for db in "$DB_SVC" "$DB_PGBENCH" "$DB_SMALL" "$DB_BIG"; do
    psql -q -d postgres -c "DROP DATABASE IF EXISTS $db" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s\n' "$*" >&2; }
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }

log "building release binaries (CARGO_TARGET_DIR=$TARGET_DIR)"
(cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release --workspace --bins --quiet)
SERVER="$TARGET_DIR/release/retry-budget"
LOADGEN="$TARGET_DIR/release/retry-budget-loadgen"

python3 - "$OUT" <<PY
import json, sys
print(json.dumps({"kind": "machine", "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "nproc": $(nproc),
  "cpu": "$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | sed -n 1p)",
  "commit": "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)",
  "postgres": "$(sql postgres -c 'SHOW server_version')",
  "warmup_s": $WARMUP, "duration_s": $DURATION, "rounds": $ROUNDS,
  "loadavg": "$(cut -d' ' -f1-3 /proc/loadavg)"}), file=open(sys.argv[1], "a"))
PY

# A server on PostgreSQL database $2 (or, with --data-dir, the embedded
# store), started as run.sh does: no retry bucket in the way.
start_server() { # label [server flags...]
  local label=$1
  shift
  PORT=$((PORT + 1))
  SERVER_LOG="$WORK/server-$PORT.log"
  RUST_LOG=info ${SERVER_PIN[@]+"${SERVER_PIN[@]}"} "$SERVER" --listen "127.0.0.1:$PORT" \
    --drain-delay 0s --retry-rate 1000000 --retry-burst 1000000 "$@" 2>"$SERVER_LOG" &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    kill -0 "$SERVER_PID" 2>/dev/null || { log "server $label failed:"; cat "$SERVER_LOG" >&2; exit 1; }
    if grep -q 'serving' "$SERVER_LOG" && (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  log "server $label did not listen on $PORT within 10 s"; exit 1
}

stop_server() {
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || log "server exited with $?"
  SERVER_PID=""
}

# One loadgen window, its CPU split added (the server, every postgres
# process, the generator, the rest), one JSON line to $OUT.
window() { # label scenario [loadgen flags...]
  local label=$1 scenario=$2 line split
  shift 2
  # The split's window ends half a second before the generator's, which
  # exits at its end and takes its CPU time with it.
  python3 "$ROOT/benches/summary.py" cpu --after "$WARMUP" --window "$(python3 -c "print($DURATION - 0.5)")" \
    --pid server="$SERVER_PID" --comm postgres=postgres \
    >"$WORK/split" &
  local sampler=$!
  line=$(${LOADGEN_PIN[@]+"${LOADGEN_PIN[@]}"} "$LOADGEN" --target "http://127.0.0.1:$PORT" \
    --connections $CONNECTIONS --concurrency $CONCURRENCY \
    --warmup "${WARMUP}s" --duration "${DURATION}s" --server-pid "$SERVER_PID" \
    --label "$label" --scenario "$scenario" "$@")
  wait "$sampler"
  split=$(cat "$WORK/split")
  python3 - "$line" "$split" >>"$OUT" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
r["cores"] = json.loads(sys.argv[2])
print(json.dumps(r))
PY
  log "  $label: $(tail -1 "$OUT" | python3 -c '
import json, sys
r = json.load(sys.stdin); c = r["cores"]
print("{:,.0f} decisions/s, p99 {} us, errors {}{}; cores: server {:.2f}, postgres {:.2f}, generator {:.2f}, other {:.2f}".format(
    r["throughput_rps"], r["latency_us"]["p99"], r["errors"],
    ", mean attempt {:.1f}".format(r["mean_attempt"]) if "mean_attempt" in r else "",
    c["server"], c["postgres"], r["client_cpu_cores"], c["other"] - r["client_cpu_cores"]))')"
}

# pgbench at each client count, one JSON line each, with its CPU split.
pgbench_sweep() { # round
  local clients tps
  for clients in "${PGBENCH_CLIENTS[@]}"; do
    python3 "$ROOT/benches/summary.py" cpu --after 1 --window "$((WARMUP + DURATION - 2))" \
      --comm postgres=postgres --comm pgbench=pgbench >"$WORK/split" &
    local sampler=$!
    # A failed pgbench (say, the server's max_connections reached by other
    # work) is recorded as no figure, with its reason, not the end of the run.
    tps=$(pgbench -n -M prepared -c "$clients" -j "$((clients < 2 ? 1 : 2))" \
      -T "$((WARMUP + DURATION))" -D rec="$RECORD_HEX" -f "$WORK/upsert.sql" "$DB_PGBENCH" \
      2>"$WORK/pgbench.err" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p') || true
    wait "$sampler"
    [ -n "$tps" ] || log "  pgbench -c $clients failed: $(tail -1 "$WORK/pgbench.err")"
    python3 - "$OUT" "$1" "$clients" "${tps:-null}" "$(cat "$WORK/split")" <<'PY'
import json, sys
out, rnd, clients, tps, split = sys.argv[1:]
print(json.dumps({"kind": "pgbench", "label": "pgbench", "round": int(rnd),
  "clients": int(clients), "tps": json.loads(tps), "cores": json.loads(split)}), file=open(out, "a"))
PY
    log "  pgbench -c $clients: ${tps:-?} tps"
  done
}

want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

SERVER_PIN=()
LOADGEN_PIN=()

if want pgbench; then
  log "(a) pgbench, one single-row upsert a transaction, vs durable NextAction at $CONCURRENCY streams (x$ROUNDS)"
  sql postgres -c "CREATE DATABASE $DB_SVC"
  sql postgres -c "CREATE DATABASE $DB_PGBENCH"
  sql "$DB_PGBENCH" -f "$ROOT/migrations/0001_activities.sql"
  # purgeable_from_ms and the record stay the same from one upsert of a
  # row to the next, as in the service's updates of an open activity.
  cat >"$WORK/upsert.sql" <<'SQL'
\set id random(1, 1000000)
INSERT INTO retry_budget_activities (tenant, activity_id, version, purgeable_from_ms, record)
VALUES ('bench', 'pgbench-' || :id, 1, 1000000 + :id, decode(:rec, 'hex'))
ON CONFLICT (tenant, activity_id) DO UPDATE
SET version = retry_budget_activities.version + 1,
    purgeable_from_ms = excluded.purgeable_from_ms, record = excluded.record;
SQL
  RECORD_HEX=""
  for round in $(seq 1 "$ROUNDS"); do
    start_server pg/service --postgres-url "$(url "$DB_SVC")"
    window pg/durable durable-next-action
    stop_server
    if [ -z "$RECORD_HEX" ]; then
      # A record of the walk's middle attempt (3 of 5): the typical size.
      RECORD_HEX=$(sql "$DB_SVC" -c "SELECT encode(record, 'hex') FROM retry_budget_activities
        WHERE version = 3 LIMIT 1")
      log "  pgbench writes a record of $((${#RECORD_HEX} / 2)) bytes"
    fi
    pgbench_sweep "$round"
  done
fi

if want pg-stored; then
  log "(b) PostgreSQL: $SMALL vs $BIG stored activities, next attempts drawn uniformly (x$ROUNDS)"
  sql postgres -c "CREATE DATABASE $DB_BIG"
  "$LOADGEN" --scenario preload --postgres-url "$(url "$DB_BIG")" --activities "$BIG" \
    --import-connections 2 --import-batch 5000 --label preload/pg-big >>"$OUT"
  log "  $(tail -1 "$OUT")"
  started=$SECONDS
  sql "$DB_BIG" -c "VACUUM ANALYZE retry_budget_activities" -c "CHECKPOINT"
  log "  vacuum, analyse and checkpoint: $((SECONDS - started)) s; table and indexes $(sql "$DB_BIG" -c \
    "SELECT pg_size_pretty(pg_total_relation_size('retry_budget_activities'))")"
  for round in $(seq 1 "$ROUNDS"); do
    sql postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $DB_SMALL" \
      -c "CREATE DATABASE $DB_SMALL"
    "$LOADGEN" --scenario preload --postgres-url "$(url "$DB_SMALL")" --activities "$SMALL" \
      --label preload/pg-small >>"$OUT"
    sql "$DB_SMALL" -c "VACUUM ANALYZE retry_budget_activities" -c "CHECKPOINT"
    rm -f "$WORK/attempts-pg-small"
    start_server pg/stored-small --postgres-url "$(url "$DB_SMALL")"
    window pg/stored-small stored-next-action --activities "$SMALL" \
      --attempts-file "$WORK/attempts-pg-small"
    stop_server
    start_server pg/stored-big --postgres-url "$(url "$DB_BIG")"
    window pg/stored-big stored-next-action --activities "$BIG" \
      --attempts-file "$WORK/attempts-pg-big"
    stop_server
  done
  sql postgres -c "DROP DATABASE IF EXISTS $DB_BIG" -c "DROP DATABASE IF EXISTS $DB_SMALL"
fi

if want embedded-stored; then
  log "(c) embedded store: $SMALL vs $EMBEDDED_BIG stored activities, next attempts drawn uniformly (x$ROUNDS)"
  if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    SERVER_PIN=(taskset -c 0)
    LOADGEN_PIN=(taskset -c 1)
  fi
  "$LOADGEN" --scenario preload --activities "$EMBEDDED_BIG" --data-dir "$WORK/stored-big" \
    --threads 2 --label preload/embedded-big >>"$OUT"
  log "  $(tail -1 "$OUT")"
  for round in $(seq 1 "$ROUNDS"); do
    rm -rf "$WORK/stored-small" "$WORK/attempts-small"
    "$LOADGEN" --scenario preload --activities "$SMALL" --data-dir "$WORK/stored-small" \
      --label preload/embedded-small >>"$OUT"
    start_server embedded/stored-small --data-dir "$WORK/stored-small"
    window embedded/stored-small stored-next-action --activities "$SMALL" \
      --attempts-file "$WORK/attempts-small"
    stop_server
    start_server embedded/stored-big --data-dir "$WORK/stored-big"
    window embedded/stored-big stored-next-action --activities "$EMBEDDED_BIG" \
      --attempts-file "$WORK/attempts-big"
    stop_server
  done
fi

python3 "$ROOT/benches/summary.py" pg "$OUT"
