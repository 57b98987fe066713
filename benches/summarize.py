#!/usr/bin/env python3
"""Summarise a results file of benches/run.sh: the ratios issue 6 targets.

Usage: benches/summarize.py RESULTS.jsonl [--append]

Reads the JSON lines (one a loadgen run, h2load run, server or machine
record), groups them by label, pairs the i-th run of one label with the
i-th run of another (the runs alternate A/B/A/B), and prints a table: for
each target the ratio of the means, the range of the per-pair ratios, and
whether the target is met. With --append, adds the summary as one more
JSON line to the file.
"""

import json
import statistics
import sys
from collections import defaultdict

MIB = 1024
# Busy cores outside the server and the generator above which a group's
# figures are flagged as taken on a busy machine.
NOISY_CORES = 0.25
# In an open loop, the generator's own p99 lateness (its pacer's, from the
# intended send time) above which a window is not judged: the generator, or
# the VM's vCPU under it, fell behind, and latency measured from the intended
# send time then charges that to the server (windows of 30 to 170 ms p99
# with nearly as much send lag were seen on the 2-core VM). A request that
# waits for an idle client because the server is slow to answer is the
# server's latency, and counts: the pacer's lag leaves that wait out, and
# the lateness the due times after it inherit from it.
# Results from before the loadgen reported `pacer_lag_us` fall back on
# `send_lag_us`, which includes it.
#
# 100 us: the p99s compared at half saturation are 300 to 560 us where the
# generator kept its schedule, and the target allows a quarter more, about
# 100 us. A generator later than that at its own p99 can make or hide the
# difference being judged: in one run, windows whose pacer was 293 and
# 374 us late at p99 measured 2.0 and 2.7 ms p99, where every window with
# the pacer under 100 us measured 0.30 to 0.56 ms. (An earlier bound of
# 1 ms let such windows through.)
LATE_SENDS_US = 100


def load(path):
    runs = defaultdict(list)
    servers = defaultdict(list)
    machine = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            kind = rec.get("kind")
            if kind == "machine":
                machine = rec
            elif kind == "server":
                servers[rec["label"]].append(rec)
            elif kind == "summary":
                continue
            else:
                runs[rec.get("label", "")].append(rec)
    return machine, runs, servers


def throughput(rec):
    return rec.get("throughput_rps")


def capacity(rec):
    """Requests a second one core of the server could serve at this cost."""
    cost = rec.get("server_cpu_us_per_request")
    return 1e6 / cost if cost else None


def p99(rec):
    return rec.get("latency_us", {}).get("p99")


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def on_schedule(rec):
    """Whether an open-loop window's generator sent on time (p99 of its own
    lateness within LATE_SENDS_US); closed loops have no schedule."""
    if rec.get("mode") != "open":
        return True
    lag = generator_lag(rec)
    return lag is None or lag <= LATE_SENDS_US


def generator_lag(rec):
    """The p99 of the generator's own lateness in an open-loop window."""
    return (rec.get("pacer_lag_us") or rec.get("send_lag_us") or {}).get("p99")


def clean(rec):
    """Whether a run's window was free of other work on the machine and,
    in an open loop, the generator kept its schedule."""
    return (rec.get("other_busy_cores") or 0.0) <= NOISY_CORES and on_schedule(rec)


def noisy_groups(runs):
    """The groups whose windows' mean other work was over NOISY_CORES, with
    that mean and the mean of it that was the hypervisor's steal (None in
    files from before the load generator recorded it)."""
    noisy = []
    for label, recs in sorted(runs.items()):
        other = mean([r.get("other_busy_cores") for r in recs])
        if (other or 0) > NOISY_CORES:
            noisy.append((label, other, mean([r.get("steal_cores") for r in recs])))
    return noisy


def noisy_label(label, other, steal):
    """A noisy group as the warning names it: with the steal's share of the
    other work when the file records it."""
    if steal is None:
        return label
    return f"{label} ({fmt(other)} of a core, {fmt(steal)} of it stolen by the host)"


def ratio(runs, a, b, metric):
    """mean(metric of a) / mean(metric of b), the per-pair ratios (the i-th
    run of a with the i-th run of b), and the ratio of the means over the
    pairs whose two runs were both clean."""
    ra, rb = runs.get(a, []), runs.get(b, [])
    va = [metric(r) for r in ra]
    vb = [metric(r) for r in rb]
    ma, mb = mean(va), mean(vb)
    whole = ma / mb if ma is not None and mb else None
    pairs = [x / y for x, y in zip(va, vb) if x is not None and y]
    clean_pairs = [(x, y) for x, y, p, q in zip(va, vb, ra, rb)
                   if x is not None and y and clean(p) and clean(q)]
    clean_ratio = None
    if clean_pairs:
        clean_ratio = mean([x for x, _ in clean_pairs]) / mean([y for _, y in clean_pairs])
    return whole, pairs, ma, mb, clean_ratio


