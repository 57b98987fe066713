#!/usr/bin/env bash
# The metastability boundary (docs/storm.md, "Against published figures"):
# the main scenario under naive retries and under retry-budget's ratio
# budget, the trigger made shorter (capacity at C/3 for 2 to 10 s) or
# weaker (capacity at 0.9 to 0.5 of C for 10 s), one seed; and the scale
# check: no retries, the adaptive default, the default before it (the
# static 100 a second) and the ratio budget in the main scenario at
# C = 1,000. Run after run.sh (it uses the binaries run.sh built):
#
#   benches/storm/sweep.sh
#
# Runs go to benches/storm/results/sweep/*.json; report.py prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."

PARALLEL="${PARALLEL:-2}"
OUT="${OUT:-benches/storm/results}/sweep"
TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p "$OUT"

jobs=()
for policy in naive rb-ratio; do
  for seconds in 2 3 4 6 8; do
    jobs+=("$policy 0.3333333333 $seconds 200")
  done
  for fraction in 0.9 0.8 0.7 0.65 0.6 0.5; do
    jobs+=("$policy $fraction 10 200")
  done
done
for policy in none rb-default rb-static100 rb-ratio; do
  jobs+=("$policy 0.3333333333 10 1000")
done

printf '%s\n' "${jobs[@]}" | xargs -P "$PARALLEL" -L 1 sh -c '
  target=$1 out=$2 policy=$3 fraction=$4 seconds=$5 capacity=$6
  run="$out/$policy-$fraction-$seconds-$capacity.json"
  [ -s "$run" ] && exit 0
  if "$target/release/retry-budget-storm" --policy "$policy" --trigger-capacity "$fraction" \
      --trigger-seconds "$seconds" --capacity "$capacity" >"$run.tmp"; then
    mv "$run.tmp" "$run"
    echo "done $policy at $fraction of C = $capacity for $seconds s"
  else
    rm -f "$run.tmp"
    echo "FAILED $policy $fraction $seconds $capacity" >&2
  fi' sweep "$TARGET" "$OUT" || true

python3 benches/storm/report.py --sweep "$OUT"
