#!/usr/bin/env python3
"""Instructions per request from callgrind dumps of the server.

Usage: benches/callgrind_summary.py DIR

DIR holds, per scenario, `SCENARIO.callgrind` (a dump of the server's
counters over the load window) and `SCENARIO.json` (the loadgen's report of
the same window). Prints, per scenario, instructions (Ir) per request, split
by crate (exclusive cost), the top functions, the inclusive cost of the
functions that matter for our code, and each scenario against `health`.
Writes summary.json.

Valgrind hides some CPU features (SHA-NI among them), so sha256 runs its
portable code here and costs more instructions than it does natively.
"""

import json
import os
import re
import sys
from collections import defaultdict

CHECKPOINT_THREAD = "checkpoint thread (all of it)"

# Inclusive costs worth naming: (label, regex on the function name).
FUNCTIONS = [
    ("handler RetryDelay (ours)", r"RetryBudgetService<S> as .*RetryBudget>::retry_delay::\{\{closure\}\}$"),
    ("handler NextAction (ours)", r"RetryBudgetService<S> as .*RetryBudget>::next_action::\{\{closure\}\}$"),
    ("  budget::delay::retry_delay (sha256)", r"^retry_budget::budget::delay::retry_delay$"),
    ("  budget::action::explain (format!)", r"^retry_budget::budget::action::explain$"),
    ("  grpc::service::pure_next_action", r"^retry_budget::grpc::service::pure_next_action$"),
    ("  ledger::Ledger::report", r"^retry_budget::ledger::Ledger<S>::report::\{\{closure\}\}$"),
    ("    budget::activity::plan", r"^retry_budget::budget::activity::plan$"),
    ("    RedbStore::load", r"RedbStore as retry_budget::store::Store>::load::\{\{closure\}\}$"),
    ("    RedbStore::save (until acked)", r"RedbStore as retry_budget::store::Store>::save::\{\{closure\}\}$"),
    ("    ledger::locks (lock + release)", r"^retry_budget::ledger::locks::KeyLocks::lock::\{\{closure\}\}$|^<retry_budget::ledger::locks::KeyGuard as core::ops::drop::Drop>::drop$"),
    ("      record encode (msgpack)", r"Serialize for retry_budget::budget::activity::ActivityRecord>::serialize$"),
    ("      store::codec::decode", r"^retry_budget::store::codec::decode$"),
    ("  grpc::convert Decided -> response", r"From<retry_budget::ledger::Decided>"),
    ("journal writer thread (Writer::run)", r"^retry_budget::store::redb::writer::Writer::run$"),
    ("  journal Segment::append", r"^retry_budget::store::journal::Segment::append$"),
    ("checkpoint thread (checkpoint_into)", r"^retry_budget::store::redb::checkpoint_into$"),
    # The thread's root: counted in full whether or not a checkpoint ran in
    # the window, so that the request path can be told apart below.
    (CHECKPOINT_THREAD, r"^retry_budget::store::redb::writer::checkpoint_loop$"),
    ("  redb BtreeMut::insert", r"^redb::tree_store::btree::BtreeMut<K,V>::insert$"),
    ("  redb WriteTransaction::commit", r"^redb::transactions::WriteTransaction::commit$"),
    ("  memset in redb PagedCachedFile::write", r"^redb::tree_store::page_store::cached_file::PagedCachedFile::write$"),
    ("health handler (tonic-health check)", r"HealthService as .*Health>::check::\{\{closure\}\}$"),
    ("prost decode (all messages)", r"^prost::encoding::.*merge|Message>::decode|ProstDecoder.*decode"),
    ("prost encode (all messages)", r"ProstEncoder.*encode|Message>::encode"),
    ("tonic EncodeBody (response framing)", r"EncodeBody<.*poll_frame"),
]


def parse(path):
    """Reads a callgrind dump (positions: line, events: Ir).

    Returns (total, self_cost[(file, function)], inclusive[function]). The
    inclusive cost of a function is the sum of the costs of the calls made
    to it from other functions: exact for functions that are not recursive,
    and unaffected by inlined code that callgrind_annotate lists under other
    file names, or by the call stacks that were active when the dump was
    taken.
    """
    names = {}

    def name(ref):
        m = re.match(r"\((\d+)\)(?: (.*))?$", ref)
        if not m:
            return ref
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), ref)

    files = {}

    def file(ref):
        m = re.match(r"\((\d+)\)(?: (.*))?$", ref)
        if not m:
            return ref
        if m.group(2) is not None:
            files[m.group(1)] = m.group(2)
        return files.get(m.group(1), ref)

    total = 0
    self_cost = defaultdict(int)
    inclusive = defaultdict(int)
    fn = None
    fn_file = current_file = "???"
    callee = None
    call_pending = False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("summary:"):
                total = int(line.split()[1])
                continue
            key, eq, value = line.partition("=")
            if eq and key in ("fl", "fi", "fe", "fn", "cfn", "cfi", "cfl", "ob", "cob", "calls"):
                if key == "fl":
                    fn_file = current_file = file(value)
                elif key in ("fi", "fe"):
                    current_file = file(value)
                elif key == "fn":
                    fn = name(value)
                    current_file = fn_file
                elif key == "cfn":
                    callee = name(value)
                elif key in ("cfi", "cfl"):
                    file(value)
                elif key == "calls":
                    call_pending = True
                continue
            if not line[0] in "0123456789+-*":
                continue
            parts = line.split()
            cost = int(parts[1]) if len(parts) > 1 else 0
            if call_pending:
                call_pending = False
                if callee != fn:
                    inclusive[callee] += cost
            else:
                self_cost[(current_file, fn)] += cost
    return total, self_cost, inclusive


