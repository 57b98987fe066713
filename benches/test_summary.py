#!/usr/bin/env python3
"""Tests of the rules the figures of BENCHMARKS.md rest on: summary.py's verdicts, the PostgreSQL
ratios, the soak's server counters, and how callgrind_summary.py reads a dump with its simulated
cache misses.

Run: python3 benches/test_summary.py (benches/loadgen/tests/bench_summary.rs runs it under
`cargo test --workspace`).
"""

import os
import sys
import tempfile
import unittest
from collections import defaultdict

sys.dont_write_bytecode = True  # no benches/__pycache__ left beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind_summary as cs  # noqa: E402
import summary  # noqa: E402


def window(throughput, *, other=0.0, cpu_us=None, p99=None, lag=None, mode="closed"):
    """One loadgen window with the fields the summaries read."""
    rec = {"throughput_rps": throughput, "other_busy_cores": other, "mode": mode,
           "server_cpu_us_per_request": cpu_us or 1e6 / throughput}
    if p99 is not None:
        rec["latency_us"] = {"p99": p99}
    if lag is not None:
        rec["pacer_lag_us"] = {"p99": lag}
    return rec


def row(runs, prefix, servers=None):
    found = [r for r in summary.verdicts(defaultdict(list, runs), servers or {}) if r["what"].startswith(prefix)]
    assert len(found) == 1, prefix
    return found[0]


class Verdicts(unittest.TestCase):
    def test_durable_is_judged_against_pure_on_the_same_server(self):
        runs = {"closed/pure-next-action": [window(100_000)] * 2,
                "durable/pure-next-action": [window(60_000), window(62_000)],
                "durable/group-commit": [window(30_000), window(31_000)]}
        durable = row(runs, "durable / pure NextAction")
        self.assertEqual(durable["pair_ratios"], [0.5, 31_000 / 62_000])
        self.assertTrue(durable["met"])

    def test_a_pair_with_other_work_on_the_machine_is_left_out(self):
        rd = row({"closed/retry-delay": [window(90_000), window(50_000, other=0.6), window(60_000)],
                  "closed/health": [window(100_000)] * 2 + [window(100_000, other=0.6)]},
                 "RetryDelay / health throughput")
        self.assertAlmostEqual(rd["ratio"], 2 / 3)
        self.assertAlmostEqual(rd["clean_ratio"], 0.90)
        self.assertTrue(rd["met"])

    def test_capacity_compares_server_cpu_a_request(self):
        cap = row({"closed/pure-next-action": [window(60_000, cpu_us=12.0)],
                   "closed/health": [window(60_000, cpu_us=10.0)]}, "server capacity: pure NextAction / health")
        self.assertAlmostEqual(cap["ratio"], 10.0 / 12.0)
        self.assertFalse(cap["met"])

    def test_an_open_loop_is_judged_only_on_the_pairs_on_schedule(self):
        late = summary.LATE_SENDS_US + 1
        health = [window(40_000, mode="open", p99=600, lag=70), window(40_000, mode="open", p99=600, lag=80)]
        pure = [window(40_000, mode="open", p99=9_000, lag=5_000), window(40_000, mode="open", p99=700, lag=60)]
        judged = row({"open/pure-next-action": pure, "open/health": health}, "pure NextAction / health p99")
        self.assertAlmostEqual(judged["clean_ratio"], 700 / 600)
        self.assertTrue(judged["met"])
        pure[1]["pacer_lag_us"]["p99"] = late
        unjudged = row({"open/pure-next-action": pure, "open/health": health}, "pure NextAction / health p99")
        self.assertIsNone(unjudged["clean_ratio"])
        self.assertIsNone(unjudged["met"], "no pair on schedule: neither met nor missed")

    def test_peak_rss_is_the_largest_of_the_big_stores_servers_and_no_window_judges_nothing(self):
        servers = {"durable/stored-big": [{"vm_hwm_kib": 130 * 1024}, {"vm_hwm_kib": 300 * 1024}]}
        rss = row({}, "peak RSS", servers)
        self.assertAlmostEqual(rss["ratio"], 300)
        self.assertFalse(rss["met"])
        self.assertTrue(all(r["met"] is None for r in summary.verdicts(defaultdict(list), {})))

    def test_a_noisy_group_says_how_much_of_it_the_host_stole(self):
        noisy = summary.noisy_groups({
            "durable/group-commit": [{"other_busy_cores": 0.5, "steal_cores": 0.4},
                                     {"other_busy_cores": 0.3, "steal_cores": 0.2}],
            "closed/health": [{"other_busy_cores": 0.1}], "closed/pure-next-action": [{"other_busy_cores": 0.4}]})
        self.assertEqual([summary.noisy_label(*n) for n in noisy], [
            "closed/pure-next-action", "durable/group-commit (0.40 of a core, 0.30 of it stolen by the host)"])


