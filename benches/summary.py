#!/usr/bin/env python3
"""The figures of BENCHMARKS.md from the results of the bench scripts.

    summary.py run RESULTS.jsonl           one benches/run.sh run: each target's ratio, by group
    summary.py line < RESULTS.jsonl        a line of progress from the last window
    summary.py pg RESULTS.jsonl            the PostgreSQL targets of one benches/pg.sh run
    summary.py soak DIR                    one benches/soak.sh run (writes DIR/summary.json)
    summary.py cpu --after S --window S [--pid NAME=PID ...] [--comm NAME=COMM ...]
                                           cores each side used in a window, one JSON line

A ratio pairs the i-th window of one label with the i-th of another (the scripts alternate
A/B/A/B), and is judged over the "clean" pairs where there are any: other work on the
machine at most NOISY_CORES of a core and, in an open loop, the generator's own p99
lateness at most LATE_SENDS_US. An open-loop figure with no pair on schedule is not judged.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

NOISY_CORES = 0.25
# The p99s compared at half saturation are 300 to 560 us where the generator
# kept its schedule, and the target allows a quarter more, about 100 us;
# windows whose pacer was 293 and 374 us late at p99 measured 2.0 and 2.7 ms.
LATE_SENDS_US = 100
MIB = 1024


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def fmt(x, digits=2):
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"


# --- one run of run.sh ----------------------------------------------------------------


def load(path):
    """The machine record, and the windows and the server records by label."""
    machine, runs, servers = None, defaultdict(list), defaultdict(list)
    for rec in records(path):
        kind = rec.get("kind")
        if kind == "machine":
            machine = rec
        elif kind == "server":
            servers[rec["label"]].append(rec)
        elif kind != "summary":
            runs[rec.get("label", "")].append(rec)
    return machine, runs, servers


def capacity(rec):
    """Requests a second one core of the server could serve at this cost."""
    cost = rec.get("server_cpu_us_per_request")
    return 1e6 / cost if cost else None


def generator_lag(rec):
    """The generator's own p99 lateness in an open loop."""
    return (rec.get("pacer_lag_us") or {}).get("p99")


def on_schedule(rec):
    lag = generator_lag(rec)
    return rec.get("mode") != "open" or lag is None or lag <= LATE_SENDS_US


def clean(rec):
    return (rec.get("other_busy_cores") or 0.0) <= NOISY_CORES and on_schedule(rec)


def noisy_groups(runs):
    """(label, other work, of it steal) of the groups whose mean other work is over NOISY_CORES."""
    means = [(label, mean([r.get("other_busy_cores") for r in recs]), mean([r.get("steal_cores") for r in recs]))
             for label, recs in sorted(runs.items())]
    return [m for m in means if (m[1] or 0) > NOISY_CORES]


def noisy_label(label, other, steal):
    return label if steal is None else f"{label} ({fmt(other)} of a core, {fmt(steal)} of it stolen by the host)"


THROUGHPUT, P99 = (lambda r: r.get("throughput_rps")), (lambda r: r.get("latency_us", {}).get("p99"))
# (figure, group A, group B, metric, op, bound): A / B against its target. Durable is judged
# against the pure window on the same server just before it (run.sh's (4)); server capacity,
# by the server's CPU a request, holds whichever side was saturated.
TARGETS = [
    ("RetryDelay / health throughput", "closed/retry-delay", "closed/health", THROUGHPUT, ">=", 0.90),
    ("pure NextAction / health throughput", "closed/pure-next-action", "closed/health", THROUGHPUT, ">=", 0.90),
    ("RetryDelay / health p99 at half saturation", "open/retry-delay", "open/health", P99, "<=", 1.25),
    ("pure NextAction / health p99 at half saturation", "open/pure-next-action", "open/health", P99, "<=", 1.25),
    ("durable / pure NextAction (same server) throughput", "durable/group-commit", "durable/pure-next-action",
     THROUGHPUT, ">=", 0.5),
    ("durable group commit / max-batch 1", "durable/group-commit", "durable/max-batch-1", THROUGHPUT, ">=", 20),
    ("durable, big store / 1k store", "durable/stored-big", "durable/stored-1k", THROUGHPUT, ">=", 0.8),
    ("server capacity: RetryDelay / health", "closed/retry-delay", "closed/health", capacity, ">=", 0.90),
    ("server capacity: pure NextAction / health", "closed/pure-next-action", "closed/health", capacity, ">=", 0.90),
    ("server capacity: durable / pure NextAction (same server)", "durable/group-commit", "durable/pure-next-action",
     capacity, ">=", 0.5),
]


