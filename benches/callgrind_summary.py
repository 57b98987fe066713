#!/usr/bin/env python3
"""Instructions per request from callgrind dumps of the server.

Usage: benches/callgrind_summary.py DIR

DIR holds, per scenario, `SCENARIO.callgrind` (the server's counters over the load window)
and `SCENARIO.json` (the loadgen's report of the same window). Prints, per scenario,
instructions (Ir) a request, the inclusive cost of the functions that matter, and each
scenario against `health` (BENCHMARKS.md's table and ratios); with `--cache-sim=yes`
(profile.sh with CACHE_SIM_KIB) also the last-level data misses a request. Writes summary.json.
(The split by crate, the top functions and where the misses fall: git history, 35e2131.)

Valgrind hides SHA-NI, so sha256 runs its portable code here. The column "SHA-NI" against
health replaces each call of the portable compression by the instructions of sha2's SHA-NI
compression of one block, counted in the server binary the dump names (`objdump`; every
jitter input, "id:attempt", is one block for ids under 45 bytes): the code the server runs
on every machine kind here.
"""

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

ENGINE_THREADS = "fjall worker threads (all of them)"

# Inclusive costs worth naming: (label, regex on the function name).
FUNCTIONS = [
    ("handler RetryDelay (ours)", r"RetryBudgetService<S> as .*RetryBudget>::retry_delay::\{\{closure\}\}$"),
    # Before 2a06a68 an async_trait method (its body a closure); since, a plain function.
    ("handler NextAction (ours)", r"RetryBudgetService<S> as .*RetryBudget>::next_action(::\{\{closure\}\})?$"),
    ("  budget::delay::retry_delay (sha256)", r"^retry_budget::budget::delay::retry_delay$"),
    ("  budget::action::explain (format!)", r"^retry_budget::budget::action::explain$"),
    # Renamed in c873c4d: decide_pure, decide, Ledger::decide and activity::plan before it.
    ("  budget::decision::pure_decision", r"^retry_budget::budget::decision::(decide_pure|pure_decision)$"),
    ("  budget::decision::draft_event", r"^retry_budget::budget::decision::(decide|draft_event)$"),
    ("  ledger::Ledger::report", r"^retry_budget::ledger::Ledger<S>::(report::\{\{closure\}\}|try_report)$"),
    ("    ledger::Ledger::decided_and_to_save", r"^retry_budget::ledger::Ledger<S>::(decide|decided_and_to_save)$"),
    ("    budget::activity::draft_or_replay", r"^retry_budget::budget::activity::(plan|draft_or_replay)$"),
    ("    EmbeddedStore::load", r"EmbeddedStore as retry_budget::store::Store>::load::\{\{closure\}\}$"),
    ("      fjall Keyspace::get", r"^fjall::keyspace::Keyspace::get$"),
    ("    EmbeddedStore::save (encode, hand-off)", r"EmbeddedStore as retry_budget::store::Store>::save$"),
    ("    ledger::locks (lock + release)", r"^retry_budget::ledger::locks::KeyLocks::(lock::\{\{closure\}\}|try_lock)$|^<retry_budget::ledger::locks::KeyGuard as core::ops::drop::Drop>::drop$"),
    ("      record encode (protobuf)", r"^retry_budget::store::codec::encode_into$"),
    ("      store::codec::decode", r"^retry_budget::store::codec::decode$"),
    ("  grpc::convert Decided -> response", r"From<retry_budget::ledger::Decided>"),
    ("store writer thread (Writer::run)", r"^retry_budget::store::embedded::writer::Writer::run$"),
    ("  fjall WriteBatch::commit", r"^fjall::batch::WriteBatch::commit$"),
    ("    fjall journal Writer::write_batch", r"^fjall::journal::writer::Writer::write_batch$"),
    ("    lsm_tree Memtable::insert", r"^lsm_tree::memtable::Memtable::insert$"),
    ("  fjall Database::persist", r"^fjall::db::Database::persist$"),
    ("fjall flush (memtable to sorted file)", r"^fjall::flush::worker::run$"),
    ("fjall compaction", r"^fjall::compaction::worker::run$"),
    # The threads' loop, whether or not a flush or compaction ran in the window.
    (ENGINE_THREADS, r"^fjall::worker_pool::worker_tick$"),
    ("health handler (tonic-health check)", r"HealthService as .*Health>::check::\{\{closure\}\}$"),
    ("prost decode (all messages)", r"^prost::encoding::.*merge|Message>::decode|ProstDecoder.*decode"),
    ("prost encode (all messages)", r"ProstEncoder.*encode|Message>::encode"),
    ("tonic EncodeBody (response framing)", r"EncodeBody<.*poll_frame"),
]

