#!/usr/bin/env bash
# Shrinks corpus/<target>/ to the few inputs that reach the most code:
#   tests/fuzz/minimize.sh TARGET [FILES]   (FILES: at most 50 by default)
# libFuzzer's merge keeps every input that adds an edge (hundreds after a
# few minutes); this keeps its greedy cover instead: the input that adds the
# most edges, then the next, up to FILES. It prints what share of the
# merged corpus's edges they reach. Run from anywhere; needs python3.
set -euo pipefail
target=$1
keep=${2:-50}
cd "$(dirname "$0")/../.."
corpus="tests/fuzz/corpus/$target"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/merged"
# Edges only: hit counts, comparisons and values would keep near-duplicates.
cargo +nightly fuzz run --fuzz-dir tests/fuzz "$target" "$work/merged" "$corpus" -- \
  -merge=1 -use_counters=0 -use_cmp=0 -use_value_profile=0 \
  -merge_control_file="$work/control" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
python3 - "$work/control" "$corpus" "$keep" <<'PY'
import os, shutil, sys
control, corpus, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = open(control).read().splitlines()
count = int(lines[0])
files = lines[2 : 2 + count]
edges = {}
for line in lines[2 + count :]:
    fields = line.split()
    if fields and fields[0] == "COV":
        edges[int(fields[1])] = set(fields[2:])
everything = set().union(*edges.values())
chosen, reached = [], set()
while len(chosen) < keep:
    best = max(edges, key=lambda i: (len(edges[i] - reached), -os.path.getsize(files[i])))
    if not edges[best] - reached:
        break
    chosen.append(files[best])
    reached |= edges[best]
kept = os.path.join(os.path.dirname(control), "kept")
os.makedirs(kept)
for f in chosen:
    shutil.copy(f, kept)
shutil.rmtree(corpus)
shutil.move(kept, corpus)
print(f"{corpus}: {len(chosen)} inputs reach {len(reached)} of {len(everything)} edges")
PY
