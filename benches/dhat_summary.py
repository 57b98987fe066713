#!/usr/bin/env python3
"""What a request allocates, from valgrind DHAT profiles of the server.

Usage: benches/dhat_summary.py DIR [TOP]

DIR holds, per scenario, two DHAT profiles of the server under the same
load for a short and a long window (`SCENARIO.short.dhat`,
`SCENARIO.long.dhat`) and the loadgen's report of each
(`SCENARIO.short.json`, `SCENARIO.long.json`), as benches/alloc.sh writes
them. A profile counts the whole life of the server (its start, the store's
opening, the warm-up, the shutdown); the difference between the two
profiles, divided by the difference in requests, is what the extra requests
allocated: the start and the warm-up, the same in both, drop out.

Prints, per scenario, allocations (blocks) and bytes a request, then the
allocation sites that make at least TOP_MIN_BLOCKS a request, largest bytes
first: each site named by the first frames of its stack that are not the
allocator's or the standard library's allocation functions. Writes
summary.json.
"""

import json
import os
import re
import sys

TOP_MIN_BLOCKS = 0.05
FRAMES_SHOWN = 3

# Frames that only say "this allocated": the allocator, RawVec, Box::new and
# the like. A site is named by the frames after them.
ALLOCATION_FRAME = re.compile(
    r"^(\[root\]|malloc|calloc|realloc|memalign|posix_memalign|aligned_alloc"
    r"|__rust|__rdl|alloc::|<alloc::|core::alloc|std::alloc|UnknownInlinedFun"
    r"|(alloc|allocate|alloc_impl|alloc_impl_runtime|aligned_malloc|box_new_uninit"
    r"|new_uninit|new_uninitialized|fallible_with_capacity|do_alloc|with_capacity"
    r"|with_capacity_in|try_allocate_in|grow_amortized|finish_grow|reserve"
    r"|do_reserve_and_handle|try_reserve|exchange_malloc|pin)(<|$| ))"
)


def shorten_generics(name):
    """Generic arguments past the first level shown as `<..>`: tonic's and
    tower's types nest a dozen deep."""
    out, depth = [], 0
    for i, ch in enumerate(name):
        if ch == ">" and name[i - 1 : i] == "-":
            # The arrow of a function type, `fn(A) -> B`: not a bracket.
            if depth < 2:
                out.append(ch)
            continue
        if ch == "<":
            depth += 1
            if depth == 2:
                out.append("<..>")
            if depth >= 2:
                continue
        elif ch == ">":
            depth -= 1
            if depth >= 1:
                continue
        elif depth >= 2:
            continue
        out.append(ch)
    return "".join(out)


def frame_name(frame):
    """`0x4A2B3C: name (file:line)` -> `name (file:line)`, the file's
    directories dropped and nested generic arguments shortened; `[root]` as
    is."""
    m = re.match(r"^0x[0-9A-Fa-f]+: (.*)$", frame)
    name = m.group(1) if m else frame
    name = re.sub(r"\((?:[^()]*/)?([^/()]+:\d+)\)$", r"(\1)", name)
    return shorten_generics(name)


def site(frames):
    """The first FRAMES_SHOWN frames of a stack past its allocation frames."""
    names = [frame_name(f) for f in frames]
    kept = [n for n in names if not ALLOCATION_FRAME.match(n)]
    return tuple(kept[:FRAMES_SHOWN]) or tuple(names[-1:])


def load(path):
    """A DHAT profile as {site: [bytes, blocks]}, summed over its program
    points, and the totals."""
    with open(path) as f:
        d = json.load(f)
    table = d["ftbl"]
    sites = {}
    for pp in d["pps"]:
        key = site([table[i] for i in pp["fs"]])
        acc = sites.setdefault(key, [0, 0])
        acc[0] += pp["tb"]
        acc[1] += pp["tbk"]
    total = [sum(v[0] for v in sites.values()), sum(v[1] for v in sites.values())]
    return sites, total


def requests(path):
    with open(path) as f:
        return json.load(f)["requests"]


def per_request(short, long, n_short, n_long):
    """(bytes, blocks) a request in all, and per site, from the two
    profiles: what the long window added over the short one."""
    n = n_long - n_short
    if n <= 0:
        raise ValueError(f"the long window served no more requests ({n_long}) than the short one ({n_short})")
    s_sites, s_total = short
    l_sites, l_total = long
    total = ((l_total[0] - s_total[0]) / n, (l_total[1] - s_total[1]) / n)
    sites = {}
    for key in set(s_sites) | set(l_sites):
        b = l_sites.get(key, [0, 0])
        a = s_sites.get(key, [0, 0])
        sites[key] = ((b[0] - a[0]) / n, (b[1] - a[1]) / n)
    return total, sites, n


def main_with(args):
    if len(args) not in (1, 2) or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args in (["-h"], ["--help"]) else 2
    d = args[0]
    top = int(args[1]) if len(args) == 2 else 25
    scenarios = sorted(f[: -len(".short.dhat")] for f in os.listdir(d) if f.endswith(".short.dhat"))
    if not scenarios:
        print(f"dhat_summary.py: no SCENARIO.short.dhat in {d}", file=sys.stderr)
        return 1
    out = {}
    for s in scenarios:
        p = lambda kind, ext: os.path.join(d, f"{s}.{kind}.{ext}")  # noqa: E731
        total, sites, n = per_request(
            load(p("short", "dhat")), load(p("long", "dhat")),
            requests(p("short", "json")), requests(p("long", "json")),
        )
        print(f"== {s}: {total[1]:.1f} allocations, {total[0]:,.0f} bytes a request "
              f"(the long window's {n:,} extra requests)")
        rows = sorted(
            ((b, k, key) for key, (b, k) in sites.items() if k >= TOP_MIN_BLOCKS),
            key=lambda r: (-r[0], -r[1], r[2]),
        )
        print(f"   {'bytes':>8} {'allocs':>6} {'each':>6}  site (first frames past the allocator)")
        for b, k, key in rows[:top]:
            print(f"   {b:8,.0f} {k:6.2f} {b / k:6,.0f}  {' < '.join(key)}")
        out[s] = {
            "requests": n,
            "bytes_per_request": total[0],
            "allocations_per_request": total[1],
            "sites": [{"bytes": b, "allocations": k, "site": list(key)} for b, k, key in rows],
        }
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main_with(sys.argv[1:]))
