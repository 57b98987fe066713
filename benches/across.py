#!/usr/bin/env python3
"""Each target of issue 6 across many runs: one row a results file, then,
for each target, in how many runs it was met and the median and range of
its figure.

    python3 benches/across.py FILE...

FILE is a results file of `benches/run.sh`. Each run's figures are the ones
`benches/summarize.py FILE` judges (its `verdicts`): the ratio over the
pairs of windows that were both clean where there are any, else over all
of them; an open-loop figure with no pair on the generator's schedule is
not judged ("-"). A figure that misses its target is marked `*`.

A single run on a shared 2-core VM can land on either side of a target
that sits near its line: its ratios move by a tenth between runs minutes
apart. This says how often each target was met, and where its figure
usually lies, over the runs given, so that a verdict does not rest on
whichever run came last.
"""

import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize import load, verdicts  # noqa: E402

# (column heading, a prefix of the figure's name in `verdicts`: the durable
# rows' names end in " (same server)" since run AH).
TARGETS = [
    ("RD/h", "RetryDelay / health throughput"),
    ("pure/h", "pure NextAction / health throughput"),
    ("h2 RD/h", "h2load: RetryDelay / health throughput"),
    ("h2 pure/h", "h2load: pure NextAction / health throughput"),
    ("cpu pure/h", "server capacity: pure NextAction / health"),
    ("p99 RD/h", "RetryDelay / health p99 at half saturation"),
    ("p99 pure/h", "pure NextAction / health p99 at half saturation"),
    ("dur/pure", "durable / pure NextAction"),
    ("cpu dur/pure", "server capacity: durable / pure NextAction"),
    ("gc/mb1", "durable group commit / max-batch 1"),
    ("1M/1k", "durable, big store / 1k store"),
    ("RSS MiB", "peak RSS, big store (MiB)"),
]


def run_name(path):
    """`runBD` from `2026-12-01-2core-intel-runBD.jsonl`; else the file name."""
    base = os.path.basename(path)
    m = re.search(r"run([A-Z]+)", base)
    return m.group(1) if m else base.removesuffix(".jsonl")


# The CPU family/model of the runs from before run.sh recorded them.
MACHINES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "machines.tsv")


def known_models(path=MACHINES):
    """run -> "family/model", from MACHINES (empty if it is missing)."""
    models = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    run, model = line.split("\t")[:2]
                    models[run] = model.strip()
    return models


def kind(machine, run=None, models=None):
    """The machine: its CPU's model name, then family/model from its record
    (run BF on) or, for an older run, from MACHINES."""
    if not machine:
        return "?"
    cpu = machine.get("cpu") or "?"
    cpu = cpu.replace("(R)", "").replace(" Processor", "").strip()
    if machine.get("cpu_family") not in (None, ""):
        cpu += f" {machine['cpu_family']}/{machine['cpu_model']}"
    elif run in (models or {}):
        cpu += f" {models[run]}"
    return cpu


def figure(row):
    """The judged figure of one verdict row, whether it met the target
    (both None when not judged), and the target's bound."""
    bound = row["bound"]
    if row.get("met") is None:
        return None, None, bound
    value = row.get("clean_ratio")
    if value is None:
        value = row.get("ratio")
    return value, row["met"], bound


def figures(path, models=None):
    """When the run began, its name, its machine, its commit and, for each
    of TARGETS, (figure, met, the target's bound)."""
    machine, runs, servers = load(path)
    rows = verdicts(runs, servers)
    out = {}
    for heading, name in TARGETS:
        match = [r for r in rows if r["what"].startswith(name)]
        out[heading] = figure(match[0]) if match else (None, None, None)
    date = (machine or {}).get("date", "")
    name = run_name(path)
    return date, name, kind(machine, name, models), (machine or {}).get("commit", "?"), out


def number(value, bound=None):
    """Two decimals (none from 100 up, nor for a figure in MiB), or more
    where two would round a ratio onto the other side of its target's bound
    (0.8996 against >= 0.9)."""
    if value >= 100 or (bound is not None and bound >= 100):
        return f"{value:.0f}"
    for digits in range(2, 6):
        text = f"{value:.{digits}f}"
        if bound is None or (float(text) >= bound) == (value >= bound):
            break
    return text


def cell(value, met, bound):
    if value is None:
        return "-"
    return number(value, bound) if met else number(value, bound) + "*"


def judged(results, heading, machine=None):
    """The (figure, met, bound) of one target in each run that judged it,
    on one machine or all."""
    return [figs[heading] for _, m, _, figs in results
            if (machine is None or m == machine) and figs[heading][0] is not None]


def median(found):
    """The median of `judged`'s figures, printed as `number` prints it."""
    return number(statistics.median([v for v, _, _ in found]), found[0][2])


def spread(found):
    """The lowest and highest of `judged`'s figures."""
    values = [v for v, _, _ in found]
    return f"{number(min(values), found[0][2])}-{number(max(values), found[0][2])}"


def met_count(found):
    return sum(1 for _, met, _ in found if met)


def report(paths):
    # In the order they ran.
    models = known_models()
    results = [r[1:] for r in sorted((figures(p, models) for p in paths), key=lambda r: r[:2])]
    lines = []
    width = max([len(machine) for _, machine, _, _ in results] + [7])
    label_width = 5 + width + 10

    def row(label, cells):
        lines.append(f"{label:<{label_width}}" + " ".join(f"{c:>12}" for c in cells))

    row(f"{'run':<5} {'machine':<{width}} {'commit':<8}", [h for h, _ in TARGETS])
    for name, machine, commit, figs in results:
        row(f"{name:<5} {machine:<{width}} {commit:<8}", [cell(*figs[h]) for h, _ in TARGETS])
    lines.append("")
    row("", [h for h, _ in TARGETS])
    all_runs = [judged(results, h) for h, _ in TARGETS]
    row("met in", [f"{met_count(j)} of {len(j)}" if j else "-" for j in all_runs])
    row("median", [median(j) if j else "-" for j in all_runs])
    row("range", [spread(j) if j else "-" for j in all_runs])
    kinds = sorted({machine for _, machine, _, _ in results})
    if len(kinds) > 1:
        lines.append("")
        lines.append("by machine: median (runs met / judged)")
        for machine in kinds:
            on_it = [judged(results, h, machine) for h, _ in TARGETS]
            row(machine, [f"{median(j)} ({met_count(j)}/{len(j)})" if j else "-" for j in on_it])
    return "\n".join(lines)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2 if len(argv) < 2 else 0
    print(report(argv[1:]))
    print()
    print("* missed its target; - not judged or not in the run. Targets: throughput ratios >= 0.9")
    print("(dur/pure >= 0.5, gc/mb1 >= 20, 1M/1k >= 0.8), p99 ratios <= 1.25, RSS < 256 MiB.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
