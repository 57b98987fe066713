#!/usr/bin/env python3
"""Tests of benches/flame_split.py: how folded stacks are split into the
handler, the kernel and the shared stack, and counted in microseconds a
request. The flame-graph split in BENCHMARKS.md rests on these rules.

Run: python3 benches/test_flame_split.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flame_split  # noqa: E402

W = "tokio-rt-worker;clone3;start_thread;tokio::runtime::task::harness::Harness::poll"
HANDLER = W + ";retry_budget::grpc::service::{impl#3}::next_action_durable::{async_fn#0}"


class Split(unittest.TestCase):
    def test_a_stack_below_the_handler_is_the_handlers_kernel_included(self):
        lines = [
            f"{HANDLER};retry_budget::store::journal::entry;retry_budget::store::codec::encode_into 3000",
            f"{HANDLER};retry_budget::store::redb::Records::get;__memcpy_avx_unaligned_erms 1000",
            f"{HANDLER};__x64_sys_futex_[k] 500",
            f"{W};h2::proto::streams::Streams::poll_complete 4000",
            f"{W};tokio::io::poll_read_buf;__x64_sys_recvfrom_[k] 2000",
            "redb-writer;clone3;std::thread::start;fdatasync_[k] 7000",
        ]
        p = flame_split.profile(lines, requests=10)
        # ns over 10 requests, in us: 1000 ns is 0.1 us a request.
        self.assertAlmostEqual(p["split"]["handler"], 0.45)
        self.assertAlmostEqual(p["split"]["kernel"], 0.2)
        self.assertAlmostEqual(p["split"]["rest"], 0.4)
        self.assertAlmostEqual(p["threads"]["tokio-rt-worker"], 1.05)
        self.assertAlmostEqual(p["threads"]["redb-writer"], 0.7)
        parts = p["parts"]
        self.assertAlmostEqual(parts[("journal entry (encode and seal)", "worker")], 0.3)
        self.assertAlmostEqual(parts[("  of it, encoding the record", "worker")], 0.3)
        self.assertAlmostEqual(parts[("overlay lookup (Records::get)", "worker")], 0.1)
        # memcpy counts where it is the leaf, wherever it was called from.
        self.assertAlmostEqual(parts[("memcpy (leaf)", "worker")], 0.1)
        self.assertAlmostEqual(parts[("socket read and write paths", "worker")], 0.2)
        self.assertNotIn(("memcpy (leaf)", "other"), parts)

    def test_mimalloc_is_counted_by_the_prefix_of_its_frames(self):
        lines = [
            f"{W};alloc::raw_vec::finish_grow;_mi_malloc_generic;mi_find_page 300",
            f"{W};bytes::BytesMut::reserve;mi_theap_malloc_zero;_mi_page_malloc_zero 200",
            # A frame with `mi_` inside its name is not mimalloc's.
            f"{W};hyper::semi_closed::poll 500",
            f"{W};h2::frame;asm_exc_page_fault_[k];exc_page_fault_[k];handle_mm_fault_[k] 100",
        ]
        parts = flame_split.profile(lines, requests=1)["parts"]
        self.assertAlmostEqual(parts[("mimalloc, all its paths (inclusive)", "worker")], 0.5)
        self.assertAlmostEqual(parts[("page faults (memory touched afresh)", "worker")], 0.1)

    def test_the_thread_name_frame_is_not_a_part(self):
        # A thread named like a pattern is not counted as that part.
        p = flame_split.profile(["redb::tree_store::page_store::cached_file::PagedCachedFile::read 100"], 1)
        self.assertEqual(p["parts"], {})

    def test_threads_line(self):
        lines = [f"{W};h2::frame 3000", f"{W};x 1000", "redb-writer;fdatasync_[k] 2000"]
        p = flame_split.profile(lines, requests=10)
        self.assertEqual(
            flame_split.threads_line("durable", 10, p),
            "durable: 10 requests, 0.6 us of server CPU a request: tokio-rt-worker 0.4, redb-writer 0.2",
        )

    def test_report_from_a_directory(self):
        with tempfile.TemporaryDirectory() as d:
            for name, stacks, requests in (
                ("pure-next-action", [f"{W};h2::frame 800"], 100),
                ("durable-next-action", [f"{W};h2::frame 1200", f"{HANDLER};x 600"], 100),
            ):
                with open(os.path.join(d, f"{name}.folded"), "w") as f:
                    f.write("\n".join(stacks) + "\n")
                with open(os.path.join(d, f"{name}.json"), "w") as f:
                    json.dump({"requests": requests}, f)
            base_requests, base = flame_split.load(d, "pure-next-action")
            _, other = flame_split.load(d, "durable-next-action")
            text = flame_split.report("pure-next-action", base, "durable-next-action", other)
        self.assertEqual(base_requests, 100)
        row = next(l for l in text.splitlines() if "our handler" in l)
        self.assertEqual(row.split()[-3:], ["0.00", "0.01", "+0.01"])
        row = next(l for l in text.splitlines() if l.strip().startswith("all"))
        self.assertEqual(row.split()[-3:], ["0.01", "0.02", "+0.01"])


if __name__ == "__main__":
    unittest.main()
