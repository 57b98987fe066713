#!/usr/bin/env bash
# The storm lab of docs/storm.md: every policy in every scenario for a few
# seeds, each run a real-time ~71 s process (the retry-budget policies start
# the real server), then the table and the plot.
#
#   benches/storm/run.sh                     # the full lab: 3 seeds, about 3 h (long-outage apart)
#   SEEDS=1 SCENARIOS=drop benches/storm/run.sh   # one scenario, one seed
#   SCENARIOS=flaky POLICIES="none rb-default" benches/storm/run.sh
#   POLICIES="none rb-default rb-default/no-reports rb-default/records-only" benches/storm/run.sh
#     (rb-*/no-reports: workers that ask about failures only; /records-only:
#     RecordSuccess but no traffic reports)
#   OUT=benches/storm/results PLOT=docs/storm.png benches/storm/run.sh   # the committed lab
#   CAPACITY=500 TIMEOUT=1 OUT=target/storm-robust SCENARIOS="drop flaky" benches/storm/run.sh
#     (the robustness runs: another capacity and caller timeout)
#
# Results go to $OUT/runs/*.json (one run each; a run already there is not
# run again, so an interrupted lab resumes), the table to $OUT/table.md, the
# plot to $PLOT. By default OUT is target/storm, a folder of the rerun's own
# that git ignores, and PLOT is $OUT/storm.png: a rerun leaves the committed
# results (benches/storm/results) and docs/storm.png alone unless OUT and
# PLOT name them. Delete $OUT, or name another, to run everything again.
# PARALLEL runs at once (default 2): each run is light (C = 200 requests a
# second), and every run reports its own scheduler lag and whether it was
# starved, so a machine that did not keep up shows in the table.
set -euo pipefail
cd "$(dirname "$0")/../.."

SEEDS="${SEEDS:-1 2 3}"
SCENARIOS="${SCENARIOS:-drop two-deps flaky drop10 drop1000 restart service-restart}"
# rb-default is the adaptive per-dependency budget (the default since issue
# #52), rb-static100 the default before it; rb-static2 to rb-static40, with
# rb-low (10), sweep the static global rate.
POLICIES="${POLICIES:-none naive backoff aws grpc finagle rb-default rb-static100 rb-ratio rb-static2 rb-static5 rb-low rb-static20 rb-static40}"
PARALLEL="${PARALLEL:-2}"
CAPACITY="${CAPACITY:-200}"
# The caller's timeout T in seconds (the scenarios' 2 s unless set).
TIMEOUT="${TIMEOUT:-}"
TARGET="${CARGO_TARGET_DIR:-target}"
OUT="${OUT:-$TARGET/storm}"
PLOT="${PLOT:-$OUT/storm.png}"

# Two builds, not one: built together, the server would be compiled with the
# lab's tokio features and be another binary than the one users run.
# The server's commit, as the build sees it: every run records it, and the
# checkout may move on while the lab runs.
STORM_SERVER_COMMIT=$(git rev-parse --short=12 HEAD)
if [ -n "$(git status --porcelain -- src proto migrations Cargo.lock)" ]; then
  STORM_SERVER_COMMIT="$STORM_SERVER_COMMIT-dirty"
fi
export STORM_SERVER_COMMIT
cargo build --release --locked --bin retry-budget
cargo build --release --locked -p retry-budget-storm
mkdir -p "$OUT/runs"

jobs=()
for seed in $SEEDS; do
  for scenario in $SCENARIOS; do
    for policy in $POLICIES; do
      file="$OUT/runs/$scenario-$(echo "$policy" | tr / @)-$seed.json"
      [ -s "$file" ] || jobs+=("$seed $scenario $policy")
    done
  done
done
echo "storm lab: ${#jobs[@]} runs, $PARALLEL at a time"

if [ "${#jobs[@]}" -gt 0 ]; then
  printf '%s\n' "${jobs[@]}" | xargs -P "$PARALLEL" -L 1 sh -c '
    target=$1 out=$2 capacity=$3 timeout=$4 seed=$5 scenario=$6 policy=$7
    run="$out/runs/$scenario-$(echo "$policy" | tr / @)-$seed.json"
    # POLICY/no-reports and POLICY/records-only: what the workers tell the
    # service besides their failures (run.rs, Reports).
    case "$policy" in
      */no-reports) reports=none ;;
      */records-only) reports=records ;;
      *) reports=all ;;
    esac
    if "$target/release/retry-budget-storm" --seed "$seed" --scenario "$scenario" \
        --policy "${policy%%/*}" --reports "$reports" --capacity "$capacity" \
        ${timeout:+--timeout "$timeout"} >"$run.tmp"; then
      mv "$run.tmp" "$run"
      echo "done $scenario $policy seed $seed"
    else
      echo "FAILED $scenario $policy seed $seed" >&2
      rm -f "$run.tmp"
    fi' storm "$TARGET" "$OUT" "$CAPACITY" "$TIMEOUT" || true
fi

# The plot needs matplotlib: python3's if it has it, else a virtual
# environment of the lab's own under $TARGET, never an install into the
# Python in use.
py=python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  venv="$TARGET/storm-venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    echo "storm lab: installing matplotlib into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "matplotlib==3.11.2"
  fi
  py="$venv/bin/python"
fi
"$py" benches/storm/report.py "$OUT/runs" --plot "$PLOT" | tee "$OUT/table.md"
echo "storm lab: runs in $OUT/runs, table in $OUT/table.md, plot in $PLOT"
