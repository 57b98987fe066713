#!/usr/bin/env python3
"""Tests of benches/host_stalls.py: how cyclictest's histogram becomes the
stall figures of an open-loop window.

Run: python3 benches/test_host_stalls.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host_stalls  # noqa: E402


def histogram(counts, overflows, latest):
    """cyclictest's `--histogram 1000` output for two threads, as it prints
    it: zero-padded rows of 0 to 999 us (a tab before the second thread's
    column), then its summary lines. `counts` maps a latency in us to the
    two threads' counts."""
    lines = ["# Histogram"]
    for us in range(1000):
        a, b = counts.get(us, (0, 0))
        lines.append(f"{us:06d} {a:06d}\t{b:06d}")
    total = [sum(c[i] for c in counts.values()) + overflows[i] for i in (0, 1)]
    lines += [
        f"# Total: {total[0]:09d} {total[1]:09d}",
        "# Min Latencies: 00016 00017",
        "# Avg Latencies: 00047 00043",
        f"# Max Latencies: {latest[0]:05d} {latest[1]:05d}",
        f"# Histogram Overflows: {overflows[0]:05d} {overflows[1]:05d}",
        "# Histogram Overflow at cycle number:",
        "# Thread 0: 00655 02123",
        "# Thread 1: 01455",
    ]
    return [line + "\n" for line in lines]


class Parse(unittest.TestCase):
    def test_each_core_counts_its_late_wakeups_and_the_latest(self):
        lines = histogram({20: (5_000, 5_990), 99: (3, 0), 100: (2, 4), 999: (1, 0)},
                          overflows=(2, 1), latest=(18_853, 2_056))
        stalls = host_stalls.parse(lines)
        self.assertEqual(stalls["cpu0"], {"wakeups": 5_008, "late_100us": 5, "late_1ms": 2,
                                          "max_us": 18_853})
        self.assertEqual(stalls["cpu1"], {"wakeups": 5_995, "late_100us": 5, "late_1ms": 1,
                                          "max_us": 2_056})

    def test_a_histogram_cut_short_adds_nothing(self):
        lines = histogram({20: (10, 10)}, overflows=(0, 0), latest=(30, 30))
        self.assertIsNone(host_stalls.parse(lines[:500]))
        self.assertIsNone(host_stalls.parse([]))

    def test_the_script_adds_the_figures_to_the_loadgen_line(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.writelines(histogram({50: (1_000, 1_000)}, overflows=(3, 0), latest=(4_100, 900)))
        try:
            out = subprocess.run(
                [sys.executable, os.path.join(HERE, "host_stalls.py"),
                 json.dumps({"label": "open/health", "mode": "open"}), f.name],
                check=True, capture_output=True, text=True).stdout
        finally:
            os.unlink(f.name)
        rec = json.loads(out)
        self.assertEqual(rec["label"], "open/health")
        self.assertEqual(rec["host_stalls"]["cpu0"]["late_1ms"], 3)
        self.assertEqual(rec["host_stalls"]["cpu1"]["max_us"], 900)


if __name__ == "__main__":
    unittest.main()
