#!/usr/bin/env bash
# The PostgreSQL targets of BENCHMARKS.md, and the embedded store's stored-size target
# beside them, in one run, on this machine.
#
#   benches/pg.sh [--rounds N] [--big N] [--embedded-big N] [--only pgbench|pg-stored|embedded-stored]
#
# (a) pgbench, ONE single-row upsert a transaction into a table made by the service's own
#     migration, the record a real one from the service's table, at 1 to 64 clients (-j 2,
#     -M prepared); then durable NextAction at 128 streams against the server on
#     PostgreSQL; --rounds (2) times, each ratio against the best pgbench of its round.
# (b) durable reports over 10k against --big (10M) activities imported into
#     PostgreSQL, each request the next attempt of one drawn uniformly (stored-next-action),
#     alternated, a fresh server each window. The big database is imported once, vacuumed
#     and checkpointed; the small one again before each of its windows, so that its records
#     do not grow to dozens of events.
# (c) the same on the embedded store, 10k against --embedded-big (1M) preloaded
#     offline, server on CPU 0 and generator on CPU 1. In (a) and (b) nothing is pinned: the
#     database needs cores too.
# Every window carries the CPU the server, every postgres process and the rest used
# (`summary.py cpu`). Databases rb_bench_*_PID on PGHOST:PGPORT (127.0.0.1:5432, user
# postgres), dropped at the end. One JSON line a window to
# target/bench-results/pg-DATE.jsonl, then `benches/summary.py pg` on it.
# Environment: PGHOST, PGPORT, PGUSER, CARGO_TARGET_DIR, BENCH_DIR, BENCH_WARMUP, BENCH_DURATION.
set -euo pipefail

# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
OUT="" ROUNDS=2 BIG=10000000 SMALL=10000 EMBEDDED_BIG=1000000 ONLY=""
bench_args --rounds=ROUNDS --big=BIG --embedded-big=EMBEDDED_BIG --only=ONLY -- "$@"
WARMUP=${BENCH_WARMUP:-2} DURATION=${BENCH_DURATION:-6}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
PORT=${BENCH_PORT:-21370}
for tool in psql pgbench python3; do
  command -v "$tool" >/dev/null || { echo "pg.sh: $tool is needed" >&2; exit 1; }
done
pg_isready -q || { echo "pg.sh: no PostgreSQL answers on $PGHOST:$PGPORT" >&2; exit 1; }

DBS=(rb_bench_svc_$$ rb_bench_pgbench_$$ rb_bench_small_$$ rb_bench_big_$$)
bench_cleanup_hook() {
  for db in "${DBS[@]}"; do psql -q -d postgres -c "DROP DATABASE IF EXISTS $db" 2>/dev/null || true; done
}
bench_setup pg file
PINNED0=("${PIN0[@]}") PINNED1=("${PIN1[@]}")
PIN0=() PIN1=()
log() { printf '%s\n' "$*" >&2; }
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$@"; }
url() { echo "host=$PGHOST port=$PGPORT user=$PGUSER dbname=$1"; }
bench_machine postgres="$(sql postgres -c 'SHOW server_version')" warmup_s="$WARMUP" duration_s="$DURATION" \
  rounds="$ROUNDS" >>"$OUT"

start_server() { # [server flags...]
  PORT=$((PORT + 1))
  bench_serve "$WORK/server-$PORT.log" "$PORT" "${ROOMY[@]}" "$@"
}