# Data misses in the simulated last-level cache: reads and writes.
LL_MISSES = ("DLmr", "DLmw")
# The portable compression as valgrind runs it, and sha2's SHA-NI one.
SOFT_SHA256 = re.compile(r"^sha2::sha256::(compress256|soft::compress)$")
SHANI_SHA256 = "x86_sha8compress"


class Profile:
    """What `parse` reads from one dump; costs are lists, one per event."""

    def __init__(self):
        self.events, self.total, self.ll_bytes, self.command = ["Ir"], [0], None, None
        self.self_cost, self.inclusive = {}, {}
        self.call_counts = defaultdict(int)

    def column(self, table, *events):
        """The sum of `events` for each key of `table` (absent events: 0)."""
        idx = [self.events.index(e) for e in events if e in self.events]
        return {k: sum(v[i] for i in idx) for k, v in table.items()}

    def has_cache_sim(self):
        return "DLmr" in self.events


def parse(path):
    """A callgrind dump (positions: line): the exclusive cost of each (file, function) and the
    inclusive cost of each function, each a list by event. A function's inclusive cost is the sum of the calls made to it from other
    functions: exact for functions that are not recursive, whatever the inlined code's file
    names or the call stacks active when the dump was taken."""
    p = Profile()
    compressed = {"fn": {}, "fl": {}}

    def name(kind, ref):
        m = re.match(r"\((\d+)\)(?: (.*))?$", ref)
        if not m:
            return ref
        if m.group(2) is not None:
            compressed[kind][m.group(1)] = m.group(2)
        return compressed[kind].get(m.group(1), ref)

    def add(table, key, values):
        # A cost line may leave out trailing events that are zero.
        into = table.setdefault(key, [0] * len(p.events))
        for i, x in enumerate(values):
            into[i] += int(x)

    fn, fn_file, current_file, callee, call_pending = None, "???", "???", None, False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("events:"):
                p.events = line.split()[1:]
            elif line.startswith("cmd:"):
                p.command = line.split()[1]
            elif line.startswith("summary:"):
                p.total = [int(x) for x in line.split()[1:]]
                p.total += [0] * (len(p.events) - len(p.total))
            elif m := re.match(r"desc: LL cache: (\d+) B", line):
                p.ll_bytes = int(m.group(1))
            elif (key := line.partition("=")[0]) in ("fl", "fi", "fe", "fn", "cfn", "cfi", "cfl", "ob", "cob", "calls"):
                value = line.partition("=")[2]
                if key == "fl":
                    fn_file = current_file = name("fl", value)
                elif key in ("fi", "fe"):
                    current_file = name("fl", value)
                elif key == "fn":
                    fn, current_file = name("fn", value), fn_file
                elif key == "cfn":
                    callee = name("fn", value)
                elif key in ("cfi", "cfl"):
                    name("fl", value)
                elif key == "calls":
                    call_pending = True
                    if callee != fn:
                        p.call_counts[callee] += int(value.split()[0])
            elif line[0] in "0123456789+-*":
                values = line.split()[1:]
                if not call_pending:
                    add(p.self_cost, (current_file, fn), values)
                elif callee != fn:
                    add(p.inclusive, callee, values)
                call_pending = False
    return p


def named_costs(inclusive, requests):
    """The inclusive cost a request of each of FUNCTIONS that ran."""
    named = {}
    for label, pattern in FUNCTIONS:
        rx = re.compile(pattern)
        cost = sum(v for f, v in inclusive.items() if rx.search(f))
        if cost:
            named[label] = cost / requests
    return named


def ll_report(p, requests):
    """Last-level data misses a request (reads and writes), and the simulated cache's size."""
    return {
        "ll_kib": p.ll_bytes // 1024 if p.ll_bytes else None,
        "per_request": sum(p.total[p.events.index(e)] for e in LL_MISSES) / requests,
    }