def verdicts(runs, servers):
    """Each target as a dict: the ratio of the means, the per-pair ratios, the ratio over
    the clean pairs, and `met` (None when not judged)."""
    rows = []
    for what, a, b, metric, op, bound in TARGETS:
        ra, rb = runs.get(a, []), runs.get(b, [])
        va, vb = [metric(r) for r in ra], [metric(r) for r in rb]
        ma, mb = mean(va), mean(vb)
        whole = ma / mb if ma is not None and mb else None
        pairs = [x / y for x, y in zip(va, vb) if x is not None and y]
        kept = [(x, y) for x, y, p, q in zip(va, vb, ra, rb) if x is not None and y and clean(p) and clean(q)]
        clean_ratio = mean([x for x, _ in kept]) / mean([y for _, y in kept]) if kept else None
        judged = clean_ratio if clean_ratio is not None else whole
        if clean_ratio is None and not all(on_schedule(r) for r in ra + rb):
            judged = None
        met = None if judged is None else (judged >= bound if op == ">=" else judged <= bound)
        spread = f"{fmt(min(pairs))}-{fmt(max(pairs))}" if pairs else "n/a"
        rows.append({"what": what, "a_mean": ma, "b_mean": mb, "ratio": whole, "clean_ratio": clean_ratio,
                     "pair_ratios": pairs, "target": f"{op} {bound}", "bound": bound, "met": met,
                     "spread": spread})
    hwm = [h for h in (s.get("vm_hwm_kib") for s in servers.get("durable/stored-big", [])) if h]
    rss = max(hwm) / MIB if hwm else None
    rows.append({"what": "peak RSS, big store (MiB)", "ratio": rss, "target": "< 256", "bound": 256,
                 "met": rss < 256 if rss is not None else None,
                 "spread": ", ".join(fmt(h / MIB, 0) for h in hwm) or "n/a"})
    return rows


def progress(r):
    """One line of progress from a loadgen window."""
    lat = r.get("latency_us", {})
    text = f"{r['throughput_rps']:,.0f} req/s, p50 {lat.get('p50')} us, p99 {lat.get('p99')} us, errors {r['errors']}"
    if "mean_attempt" in r:
        text += f", mean attempt {r['mean_attempt']:.1f}"
    cores = {"server": r.get("server_cpu_cores"), "postgres": (r.get("cores") or {}).get("postgres"),
             "generator": r.get("client_cpu_cores"), "other": r.get("other_busy_cores"), "steal": r.get("steal_cores")}
    return text + "; cores: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items() if v is not None)