# A loadgen window, the CPU split of its measured part added as "cores". The split ends
# half a second before the generator, which exits at its end and takes its CPU time along.
window() { # label scenario [loadgen flags...]
  local label=$1 scenario=$2 line
  shift 2
  python3 "$ROOT/benches/summary.py" cpu --after "$WARMUP" --window "$(python3 -c "print($DURATION - 0.5)")" \
    --pid server="$PID" --comm postgres=postgres >"$WORK/split" &
  SAMPLER=$!
  line=$("${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --connections 4 --concurrency 128 \
    --warmup "${WARMUP}s" --duration "${DURATION}s" --server-pid "$PID" --label "$label" --scenario "$scenario" "$@")
  wait "$SAMPLER"
  SAMPLER=""
  python3 -c 'import json, sys; r = json.loads(sys.argv[1]); r["cores"] = json.loads(sys.argv[2]); print(json.dumps(r))' \
    "$line" "$(cat "$WORK/split")" >>"$OUT"
  log "  $label: $(tail -1 "$OUT" | python3 "$ROOT/benches/summary.py" line)"
}

pgbench_sweep() { # round
  local clients tps
  for clients in 1 2 4 8 16 32 64; do
    python3 "$ROOT/benches/summary.py" cpu --after 1 --window "$((WARMUP + DURATION - 2))" \
      --comm postgres=postgres --comm pgbench=pgbench >"$WORK/split" &
    SAMPLER=$!
    # A failed pgbench (say, max_connections reached by other work) is no figure, not the end.
    tps=$(pgbench -n -M prepared -c "$clients" -j "$((clients < 2 ? 1 : 2))" -T "$((WARMUP + DURATION))" \
      -D rec="$RECORD_HEX" -f "$WORK/upsert.sql" "${DBS[1]}" 2>"$WORK/pgbench.err" |
      sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p') || true
    wait "$SAMPLER"
    SAMPLER=""
    [ -n "$tps" ] || log "  pgbench -c $clients failed: $(tail -1 "$WORK/pgbench.err")"
    bench_json kind=pgbench label=pgbench round="$1" clients="$clients" tps="${tps:-null}" \
      cores="$(cat "$WORK/split")" >>"$OUT"
    log "  pgbench -c $clients: ${tps:-?} tps"
  done
}

want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

if want pgbench; then
  log "(a) pgbench, one single-row upsert a transaction, vs durable NextAction at 128 streams (x$ROUNDS)"
  sql postgres -c "CREATE DATABASE ${DBS[0]}" -c "CREATE DATABASE ${DBS[1]}"
  sql "${DBS[1]}" -f "$ROOT/migrations/0001_activities.sql"
  # purgeable_from_ms and the record stay the same from one upsert of a row to the next,
  # as in the service's updates of an open activity.
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
    start_server --postgres-url "$(url "${DBS[0]}")"
    window pg/durable durable-next-action
    bench_stop
    if [ -z "$RECORD_HEX" ]; then # a record of the walk's middle attempt (3 of 5)
      RECORD_HEX=$(sql "${DBS[0]}" -c "SELECT encode(record, 'hex') FROM retry_budget_activities WHERE version = 3 LIMIT 1")
      log "  pgbench writes a record of $((${#RECORD_HEX} / 2)) bytes"
    fi
    pgbench_sweep "$round"
  done
fi

if want pg-stored; then
  log "(b) PostgreSQL: $SMALL vs $BIG stored activities, next attempts drawn uniformly (x$ROUNDS)"
  sql postgres -c "CREATE DATABASE ${DBS[3]}"
  "$LOADGEN" --scenario preload --postgres-url "$(url "${DBS[3]}")" --activities "$BIG" --label preload/pg-big >>"$OUT"
  log "  $(tail -1 "$OUT")"
  started=$SECONDS
  sql "${DBS[3]}" -c "VACUUM ANALYZE retry_budget_activities" -c "CHECKPOINT"
  log "  vacuum, analyse and checkpoint: $((SECONDS - started)) s; table and indexes $(sql "${DBS[3]}" -c \
    "SELECT pg_size_pretty(pg_total_relation_size('retry_budget_activities'))")"
  for round in $(seq 1 "$ROUNDS"); do
    sql postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS ${DBS[2]}" -c "CREATE DATABASE ${DBS[2]}"
    "$LOADGEN" --scenario preload --postgres-url "$(url "${DBS[2]}")" --activities "$SMALL" --label preload/pg-small >>"$OUT"
    sql "${DBS[2]}" -c "VACUUM ANALYZE retry_budget_activities" -c "CHECKPOINT"
    rm -f "$WORK/attempts-pg-small"
    start_server --postgres-url "$(url "${DBS[2]}")"
    window pg/stored-small stored-next-action --activities "$SMALL" --attempts-file "$WORK/attempts-pg-small"
    bench_stop
    start_server --postgres-url "$(url "${DBS[3]}")"
    window pg/stored-big stored-next-action --activities "$BIG" --attempts-file "$WORK/attempts-pg-big"
    bench_stop
  done
fi

if want embedded-stored; then
  log "(c) embedded store: $SMALL vs $EMBEDDED_BIG stored activities, next attempts drawn uniformly (x$ROUNDS)"
  PIN0=("${PINNED0[@]}") PIN1=("${PINNED1[@]}")
  "$LOADGEN" --scenario preload --activities "$EMBEDDED_BIG" --data-dir "$WORK/stored-big" --threads 2 \
    --label preload/embedded-big >>"$OUT"
  for round in $(seq 1 "$ROUNDS"); do
    rm -rf "$WORK/stored-small" "$WORK/attempts-small"
    "$LOADGEN" --scenario preload --activities "$SMALL" --data-dir "$WORK/stored-small" --label preload/embedded-small >>"$OUT"
    start_server --data-dir "$WORK/stored-small"
    window embedded/stored-small stored-next-action --activities "$SMALL" --attempts-file "$WORK/attempts-small"
    bench_stop
    start_server --data-dir "$WORK/stored-big"
    window embedded/stored-big stored-next-action --activities "$EMBEDDED_BIG" --attempts-file "$WORK/attempts-big"
    bench_stop
  done
fi
python3 "$ROOT/benches/summary.py" pg "$OUT"
