#!/usr/bin/env python3
"""Tests of benches/callgrind_summary.py: how a callgrind dump is read, with
one event (instructions) or with the cache simulation's nine, and how the
simulated last-level misses are put down to functions and to the callers of
the function that misses most. The cache-simulation figures in
BENCHMARKS.md rest on these rules.

Run: python3 benches/test_callgrind_summary.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind_summary as cs  # noqa: E402

# Names are compressed as callgrind writes them: "(N) name" the first time,
# "(N)" after. The second cost line of handler_a leaves out its trailing
# zero events; the call's line carries the inclusive cost of the call.
CACHE_SIM_DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: LL cache: 524288 B, 64 B, 8-way associative
summary: 1000 0 0 0 0 0 0 40 20

fl=(1) ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S
fn=(1) __memcpy_avx_unaligned_erms
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

IR_ONLY_DUMP = """# callgrind format
positions: line
events: Ir
summary: 300

fl=(1) src/a.rs
fn=(1) a
1 300
"""


def parse(text):
    with tempfile.NamedTemporaryFile("w", suffix=".callgrind", delete=False) as f:
        f.write(text)
    try:
        return cs.parse(f.name)
    finally:
        os.unlink(f.name)


class Parse(unittest.TestCase):
    def test_every_event_is_kept_and_short_lines_are_padded(self):
        p = parse(CACHE_SIM_DUMP)
        self.assertTrue(p.has_cache_sim())
        self.assertEqual(p.ll_bytes, 524288)
        self.assertEqual(len(p.total), 9)
        self.assertEqual(p.self_cost[("/work/main/src/grpc/service.rs", "handler_a")], [600, 0, 0, 0, 0, 0, 0, 5, 0])
        misses = p.column(p.self_cost, *cs.LL_MISSES)
        self.assertEqual(misses[("./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S",
                                 "__memcpy_avx_unaligned_erms")], 30)
        self.assertEqual(misses[("/work/main/src/grpc/service.rs", "handler_b")], 25)

    def test_a_call_line_is_the_callees_inclusive_cost_and_the_edges(self):
        p = parse(CACHE_SIM_DUMP)
        # memcpy called from handler_a (25 misses) and from handler_b (5).
        self.assertEqual(p.column(p.inclusive, *cs.LL_MISSES)["__memcpy_avx_unaligned_erms"], 30)
        edges = p.column(p.calls, *cs.LL_MISSES)
        self.assertEqual(edges[("handler_a", "__memcpy_avx_unaligned_erms")], 25)
        self.assertEqual(edges[("handler_b", "__memcpy_avx_unaligned_erms")], 5)
        self.assertEqual(p.column(p.inclusive, "Ir")["handler_a"], 10)

    def test_the_report_names_the_missing_function_and_whose_memory_it_was(self):
        p = parse(CACHE_SIM_DUMP)
        ll = cs.ll_report(p, requests=10)
        self.assertEqual(ll["ll_kib"], 512)
        self.assertAlmostEqual(ll["per_request"], 6.0)
        self.assertEqual(list(ll["top_self"])[0], "__memcpy_avx_unaligned_erms")
        self.assertAlmostEqual(ll["top_self"]["__memcpy_avx_unaligned_erms"], 3.0)
        self.assertEqual(ll["top_callers"]["function"], "__memcpy_avx_unaligned_erms")
        self.assertEqual(ll["top_callers"]["callers"], {"handler_a": 2.5, "handler_b": 0.5})

    def test_a_dump_of_instructions_alone_has_no_cache_report(self):
        p = parse(IR_ONLY_DUMP)
        self.assertFalse(p.has_cache_sim())
        self.assertIsNone(p.ll_bytes)
        self.assertEqual(p.total, [300])
        self.assertEqual(p.column(p.self_cost, "Ir"), {("src/a.rs", "a"): 300})
        self.assertEqual(p.column(p.self_cost, *cs.LL_MISSES), {("src/a.rs", "a"): 0})


if __name__ == "__main__":
    unittest.main()