def run_report(path):
    machine, runs, servers = load(path)
    if machine:
        print(f"\ndate {machine.get('date')}  machine: {machine.get('nproc')} cores, {machine.get('cpu')}  "
              f"commit {machine.get('commit')}  quick={machine.get('quick')}  pinned={machine.get('pinned')}  "
              f"nice={machine.get('nice', 0)}")
    print(f"results: {path}\n\nA/B is the ratio of the means over all reps; 'clean' over the pairs of reps during "
          f"which\nother work used at most {NOISY_CORES} of a core and, in open loops, the generator's own p99\n"
          f"lateness was at most {LATE_SENDS_US} us (the verdict uses it when there is one).")
    print(f"{'figure':<52} {'A':>10} {'B':>10} {'A/B':>6} {'clean':>6} {'per rep':>11} {'target':>8}  met")
    for r in verdicts(runs, servers):
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        print(f"{r['what']:<52} {fmt(r.get('a_mean')):>10} {fmt(r.get('b_mean')):>10} "
              f"{fmt(r['ratio']):>6} {fmt(r.get('clean_ratio')):>6} {r['spread']:>11} {r['target']:>8}  {met}")
    print("\nby group, mean of the reps: throughput (req/s), latency (us), CPU (cores: the server, the generator,\n"
          "other work on the machine, and of it the host's steal), server CPU a request (us), server\n"
          "run-queue wait (ms in the window), and which side was saturated:")
    print(f"  {'group':<26} {'runs':>4} {'req/s':>9} {'p50':>7} {'p99':>7} {'p99.9':>7} {'server':>6} "
          f"{'gen':>5} {'other':>5} {'steal':>5} {'us/req':>6} {'wait':>5} {'bound':>9} {'errors':>6}")
    for label in sorted(runs):
        recs = [r for r in runs[label] if "throughput_rps" in r]
        if not recs:
            continue
        avg = lambda key: mean([r.get(key) for r in recs])  # noqa: E731
        lat = lambda q: fmt(mean([r.get("latency_us", {}).get(q) for r in recs]), 0)  # noqa: E731
        server, client = avg("server_cpu_cores"), avg("client_cpu_cores")
        # An open loop spins between sends: only closed loops say who was saturated.
        bound = "-"
        if not any(r.get("mode") == "open" for r in recs):
            bound = "server" if (server or 0) >= 0.95 else "generator" if (client or 0) >= 0.95 else "-"
        print(f"  {label:<26} {len(recs):>4} {fmt(avg('throughput_rps')):>9} {lat('p50'):>7} {lat('p99'):>7} "
              f"{lat('p999'):>7} {fmt(server):>6} {fmt(client):>5} {fmt(avg('other_busy_cores')):>5} "
              f"{fmt(avg('steal_cores')):>5} {fmt(avg('server_cpu_us_per_request'), 1):>6} "
              f"{fmt(avg('server_runqueue_wait_ms'), 0):>5} {bound:>9} {sum(r.get('errors') or 0 for r in recs):>6}")
    if noisy := noisy_groups(runs):
        print(f"\nWARNING: other work used more than {NOISY_CORES} of a core during: "
              f"{', '.join(noisy_label(*n) for n in noisy)}; their figures (and ratios using them) are not clean.")
    late = [f"{label} rep {i + 1} (generator lag p99 {fmt(generator_lag(r), 0)} us)"
            for label, recs in sorted(runs.items())
            for i, r in enumerate(x for x in recs if "throughput_rps" in x) if not on_schedule(r)]
    if late:
        print(f"\nNot judged, the generator fell behind its schedule: {'; '.join(late)}.")
    print("\ndecisions per fsync (saves / commits, whole server lifetime incl. warm-up):")
    for label, recs in sorted(servers.items()):
        if commits := sum(r.get("commits") or 0 for r in recs):
            print(f"  {label:<28} {sum(r.get('saves') or 0 for r in recs) / commits:8.1f}")
    for key, text in (("latency_us", "fsync of 4 KiB on the data dir's disk, median"),
                      ("overwrite_latency_us", "same, written over blocks the file has (fdatasync), median")):
        if values := [fmt(r[key]["p50"] / 1000) for r in runs.get("fsync", []) if key in r]:
            print(f"{text}: {', '.join(values)} ms")
    if stored := {r.get("label"): r.get("activities") for rs in runs.values() for r in rs
                  if r.get("scenario") == "preload"}:
        print("preloaded: " + ", ".join(f"{k} = {v:,}" for k, v in sorted(stored.items())))


# --- PostgreSQL (pg.sh) -----------------------------------------------------------------

SERVICE_VS_PGBENCH = 1.5
BIG_VS_SMALL = 0.8


