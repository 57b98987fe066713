#!/usr/bin/env python3
"""The CPU each side of a measured window used, from /proc, as one JSON line.

    pg_cpu.py --after S --window S [--pid NAME=PID ...] [--comm NAME=COMM ...]

Sleeps --after seconds (the warm-up), then reads utime + stime
(/proc/PID/stat) of each named process (--pid: one process id; --comm:
every process whose command is COMM, such as all of PostgreSQL's
processes, whoever's database they serve) and the machine's busy time
(/proc/stat), sleeps --window seconds and reads them again. Prints, in
cores (1.0 = one core busy throughout): each name, "busy" (the whole
machine, steal left out) and "other" (busy less the names). A process that
ends within the window loses the ticks of its own; one that starts within
it is not counted: both are rare for a server, its database's backends and a
load generator.
"""

import argparse
import json
import os
import sys
import time


def ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command may hold spaces: the fields follow its ')'.
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return None


def pids_of(comm):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == comm:
                        found.append(int(entry))
            except OSError:
                pass
    return found


def busy():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return sum(fields[:8]) - fields[3] - fields[4] - fields[7]


def snapshot(groups):
    return {name: {pid: ticks(pid) for pid in pids} for name, pids in groups.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--after", type=float, default=0.0)
    p.add_argument("--window", type=float, required=True)
    p.add_argument("--pid", action="append", default=[])
    p.add_argument("--comm", action="append", default=[])
    args = p.parse_args(argv)
    time.sleep(args.after)
    groups = {}
    for spec in args.pid:
        name, _, pid = spec.partition("=")
        groups[name] = [int(pid)]
    for spec in args.comm:
        name, _, comm = spec.partition("=")
        groups[name] = pids_of(comm)
    hz = os.sysconf("SC_CLK_TCK")
    t0, b0, s0 = time.monotonic(), busy(), snapshot(groups)
    time.sleep(args.window)
    t1, b1, s1 = time.monotonic(), busy(), snapshot(groups)
    seconds = t1 - t0
    out = {}
    for name, before in s0.items():
        used = sum(
            s1[name][pid] - t
            for pid, t in before.items()
            if t is not None and s1[name].get(pid) is not None
        )
        out[name] = used / hz / seconds
    out["busy"] = (b1 - b0) / hz / seconds
    out["other"] = out["busy"] - sum(v for k, v in out.items() if k != "busy")
    out["seconds"] = seconds
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
