#!/usr/bin/env python3
"""Tests of benches/soak_summary.py: the histogram quantile between two
scrapes and the parsing of a scrape.

Run: python3 benches/test_soak_summary.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak_summary as s  # noqa: E402


class SoakSummary(unittest.TestCase):
    def test_quantile_interpolates_within_the_bucket_of_the_difference(self):
        before = [(0.001, 10), (0.002, 10), (float("inf"), 10)]
        # 100 new observations: 50 under 1 ms, 50 between 1 and 2 ms.
        after = [(0.001, 60), (0.002, 110), (float("inf"), 110)]
        self.assertAlmostEqual(s.quantile(0.5, before, after), 0.001)
        self.assertAlmostEqual(s.quantile(0.99, before, after), 0.00198)

    def test_quantile_of_nothing_new_is_none(self):
        same = [(0.001, 5), (float("inf"), 5)]
        self.assertIsNone(s.quantile(0.99, same, same))

    def test_parse_and_sum_by_label(self):
        scrape = s.parse(
            'retry_budget_decisions_total{action="ACTION_DEFERRED",code="deferred"} 7\n'
            'retry_budget_decisions_total{action="ACTION_SCHEDULE_RETRY",code="schedule_retry"} 5\n'
            "# EOF\n"
        )
        self.assertEqual(s.total(scrape, "retry_budget_decisions_total"), 12)
        self.assertEqual(s.total(scrape, "retry_budget_decisions_total", action="ACTION_DEFERRED"), 7)


if __name__ == "__main__":
    unittest.main()