def per_unit(row, rate):
    """Microseconds of CPU a unit of work on each side; the generator's own figure
    (client_cpu_cores, over its exact window) stands for it."""
    cores = dict(row["cores"])
    if "client_cpu_cores" in row:
        cores["loadgen"] = row["client_cpu_cores"]
    named = [k for k in cores if k not in ("busy", "seconds", "other")]
    cores["other"] = cores["busy"] - sum(cores[k] for k in named)
    return {k: cores[k] * 1e6 / rate for k in named + ["other", "busy"]}


def pgbench_rounds(rows):
    """Each round's service window, its best pgbench, and their ratio."""
    rounds = []
    for i, s in enumerate((r for r in rows if r.get("label") == "pg/durable"), 1):
        sweep = [r for r in rows if r.get("kind") == "pgbench" and r["round"] == i and r["tps"]]
        if sweep:
            best = max(sweep, key=lambda r: r["tps"])
            rounds.append({"service": s, "best": best, "ratio": s["throughput_rps"] / best["tps"]})
    return rounds


def stored_pairs(rows, prefix):
    """(small, big, ratio) for each big-store window and the small one just before it."""
    pairs, small = [], None
    for r in rows:
        if r.get("label") == f"{prefix}/stored-small":
            small = r
        elif r.get("label") == f"{prefix}/stored-big" and small is not None:
            pairs.append((small, r, r["throughput_rps"] / small["throughput_rps"]))
            small = None
    return pairs


def verdict(ratios, bound):
    if not ratios:
        return "not measured"
    m = statistics.median(ratios)
    return f"median {m:.2f} ({'met' if m >= bound else 'MISSED'}, target >= {bound})"


def split_text(u):
    keys = [k for k in ("server", "postgres", "loadgen", "pgbench", "other") if k in u]
    return ", ".join(f"{k} {u[k]:.1f}" for k in keys) + f"; machine {u['busy']:.1f} us"


def pg_report(rows):
    lines = []
    rounds = pgbench_rounds(rows)
    if rounds:
        lines.append("service / best pgbench (one single-row upsert a transaction):")
        for i, r in enumerate(rounds, 1):
            s, b = r["service"], r["best"]
            lines.append(f"  round {i}: {s['throughput_rps']:,.0f} decisions/s / {b['tps']:,.0f} tps "
                         f"(-c {b['clients']}) = {r['ratio']:.2f}")
            sweep = [x for x in rows if x.get("kind") == "pgbench" and x["round"] == i]
            lines.append("    pgbench by clients: " + ", ".join(f"{x['clients']}: {x['tps'] or 0:,.0f}" for x in sweep))
        lines.append("  " + verdict([r["ratio"] for r in rounds], SERVICE_VS_PGBENCH))
        s, b = rounds[0]["service"], rounds[0]["best"]
        if s.get("cores"):
            lines.append("  CPU a decision (us): " + split_text(per_unit(s, s["throughput_rps"])))
        if b.get("cores"):
            lines.append("  CPU a pgbench transaction (us): " + split_text(per_unit(b, b["tps"])))
    for prefix, name in (("pg", "PostgreSQL"), ("embedded", "embedded")):
        pairs = stored_pairs(rows, prefix)
        if not pairs:
            continue
        lines.append(f"{name}: {pairs[0][1].get('stored_activities'):,} / {pairs[0][0].get('stored_activities'):,}"
                     " stored activities (uniform next attempts):")
        for small, big, ratio in pairs:
            lines.append(f"  {big['throughput_rps']:,.0f} / {small['throughput_rps']:,.0f} decisions/s = {ratio:.2f}"
                         f" (mean attempt {big.get('mean_attempt', 0):.1f} / {small.get('mean_attempt', 0):.1f};"
                         f" errors {big['errors']} / {small['errors']})")
        lines.append("  " + verdict([p[2] for p in pairs], BIG_VS_SMALL))
        for label, r in (("small", pairs[0][0]), ("big", pairs[0][1])):
            if r.get("cores"):
                lines.append(f"  CPU a decision, {label} (us): " + split_text(per_unit(r, r["throughput_rps"])))
    for r in rows:
        if r.get("scenario") == "preload":
            lines.append(f"{r['label']}: {r['activities']:,} activities in {r['seconds']:.0f} s, "
                         f"{r['activities_per_s']:,.0f}/s")
    return "\n".join(lines)