class Postgres(unittest.TestCase):
    @staticmethod
    def pg_window(label, rps):
        return {"label": label, "throughput_rps": rps, "errors": 0, "client_cpu_cores": 0.2,
                "cores": {"server": 0.5, "postgres": 1.0, "busy": 1.9, "other": 0.4}}

    def test_each_round_is_judged_against_its_own_best_pgbench(self):
        pgbench = lambda rnd, clients, tps: {"kind": "pgbench", "round": rnd, "clients": clients, "tps": tps}  # noqa
        rows = [self.pg_window("pg/durable", 9000), pgbench(1, 1, 2000), pgbench(1, 32, 6000), pgbench(1, 64, 5000),
                # A failed pgbench (no tps) is no figure, not a zero.
                self.pg_window("pg/durable", 8000), pgbench(2, 32, 4000), pgbench(2, 64, None)]
        rounds = summary.pgbench_rounds(rows)
        self.assertEqual([(r["ratio"], r["best"]["clients"]) for r in rounds], [(1.5, 32), (2.0, 32)])
        self.assertIn("median 1.75 (met", summary.pg_report(rows))

    def test_a_big_window_is_paired_with_the_small_one_just_before_it(self):
        rows = [self.pg_window(f"pg/stored-{size}", rps) for size, rps in
                [("small", 1000), ("big", 700), ("small", 1000), ("small", 2000), ("big", 1800), ("big", 5000)]]
        ratios = [p[2] for p in summary.stored_pairs(rows, "pg")]
        self.assertEqual(ratios, [0.7, 0.9])
        self.assertEqual(summary.verdict(ratios, 0.8), "median 0.80 (met, target >= 0.8)")
        self.assertIn("MISSED", summary.verdict([0.7], 0.8))

    def test_the_generators_own_cpu_figure_stands_for_it_and_other_is_the_rest(self):
        split = summary.per_unit(self.pg_window("pg/durable", 10000), 10000)
        self.assertEqual({k: round(v, 6) for k, v in split.items()},
                         {"server": 50, "postgres": 100, "loadgen": 20, "other": 20, "busy": 190})


class Soak(unittest.TestCase):
    def test_a_scrape_is_summed_by_label(self):
        scrape = summary.parse_scrape(
            'retry_budget_decisions_total{action="ACTION_DEFERRED",code="deferred"} 7\n'
            'retry_budget_decisions_total{action="ACTION_SCHEDULE_RETRY",code="schedule_retry"} 5\n# EOF\n')
        self.assertEqual(summary.total(scrape, "retry_budget_decisions_total"), 12)
        self.assertEqual(summary.total(scrape, "retry_budget_decisions_total", action="ACTION_DEFERRED"), 7)


# Names compressed as callgrind writes them ("(N) name", then "(N)"); handler_a's second cost
# line leaves out its trailing zero events; a call's line is the call's inclusive cost.
CACHE_SIM_DUMP = """# callgrind format
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
desc: LL cache: 524288 B, 64 B, 8-way associative
summary: 1000 0 0 0 0 0 0 40 20
fl=(1) ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S
fn=(1) memcpy
0 200 0 0 0 0 0 0 20 10
fl=(2) /work/main/src/grpc/service.rs
fn=(2) handler_a
12 500
13 100 0 0 0 0 0 0 5
cfn=(1)
calls=2 0
14 150 0 0 0 0 0 0 15 10
fn=(3) handler_b
20 150 0 0 0 0 0 0 15 10
cfn=(1)
calls=1 0
21 50 0 0 0 0 0 0 5 0
cfn=(2)
calls=1 0
22 10 0 0 0 0 0 0 1 1
"""


class Callgrind(unittest.TestCase):
    def parse(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".callgrind", delete=False) as f:
            f.write(text)
        self.addCleanup(os.unlink, f.name)
        return cs.parse(f.name)

    def test_costs_calls_and_cache_misses(self):
        p = self.parse(CACHE_SIM_DUMP)
        self.assertTrue(p.has_cache_sim())
        self.assertEqual(p.self_cost[("/work/main/src/grpc/service.rs", "handler_a")], [600, 0, 0, 0, 0, 0, 0, 5, 0])
        self.assertEqual(p.column(p.self_cost, *cs.LL_MISSES)[("/work/main/src/grpc/service.rs", "handler_b")], 25)
        self.assertEqual(p.column(p.inclusive, *cs.LL_MISSES)["memcpy"], 30)
        self.assertEqual(p.column(p.inclusive, "Ir")["handler_a"], 10)
        self.assertEqual(p.call_counts["memcpy"], 3)
        self.assertEqual(cs.ll_report(p, requests=10), {"ll_kib": 512, "per_request": 6.0})

    def test_a_dump_of_instructions_alone_has_no_cache_report(self):
        p = self.parse("events: Ir\nsummary: 300\nfl=(1) src/a.rs\nfn=(1) a\n1 300\n")
        self.assertFalse(p.has_cache_sim())
        self.assertEqual((p.ll_bytes, p.total), (None, [300]))
        self.assertEqual(p.column(p.self_cost, *cs.LL_MISSES), {("src/a.rs", "a"): 0})


if __name__ == "__main__":
    unittest.main()
