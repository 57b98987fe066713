#!/usr/bin/env python3
"""The host's stalls of each vCPU in a window, from cyclictest's histogram.

Usage: benches/host_stalls.py LOADGEN_JSON HISTOGRAM_FILE

run.sh runs `cyclictest --threads 2 --affinity 0,1 --interval 4000
--histogram 1000` through each open-loop window: a SCHED_FIFO thread on each
core, woken every 4 ms. Nothing in the guest holds such a thread off for
long, so a wake-up that comes a millisecond late or more is a vCPU that the
hypervisor did not run (a stall shorter than 4 ms shows only when a wake-up
falls in it). Prints the loadgen line with `host_stalls`
added: per core (`cpu0`, the server's, and `cpu1`, the generator's), the
wake-ups, how many came 100 us and 1 ms late or more, and the latest (us).
A histogram without its summary lines (cyclictest cut short) adds nothing.
"""

import json
import sys


def parse(lines):
    """cyclictest's `--histogram 1000` output -> {"cpuN": {...}} or None.

    Its lines are `LATENCY_US COUNT_THREAD0 COUNT_THREAD1 ...` for 0 to 999
    us, then comments; `# Histogram Overflows:` counts the wake-ups 1000 us
    late or more (outside the histogram), `# Max Latencies:` the latest.
    """
    rows, over_1ms, latest = [], None, None
    for line in lines:
        if line[:1].isdigit():
            rows.append([int(x) for x in line.split()])
        elif line.startswith("# Histogram Overflows:"):
            over_1ms = [int(x) for x in line.split(":")[1].split()]
        elif line.startswith("# Max Latencies:"):
            latest = [int(x) for x in line.split(":")[1].split()]
    if not rows or over_1ms is None or latest is None:
        return None
    return {
        f"cpu{cpu}": {
            "wakeups": sum(r[cpu + 1] for r in rows) + over_1ms[cpu],
            "late_100us": sum(r[cpu + 1] for r in rows if r[0] >= 100) + over_1ms[cpu],
            "late_1ms": over_1ms[cpu],
            "max_us": latest[cpu],
        }
        for cpu in range(len(latest))
    }


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rec = json.loads(sys.argv[1])
    with open(sys.argv[2]) as f:
        stalls = parse(f)
    if stalls:
        rec["host_stalls"] = stalls
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