def cpu_split(args):
    """Sleeps --after, reads utime + stime of each named process (--pid NAME=PID, --comm
    NAME=COMM: every process of that command) and the machine's busy time (steal left out),
    sleeps --window and reads again; prints cores (1.0 = one core throughout) by name,
    "busy" and "other" (busy less the names)."""
    def ticks(pid):
        try:  # the command, in brackets, may hold spaces
            rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(rest[11]) + int(rest[12])
        except (OSError, IndexError, ValueError):
            return None

    def comm(pid):
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return None

    def busy():
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields[:8]) - fields[3] - fields[4] - fields[7]  # less idle, iowait, steal

    def snapshot():
        return time.monotonic(), busy(), {name: {pid: ticks(pid) for pid in pids} for name, pids in groups.items()}

    time.sleep(args.after)
    groups = {name: [int(pid)] for name, _, pid in (s.partition("=") for s in args.pid)}
    pids = [int(p) for p in filter(str.isdigit, os.listdir("/proc"))]
    groups.update({name: [p for p in pids if comm(p) == c] for name, _, c in (s.partition("=") for s in args.comm)})
    t0, b0, s0 = snapshot()
    time.sleep(args.window)
    t1, b1, s1 = snapshot()
    seconds, hz = t1 - t0, os.sysconf("SC_CLK_TCK")
    out = {name: sum(s1[name][p] - t for p, t in before.items() if t is not None and s1[name].get(p) is not None)
           / hz / seconds for name, before in s0.items()}
    out["busy"] = (b1 - b0) / hz / seconds
    out["other"] = out["busy"] - sum(v for k, v in out.items() if k != "busy")
    out["seconds"] = seconds
    print(json.dumps(out))


# --- the soak (soak.sh) -----------------------------------------------------------------

