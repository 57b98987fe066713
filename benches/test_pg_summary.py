#!/usr/bin/env python3
"""Tests of benches/pg_summary.py: how the windows of benches/pg.sh become
the PostgreSQL targets' ratios and the CPU a decision.

Run: python3 benches/test_pg_summary.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pg_summary  # noqa: E402


def window(label, rps):
    cores = {"server": 0.5, "postgres": 1.0, "busy": 1.9, "other": 0.4}
    return {"label": label, "throughput_rps": rps, "errors": 0, "cores": cores,
            "client_cpu_cores": 0.2}


def pgbench(rnd, clients, tps):
    return {"kind": "pgbench", "label": "pgbench", "round": rnd, "clients": clients, "tps": tps,
            "cores": {"postgres": 1.5, "pgbench": 0.3, "busy": 1.9, "other": 0.1}}


class PgSummaryTest(unittest.TestCase):
    def test_each_round_is_judged_against_its_own_best_pgbench(self):
        rows = [
            window("pg/durable", 9000), pgbench(1, 1, 2000), pgbench(1, 32, 6000),
            pgbench(1, 64, 5000),
            # A failed pgbench (no tps) is no figure, not a zero.
            window("pg/durable", 8000), pgbench(2, 1, 2000), pgbench(2, 32, 4000),
            pgbench(2, 64, None),
        ]
        rounds = pg_summary.pgbench_rounds(rows)
        self.assertEqual([r["ratio"] for r in rounds], [1.5, 2.0])
        self.assertEqual(rounds[0]["best"]["clients"], 32)
        self.assertIn("median 1.75 (met", pg_summary.report(rows))

    def test_a_big_window_is_paired_with_the_small_one_just_before_it(self):
        rows = [
            window("pg/stored-small", 1000), window("pg/stored-big", 700),
            window("pg/stored-small", 1000), window("pg/stored-small", 2000),
            window("pg/stored-big", 1800), window("pg/stored-big", 5000),
        ]
        ratios = [p[2] for p in pg_summary.stored_pairs(rows, "pg")]
        self.assertEqual(ratios, [0.7, 0.9])
        self.assertEqual(pg_summary.verdict(ratios, 0.8), "median 0.80 (met, target >= 0.8)")
        self.assertIn("MISSED", pg_summary.verdict([0.7], 0.8))

    def test_the_generators_own_cpu_figure_stands_for_it_and_other_is_the_rest(self):
        split = pg_summary.per_unit(window("pg/durable", 10000), 10000)
        self.assertAlmostEqual(split["loadgen"], 20.0)
        self.assertAlmostEqual(split["other"], 20.0)  # 1.9 - 0.5 - 1.0 - 0.2 cores
        self.assertAlmostEqual(split["busy"], 190.0)


if __name__ == "__main__":
    unittest.main()