def fmt(x, digits=2):
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def verdicts(runs, servers):
    """The targets of issue 6, each a dict: the ratio of the means, the
    per-pair ratios, the ratio over the clean pairs, and `met` (True, False,
    or None when the figure cannot be judged)."""
    rows = []

    def target(what, a, b, metric, op, bound, unit=""):
        whole, pairs, ma, mb, clean_ratio = ratio(runs, a, b, metric)
        # Judged on the clean pairs when there are any: a run during which
        # other work took the server's CPU measures the machine, not us.
        # An open-loop figure with no pair on schedule is not judged at all:
        # its latencies are the generator's stalls.
        judged = clean_ratio if clean_ratio is not None else whole
        late = any(not on_schedule(r) for r in runs.get(a, []) + runs.get(b, []))
        if clean_ratio is None and late:
            judged = None
        met = None
        if judged is not None:
            met = judged >= bound if op == ">=" else judged <= bound
        spread = f"{fmt(min(pairs))}-{fmt(max(pairs))}" if pairs else "n/a"
        rows.append(
            {
                "what": what,
                "a": a,
                "b": b,
                "a_mean": ma,
                "b_mean": mb,
                "unit": unit,
                "ratio": whole,
                "clean_ratio": clean_ratio,
                "pair_ratios": pairs,
                "target": f"{op} {bound}",
                "bound": bound,
                "met": met,
                "spread": spread,
            }
        )

    target("RetryDelay / health throughput", "closed/retry-delay", "closed/health", throughput, ">=", 0.90, "req/s")
    target("pure NextAction / health throughput", "closed/pure-next-action", "closed/health", throughput, ">=", 0.90, "req/s")
    target("RetryDelay / health p99 at half saturation", "open/retry-delay", "open/health", p99, "<=", 1.25, "us")
    target("pure NextAction / health p99 at half saturation", "open/pure-next-action", "open/health", p99, "<=", 1.25, "us")
    # run.sh measures pure NextAction again on each durable server, just
    # before its durable window; older results files compare with the
    # closed loops of step (1)-(3), minutes earlier.
    pure = "durable/pure-next-action" if "durable/pure-next-action" in runs else "closed/pure-next-action"
    same = " (same server)" if pure.startswith("durable/") else ""
    target(f"durable / pure NextAction{same} throughput", "durable/group-commit", pure, throughput, ">=", 0.5, "req/s")
    target("durable group commit / max-batch 1", "durable/group-commit", "durable/max-batch-1", throughput, ">=", 20, "req/s")
    target("durable, big store / 1k store", "durable/stored-big", "durable/stored-1k", throughput, ">=", 0.8, "req/s")
    target("h2load: RetryDelay / health throughput", "h2load/retry-delay", "h2load/health", throughput, ">=", 0.90, "req/s")
    target("h2load: pure NextAction / health throughput", "h2load/pure-next-action", "h2load/health", throughput, ">=", 0.90, "req/s")
    # The same comparisons by the server's CPU per request (as requests a
    # second per server core): they hold whichever side was saturated.
    target("server capacity: RetryDelay / health", "closed/retry-delay", "closed/health", capacity, ">=", 0.90, "req/s/core")
    target("server capacity: pure NextAction / health", "closed/pure-next-action", "closed/health", capacity, ">=", 0.90, "req/s/core")
    target(f"server capacity: durable / pure NextAction{same}", "durable/group-commit", pure, capacity, ">=", 0.5, "req/s/core")

    hwm = [s.get("vm_hwm_kib") for s in servers.get("durable/stored-big", [])]
    hwm = [h for h in hwm if h]
    rss_mib = max(hwm) / MIB if hwm else None
    rows.append(
        {
            "what": "peak RSS, big store (MiB)",
            "ratio": rss_mib,
            "target": "< 256",
            "bound": 256,
            "met": rss_mib < 256 if rss_mib is not None else None,
            "spread": ", ".join(fmt(h / MIB, 0) for h in hwm) or "n/a",
        }
    )

    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    machine, runs, servers = load(path)

    rows = verdicts(runs, servers)

    per_fsync = {}
    for label, recs in servers.items():
        commits = sum(r.get("commits") or 0 for r in recs)
        saves = sum(r.get("saves") or 0 for r in recs)
        if commits:
            per_fsync[label] = saves / commits

    fsync = [r["latency_us"]["p50"] for r in runs.get("fsync", []) if "latency_us" in r]
    overwrite = [r["overwrite_latency_us"]["p50"] for r in runs.get("fsync", []) if "overwrite_latency_us" in r]
    stored = {r.get("label"): r.get("activities") for rs in runs.values() for r in rs if r.get("scenario") == "preload"}

    print()
    if machine:
        print(f"date {machine.get('date')}  machine: {machine.get('nproc')} cores, {machine.get('cpu')}  "
              f"commit {machine.get('commit')}  quick={machine.get('quick')}  pinned={machine.get('pinned')}  "
              f"nice={machine.get('nice', 0)}")
    print(f"results: {path}")
    print()
    print("A/B is the ratio of the means over all reps; 'clean' over the pairs of reps during which")
    print(f"other work used at most {NOISY_CORES} of a core and, in open loops, the generator's own p99")
    print(f"lateness was at most {LATE_SENDS_US} us (the verdict uses it when there is one).")
    print(f"{'figure':<52} {'A':>10} {'B':>10} {'A/B':>6} {'clean':>6} {'per rep':>11} {'target':>8}  met")
    for r in rows:
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        print(f"{r['what']:<52} {fmt(r.get('a_mean')):>10} {fmt(r.get('b_mean')):>10} "
              f"{fmt(r['ratio']):>6} {fmt(r.get('clean_ratio')):>6} {r['spread']:>11} {r['target']:>8}  {met}")
    print()
    print("by group, mean of the reps: throughput (req/s), latency (us), CPU (cores: the server, the generator,")
    print("other work on the machine, and of it the host's steal), server CPU a request (us), server")
    print("run-queue wait (ms in the window), and which side was saturated:")
    print(f"  {'group':<26} {'runs':>4} {'req/s':>9} {'p50':>7} {'p99':>7} {'p99.9':>7} {'server':>6} "
          f"{'gen':>5} {'other':>5} {'steal':>5} {'us/req':>6} {'wait':>5} {'bound':>9} {'errors':>6}")
    for label in sorted(runs):
        recs = [r for r in runs[label] if "throughput_rps" in r]
        if not recs:
            continue
        lat = lambda q: mean([r.get("latency_us", {}).get(q) for r in recs])
        server = mean([r.get("server_cpu_cores") for r in recs])
        client = mean([r.get("client_cpu_cores") for r in recs])
        bound = "-"
        # An open loop spins between sends, so its generator always looks
        # busy: only closed loops (and h2load) say who was saturated.
        if any(r.get("mode") == "open" for r in recs):
            pass
        elif server is not None and server >= 0.95:
            bound = "server"
        elif client is not None and client >= 0.95:
            bound = "generator"
        print(f"  {label:<26} {len(recs):>4} {fmt(mean([throughput(r) for r in recs])):>9} "
              f"{fmt(lat('p50'), 0):>7} {fmt(lat('p99'), 0):>7} {fmt(lat('p999'), 0):>7} "
              f"{fmt(server):>6} {fmt(client):>5} "
              f"{fmt(mean([r.get('other_busy_cores') for r in recs])):>5} "
              f"{fmt(mean([r.get('steal_cores') for r in recs])):>5} "
              f"{fmt(mean([r.get('server_cpu_us_per_request') for r in recs]), 1):>6} "
              f"{fmt(mean([r.get('server_runqueue_wait_ms') for r in recs]), 0):>5} {bound:>9} "
              f"{sum(r.get('errors') or 0 for r in recs):>6}")
    print()
    print("where the server's CPU went, mean of the reps: us a request by thread, the kernel's share")
    print("of the server's CPU time, and minor page faults a request (closed loops):")
    threads = sorted({
        name for recs in runs.values() for r in recs
        for name in (r.get("server_thread_cpu_us_per_request") or {})
    })
    if threads:
        print(f"  {'group':<26} " + " ".join(f"{t:>16}" for t in threads) + f" {'kernel':>7} {'faults':>7}")
    else:
        print("  (not in this file: older results files lack them)")
    for label in sorted(runs):
        recs = [r for r in runs[label]
                if r.get("mode") == "closed" and r.get("server_thread_cpu_us_per_request")]
        if not recs:
            continue
        cells = " ".join(
            f"{fmt(mean([(r['server_thread_cpu_us_per_request']).get(t) for r in recs]), 1):>16}"
            for t in threads
        )
        print(f"  {label:<26} {cells} {fmt(mean([r.get('server_kernel_share') for r in recs])):>7} "
              f"{fmt(mean([r.get('server_minor_faults_per_request') for r in recs]), 3):>7}")
    noisy = noisy_groups(runs)
    if noisy:
        print(f"\nWARNING: other work used more than {NOISY_CORES} of a core during: "
              f"{', '.join(noisy_label(*n) for n in noisy)};"
              " their figures (and ratios using them) are not clean.")
    late = [
        f"{label} rep {i + 1} (generator lag p99 {fmt(generator_lag(r), 0)} us)"
        for label, recs in sorted(runs.items())
        for i, r in enumerate(x for x in recs if "throughput_rps" in x)
        if not on_schedule(r)
    ]
    if late:
        print(f"\nNot judged, the generator fell behind its schedule: {'; '.join(late)}.")
    print()
    print("decisions per fsync (saves / commits, whole server lifetime incl. warm-up):")
    for label, v in sorted(per_fsync.items()):
        print(f"  {label:<28} {v:8.1f}")
    if fsync:
        print(f"fsync of 4 KiB on the data dir's disk, median: {', '.join(fmt(v / 1000) for v in fsync)} ms")
    if overwrite:
        print(f"same, written over blocks the file has (fdatasync), median: {', '.join(fmt(v / 1000) for v in overwrite)} ms")
    if stored:
        print("preloaded: " + ", ".join(f"{k} = {v:,}" for k, v in sorted(stored.items())))

    summary = {
        "kind": "summary",
        "targets": rows,
        "decisions_per_fsync": per_fsync,
        "fsync_p50_us": fsync,
    }
    if "--append" in sys.argv[2:]:
        with open(path, "a") as f:
            f.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
