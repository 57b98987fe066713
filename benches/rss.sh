#!/usr/bin/env bash
# The memory target: the server's peak RSS while ACTIVITIES (2,000,000) activities it has
# never seen are written through gRPC at full speed, nothing preloaded, and its RSS idle after.
#
#   benches/rss.sh [--activities N] [--idle SECONDS] [--out DIR]
#
# The release server on CPU 0 on a fresh data directory (retry and dependency budgets too
# large to defer), the load generator on CPU 1: `--scenario new-activities`, one first
# failure each, CONC (128) streams over CONN (4) connections, every answer checked to be a
# stored decision; a refusal with a pushback (`store_backlogged`) is sent again after its
# wait, as a worker would. VmRSS and VmHWM are sampled every second into DIR/rss.tsv.
# Prints the peak (VmHWM once the last write is answered) and the RSS after --idle (30) s,
# against 256 MiB, the bytes the server wrote to disk (/proc/PID/io) and its group commits
# (its exit log), and appends the generator's report with them to DIR/rss.jsonl. Exits 1
# if a write failed or the peak is over the target. SERVER_BIN pairs another build.
set -euo pipefail

# shellcheck source=benches/common.sh
. "$(dirname "$0")/common.sh"
ACTIVITIES=2000000 IDLE=30 OUT="" TARGET_MIB=256
bench_args --activities=ACTIVITIES --idle=IDLE --out=OUT -- "$@"
CONC=${CONC:-128} CONN=${CONN:-4} PORT=${RSS_PORT:-21460}
bench_setup rss

bench_serve "$OUT/server.log" "$PORT" --data-dir "$WORK/data" "${ROOMY[@]}"
echo "server $PID on 127.0.0.1:$PORT, data in $WORK/data; at start: RSS $(status_mib VmRSS) MiB" >&2
START=$SECONDS
bench_rss 1

echo "writing $ACTIVITIES new activities ($CONC streams over $CONN connections)" >&2
"${PIN1[@]}" "$LOADGEN" --target "http://127.0.0.1:$PORT" --scenario new-activities --activities "$ACTIVITIES" \
  --concurrency "$CONC" --connections "$CONN" --label "rss/new-activities" >"$OUT/loadgen.json"
PEAK=$(status_mib VmHWM) LOADED=$(status_mib VmRSS) WRITE_SECONDS=$((SECONDS - START))
WRITTEN_BYTES=$(awk '$1 == "write_bytes:" { print $2 }' "/proc/$PID/io")
echo "written in ${WRITE_SECONDS} s: peak RSS (VmHWM) $PEAK MiB, RSS $LOADED MiB; idle for $IDLE s" >&2
sleep "$IDLE"
IDLE_RSS=$(status_mib VmRSS) PEAK_END=$(status_mib VmHWM) DATA_MIB=$(du -sm "$WORK/data" | cut -f1)
bench_stop
# "group commit totals commits=N saves=M" (or with the fields first, by log format).
COMMITS=$(grep 'group commit totals' "$OUT/server.log" | grep -o 'commits=[0-9]*' | cut -d= -f2)
VERDICT=$(awk -v p="$PEAK" -v t="$TARGET_MIB" 'BEGIN { print (p < t) ? "met" : "missed" }')
python3 - "$OUT/loadgen.json" "$PEAK" "$LOADED" "$IDLE" "$IDLE_RSS" "$PEAK_END" "$DATA_MIB" "$TARGET_MIB" \
  "$VERDICT" "$WRITTEN_BYTES" "${COMMITS:-0}" "$(git -C "$ROOT" rev-parse --short HEAD)" "$SERVER" >>"$OUT/rss.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r.update(peak_rss_mib=float(sys.argv[2]), rss_after_writes_mib=float(sys.argv[3]), idle_seconds=int(sys.argv[4]),
         idle_rss_mib=float(sys.argv[5]), peak_rss_end_mib=float(sys.argv[6]), data_dir_mib=int(sys.argv[7]),
         target_mib=int(sys.argv[8]), verdict=sys.argv[9], written_bytes=int(sys.argv[10]),
         group_commits=int(sys.argv[11]), checkout=sys.argv[12], server=sys.argv[13])
print(json.dumps(r))
PY
read -r WRITTEN FAILED RATE PUSHED_BACK P99 < <(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print(r["written"], r["failed"], round(r["activities_per_s"]), r.get("pushed_back", 0), r.get("latency_us", {}).get("p99", "?"))' "$OUT/loadgen.json")
cat <<EOF
activities written:     $WRITTEN of $ACTIVITIES ($FAILED failed), $RATE a second, ${WRITE_SECONDS} s; $PUSHED_BACK refusals with a pushback, each sent again
latency p99:            $P99 us
disk:                   $((WRITTEN_BYTES / WRITTEN)) bytes written a decision; ${COMMITS:-?} group commits ($(awk -v c="${COMMITS:-0}" -v w="$WRITTEN" 'BEGIN { printf "%.4f", c / w }') fsyncs a decision)
peak RSS during writes: $PEAK MiB (VmHWM; target < $TARGET_MIB MiB: $VERDICT)
RSS after the writes:   $LOADED MiB
idle RSS:               $IDLE_RSS MiB, ${IDLE} s after the writes (VmHWM then $PEAK_END MiB)
data directory:         $DATA_MIB MiB
samples: $OUT/rss.tsv; report: $OUT/rss.jsonl; server log: $OUT/server.log
EOF
[ "$FAILED" = 0 ] && [ "$WRITTEN" = "$ACTIVITIES" ] && [ "$VERDICT" = met ]
