#!/usr/bin/env python3
"""Each target of issue 6 across many runs: one row a run, then, for each
target, in how many runs it was met and the median and range of its figure,
overall and by kind of machine; and, with --costs, what a request costs the
server on each kind of machine.

    python3 benches/across.py FILE...                 the verdict table
    python3 benches/across.py --costs FILE...         the cost model by machine kind
    python3 benches/across.py --write OUT [--models TSV] RESULTS...
                                                      one summary row a run, to OUT

FILE is a results file of `benches/run.sh` or a summary written by
--write (one JSON line a run). `benches/results/summary.jsonl` holds the
runs BENCHMARKS.md's verdict is taken from; the results files it was
written from are in the repository's history (`git log --
benches/results`), so `python3 benches/across.py benches/results/summary.jsonl`
prints the table BENCHMARKS.md quotes, and a new run's results file can be
given beside it.

Each run's figures are the ones `benches/summarize.py FILE` judges (its
`verdicts`): the ratio over the pairs of windows that were both clean where
there are any, else over all of them; an open-loop figure with no pair on
the generator's schedule is not judged ("-"). A figure that misses its
target is marked `*`.

A single run on a shared 2-core VM can land on either side of a target
that sits near its line: its ratios move by a tenth between runs minutes
apart. This says how often each target was met, and where its figure
usually lies, over the runs given, so that a verdict does not rest on
whichever run came last.
"""

import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize import load, mean, verdicts  # noqa: E402

# (column heading, a prefix of the figure's name in `verdicts`: the durable
# rows' names end in " (same server)" in the newer results files).
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

# (column heading, group label, what): the server's CPU a request in the
# closed loops at 128 streams, mean of the reps, in us. "pure (dur)" is the
# pure NextAction window each group-commit server serves before its durable
# one; the durable decision is split by the server's threads.
COSTS = [
    ("health", "closed/health", None),
    ("pure", "closed/pure-next-action", None),
    ("pure (dur)", "durable/pure-next-action", None),
    ("durable", "durable/group-commit", None),
    ("worker", "durable/group-commit", "tokio-rt-worker"),
    ("writer", "durable/group-commit", "redb-writer"),
    ("checkpoint", "durable/group-commit", "redb-checkpoint"),
    ("1 fsync/dec", "durable/max-batch-1", None),
]


def run_name(path):
    """`BD` from `2026-12-01-2core-intel-runBD.jsonl`; else the file name."""
    base = os.path.basename(path)
    m = re.search(r"run([A-Z]+)", base)
    return m.group(1) if m else base.removesuffix(".jsonl")


def kind(machine, run=None, models=None):
    """The machine: its CPU's model name, then family/model from its record
    or, for a results file that did not record them, from `models`
    (run -> "family/model")."""
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


def costs(runs):
    """The COSTS of one results file's groups (None where a group or its
    thread split is missing), and the median flush of its fsync probes (ms)."""
    out = {}
    for heading, label, thread in COSTS:
        recs = [r for r in runs.get(label, []) if r.get("mode", "closed") == "closed"]
        if thread:
            value = mean([(r.get("server_thread_cpu_us_per_request") or {}).get(thread) for r in recs])
        else:
            value = mean([r.get("server_cpu_us_per_request") for r in recs])
        out[heading] = None if value is None else round(value, 3)
    flushes = [r["latency_us"]["p50"] / 1000 for r in runs.get("fsync", []) if "latency_us" in r]
    out["fsync ms"] = round(statistics.median(flushes), 4) if flushes else None
    return out


def summary_row(path, models=None):
    """One run's row: when it began, its name, machine and commit, each of
    TARGETS as [figure, met, bound], and its `costs`."""
    machine, runs, servers = load(path)
    rows = verdicts(runs, servers)
    targets = {}
    for heading, name in TARGETS:
        match = [r for r in rows if r["what"].startswith(name)]
        targets[heading] = list(figure(match[0])) if match else [None, None, None]
    name = run_name(path)
    return {
        "kind": "run",
        "date": (machine or {}).get("date", ""),
        "run": name,
        "machine": kind(machine, name, models),
        "commit": (machine or {}).get("commit", "?"),
        "targets": targets,
        "costs": costs(runs),
    }


def rows_of(path):
    """The rows of a summary written by --write, or the one row of a results
    file."""
    with open(path) as f:
        first = f.readline()
    if first.strip() and json.loads(first).get("kind") == "run":
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    return [summary_row(path)]