@functools.cache
def shani_block_ir(binary):
    """The instructions of sha2's SHA-NI compression of one block: each instruction of the
    function once, padding left out; None without the binary or binutils."""
    if not binary or not os.path.exists(binary) or not shutil.which("objdump") or not shutil.which("nm"):
        return None
    symbols = subprocess.run(["nm", binary], capture_output=True, text=True).stdout.split("\n")
    counts = set()
    for name in [line.split()[-1] for line in symbols if SHANI_SHA256 in line]:
        listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={name}", binary],
                                 capture_output=True, text=True).stdout
        counts.add(sum(1 for line in listing.split("\n") if re.match(r"^\s+[0-9a-f]+:\t", line) and "int3" not in line))
    return max(counts) if counts else None


def with_shani(p, total):
    """`total` with each portable compression call replaced by one SHA-NI block, or None."""
    soft = sum(v for (_, fn), v in p.column(p.self_cost, "Ir").items() if SOFT_SHA256.search(fn))
    calls = sum(n for fn, n in p.call_counts.items() if SOFT_SHA256.search(fn))
    block = shani_block_ir(p.command) if calls else None
    return None if block is None else total - soft + calls * block


def print_scenario(s, summary, p, requests, total):
    print(f"\n== {s}: {requests:,} requests, {total / requests:,.0f} instructions per request (user space)")
    print("   functions (inclusive):")
    named = summary["functions_per_request"]
    for k, v in named.items():
        print(f"     {k:<40} {v:>9,.0f}  {100 * v / (total / requests):5.1f}%")
    # fjall flushes a memtable once it is full and compacts the sorted files behind it: a
    # window holds none, one or several, so the total moves from dump to dump; the request
    # path does not.
    if s.startswith("durable") and ENGINE_THREADS in named:
        path = total / requests - named[ENGINE_THREADS]
        summary["ir_per_request_without_engine_threads"] = path
        print(f"   without fjall's worker threads (the request path): {path:,.0f} instructions a decision")
    if p.has_cache_sim():
        ll = summary["ll_misses"] = ll_report(p, requests)
        print(f"   last-level data misses a request (simulated LL of {ll['ll_kib']} KiB, reads and writes): "
              f"{ll['per_request']:,.1f}")


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    d = sys.argv[1]
    order = ["health", "retry-delay", "pure-next-action", "durable-next-action"]
    scenarios = sorted(f[:-len(".callgrind")] for f in os.listdir(d) if f.endswith(".callgrind"))
    scenarios.sort(key=lambda s: order.index(s) if s in order else 99)
    summary = {}
    for s in scenarios:
        with open(os.path.join(d, s + ".json")) as f:
            report = json.load(f)
        requests = report["requests"]
        if not requests:
            print(f"\n== {s}: no successful request in the window ({report.get('error_codes')}); skipped")
            continue
        p = parse(os.path.join(d, s + ".callgrind"))
        total = p.total[p.events.index("Ir")]
        shani = with_shani(p, total)
        summary[s] = {
            "requests": requests,
            "ir_total": total,
            "ir_per_request": total / requests,
            "ir_per_request_shani": (shani if shani is not None else total) / requests,
            "functions_per_request": named_costs(p.column(p.inclusive, "Ir"), requests),
        }
        print_scenario(s, summary[s], p, requests, total)
    if "health" in summary:
        base, shani_base = summary["health"]["ir_per_request"], summary["health"]["ir_per_request_shani"]
        print("\ninstructions per request against health (a CPU-bound server's throughput ratio is about the inverse);")
        print("SHA-NI: with SHA-256 as the server runs it on a CPU with SHA-NI (see the top of this script):")
        for s, v in summary.items():
            ratio, shani = v["ir_per_request"] / base, v["ir_per_request_shani"] / shani_base
            print(f"   {s:<22} {v['ir_per_request']:>9,.0f}  x{ratio:.3f}  (throughput bound ~{1 / ratio:.2f})"
                  f"   SHA-NI {v['ir_per_request_shani']:>9,.0f}  x{shani:.3f}")
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
