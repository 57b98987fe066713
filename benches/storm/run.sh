#!/usr/bin/env bash
# The storm lab of docs/storm.md: every policy in every scenario for a few
# seeds, each run a real-time ~71 s process (the retry-budget policies start
# the real server), then the table and the plot.
#
#   benches/storm/run.sh                     # the full lab: 3 seeds, ~2 h 40 min
#   SEEDS=1 SCENARIOS=drop benches/storm/run.sh   # one scenario, one seed
#   SCENARIOS=flaky POLICIES="none rb-default" benches/storm/run.sh
#
# Results go to benches/storm/results/runs/*.json (one run each; a run
# already there is not run again, so an interrupted lab resumes), the table
# to benches/storm/results/table.md, the plot to docs/storm.png.
# PARALLEL runs at once (default 2): each run is light (C = 200 requests a
# second), and every run reports its own scheduler lag and whether it was
# starved, so a machine that did not keep up shows in the table.
set -euo pipefail
cd "$(dirname "$0")/../.."

SEEDS="${SEEDS:-1 2 3}"
SCENARIOS="${SCENARIOS:-drop two-deps flaky drop10 drop1000 restart}"
# rb-default is the adaptive per-dependency budget (the default since issue
# #52), rb-static100 the default before it; rb-static2 to rb-static40, with
# rb-low (10), sweep the static global rate.
POLICIES="${POLICIES:-none naive backoff aws grpc finagle rb-default rb-static100 rb-ratio rb-static2 rb-static5 rb-low rb-static20 rb-static40}"
PARALLEL="${PARALLEL:-2}"
CAPACITY="${CAPACITY:-200}"
OUT="${OUT:-benches/storm/results}"
TARGET="${CARGO_TARGET_DIR:-target}"

# Two builds, not one: built together, the server would be compiled with the
# lab's tokio features and be another binary than the one users run.
cargo build --release --locked --bin retry-budget
cargo build --release --locked -p retry-budget-storm
mkdir -p "$OUT/runs"

jobs=()
for seed in $SEEDS; do
  for scenario in $SCENARIOS; do
    for policy in $POLICIES; do
      file="$OUT/runs/$scenario-$policy-$seed.json"
      [ -s "$file" ] || jobs+=("$seed $scenario $policy")
    done
  done
done
echo "storm lab: ${#jobs[@]} runs, $PARALLEL at a time"

if [ "${#jobs[@]}" -gt 0 ]; then
  printf '%s\n' "${jobs[@]}" | xargs -P "$PARALLEL" -L 1 sh -c '
    target=$1 out=$2 capacity=$3 seed=$4 scenario=$5 policy=$6
    run="$out/runs/$scenario-$policy-$seed.json"
    if "$target/release/retry-budget-storm" --seed "$seed" --scenario "$scenario" \
        --policy "$policy" --capacity "$capacity" >"$run.tmp"; then
      mv "$run.tmp" "$run"
      echo "done $scenario $policy seed $seed"
    else
      echo "FAILED $scenario $policy seed $seed" >&2
      rm -f "$run.tmp"
    fi' storm "$TARGET" "$OUT" "$CAPACITY" || true
fi

python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib
python3 benches/storm/report.py "$OUT/runs" --plot docs/storm.png | tee "$OUT/table.md"
