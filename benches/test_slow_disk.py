#!/usr/bin/env python3
"""Tests of benches/slow_disk.py: how the windows of benches/slow-disk.sh
become the durable targets' ratios per flush delay.

Run: python3 benches/test_slow_disk.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import slow_disk  # noqa: E402


def window(label, rps, cpu_us=10.0):
    return {"label": label, "throughput_rps": rps, "server_cpu_us_per_request": cpu_us,
            "latency_us": {"p99": 900}, "concurrency": 128}


def server(label, commits, saves, hwm_kib=100 * 1024):
    return {"kind": "server", "label": label, "commits": commits, "saves": saves, "vm_hwm_kib": hwm_kib}


def probe(delay, p50):
    return {"scenario": "fsync", "label": f"{delay}/fsync", "latency_us": {"p50": p50 + 50},
            "overwrite_latency_us": {"p50": p50}}


def records():
    """Two delays; in delay 1000's second round the machine ran twice as
    fast for both servers, so only a ratio taken within the round stays."""
    return [
        {"label": "", "note": "a record of another kind is ignored"},
        probe(0, 180),
        window("0/pure/1", 80_000), window("0/gc/1", 36_000, 22.0), server("0/gc/1", 1_000, 40_000),
        window("0/mb1/1", 4_000, 90.0), server("0/mb1/1", 20_000, 20_000),
        probe(1000, 1180),
        window("1000/pure/1", 80_000), window("1000/gc/1", 40_000), server("1000/gc/1", 500, 50_000),
        window("1000/mb1/1", 800), server("1000/mb1/1", 4_000, 4_000, 200 * 1024),
        window("1000/pure/2", 160_000), window("1000/gc/2", 72_000), server("1000/gc/2", 400, 60_000),
        window("1000/mb1/2", 1_600), server("1000/mb1/2", 8_000, 8_000),
    ]


class SlowDiskTest(unittest.TestCase):
    def test_ratios_are_taken_within_each_round(self):
        rows = {r["delay_us"]: r for r in slow_disk.summarize(records())}
        self.assertEqual(sorted(rows), [0, 1000])
        slow = rows[1000]
        # 40,000 / 800 and 72,000 / 1,600: 50x and 45x, median 47.5x; a
        # median of throughputs across rounds would pair 56,000 with 1,200.
        self.assertEqual(slow["gc_over_mb1"], (47.5, 45.0, 50.0))
        self.assertEqual(slow["durable_over_pure"], (0.475, 0.45, 0.5))
        self.assertEqual(slow["decisions_per_fsync"], (125.0, 100.0, 150.0))
        self.assertEqual(slow["flush_p50_us"], 1180)
        self.assertEqual(slow["peak_rss_mib"], 200)
        fast = rows[0]
        self.assertEqual(fast["gc_over_mb1"], (9.0, 9.0, 9.0))
        self.assertEqual(fast["cpu_us"]["gc"], (22.0, 22.0, 22.0))
        self.assertEqual(fast["decisions_per_fsync"], (40.0, 40.0, 40.0))

    def test_a_missing_window_leaves_its_ratio_out(self):
        recs = [r for r in records() if r.get("label") != "1000/mb1/2"]
        slow = {r["delay_us"]: r for r in slow_disk.summarize(recs)}[1000]
        self.assertEqual(slow["gc_over_mb1"], (50.0, 50.0, 50.0))
        self.assertEqual(slow["durable_over_pure"], (0.475, 0.45, 0.5))

    def test_verdicts_at_the_line(self):
        self.assertEqual(slow_disk.verdict((20.0, 19.0, 21.0), 20), "met")
        self.assertEqual(slow_disk.verdict((19.99, 19.0, 21.0), 20), "missed")
        self.assertEqual(slow_disk.verdict(None, 20), "-")

    def test_the_printed_summary(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(r) for r in records()) + "\n")
        try:
            out = io.StringIO()
            with redirect_stdout(out):
                slow_disk.main(f.name)
        finally:
            os.unlink(f.name)
        text = out.getvalue()
        self.assertIn("flush + 1000 us, 128 streams (the probe's fdatasync of an overwritten 4 KiB block, "
                      "median: 1.18 ms)", text)
        self.assertIn("(>= 20x): 47.5x (45.0x to 50.0x), met", text)
        self.assertIn("(>= 20x): 9.0x (9.0x to 9.0x), missed", text)
        self.assertIn("(>= 0.5):           0.47 (0.45 to 0.50), missed", text)


# A child that times fdatasync and fsync on a file, then fdatasync on a bad
# descriptor, and prints the three as JSON.
CHILD = """
import errno, json, os, sys, tempfile, time
fd, path = tempfile.mkstemp()
os.write(fd, b"x")
t = time.monotonic(); os.fdatasync(fd); datasync = time.monotonic() - t
t = time.monotonic(); os.fsync(fd); sync = time.monotonic() - t
os.close(fd); os.unlink(path)
try:
    os.fdatasync(fd)
    bad = "no error"
except OSError as e:
    bad = errno.errorcode[e.errno]
print(json.dumps({"fdatasync": datasync, "fsync": sync, "bad": bad}))
"""


class ShimTest(unittest.TestCase):
    """benches/slow_fsync.c, built and preloaded into a real process."""

    @classmethod
    def setUpClass(cls):
        cc = shutil.which("cc")
        if cc is None:
            if os.environ.get("CI") == "true":
                raise AssertionError("cc is needed for the shim's test in CI")
            raise unittest.SkipTest("skipped: no cc to build benches/slow_fsync.c")
        cls.dir = tempfile.mkdtemp()
        cls.shim = os.path.join(cls.dir, "slow_fsync.so")
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", cls.shim,
                        os.path.join(HERE, "slow_fsync.c"), "-ldl"], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def run_child(self, delay_us):
        env = dict(os.environ, LD_PRELOAD=self.shim)
        if delay_us is not None:
            env["SLOW_FSYNC_US"] = str(delay_us)
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                             capture_output=True, text=True)
        return json.loads(out.stdout)

    def test_both_calls_wait_the_delay_and_keep_the_error(self):
        r = self.run_child(150_000)
        self.assertGreaterEqual(r["fdatasync"], 0.15)
        self.assertGreaterEqual(r["fsync"], 0.15)
        self.assertEqual(r["bad"], "EBADF")

    def test_no_delay_unless_asked(self):
        for delay in (None, 0):
            r = self.run_child(delay)
            self.assertLess(r["fdatasync"], 0.15)
            self.assertLess(r["fsync"], 0.15)
            self.assertEqual(r["bad"], "EBADF")


if __name__ == "__main__":
    unittest.main()