def crate_of(file, function):
    m = re.search(r"/registry/src/[^/]+/([A-Za-z0-9_\-]+?)-\d+\.\d+\.\d+[^/]*/", file)
    if m:
        return m.group(1)
    if "/rustc/" in file or "/rust/deps/" in file:
        return "std (alloc, core, hashbrown)"
    if "/out/" in file and "retrybudget" in file:
        return "retry-budget (generated pb)"
    if re.search(r"/src/(budget|grpc|ledger|store|server|clock|cli)", file) or file.startswith("src/"):
        return "retry-budget (ours)"
    if re.search(r"malloc|free|_int_|consolidate|unlink_chunk|tcache", function):
        return "libc malloc/free"
    if re.search(r"mem(move|cpy|set|cmp)|strlen", function):
        return "libc memcpy/memmove/memcmp"
    if file.startswith("./") or "libc" in file or "sysdeps" in file:
        return "libc other (syscall stubs...)"
    return "other"


def main():
    d = sys.argv[1]
    scenarios = sorted(f[:-len(".callgrind")] for f in os.listdir(d) if f.endswith(".callgrind"))
    order = ["health", "retry-delay", "pure-next-action", "durable-next-action"]
    scenarios.sort(key=lambda s: order.index(s) if s in order else 99)
    summary = {}
    for s in scenarios:
        report = json.load(open(os.path.join(d, s + ".json")))
        requests = report["requests"]
        if not requests:
            print(f"\n== {s}: no successful request in the window ({report.get('error_codes')}); skipped")
            continue
        total, self_cost, by_function = parse(os.path.join(d, s + ".callgrind"))
        groups = defaultdict(int)
        per_function = defaultdict(int)
        for (file, function), ir in self_cost.items():
            groups[crate_of(file, function)] += ir
            per_function[function] += ir
        top = sorted(per_function.items(), key=lambda kv: -kv[1])[:12]
        named = {}
        for label, pattern in FUNCTIONS:
            rx = re.compile(pattern)
            ir = sum(v for f, v in by_function.items() if rx.search(f))
            if ir:
                named[label] = ir / requests
        summary[s] = {
            "requests": requests,
            "ir_total": total,
            "ir_per_request": total / requests,
            "by_crate_per_request": {k: v / requests for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "functions_per_request": named,
            "top_self_per_request": {f: v / requests for f, v in top},
        }
        print(f"\n== {s}: {requests:,} requests, {total / requests:,.0f} instructions per request (user space)")
        print("   by crate (exclusive):")
        for k, v in summary[s]["by_crate_per_request"].items():
            if v / (total / requests) >= 0.01:
                print(f"     {k:<34} {v:>9,.0f}  {100 * v / (total / requests):5.1f}%")
        print("   top functions (exclusive):")
        for f, v in top[:8]:
            print(f"     {f[:90]:<90} {v / requests:>9,.0f}  {100 * v / total:5.1f}%")
        print("   functions (inclusive):")
        for k, v in named.items():
            print(f"     {k:<40} {v:>9,.0f}  {100 * v / (total / requests):5.1f}%")
        if s.startswith("durable"):
            # A segment is checkpointed every 5 s or 16 MiB: a window holds
            # one or two checkpoints, or none, so the total moves by
            # thousands of instructions a decision from dump to dump. The
            # request path (worker and journal writer) does not.
            path = total / requests - named.get(CHECKPOINT_THREAD, 0)
            summary[s]["ir_per_request_without_checkpoints"] = path
            print(f"   without the checkpoint thread (the request path): {path:,.0f} instructions a decision")
    if "health" in summary:
        base = summary["health"]["ir_per_request"]
        print("\ninstructions per request against health (a CPU-bound server's throughput ratio is about the inverse):")
        for s, v in summary.items():
            print(f"   {s:<22} {v['ir_per_request']:>9,.0f}  x{v['ir_per_request'] / base:.2f}  (throughput bound ~{base / v['ir_per_request']:.2f})")
    json.dump(summary, open(os.path.join(d, "summary.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