SOAK_WARMUP_S = 120
SOAK_FLAT = 0.10
SAMPLE = re.compile(r'^(retry_budget_[a-z_]+)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_scrape(text):
    """{(name, frozenset(labels)): value} of a /metrics scrape."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[(m.group(1), frozenset(LABEL.findall(m.group(2) or "")))] = float(m.group(3))
    return out


def total(scrape, name, **want):
    return sum(v for (n, labels), v in scrape.items() if n == name and all(kv in labels for kv in want.items()))


def soak_report(out):
    """Per minute the rate, latencies (from due and from send times), errors, the generator's
    lag and the RSS; the mix; the verdict (RSS at the end within 10% of its value after the
    2-minute warm-up, no error). Writes summary.json; 1 if it fails."""
    out = Path(out)
    run = json.loads((out / "run.json").read_text())
    minutes = records(out / "minutes.jsonl")
    rss = [(int(t), float(r), float(h)) for t, r, h in
           (line.split("\t") for line in (out / "rss.tsv").read_text().splitlines()[1:])]

    def rss_at(t):
        before = [r for s, r, _ in rss if s <= t]
        return before[-1] if before else None

    print(f"saturation (closed loop, {run['concurrency']} streams): {run['saturation_rps']:.0f} requests/s; "
          f"soak at {run['rate']}/s open loop, retry rate {run['retry_rate']}/s, "
          f"{run['tenants']} tenants, {run['attempts']} failures then a success an activity; {run['cpu']}\n")
    print("| minute | requests/s | p50 us | p99 us | p99 from send us | max us | errors | generator lag p99 us "
          "| generator run-queue wait s | machine busy cores | server CPU cores | RSS MiB at end |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    errors = 0
    for i, m in enumerate(minutes, 1):
        errors += m["errors"]
        lat, wait = m["latency_us"], m.get("client_runqueue_wait_ms")
        print(f"| {i} | {m['throughput_rps']:.0f} | {lat['p50']} | {lat['p99']} | "
              f"{m.get('latency_from_send_us', {}).get('p99', '-')} | {lat['max']} | {m['errors']}"
              f"{' ' + json.dumps(m['error_codes']) if m['errors'] else ''} | {m.get('pacer_lag_us', {}).get('p99')} | "
              f"{'-' if wait is None else f'{wait / 1000:.1f}'} | {m.get('system_busy_cores') or 0:.2f} | "
              f"{m.get('server_cpu_cores') or 0:.2f} | {rss_at(i * 60)} |")
    final = parse_scrape((out / "final-metrics.txt").read_text())
    mix = {
        "retries granted": total(final, "retry_budget_decisions_total", action="ACTION_SCHEDULE_RETRY"),
        "deferrals": total(final, "retry_budget_decisions_total", action="ACTION_DEFERRED"),
        "successes": total(final, "retry_budget_rpc_calls_total", method="RecordSuccess", code="OK"),
        "refusals": total(final, "retry_budget_rpc_refusals_total"),
        "store saves": total(final, "retry_budget_store_saves_total"),
        "tenants tracked": total(final, "retry_budget_bucket_tracked_tenants"),
    }
    reasons = {dict(labels)["reason"]: v for (n, labels), v in final.items() if n == "retry_budget_deferrals_total"}
    print("mix (server counters):", ", ".join(f"{k} {v:,.0f}" for k, v in mix.items()),
          "; deferrals by reason:", ", ".join(f"{k} {v:,.0f}" for k, v in sorted(reasons.items())))
    warm, load_end = rss_at(SOAK_WARMUP_S), len(minutes) * 60
    end = rss_at(load_end)  # the last sample under load, not the idle one after
    after = [r for s, r, _ in rss if SOAK_WARMUP_S <= s <= load_end]
    ok = warm is not None and end is not None and abs(end - warm) <= SOAK_FLAT * warm and errors == 0
    p99s = [m["latency_us"]["p99"] for m in minutes]
    print(f"\nRSS after warm-up ({SOAK_WARMUP_S} s) {warm} MiB, at the end {end} MiB "
          f"({(end - warm) / warm * 100:+.1f}%), {min(after, default=0)} to {max(after, default=0)} MiB after warm-up; "
          f"peak (VmHWM) {rss[-1][2] if rss else None} MiB; errors {errors}; "
          f"p99 by minute {min(p99s, default=0)} to {max(p99s, default=0)} us: {'PASS' if ok else 'FAIL'}")
    summary = {**run, "minutes_p99_us": p99s, "minutes_rps": [round(m["throughput_rps"]) for m in minutes],
               "rss_after_warmup_mib": warm, "rss_end_mib": end,
               "rss_max_after_warmup_mib": max(after, default=None), "errors": errors, "mix": mix,
               "deferral_reasons": reasons, "pass": ok}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if ok else 1


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("results")
    sub.add_parser("line", help="progress from the last of the JSON lines on stdin")
    sub.add_parser("pg").add_argument("results")
    sub.add_parser("soak").add_argument("dir")
    c = sub.add_parser("cpu")
    c.add_argument("--after", type=float, default=0.0)
    c.add_argument("--window", type=float, required=True)
    c.add_argument("--pid", action="append", default=[])
    c.add_argument("--comm", action="append", default=[])
    args = p.parse_args(argv)
    if args.command == "run":
        run_report(args.results)
    elif args.command == "line":
        print(progress(json.loads(sys.stdin.read().strip().splitlines()[-1])))
    elif args.command == "pg":
        print(pg_report(records(args.results)))
    elif args.command == "soak":
        return soak_report(args.dir)
    else:
        cpu_split(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
