#!/usr/bin/env python3
"""Tests of benches/across.py: each run's figure is the one summarize.py
judges, misses are marked, the counts, medians and ranges below the table
take only the runs that judged the target, a summary written by --write
gives the same table as the results files it was written from, and the
cost model takes each kind's median.

Run: python3 benches/test_across.py
(benches/loadgen/tests/bench_summary.rs runs it under `cargo test --workspace`).
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import across  # noqa: E402


def closed(label, throughput, other=0.0, threads=None):
    rec = {"label": label, "mode": "closed", "throughput_rps": throughput,
           "other_busy_cores": other, "server_cpu_us_per_request": 1e6 / throughput}
    if threads:
        rec["server_thread_cpu_us_per_request"] = threads
    return rec


def write_run(directory, name, date, windows, cpu="AMD EPYC", **machine):
    path = os.path.join(directory, f"2026-12-01-2core-amd-run{name}.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "machine", "date": date, "cpu": cpu, "commit": "abc1234", **machine}) + "\n")
        for w in windows:
            f.write(json.dumps(w) + "\n")
    return path


class Across(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_figures_are_the_judged_ratios_and_misses_are_marked(self):
        path = write_run(self.dir.name, "ZA", "2026-12-01T10:00:00Z", [
            closed("closed/health", 100_000), closed("closed/health", 100_000),
            # The second pair had other work on the machine: left out.
            closed("closed/pure-next-action", 95_000), closed("closed/pure-next-action", 40_000, other=0.9),
            closed("durable/pure-next-action", 100_000), closed("durable/group-commit", 45_000),
        ])
        row = across.summary_row(path)
        figs = row["targets"]
        self.assertEqual((row["run"], row["machine"]), ("ZA", "AMD EPYC"))
        # An older run's family/model come from the table of known runs.
        self.assertEqual(across.kind({"cpu": "AMD EPYC"}, "ZA", {"ZA": "25/1"}), "AMD EPYC 25/1")
        self.assertEqual(across.kind({"cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 17}, "ZA",
                                     {"ZA": "25/1"}), "AMD EPYC 25/17")
        value, met, _ = figs["pure/h"]
        self.assertAlmostEqual(value, 0.95)
        self.assertTrue(met)
        value, met, _ = figs["dur/pure"]
        self.assertAlmostEqual(value, 0.45)
        self.assertFalse(met)
        self.assertEqual(across.cell(*figs["dur/pure"]), "0.45*")
        # Not in the run: not judged.
        self.assertEqual(across.cell(*figs["h2 RD/h"]), "-")

    def test_a_figure_is_never_rounded_across_its_bound(self):
        self.assertEqual(across.cell(0.8996, False, 0.9), "0.8996*")
        self.assertEqual(across.cell(0.8970, False, 0.9), "0.897*")
        self.assertEqual(across.cell(0.9019, True, 0.9), "0.90")
        self.assertEqual(across.cell(0.4951, False, 0.5), "0.495*")
        self.assertEqual(across.cell(139.2, True, 256.0), "139")
        self.assertEqual(across.cell(93.28, True, 256.0), "93")

    def test_counts_and_medians_take_only_the_runs_that_judged(self):
        paths = []
        for i, (name, ratio) in enumerate([("ZC", 0.40), ("ZB", 0.55), ("ZD", 0.46)]):
            paths.append(write_run(self.dir.name, name, f"2026-12-01T1{i}:00:00Z", [
                closed("durable/pure-next-action", 100_000),
                closed("durable/group-commit", 100_000 * ratio),
            ], cpu="Intel(R) Xeon(R) Processor", cpu_family=6, cpu_model=207))
        text = across.report(paths)
        lines = text.splitlines()
        # In the order they ran, not the order given.
        self.assertEqual([line.split()[0] for line in lines[1:4]], ["ZC", "ZB", "ZD"])
        self.assertIn("Intel Xeon 6/207", lines[1])
        met = next(line for line in lines if line.startswith("met in"))
        median = next(line for line in lines if line.startswith("median"))
        rng = next(line for line in lines if line.startswith("range"))
        self.assertIn("1 of 3", met)
        self.assertIn("0.46", median)
        self.assertIn("0.40-0.55", rng)
        # Targets no run judged: a dash, not "0 of 0".
        self.assertNotIn("0 of 0", met)
        # One kind of machine: no lines by machine.
        self.assertNotIn("by machine", text)

    def test_medians_by_machine(self):
        paths = [
            write_run(self.dir.name, name, f"2026-12-01T1{i}:00:00Z", [
                closed("durable/pure-next-action", 100_000),
                closed("durable/group-commit", 100_000 * ratio),
            ], cpu="AMD EPYC", cpu_family=25, cpu_model=model)
            for i, (name, ratio, model) in enumerate([("ZE", 0.40, 1), ("ZF", 0.60, 1), ("ZG", 0.45, 17)])
        ]
        lines = across.report(paths).splitlines()
        start = lines.index("by machine: median (runs met / judged)")
        self.assertTrue(lines[start + 1].startswith("AMD EPYC 25/1 "))
        self.assertIn("0.50 (1/2)", lines[start + 1])
        self.assertTrue(lines[start + 2].startswith("AMD EPYC 25/17 "))
        self.assertIn("0.45 (0/1)", lines[start + 2])


    def test_a_summary_gives_the_table_of_its_results_files(self):
        paths = [
            write_run(self.dir.name, name, f"2026-12-01T1{i}:00:00Z", [
                closed("closed/health", 100_000), closed("closed/pure-next-action", 100_000 * ratio),
                closed("durable/pure-next-action", 100_000),
                closed("durable/group-commit", 40_000),
            ], cpu="AMD EPYC")
            for i, (name, ratio) in enumerate([("ZH", 0.95), ("ZI", 0.85)])
        ]
        tsv = os.path.join(self.dir.name, "models.tsv")
        with open(tsv, "w") as f:
            f.write("# run\tfamily/model\nZH\t26/2\nZI\t26/2\n")
        out = os.path.join(self.dir.name, "summary.jsonl")
        self.assertEqual(across.main(["across.py", "--write", out, "--models", tsv, *reversed(paths)]), 0)
        with open(out) as f:
            self.assertEqual(len(f.readlines()), 2)
        from_summary = across.report([out])
        self.assertIn("AMD EPYC 26/2", from_summary)
        self.assertIn("1 of 2", from_summary)
        # The same table as from the results files, given the same models.
        rows = sorted((across.summary_row(p, across.known_models(tsv)) for p in paths),
                      key=lambda r: r["date"])
        self.assertEqual([r["targets"] for r in across.all_rows([out])], [r["targets"] for r in rows])
        # A summary and a new results file can be given together.
        newer = write_run(self.dir.name, "ZJ", "2026-12-02T10:00:00Z", [
            closed("closed/health", 100_000), closed("closed/pure-next-action", 92_000)])
        lines = across.report([out, newer]).splitlines()
        self.assertEqual([line.split()[0] for line in lines[1:4]], ["ZH", "ZI", "ZJ"])

    def test_costs_by_machine_take_each_kinds_median(self):
        paths = [
            write_run(self.dir.name, name, f"2026-12-01T1{i}:00:00Z", [
                closed("closed/health", 1e6 / health),
                closed("closed/pure-next-action", 1e6 / (health + 1)),
                closed("durable/pure-next-action", 1e6 / (health + 1)),
                closed("durable/group-commit", 1e6 / (3 * health),
                       threads={"tokio-rt-worker": 2 * health, "redb-writer": health / 2,
                                "redb-checkpoint": health / 2}),
                {"label": "fsync", "scenario": "fsync", "latency_us": {"p50": fsync}},
            ], cpu="AMD EPYC", cpu_family=25, cpu_model=1)
            for i, (name, health, fsync) in enumerate([("ZK", 10.0, 200), ("ZL", 12.0, 300), ("ZM", 20.0, 250)])
        ]
        lines = across.cost_report(paths).splitlines()
        self.assertEqual(lines[0].split()[:3], ["machine", "runs", "health"])
        cells = lines[1].split()
        self.assertEqual(cells[:4], ["AMD", "EPYC", "25/1", "3"])
        # health, pure, pure (dur), durable, worker, writer, checkpoint, 1 fsync/dec,
        # dur/pure, fsync ms: medians over the three runs.
        self.assertEqual(cells[4:11], ["12.0", "13.0", "13.0", "36.0", "24.0", "6.0", "6.0"])
        self.assertEqual(cells[11], "-")
        self.assertEqual(cells[12:], ["2.77", "0.25"])


if __name__ == "__main__":
    unittest.main()