def all_rows(paths):
    """Every run's row, in the order they ran."""
    return sorted((row for p in paths for row in rows_of(p)), key=lambda r: (r["date"], r["run"]))


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


def judged(rows, heading, machine=None):
    """The (figure, met, bound) of one target in each run that judged it,
    on one machine or all."""
    return [tuple(r["targets"][heading]) for r in rows
            if (machine is None or r["machine"] == machine) and r["targets"][heading][0] is not None]


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
    rows = all_rows(paths)
    lines = []
    width = max([len(r["machine"]) for r in rows] + [7])
    label_width = 5 + width + 10

    def line(label, cells):
        lines.append(f"{label:<{label_width}}" + " ".join(f"{c:>12}" for c in cells))

    line(f"{'run':<5} {'machine':<{width}} {'commit':<8}", [h for h, _ in TARGETS])
    for r in rows:
        line(f"{r['run']:<5} {r['machine']:<{width}} {r['commit']:<8}",
             [cell(*r["targets"][h]) for h, _ in TARGETS])
    lines.append("")
    line("", [h for h, _ in TARGETS])
    every = [judged(rows, h) for h, _ in TARGETS]
    line("met in", [f"{met_count(j)} of {len(j)}" if j else "-" for j in every])
    line("median", [median(j) if j else "-" for j in every])
    line("range", [spread(j) if j else "-" for j in every])
    kinds = sorted({r["machine"] for r in rows})
    if len(kinds) > 1:
        lines.append("")
        lines.append("by machine: median (runs met / judged)")
        for machine in kinds:
            on_it = [judged(rows, h, machine) for h, _ in TARGETS]
            line(machine, [f"{median(j)} ({met_count(j)}/{len(j)})" if j else "-" for j in on_it])
    return "\n".join(lines)


def cost_report(paths):
    """By kind of machine: the runs, then the median over its runs of each
    of COSTS (us of server CPU a request), durable over pure on the same
    servers, and the median fsync probe (ms)."""
    rows = all_rows(paths)
    headings = [h for h, _, _ in COSTS] + ["dur/pure", "fsync ms"]
    width = max([len(r["machine"]) for r in rows] + [7])
    lines = [f"{'machine':<{width}} {'runs':>4} " + " ".join(f"{h:>11}" for h in headings)]
    for machine in sorted({r["machine"] for r in rows}):
        on_it = [r["costs"] for r in rows if r["machine"] == machine]
        cells = []
        for h in headings:
            if h == "dur/pure":
                values = [c["durable"] / c["pure (dur)"] for c in on_it if c.get("durable") and c.get("pure (dur)")]
            else:
                values = [c[h] for c in on_it if c.get(h) is not None]
            digits = 2 if h in ("dur/pure", "fsync ms") else 1
            cells.append(f"{statistics.median(values):.{digits}f}" if values else "-")
        lines.append(f"{machine:<{width}} {len(on_it):>4} " + " ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def known_models(path):
    """run -> "family/model" from a table of tab-separated lines (`#` starts
    a comment): for results files written before run.sh recorded them."""
    models = {}
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                run, model = line.split("\t")[:2]
                models[run] = model.strip()
    return models


def write(out, paths, models=None):
    """One summary row a results file, in the order they ran, to `out`."""
    rows = sorted((summary_row(p, models) for p in paths), key=lambda r: (r["date"], r["run"]))
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return len(rows)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2 if len(argv) < 2 else 0
    if argv[1] == "--write":
        out, paths, models = argv[2:3], argv[3:], None
        if paths[:1] == ["--models"]:
            models, paths = known_models(paths[1]), paths[2:]
        if not out or not paths:
            print(__doc__, file=sys.stderr)
            return 2
        print(f"{write(out[0], paths, models)} runs written to {out[0]}")
        return 0
    if argv[1] == "--costs":
        print(cost_report(argv[2:]))
        print()
        print("us of server CPU a request, closed loops at 128 streams, median of the runs; 'pure (dur)'")
        print("on the group-commit servers; durable split worker / writer / checkpoint threads;")
        print("'1 fsync/dec' with --max-batch 1; fsync ms: the median probe of a 4 KiB write and fsync.")
        return 0
    print(report(argv[1:]))
    print()
    print("* missed its target; - not judged or not in the run. Targets: throughput ratios >= 0.9")
    print("(dur/pure >= 0.5, gc/mb1 >= 20, 1M/1k >= 0.8), p99 ratios <= 1.25, RSS < 256 MiB.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
