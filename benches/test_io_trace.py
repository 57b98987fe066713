#!/usr/bin/env python3
"""Tests of benches/io_trace.py: how a trace is split into each fsync's disk
and CPU parts, and the server's idle time by what it waited on, as
`benches/io-trace.sh` prints them.

Run: python3 benches/test_io_trace.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import io_trace  # noqa: E402

WRITER, CHECKPOINT, WORKER = 11, 12, 10


def line(t, comm, tid, event, fields):
    """One line as `perf script -F comm,tid,time,event,trace` prints it."""
    return f"{comm:>16} {tid:5d} {t:.6f}: {event}: {fields}\n"


def enter(t, comm, tid):
    return line(t, comm, tid, "syscalls:sys_enter_fdatasync", "fd: 0x0000000c")


def leave(t, comm, tid):
    return line(t, comm, tid, " syscalls:sys_exit_fdatasync", "0x0")


def switch(t, prev, nxt):
    names = {0: "swapper/0", WRITER: "redb-writer", CHECKPOINT: "redb-checkpoint", WORKER: "tokio-rt-worker"}
    return line(
        t, names[prev], prev, "sched:sched_switch",
        f"prev_comm={names[prev]} prev_pid={prev} prev_prio=120 prev_state=S ==> "
        f"next_comm={names[nxt]} next_pid={nxt} next_prio=120",
    )


def wakeup(t, tid):
    return line(t, "swapper/1", 0, "sched:sched_wakeup", f"comm=redb-writer pid={tid} prio=110 target_cpu=000")


def analyse(*lines):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        # perf script prints each file in its own order: the parser sorts.
        f.writelines(sorted(lines, key=lambda l: l.split()[2], reverse=True))
    try:
        return io_trace.fsyncs_and_idle(io_trace.parse(f.name))
    finally:
        os.unlink(f.name)


class Fsyncs(unittest.TestCase):
    def test_an_fsync_splits_at_the_threads_wakeup(self):
        # In at 1.000, the disk answers at 1.001, the writer runs at 1.004.
        syncs, _ = analyse(
            enter(1.000, "redb-writer", WRITER),
            wakeup(1.001, WRITER),
            leave(1.004, "redb-writer", WRITER),
        )
        (start, woken, end), = syncs["redb-writer"]
        self.assertAlmostEqual(woken - start, 0.001)
        self.assertAlmostEqual(end - woken, 0.003)

    def test_wakeups_outside_the_call_or_of_other_threads_do_not_count(self):
        syncs, _ = analyse(
            wakeup(0.999, WRITER),
            enter(1.000, "redb-writer", WRITER),
            wakeup(1.002, WORKER),
            leave(1.004, "redb-writer", WRITER),
        )
        (start, woken, end), = syncs["redb-writer"]
        # No wakeup inside: the call did not sleep, all of it is its own.
        self.assertEqual(woken, start)

    def test_threads_are_kept_apart(self):
        syncs, _ = analyse(
            enter(1.000, "redb-checkpoint", CHECKPOINT),
            enter(1.001, "redb-writer", WRITER),
            leave(1.002, "redb-writer", WRITER),
            leave(1.010, "redb-checkpoint", CHECKPOINT),
        )
        self.assertEqual(len(syncs["redb-writer"]), 1)
        self.assertAlmostEqual(syncs["redb-checkpoint"][0][2] - syncs["redb-checkpoint"][0][0], 0.010)


class Idle(unittest.TestCase):
    def test_idle_time_is_charged_to_what_was_in_an_fsync(self):
        _, idle = analyse(
            # 2 ms idle with nothing in an fsync.
            switch(1.000, WORKER, 0),
            switch(1.002, 0, WORKER),
            # The writer in its fsync, the core idle 3 ms of it.
            enter(1.003, "redb-writer", WRITER),
            switch(1.004, WORKER, 0),
            # The checkpoint joins it: 1 ms idle with both inside.
            switch(1.0070, 0, CHECKPOINT),
            enter(1.0071, "redb-checkpoint", CHECKPOINT),
            switch(1.0072, CHECKPOINT, 0),
            switch(1.0082, 0, WRITER),
            leave(1.0083, "redb-writer", WRITER),
        )
        self.assertAlmostEqual(idle["no fsync"], 0.002)
        self.assertAlmostEqual(idle["redb-writer"], 0.003)
        self.assertAlmostEqual(idle["redb-checkpoint + redb-writer"], 0.001)
        self.assertAlmostEqual(sum(idle.values()), 0.006)

    def test_busy_time_is_not_idle(self):
        _, idle = analyse(
            switch(1.000, WORKER, WRITER),
            enter(1.001, "redb-writer", WRITER),
            switch(1.001, WRITER, WORKER),
            leave(1.005, "redb-writer", WRITER),
        )
        self.assertEqual(sum(idle.values()), 0)


if __name__ == "__main__":
    unittest.main()
