#!/usr/bin/env python3
"""The summary of benches/slow-disk.sh: for each flush delay the shim added,
the ratios of issue 6's durable targets, taken round by round.

    python3 benches/slow_disk.py FILE.jsonl

A round is one group-commit server (a pure NextAction window, then a durable
one) and one --max-batch 1 server (a durable window), alternated; its
ratios are group commit / one fsync a decision (target >= 20) and durable /
pure NextAction on the same server (target >= 0.5). Per delay it prints
their medians and ranges over the rounds, the decisions an fsync (saves /
commits over each group-commit server's life), the server's CPU a request,
the flush the fsync probe saw under the shim, and the peak RSS.
"""

import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def by_delay(records):
    """{delay_us: {"fsync": record, "windows": {(kind, round): record},
    "servers": {(kind, round): record}}} from the file's records, whose
    labels are DELAY/fsync, DELAY/KIND/ROUND (KIND pure, gc or mb1)."""
    out = {}
    for r in records:
        parts = r.get("label", "").split("/")
        if not parts[0].isdigit():
            continue
        d = out.setdefault(int(parts[0]), {"fsync": None, "windows": {}, "servers": {}})
        if parts[1:] == ["fsync"]:
            d["fsync"] = r
        elif len(parts) == 3:
            key = (parts[1], int(parts[2]))
            d["servers" if r.get("kind") == "server" else "windows"][key] = r
    return out


def spread(values):
    """(median, min, max) or None."""
    return (statistics.median(values), min(values), max(values)) if values else None


def summarize(records):
    """Per delay, in order: the figures the summary prints."""
    rows = []
    for delay, d in sorted(by_delay(records).items()):
        w, s = d["windows"], d["servers"]
        rounds = sorted({r for (_, r) in w})
        gc_mb1, dur_pure, per_fsync = [], [], []
        for r in rounds:
            gc, mb1, pure = (w.get((kind, r), {}).get("throughput_rps") for kind in ("gc", "mb1", "pure"))
            if gc and mb1:
                gc_mb1.append(gc / mb1)
            if gc and pure:
                dur_pure.append(gc / pure)
            server = s.get(("gc", r))
            if server and server.get("commits"):
                per_fsync.append(server["saves"] / server["commits"])

        def of(kind, field):
            return spread([v[field] for (k, _), v in w.items() if k == kind])

        hwm = [v["vm_hwm_kib"] / 1024 for v in s.values() if v.get("vm_hwm_kib")]
        fsync = d["fsync"]
        streams = sorted({v["concurrency"] for v in w.values() if "concurrency" in v})
        rows.append({
            "delay_us": delay,
            "streams": streams,
            "flush_p50_us": fsync["overwrite_latency_us"]["p50"] if fsync else None,
            "gc_rps": of("gc", "throughput_rps"),
            "mb1_rps": of("mb1", "throughput_rps"),
            "pure_rps": of("pure", "throughput_rps"),
            "gc_over_mb1": spread(gc_mb1),
            "durable_over_pure": spread(dur_pure),
            "decisions_per_fsync": spread(per_fsync),
            "cpu_us": {k: of(k, "server_cpu_us_per_request") for k in ("pure", "gc", "mb1")},
            "peak_rss_mib": max(hwm) if hwm else None,
        })
    return rows


def fmt(s, digits=2, suffix=""):
    if s is None:
        return "-"
    med, lo, hi = s
    return f"{med:.{digits}f}{suffix} ({lo:.{digits}f}{suffix} to {hi:.{digits}f}{suffix})"


def verdict(s, line):
    return "-" if s is None else ("met" if s[0] >= line else "missed")


def main(path):
    rows = summarize(load(path))
    for row in rows:
        flush = row["flush_p50_us"]
        streams = ", ".join(map(str, row["streams"])) or "?"
        print(f"flush + {row['delay_us']} us, {streams} streams (the probe's fdatasync of an overwritten 4 KiB "
              f"block, median: {'-' if flush is None else f'{flush / 1000:.2f} ms'})")
        print(f"  group commit / one fsync a decision (>= 20x): {fmt(row['gc_over_mb1'], 1, 'x')}, "
              f"{verdict(row['gc_over_mb1'], 20)}")
        print(f"  durable / pure NextAction (>= 0.5):           {fmt(row['durable_over_pure'])}, "
              f"{verdict(row['durable_over_pure'], 0.5)}")
        print(f"  req/s: pure {fmt(row['pure_rps'], 0)}; group commit {fmt(row['gc_rps'], 0)}; "
              f"one fsync a decision {fmt(row['mb1_rps'], 0)}")
        cpu = row["cpu_us"]
        print(f"  server CPU a request, us: pure {fmt(cpu['pure'], 1)}; group commit {fmt(cpu['gc'], 1)}; "
              f"one fsync a decision {fmt(cpu['mb1'], 1)}")
        rss = row["peak_rss_mib"]
        print(f"  decisions an fsync (group commit): {fmt(row['decisions_per_fsync'], 1)}; peak RSS "
              f"{'-' if rss is None else f'{rss:.0f} MiB'}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
