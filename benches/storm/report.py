#!/usr/bin/env python3
"""The storm lab's table and plot, from the runs benches/storm/run.sh wrote.

    python3 benches/storm/report.py target/storm/runs --plot target/storm/storm.png
    python3 benches/storm/report.py benches/storm/results/runs --plot docs/storm.png   # the page's

Prints one Markdown table per scenario: each figure is the median over the
seeds, with the range [min-max] when the seeds differ; for `two-deps`, the
failing dependency A's figures and the healthy B's side by side; then, for
the retry-budget policies, what the service answered (deferrals by reason,
stops by code). With --plot, draws goodput, dependency calls and queue
length over time for the main scenario (`drop`, the first seed), one line a
policy, and beside it `two-deps`: A's and B's goodput and the adaptive
default's allowed retries a second.
"""

import argparse
import glob
import json
import os
import statistics
import sys

POLICIES = ["none", "naive", "backoff", "aws", "grpc", "finagle", "rb-default",
            "rb-default/no-reports", "rb-default/records-only", "rb-static100",
            "rb-ratio", "rb-static2", "rb-static5", "rb-low", "rb-static20", "rb-static40"]
SCENARIOS = ["drop", "two-deps", "flaky", "drop10", "drop1000", "restart", "service-restart"]
LONG = ["long-outage", "long-outage-down", "long-outage-restart"]
# The plot's lines: the sweep's other static rates would hide the rest.
PLOTTED = ["none", "naive", "backoff", "aws", "grpc", "finagle", "rb-default", "rb-static100",
           "rb-low", "rb-ratio"]
DEFER_REASONS = [("dependency_budget_exhausted", "dependency"), ("tenant_share_exhausted", "tenant share"),
                 ("global_capacity_exhausted", "global"), ("tenant_backlog_full", "tenant backlog")]
STOPS = [("deadline_exceeded", "deadline"), ("attempts_exhausted", "attempts"), ("lab_deadline", "lab deadline")]


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


