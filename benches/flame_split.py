#!/usr/bin/env python3
"""Where a request's server CPU goes, from benches/flame.sh's folded stacks.

    benches/flame_split.py DIR [BASE SCENARIO]
    benches/flame_split.py --threads DIR SCENARIO


DIR holds flame.sh's output: SCENARIO.folded (inferno's folded stacks, each
count a cpu-clock sample's period in nanoseconds) and SCENARIO.json (the load
generator's report, for the request count of the same window). BASE and
SCENARIO default to pure-next-action and durable-next-action. Printed, in
microseconds a request, for each and the difference:

- each server thread (the stack's first frame);
- the request workers split three ways: our handler (frames of
  HANDLER_FRAMES and everything below them, kernel included), the kernel
  outside it (stacks whose leaf is a kernel frame), and the rest: the tonic,
  h2, hyper and tokio code every RPC runs;
- named parts (PARTS), inclusive, on the request workers and on the other
  threads;
- the leaf functions of the request workers that grew the most.

With --threads, one line for SCENARIO alone: its server CPU a request, in
all and by thread (what flame.sh prints after sampling each scenario).

BENCHMARKS.md's split of a durable decision's extra CPU is such a table.
perf's DWARF unwinding slows a server that switches threads more than one
that does not, so read the split and the differences, not the totals.
"""

import collections
import json
import os
import sys

WORKER = "tokio-rt-worker"
# The handlers of src/grpc/service.rs below which a request is our code.
HANDLER_FRAMES = ("next_action_durable", "next_action_pure")


class Prefix(str):
    """A pattern that matches the frames starting with it, rather than the
    frames containing it anywhere (mimalloc's `mi_` would match `semi_`)."""


# (label, substring of a frame (or a Prefix, or a tuple of either), leaf only?)
PARTS = [
    ("journal entry (encode and seal)", "store::journal::entry", False),
    ("  of it, encoding the record", "store::codec::encode_into", False),
    ("activity::plan", "budget::activity::plan", False),
    ("redb page reads", "PagedCachedFile::read", False),
    ("overlay lookup (Records::get)", "store::redb::Records::get", False),
    ("key lock released (KeyGuard drop)", "KeyGuard as core::ops::drop::Drop", False),
    ("records dropped", "drop_in_place<retry_budget::budget::activity::ActivityRecord", False),
    ("memcpy (leaf)", "__memcpy", True),
    ("mimalloc allocation fast path (leaf)", "mi_page_malloc_zero", True),
    ("frees from other threads collected", "mi_page_thread_collect_to_local", False),
    ("mimalloc, all its paths (inclusive)", (Prefix("mi_"), Prefix("_mi_")), False),
    ("page faults (memory touched afresh)", "exc_page_fault", False),
    ("socket read and write paths", ("poll_read_buf", "poll_write_vectored", "poll_write_buf"), False),
]


def matches(frame, pattern):
    if isinstance(pattern, tuple):
        return any(matches(frame, p) for p in pattern)
    if isinstance(pattern, Prefix):
        return frame.startswith(pattern)
    return pattern in frame


def profile(folded_lines, requests):
    """The figures of one scenario, in us a request, from its folded lines."""
    per = lambda n: n / 1e3 / max(1, requests)
    threads = collections.Counter()
    split = collections.Counter()
    parts = collections.Counter()
    leaves = collections.Counter()
    for line in folded_lines:
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        count = int(count)
        frames = stack.split(";")
        thread = frames[0]
        threads[thread] += count
        worker = thread.startswith(WORKER)
        where = "worker" if worker else "other"
        if worker:
            leaves[frames[-1]] += count
            if any(any(h in f for h in HANDLER_FRAMES) for f in frames[1:]):
                split["handler"] += count
            elif frames[-1].endswith("_[k]"):
                split["kernel"] += count
            else:
                split["rest"] += count
        for label, pattern, leaf_only in PARTS:
            hit = matches(frames[-1], pattern) if leaf_only else any(
                matches(f, pattern) for f in frames[1:]
            )
            if hit:
                parts[(label, where)] += count
    return {
        "threads": {t: per(n) for t, n in threads.items()},
        "split": {k: per(split[k]) for k in ("handler", "kernel", "rest")},
        "parts": {k: per(n) for k, n in parts.items()},
        "leaves": {k: per(n) for k, n in leaves.items()},
    }


def load(directory, scenario):
    with open(os.path.join(directory, f"{scenario}.json")) as f:
        requests = json.load(f)["requests"]
    with open(os.path.join(directory, f"{scenario}.folded")) as f:
        return requests, profile(f, requests)


def report(base_name, base, name, other, top=15):
    out = []
    row = lambda label, a, b: out.append(f"  {label:<52} {a:8.2f} {b:8.2f} {b - a:+8.2f}")
    out.append(f"us a request; A = {base_name}, B = {name}")
    out.append(f"  {'':<52} {'A':>8} {'B':>8} {'B - A':>8}")
    threads = sorted(set(base["threads"]) | set(other["threads"]))
    out.append("threads")
    for t in threads:
        row(t, base["threads"].get(t, 0.0), other["threads"].get(t, 0.0))
    row("all", sum(base["threads"].values()), sum(other["threads"].values()))
    out.append("request workers, split")
    for key, label in (
        ("handler", "our handler (and below it, kernel included)"),
        ("kernel", "the kernel, outside the handler (leaf frames)"),
        ("rest", "the rest: tonic, h2, hyper, tokio"),
    ):
        row(label, base["split"][key], other["split"][key])
    for where, title in (("worker", "named parts, request workers"), ("other", "named parts, other threads")):
        out.append(title)
        for label, _, _ in PARTS:
            a = base["parts"].get((label, where), 0.0)
            b = other["parts"].get((label, where), 0.0)
            if a or b:
                row(label, a, b)
    out.append("request workers' leaf functions that grew the most")
    keys = set(base["leaves"]) | set(other["leaves"])
    grown = sorted(keys, key=lambda k: other["leaves"].get(k, 0.0) - base["leaves"].get(k, 0.0), reverse=True)
    for k in grown[:top]:
        row(k[:52], base["leaves"].get(k, 0.0), other["leaves"].get(k, 0.0))
    return "\n".join(out)


def threads_line(name, requests, p):
    """One scenario's server CPU a request, in all and by thread."""
    threads = sorted(p["threads"].items(), key=lambda t: t[1], reverse=True)
    return (
        f"{name}: {requests} requests, {sum(p['threads'].values()):.1f} us of server CPU a request: "
        + ", ".join(f"{t} {us:.1f}" for t, us in threads)
    )


def main(argv):
    if len(argv) == 4 and argv[1] == "--threads":
        requests, p = load(argv[2], argv[3])
        print(threads_line(argv[3], requests, p))
        return
    if len(argv) not in (2, 4):
        sys.exit(__doc__)
    directory = argv[1]
    base_name, name = (argv[2], argv[3]) if len(argv) == 4 else ("pure-next-action", "durable-next-action")
    base_requests, base = load(directory, base_name)
    requests, other = load(directory, name)
    print(f"{base_name}: {base_requests} requests; {name}: {requests} requests")
    print(report(base_name, base, name, other))


if __name__ == "__main__":
    main(sys.argv)
