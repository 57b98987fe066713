#!/usr/bin/env python3
"""The storm lab's table and plot, from the runs benches/storm/run.sh wrote.

    python3 benches/storm/report.py benches/storm/results/runs --plot docs/storm.png

Prints one Markdown table per scenario: each figure is the median over the
seeds, with the range [min-max] when the seeds differ. With --plot, draws
goodput, dependency calls and queue length over time for the main scenario
(`drop`, the first seed), one line a policy.
"""

import argparse
import glob
import json
import os
import statistics

POLICIES = ["none", "naive", "backoff", "aws", "grpc", "finagle", "rb-default", "rb-low", "rb-ratio"]
SCENARIOS = ["drop", "flaky", "drop10", "drop1000", "restart"]


def load(directory):
    runs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def fmt(values, digits=1, pct=False):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    scale = 100.0 if pct else 1.0
    med = statistics.median(values) * scale
    lo, hi = min(values) * scale, max(values) * scale
    suffix = "%" if pct else ""
    if round(lo, digits) == round(hi, digits):
        return f"{med:.{digits}f}{suffix}"
    return f"{med:.{digits}f}{suffix} [{lo:.{digits}f}-{hi:.{digits}f}]"


def recovery(values):
    """Median recovery in seconds; 'never' counts as infinitely slow."""
    inf = float("inf")
    xs = [inf if v is None else v for v in values]
    med = statistics.median(xs)
    def show(x):
        return "never" if x == inf else f"{x:.0f}"
    text = show(med)
    if min(xs) != max(xs):
        text += f" [{show(min(xs))}-{show(max(xs))}]"
    return text


def first_back(run):
    """Seconds from the trigger's end to the first second whose goodput is
    back at 95% of the before mean (no hold): when recovery starts, robust to
    the arrivals' noise that can break the 10 s hold of `recovery_s`."""
    goodput = run["series"]["goodput"]
    start, end = int(run["trigger_end"]), len(goodput) - 1
    for s in range(start, end):
        if goodput[s] >= 0.95 * run["goodput_before"]:
            return float(s - start)
    return None


def table(runs, scenario):
    rows = [r for r in runs if r["scenario"] == scenario]
    if not rows:
        return ""
    flaky = scenario == "flaky"
    head = ["policy", "seeds", "goodput before/s", "during/s", "after/s"]
    if flaky:
        head += ["activities succeeded"]
    else:
        head += ["recovery s", "back s", "last 10 s/s", "queue max / at end"]
    head += ["calls/activity", "worst second", "wasted", "quiet during", "noisy during",
             "quiet after", "noisy after", "lag p99/max ms"]
    out = [f"### {scenario}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        if not rs:
            continue
        col = lambda k: [r.get(k) for r in rs]
        starved = sum(1 for r in rs if r.get("starved"))
        lag = f"{fmt(col('lag_p99_ms'))} / {fmt(col('lag_max_ms'), 0)}"
        if starved:
            lag += f" ({starved} starved)"
        cells = [policy, str(len(rs)), fmt(col("goodput_before")), fmt(col("goodput_during")),
                 fmt(col("goodput_after"))]
        if flaky:
            cells += [fmt(col("succeeded_share"), 1, pct=True)]
        else:
            cells += [recovery(col("recovery_s")), recovery([first_back(r) for r in rs]),
                      fmt(col("goodput_last10")),
                      f"{fmt(col('queue_max'), 0)} / {fmt(col('queue_end'), 0)}"]
        cells += [fmt(col("amplification"), 2), fmt(col("amplification_worst_second"), 2),
                  fmt(col("wasted_share"), 0, pct=True),
                  fmt(col("quiet_during"), 0, pct=True), fmt(col("noisy_during"), 0, pct=True),
                  fmt(col("quiet_after"), 0, pct=True), fmt(col("noisy_after"), 0, pct=True), lag]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot(runs, path, scenario="drop"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in runs if r["scenario"] == scenario]
    if not rows:
        return
    seed = min(r["seed"] for r in rows)
    rows = {r["policy"]: r for r in rows if r["seed"] == seed}
    first = next(iter(rows.values()))
    fig, axes = plt.subplots(3, 1, figsize=(11, 11), sharex=True)
    series = [("goodput", "activities succeeded / s"), ("calls", "dependency calls / s"),
              ("queue", "dependency queue (max in the second)")]
    styles = {"none": ("black", "-", 2.2), "naive": ("tab:red", "-", 1.4),
              "backoff": ("tab:orange", "-", 1.2), "aws": ("tab:brown", "--", 1.2),
              "grpc": ("tab:purple", "--", 1.2), "finagle": ("tab:pink", "--", 1.2),
              "rb-default": ("tab:blue", "-", 1.6), "rb-low": ("tab:green", "-", 1.6),
              "rb-ratio": ("tab:cyan", "-", 1.6)}
    end = len(first["series"]["goodput"]) - 1
    for ax, (key, label) in zip(axes, series):
        for policy in POLICIES:
            if policy not in rows:
                continue
            ys = rows[policy]["series"][key][:end]
            color, ls, lw = styles[policy]
            ax.plot(range(len(ys)), ys, label=policy, color=color, linestyle=ls, linewidth=lw)
        ax.axvspan(first["trigger_start"], first["trigger_end"], color="grey", alpha=0.15)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if key == "queue":
            ax.set_yscale("symlog", linthresh=10)
    axes[0].set_title(f"storm lab, {scenario}: C = {first['capacity']:.0f}/s, rho {first['rho']}, "
                      f"{first['workers']} workers, capacity at C/3 in the grey band (seed {seed})")
    axes[0].legend(ncol=3, fontsize=8)
    axes[-1].set_xlabel("seconds into the run")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def sweep(directory):
    runs = load(directory)
    out = ["| C | policy | trigger | recovery s | back s | last 10 s/s | queue max / at end | calls/activity "
           "| worst second | lag p99/max ms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["capacity"], r["policy"], r["trigger_end"] - r["trigger_start"], -r["trigger_capacity"])
    for r in sorted(runs, key=key):
        length = r["trigger_end"] - r["trigger_start"]
        rec = "never" if r["recovery_s"] is None else f"{r['recovery_s']:.0f}"
        back = first_back(r)
        back = "never" if back is None else f"{back:.0f}"
        out.append(f"| {r['capacity']:.0f} | {r['policy']} | {r['trigger_capacity']:.2f} C for {length:.0f} s | "
                   f"{rec} | {back} | {r['goodput_last10']:.1f} | {r['queue_max']} / {r['queue_end']} | "
                   f"{r['amplification']:.2f} | {r['amplification_worst_second']:.2f} | "
                   f"{r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.0f} |")
    print("\n".join(out))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="?")
    parser.add_argument("--plot")
    parser.add_argument("--sweep")
    args = parser.parse_args()
    if args.sweep:
        sweep(args.sweep)
        return
    runs = load(args.runs)
    for scenario in SCENARIOS:
        text = table(runs, scenario)
        if text:
            print(text)
    starved = [r for r in runs if r.get("starved")]
    print(f"{len(runs)} runs, {len(starved)} starved (lag p99 > 10 ms or max > 100 ms)")
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
