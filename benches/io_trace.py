#!/usr/bin/env python3
"""Summarizes a trace taken by benches/io-trace.sh (see there).

    io_trace.py TRACE.txt LOADGEN.json SWITCHES.before SWITCHES.after STARTED ENDED

TRACE.txt is `perf script -F comm,tid,time,event,trace` of the fsync
tracepoints of every thread and the context switches of the server's CPU;
LOADGEN.json the generator's report (for the request rate); SWITCHES.* the
context-switch counts of each server thread, by name, before and after the
trace; STARTED and ENDED the trace's wall-clock bounds (seconds).
"""

import json
import re
import sys
from collections import Counter, defaultdict

LINE = re.compile(r"\s*(.+?)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")
SWITCH = re.compile(r"prev_pid=(\d+) .*next_pid=(\d+)")
WAKEUP = re.compile(r"pid=(\d+)")
# A journal fsync this many times its median is "slow".
SLOW = 4


def parse(path):
    """The trace's events, in time order: (time, comm, tid, event, fields)."""
    events = []
    with open(path) as lines:
        for line in lines:
            m = LINE.match(line)
            if m:
                events.append(
                    (float(m.group(3)), m.group(1).strip(), int(m.group(2)), m.group(4), m.group(5))
                )
    # Two perf files, each in its own order; equal times keep file order.
    events.sort(key=lambda event: event[0])
    return events


def quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def fsyncs_and_idle(events):
    """Each thread's fsyncs as (start, woken, end), and CPU idle time split
    by the set of server threads inside an fsync meanwhile. `woken` is the
    last wakeup of the thread inside the call (its start when none was
    recorded: the call did not sleep)."""
    inside = {}  # tid -> (start, comm)
    woken = {}  # tid -> the last wakeup while inside
    syncs = defaultdict(list)
    idle = Counter()
    idle_from = None
    for t, comm, tid, event, fields in events:
        if event.startswith("syscalls:sys_enter_f"):
            inside[tid] = (t, comm)
        elif event.startswith("syscalls:sys_exit_f"):
            if tid in inside:
                start, name = inside.pop(tid)
                syncs[name].append((start, woken.pop(tid, start), t))
        elif event == "sched:sched_wakeup":
            m = WAKEUP.search(fields)
            if m and int(m.group(1)) in inside:
                woken[int(m.group(1))] = t
        elif event == "sched:sched_switch":
            m = SWITCH.search(fields)
            if not m:
                continue
            prev, nxt = int(m.group(1)), int(m.group(2))
            if nxt == 0:
                idle_from = t
            elif prev == 0 and idle_from is not None:
                waiting = sorted({name for _, name in inside.values()})
                idle[" + ".join(waiting) or "no fsync"] += t - idle_from
                idle_from = None
    return syncs, idle


def switches(path):
    counts = {}
    with open(path) as lines:
        for line in lines:
            name, voluntary, involuntary = line.split()
            counts[name] = (int(voluntary), int(involuntary))
    return counts


def main():
    trace, loadgen, before, after, started, ended = sys.argv[1:7]
    events = parse(trace)
    if not events:
        sys.exit("io_trace.py: the trace is empty (perf could not record the tracepoints?)")
    # The idle time is over the trace's own span; the context switches over
    # the wall-clock time around perf, which takes a moment to start.
    window = events[-1][0] - events[0][0]
    with open(loadgen) as f:
        report = json.load(f)
    requests = report["throughput_rps"] * (float(ended) - float(started))
    print(
        f"{report.get('scenario', '?')}: {report['throughput_rps']:,.0f} req/s, "
        f"server {report.get('server_cpu_cores', float('nan')):.2f} cores, "
        f"p50 {report['latency_us']['p50']} us, p99 {report['latency_us']['p99']} us "
        f"(generator window); trace {window:.2f} s"
    )

    syncs, idle = fsyncs_and_idle(events)
    print("\nfsyncs by thread, us: entry to return; of which entry to wakeup (the disk) and wakeup to return (the CPU):")
    for name, spans in sorted(syncs.items()):
        for part, (a, b) in (("whole", (0, 2)), ("disk", (0, 1)), ("CPU", (1, 2))):
            d = sorted((span[b] - span[a]) * 1e6 for span in spans)
            print(
                f"  {name if part == 'whole' else '':<16} {part:<5} {len(d):6d}  p50 {quantile(d, .5):7.0f}"
                f"  p90 {quantile(d, .9):7.0f}  p99 {quantile(d, .99):7.0f}  max {d[-1]:7.0f}"
                f"  total {sum(d) / 1e3:7.1f} ms"
            )
    journal = [(s, e) for s, _, e in syncs.get("redb-writer", [])]
    checkpoint = [(s, e) for s, _, e in syncs.get("redb-checkpoint", [])]
    if journal:
        median = quantile(sorted(e - s for s, e in journal), 0.5)
        slow = [(s, e) for s, e in journal if e - s > SLOW * median]
        overlapping = [(s, e) for s, e in slow if any(s < ce and e > cs for cs, ce in checkpoint)]
        print(
            f"\njournal fsyncs over {SLOW}x their median ({median * 1e6:.0f} us): {len(slow)} of "
            f"{len(journal)}, {sum(e - s for s, e in slow) * 1e3:.1f} ms in all; "
            f"{len(overlapping)} of them ({sum(e - s for s, e in overlapping) * 1e3:.1f} ms) "
            f"overlap a checkpoint fsync"
        )

    total_idle = sum(idle.values())
    print(f"\nCPU 0 idle: {total_idle * 1e3:.1f} ms of {window * 1e3:.0f} ({total_idle / window:.1%}); meanwhile the server was in:")
    for what, seconds in idle.most_common():
        print(f"  {what:<34} {seconds * 1e3:7.1f} ms")

    b, a = switches(before), switches(after)
    print(f"\ncontext switches a request ({requests:,.0f} requests in the trace's window):")
    for name in sorted(a):
        v = (a[name][0] - b.get(name, (0, 0))[0]) / requests
        n = (a[name][1] - b.get(name, (0, 0))[1]) / requests
        if v or n:
            print(f"  {name:<18} voluntary {v:.3f}  involuntary {n:.3f}")


if __name__ == "__main__":
    main()