def two_table(runs, scenario="two-deps"):
    rows = [r for r in runs if r["scenario"] == scenario]
    if not rows:
        return ""
    head = ["policy", "seeds", "A before/s", "A during/s", "A after/s", "A recovery s", "A back s",
            "A queue max / at end", "A calls/activity", "A succeeded", "B before/s",
            "B during mean/s", "B during min/s", "B after/s", "B succeeded", "B succeeded during",
            "B calls/activity", "lag p99/max ms"]
    out = [f"### {scenario}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        if not rs:
            continue
        col = lambda k: [r.get(k) for r in rs]
        bcol = lambda k: [r["healthy"].get(k) for r in rs]
        starved = sum(1 for r in rs if r.get("starved"))
        lag = f"{fmt(col('lag_p99_ms'))} / {fmt(col('lag_max_ms'), 0)}"
        if starved:
            lag += f" ({starved} starved)"
        cells = [policy, str(len(rs)), fmt(col("goodput_before")), fmt(col("goodput_during")),
                 fmt(col("goodput_after")), recovery(col("recovery_s")),
                 recovery([first_back(r) for r in rs]),
                 f"{fmt(col('queue_max'), 0)} / {fmt(col('queue_end'), 0)}",
                 fmt(col("amplification"), 2), fmt(col("succeeded_share"), 1, pct=True),
                 fmt(bcol("goodput_before")), fmt(bcol("goodput_during")),
                 fmt(bcol("goodput_during_min"), 0), fmt(bcol("goodput_after")),
                 fmt(bcol("succeeded_share"), 1, pct=True),
                 fmt(bcol("succeeded_share_during"), 1, pct=True),
                 fmt(bcol("amplification"), 2), lag]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def answers_table(runs, scenario):
    """What the service answered the retry-budget policies: deferrals by
    reason and stops by code, per dependency, summed over a run (median over
    the seeds)."""
    rows = [r for r in runs if r["scenario"] == scenario and r["policy"].startswith("rb-")]
    if not rows:
        return ""
    deps = [("", lambda r: r)]
    if any(r.get("healthy") for r in rows):
        deps = [("A ", lambda r: r), ("B ", lambda r: r["healthy"])]
    head = ["policy"]
    for prefix, _ in deps:
        head += [f"{prefix}deferred: {name}" for _, name in DEFER_REASONS]
        head += [f"{prefix}stops: {name}" for _, name in STOPS]
    out = [f"### {scenario}: the service's answers", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        if not rs:
            continue
        cells = [policy]
        for _, get in deps:
            cells += [fmt([get(r).get("deferral_reasons", {}).get(k, 0) for r in rs], 0)
                      for k, _ in DEFER_REASONS]
            cells += [fmt([get(r).get("stops", {}).get(k, 0) for r in rs], 0) for k, _ in STOPS]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


STYLES = {"none": ("black", "-", 2.2), "naive": ("tab:red", "-", 1.4),
          "backoff": ("tab:orange", "-", 1.2), "aws": ("tab:brown", "--", 1.2),
          "grpc": ("tab:purple", "--", 1.2), "finagle": ("tab:pink", "--", 1.2),
          "rb-default": ("tab:blue", "-", 2.0), "rb-static100": ("tab:gray", "-", 1.4),
          "rb-low": ("tab:green", "-", 1.6), "rb-ratio": ("tab:cyan", "-", 1.6)}


def first_seed(runs, scenario):
    rows = [r for r in runs if r["scenario"] == scenario]
    if not rows:
        return None, {}
    seed = min(r["seed"] for r in rows)
    return seed, {r["policy"]: r for r in rows if r["seed"] == seed}


def trailing(ys, window=5):
    """The mean of the `window` seconds ending at each second: B's 2 to 5%
    differences are smaller than its per-second Poisson noise."""
    return [sum(ys[max(0, i + 1 - window):i + 1]) / len(ys[max(0, i + 1 - window):i + 1])
            for i in range(len(ys))]


def draw(ax, rows, get, first, label):
    end = len(first["series"]["goodput"]) - 1
    for policy in PLOTTED:
        if policy not in rows:
            continue
        ys = get(rows[policy])[:end]
        color, ls, lw = STYLES[policy]
        ax.plot(range(len(ys)), ys, label=policy, color=color, linestyle=ls, linewidth=lw)
    ax.axvspan(first["trigger_start"], first["trigger_end"], color="grey", alpha=0.15)
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)


def plot(runs, path):
    try:
        import matplotlib
    except ImportError:
        sys.exit("report.py: --plot needs matplotlib, which this Python lacks; benches/storm/run.sh "
                 "makes a virtual environment with it (target/storm-venv), or: python3 -m venv v && "
                 "v/bin/pip install matplotlib==3.11.2, then run this with v/bin/python")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed, rows = first_seed(runs, "drop")
    two_seed, two = first_seed(runs, "two-deps")
    if not rows:
        return
    cols = 2 if two else 1
    fig, axes = plt.subplots(3, cols, figsize=(11 * cols, 11), sharex=True, squeeze=False)
    first = next(iter(rows.values()))
    series = [("goodput", "activities succeeded / s"), ("calls", "dependency calls / s"),
              ("queue", "dependency queue (max in the second)")]
    for ax, (key, label) in zip(axes[:, 0], series):
        draw(ax, rows, lambda r, key=key: r["series"][key], first, label)
        if key == "queue":
            ax.set_yscale("symlog", linthresh=10)
    axes[0, 0].set_title(f"drop: C = {first['capacity']:.0f}/s, rho {first['rho']}, "
                         f"{first['workers']} workers, capacity at C/3 in the grey band (seed {seed})")
    axes[0, 0].legend(ncol=3, fontsize=8)
    axes[-1, 0].set_xlabel("seconds into the run")
    if two:
        first = next(iter(two.values()))
        draw(axes[0, 1], two, lambda r: r["series"]["goodput"], first, "A: activities succeeded / s")
        draw(axes[1, 1], two, lambda r: trailing(r["healthy"]["series"]["goodput"]), first,
             "B: activities succeeded / s (5 s mean)")
        axes[0, 1].set_title(f"two-deps: A as in drop, B healthy beside it (C = "
                             f"{first['healthy_setup']['capacity']:.0f}/s, rho "
                             f"{first['healthy_setup']['rho']}, "
                             f"{first['healthy_setup']['fail_probability']:.0%} failing) (seed {two_seed})")
        ax = axes[2, 1]
        for policy, key, label, ls in [("rb-default", None, "A", "-"),
                                         ("rb-default", "healthy", "B", "--")]:
            if policy not in two:
                continue
            r = two[policy] if key is None else two[policy][key]
            ys = [float("nan") if y is None else y for y in r["series"]["allowed_rate"]]
            ax.plot(range(len(ys)), ys, label=f"{policy}: {label}", color="tab:blue", linestyle=ls)
        ax.axvspan(first["trigger_start"], first["trigger_end"], color="grey", alpha=0.15)
        ax.set_ylabel("rb-default: retries/s allowed")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_xlabel("seconds into the run")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def backlog_table(runs, scenario):
    """The long outages: the backlog at the return of capacity and how it
    drained (benches/storm/src/backlog.rs), per policy."""
    rows = [r for r in runs if r["scenario"] == scenario and r.get("backlog")]
    if not rows:
        return ""
    head = ["policy", "seeds", "backlog", "limit s", "drain s", "drain / limit", "done 60 s",
            "done 180 s", "given up", "longest wait s", "out of order", "queue peak outage / after",
            "outage arrivals succeeded", "calls/activity", "lag p99/max ms"]
    out = [f"### {scenario}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        if not rs:
            continue
        b = lambda k: [r["backlog"].get(k) for r in rs]
        drain = ["never" if d is None else f"{d:.0f}" for d in b("drain_s")]
        order = [f"{r['backlog']['order_out_of_order']} of {r['backlog']['order_pairs']}" for r in rs]
        cells = [policy, str(len(rs)), fmt(b("backlog"), 0), fmt(b("limit_s"), 0),
                 "/".join(drain), fmt(b("drain_over_limit"), 2),
                 fmt(b("done_60"), 1, pct=True), fmt(b("done_180"), 1, pct=True),
                 fmt(b("given_up"), 0), fmt(b("longest_wait_s"), 0), "; ".join(order),
                 f"{fmt(b('queue_peak_outage'), 0)} / {fmt(b('queue_max_after'), 0)}",
                 fmt([r.get("succeeded_share_during") for r in rs], 1, pct=True),
                 fmt([r.get("amplification") for r in rs], 2),
                 f"{fmt([r.get('lag_p99_ms') for r in rs])} / {fmt([r.get('lag_max_ms') for r in rs], 0)}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def margins(runs):
    """Each retry-budget policy against no retries, seed by seed: how much
    later the goodput is first back (`back`) and back to hold for 10 s
    (`recovery_s`) than under `none` in the same scenario and seed; for
    `flaky`, the share of activities done and the calls an activity."""
    out = ["| scenario | policy | seeds | back - none s | held - none s | done | calls/activity |",
           "|---|---|---|---|---|---|---|"]
    for scenario in SCENARIOS:
        rows = [r for r in runs if r["scenario"] == scenario]
        none = {r["seed"]: r for r in rows if r["policy"] == "none"}
        for policy in POLICIES:
            rs = [r for r in rows if r["policy"] == policy and policy.startswith("rb-")]
            if not rs:
                continue
            back, held = [], []
            for r in rs:
                base = none.get(r["seed"])
                if base is None or scenario == "flaky":
                    continue
                b0, b1 = first_back(base), first_back(r)
                back.append(None if b0 is None or b1 is None else b1 - b0)
                h0, h1 = base["recovery_s"], r["recovery_s"]
                held.append(None if h0 is None or h1 is None else h1 - h0)
            never = lambda xs: "never" if xs and all(x is None for x in xs) else fmt(xs, 0)
            out.append(f"| {scenario} | {policy} | {len(rs)} | {never(back)} | {never(held)} | "
                       f"{fmt([r.get('succeeded_share') for r in rs], 1, pct=True)} | "
                       f"{fmt([r.get('amplification') for r in rs], 2)} |")
    commits = sorted({r.get("server_commit") for r in runs if r.get("server_commit")})
    out.append("")
    out.append(f"servers: {', '.join(commits) if commits else 'commit not recorded'}")
    return "\n".join(out) + "\n"


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
        text = two_table(runs, scenario) if scenario == "two-deps" else table(runs, scenario)
        if text:
            print(text)
        text = answers_table(runs, scenario)
        if text:
            print(text)
    for scenario in LONG:
        text = backlog_table(runs, scenario)
        if text:
            print(text)
    print("### against no retries, seed by seed\n")
    print(margins(runs))
    starved = [r for r in runs if r.get("starved")]
    print(f"{len(runs)} runs, {len(starved)} starved (lag p99 > 10 ms or max > 100 ms)")
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
