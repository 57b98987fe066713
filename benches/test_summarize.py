#!/usr/bin/env python3
"""Tests of the verdicts of benches/summarize.py: which windows a target's
ratio pairs, which pairs it leaves out, and when it judges nothing. The
figures in BENCHMARKS.md rest on these rules.

Run: python3 benches/test_summarize.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import os
import sys
import unittest
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import summarize  # noqa: E402


def window(throughput, *, other=0.0, cpu_us=10.0, p99=None, lag=None, mode="closed"):
    """One loadgen window as run.sh records it (the fields the verdicts read)."""
    rec = {
        "throughput_rps": throughput,
        "other_busy_cores": other,
        "server_cpu_us_per_request": cpu_us,
        "mode": mode,
    }
    if p99 is not None:
        rec["latency_us"] = {"p99": p99}
    if lag is not None:
        rec["pacer_lag_us"] = {"p99": lag}
    return rec


def runs_of(**by_label):
    runs = defaultdict(list)
    for label, recs in by_label.items():
        runs[label.replace("__", "/").replace("_", "-")] = list(recs)
    return runs


def row(rows, prefix):
    found = [r for r in rows if r["what"].startswith(prefix)]
    assert len(found) == 1, (prefix, [r["what"] for r in rows])
    return found[0]


class Verdicts(unittest.TestCase):
    def test_durable_is_judged_against_pure_on_the_same_server(self):
        runs = runs_of(
            closed__pure_next_action=[window(100_000), window(100_000)],
            durable__pure_next_action=[window(60_000), window(62_000)],
            durable__group_commit=[window(30_000), window(31_000)],
        )
        durable = row(summarize.verdicts(runs, {}), "durable / pure NextAction")
        self.assertEqual(durable["b"], "durable/pure-next-action")
        self.assertIn("same server", durable["what"])
        self.assertAlmostEqual(durable["ratio"], 30_500 / 61_000)
        self.assertEqual(durable["pair_ratios"], [0.5, 31_000 / 62_000])
        self.assertTrue(durable["met"])

    def test_older_files_fall_back_on_the_closed_loop(self):
        runs = runs_of(
            closed__pure_next_action=[window(100_000), window(100_000)],
            durable__group_commit=[window(30_000), window(31_000)],
        )
        durable = row(summarize.verdicts(runs, {}), "durable / pure NextAction")
        self.assertEqual(durable["b"], "closed/pure-next-action")
        self.assertNotIn("same server", durable["what"])
        self.assertAlmostEqual(durable["ratio"], 0.305)
        self.assertFalse(durable["met"])

    def test_a_pair_with_other_work_on_the_machine_is_left_out(self):
        runs = runs_of(
            closed__retry_delay=[window(90_000), window(50_000, other=0.6)],
            closed__health=[window(100_000), window(100_000)],
        )
        rd = row(summarize.verdicts(runs, {}), "RetryDelay / health throughput")
        self.assertAlmostEqual(rd["ratio"], 0.70)
        self.assertAlmostEqual(rd["clean_ratio"], 0.90)
        self.assertEqual(rd["pair_ratios"], [0.9, 0.5])
        self.assertTrue(rd["met"], "judged on the clean pair")

    def test_capacity_compares_server_cpu_a_request(self):
        runs = runs_of(
            closed__pure_next_action=[window(60_000, cpu_us=12.0)],
            closed__health=[window(60_000, cpu_us=10.0)],
        )
        capacity = row(summarize.verdicts(runs, {}), "server capacity: pure NextAction / health")
        self.assertAlmostEqual(capacity["ratio"], 10.0 / 12.0)
        self.assertFalse(capacity["met"])

    def test_an_open_loop_whose_generator_fell_behind_is_not_judged(self):
        late = summarize.LATE_SENDS_US + 1
        runs = runs_of(
            open__pure_next_action=[window(40_000, mode="open", p99=900, lag=late)],
            open__health=[window(40_000, mode="open", p99=600, lag=50)],
        )
        pure = row(summarize.verdicts(runs, {}), "pure NextAction / health p99")
        self.assertAlmostEqual(pure["ratio"], 1.5)
        self.assertIsNone(pure["clean_ratio"])
        self.assertIsNone(pure["met"], "no pair on schedule: not judged, neither met nor missed")

    def test_an_open_loop_is_judged_on_the_pairs_on_schedule(self):
        runs = runs_of(
            open__pure_next_action=[
                window(40_000, mode="open", p99=9_000, lag=5_000),
                window(40_000, mode="open", p99=700, lag=60),
            ],
            open__health=[
                window(40_000, mode="open", p99=600, lag=70),
                window(40_000, mode="open", p99=600, lag=80),
            ],
        )
        pure = row(summarize.verdicts(runs, {}), "pure NextAction / health p99")
        self.assertAlmostEqual(pure["clean_ratio"], 700 / 600)
        self.assertTrue(pure["met"])

    def test_peak_rss_is_the_largest_of_the_big_stores_servers(self):
        servers = {"durable/stored-big": [{"vm_hwm_kib": 130 * 1024}, {"vm_hwm_kib": 300 * 1024}]}
        rss = row(summarize.verdicts(defaultdict(list), servers), "peak RSS")
        self.assertAlmostEqual(rss["ratio"], 300)
        self.assertFalse(rss["met"])

    def test_a_noisy_group_says_how_much_of_it_the_host_stole(self):
        runs = {
            "durable/group-commit": [{"other_busy_cores": 0.5, "steal_cores": 0.4},
                                     {"other_busy_cores": 0.3, "steal_cores": 0.2}],
            "closed/health": [{"other_busy_cores": 0.1, "steal_cores": 0.1}],
            "closed/pure-next-action": [{"other_busy_cores": 0.4}],
        }
        noisy = summarize.noisy_groups(runs)
        self.assertEqual([n[0] for n in noisy], ["closed/pure-next-action", "durable/group-commit"])
        self.assertEqual(summarize.noisy_label(*noisy[0]), "closed/pure-next-action")
        self.assertEqual(summarize.noisy_label(*noisy[1]),
                         "durable/group-commit (0.40 of a core, 0.30 of it stolen by the host)")

    def test_a_target_without_windows_is_not_judged(self):
        rows = summarize.verdicts(defaultdict(list), {})
        self.assertTrue(all(r["met"] is None for r in rows))


if __name__ == "__main__":
    unittest.main()
