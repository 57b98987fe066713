#!/usr/bin/env python3
"""Tests of benches/dhat_summary.py: how two DHAT profiles of the server
become allocations and bytes a request, and how an allocation site is
named. The allocations a call quoted in BENCHMARKS.md and docs/design.md
rest on these rules.

Run: python3 benches/test_dhat_summary.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dhat_summary  # noqa: E402

FRAMES = [
    "[root]",
    "0x48A1B2C: malloc (in /usr/libexec/valgrind/vgpreload_dhat-amd64-linux.so)",
    "0x1000: alloc (/rustc/abc/library/alloc/src/alloc.rs:95)",
    "0x1001: with_capacity<u8> (/rustc/abc/library/alloc/src/vec/mod.rs:524)",
    "0x1002: new<tonic_prost::codec::ProstEncoder<a::B<c::D>>, e::F> (/root/.cargo/registry/src/x/tonic-0.14.5/src/codec/encode.rs:43)",
    "0x1003: tonic::server::grpc::Grpc<T>::map_response (/root/.cargo/registry/src/x/tonic-0.14.5/src/server/grpc.rs:447)",
    "0x1004: retry_budget::store::journal::entry (/work/main/src/store/journal.rs:100)",
    "0x1005: UnknownInlinedFun (/work/main/src/store/redb.rs:461)",
    "0x1006: submit (/work/main/src/store/redb.rs:461)",
    "0x1007: save (/work/main/src/store/redb.rs:491)",
    "0x1008: main (/work/main/src/main.rs:1)",
]


def pp(tb, tbk, frames):
    return {"tb": tb, "tbk": tbk, "tl": 0, "fs": frames}


def profile(pps):
    return {"dhatFileVersion": 2, "mode": "heap", "ftbl": FRAMES, "pps": pps}


class SiteNames(unittest.TestCase):
    def test_allocation_frames_are_skipped_and_generics_shortened(self):
        frames = [FRAMES[i] for i in (1, 2, 3, 4, 5, 10)]
        self.assertEqual(
            dhat_summary.site(frames),
            (
                "new<tonic_prost::codec::ProstEncoder<..>, e::F> (encode.rs:43)",
                "tonic::server::grpc::Grpc<T>::map_response (grpc.rs:447)",
                "main (main.rs:1)",
            ),
        )

    def test_inlined_frames_are_skipped(self):
        frames = [FRAMES[i] for i in (1, 6, 7, 8, 9)]
        self.assertEqual(
            dhat_summary.site(frames),
            (
                "retry_budget::store::journal::entry (journal.rs:100)",
                "submit (redb.rs:461)",
                "save (redb.rs:491)",
            ),
        )

    def test_a_function_types_arrow_is_not_a_bracket(self):
        self.assertEqual(
            dhat_summary.shorten_generics("new<a::MapErr<b::C<d::E>, fn(f::G) -> h::I>, j::K>"),
            "new<a::MapErr<..>, j::K>",
        )
        self.assertEqual(dhat_summary.shorten_generics("call<fn(u8) -> u16>"), "call<fn(u8) -> u16>")

    def test_a_stack_of_allocation_frames_keeps_its_last(self):
        self.assertEqual(dhat_summary.site([FRAMES[1], FRAMES[2]]), ("alloc (alloc.rs:95)",))


class PerRequest(unittest.TestCase):
    def write(self, d, scenario, window, pps, requests):
        with open(os.path.join(d, f"{scenario}.{window}.dhat"), "w") as f:
            json.dump(profile(pps), f)
        with open(os.path.join(d, f"{scenario}.{window}.json"), "w") as f:
            json.dump({"requests": requests}, f)

    def test_the_difference_of_two_windows_over_their_requests(self):
        encoder = [1, 2, 3, 4, 5, 10]
        journal = [1, 6, 7, 8, 9]
        with tempfile.TemporaryDirectory() as d:
            # The start allocates 1 MB once; each request a 1,024-byte buffer,
            # and every other request a 600-byte journal entry.
            self.write(d, "durable", "short", [
                pp(1_000_000, 1, [1, 2, 10]),
                pp(1024 * 1000, 1000, encoder),
                pp(600 * 500, 500, journal),
            ], 1000)
            self.write(d, "durable", "long", [
                pp(1_000_000, 1, [1, 2, 10]),
                pp(1024 * 4000, 4000, encoder),
                pp(600 * 2000, 2000, journal),
            ], 4000)
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(dhat_summary.main_with([d]), 0)
            with open(os.path.join(d, "summary.json")) as f:
                summary = json.load(f)["durable"]
        self.assertEqual(summary["requests"], 3000)
        self.assertAlmostEqual(summary["allocations_per_request"], 1.5)
        self.assertAlmostEqual(summary["bytes_per_request"], 1024 + 300)
        sites = summary["sites"]
        self.assertEqual([s["bytes"] for s in sites], [1024, 300])
        self.assertEqual([s["allocations"] for s in sites], [1.0, 0.5])
        self.assertEqual(sites[1]["site"][0], "retry_budget::store::journal::entry (journal.rs:100)")
        # The start's allocation is the same in both windows: no site.
        self.assertNotIn("main (main.rs:1)", [s["site"][0] for s in sites])
        self.assertIn("1.5 allocations, 1,324 bytes a request", out.getvalue())

    def test_a_long_window_with_no_more_requests_is_refused(self):
        with self.assertRaises(ValueError):
            dhat_summary.per_request(({}, [0, 0]), ({}, [0, 0]), 100, 100)


if __name__ == "__main__":
    unittest.main()
