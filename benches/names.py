#!/usr/bin/env python3
"""Issue #61: one tenant names 100,000 dependencies; the server's RSS and /metrics stay bounded.

    python3 benches/names.py [--server target/release/retry-budget] [--names 100000] [--reports 500]

The server on free 127.0.0.1 ports, a fresh --data-dir, default flags otherwise (tenant `default`).
--names durable NextAction first failures, each its own activity and dependency (dep-000001...),
then --reports ReportTraffic of 64 new names each (under 500/s). VmRSS before, every 10,000 names,
after; /metrics at the end; then the control, the same activities under one name and no report (unless
--no-control). Exits 1 when the names add 64 MiB or more to the peak RSS's growth, a metric names more
than max_dependencies + 8 dependencies, a duplicated series, or a failed NextAction (refusals are
sent again, 10 times at most). --one-name --reports 0: the control alone.
Without grpcio: clients/python/requirements.txt in target/bench-venv.
"""
import argparse, asyncio, collections, os, re, socket, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "bench-venv")
try:
    import grpc
except ImportError:
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        raise
    if not os.path.exists(f"{VENV}/bin/python"):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([f"{VENV}/bin/pip", "install", "-q", "--disable-pip-version-check",
                               "-r", f"{ROOT}/clients/python/requirements.txt"])
    os.execv(f"{VENV}/bin/python", [f"{VENV}/bin/python"] + sys.argv)
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from retry_budget._pb import retry_budget_pb2 as pb, retry_budget_pb2_grpc as pb_grpc  # noqa: E402

MAX_DEPENDENCIES, MIB = 64, 1024.0  # src/bucket/pace.rs DEFAULT_MAX_DEPENDENCIES


def free_port():
    with socket.socket() as s:
        return s.bind(("127.0.0.1", 0)) or s.getsockname()[1]


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))


async def flood(args, port, pid, samples):
    stats, codes = collections.Counter(), collections.Counter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.RetryBudgetStub(channel)
        todo = iter(range(1, args.names + 1))

        async def worker():
            for i in todo:
                req = pb.NextActionRequest(activity_id=f"names-{i:06d}", attempt=1, dependency=f"dep-{1 if args.one_name else i:06d}",
                                           error_class=pb.ERROR_CLASS_TRANSIENT)
                for attempt in range(11):
                    try:
                        resp = await stub.NextAction(req, timeout=30)
                        codes[resp.code] += 1
                        stats["untracked"] += resp.dependency_untracked
                        break
                    except grpc.aio.AioRpcError as e:
                        if attempt == 10 or e.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                             grpc.StatusCode.UNAVAILABLE):
                            stats.update(["failed", "failed " + e.code().name])
                            break
                        stats["pushed back"] += 1
                        await asyncio.sleep(min(2.0, 0.05 * 2 ** attempt))
                stats["names"] += 1
                if stats["names"] % 10000 == 0:
                    samples.append((stats["names"], status_kib(pid, "VmRSS")))

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        for r in range(args.reports):  # 64 new names a report, the most one may carry
            deps = [pb.DependencyTraffic(dependency=f"rt-{r:05d}-{j:02d}", calls=2, successes=1, failures=1)
                    for j in range(64)]
            try:
                resp = await stub.ReportTraffic(pb.ReportTrafficRequest(dependencies=deps), timeout=30)
                stats["reports ok"] += 1
                stats["paces untracked"] += sum(d.untracked for d in resp.dependencies)
            except grpc.aio.AioRpcError as e:
                stats["reports refused " + e.code().name] += 1
            stats["names"] += 64
            if stats["names"] // 10000 > (stats["names"] - 64) // 10000:
                samples.append((stats["names"], status_kib(pid, "VmRSS")))
            await asyncio.sleep(1 / 500)
    return stats, codes


LINE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+\S+')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def check_metrics(text):
    """Per family with a `dependency` label: its series (without `le`); and duplicated series."""
    types, series, seen, dups = set(), collections.defaultdict(set), set(), []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            types.add(line.split()[2])
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        name, labels = m.group(1), tuple(sorted(LABEL.findall(m.group(2) or "")))
        if (name, labels) in seen:
            dups.append(line)
        seen.add((name, labels))
        family = next((name[: -len(x)] for x in ("_total", "_bucket", "_sum", "_count", "_created")
                       if name.endswith(x) and name[: -len(x)] in types), name)
        if any(k == "dependency" for k, _ in labels):
            series[family].add(tuple(kv for kv in labels if kv[0] != "le"))
    return series, dups


def serve(args):
    """One server run: the flood, RSS before, after and at its peak, and /metrics at the end."""
    port, mport = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="retry-budget-names.") as work:
        log = open(os.path.join(work, "server.log"), "w")
        server = subprocess.Popen([args.server, "--listen", f"127.0.0.1:{port}", "--metrics-listen",
                                   f"127.0.0.1:{mport}", "--data-dir", os.path.join(work, "data")],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(300):
                if server.poll() is not None:
                    sys.exit("the server exited:\n" + open(log.name).read()[-2000:])
                if socket.socket().connect_ex(("127.0.0.1", port)) == 0:
                    break
                time.sleep(0.1)
            time.sleep(1)
            samples, before, start = [], status_kib(server.pid, "VmRSS"), time.monotonic()
            stats, codes = asyncio.run(flood(args, port, server.pid, samples))
            elapsed = time.monotonic() - start
            time.sleep(2)
            after, peak = status_kib(server.pid, "VmRSS"), status_kib(server.pid, "VmHWM")
            text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=30).read().decode()
        finally:
            server.terminate()
            server.wait(60)
    return stats, codes, samples, before, after, peak, elapsed, text


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default=os.path.join(ROOT, "target", "release", "retry-budget"))
    p.add_argument("--names", type=int, default=100_000)  # NextAction, one name each
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--reports", type=int, default=500)  # ReportTraffic, 64 names each
    p.add_argument("--one-name", action="store_true", help="the control: every NextAction names dep-000001")
    p.add_argument("--no-control", action="store_true", help="skip the one-name control run")
    args = p.parse_args()
    stats, codes, samples, before, after, peak, elapsed, text = serve(args)
    control = None
    if not args.one_name and not args.no_control:
        # The same activities under one name and no report: what the names add is the difference.
        control = serve(argparse.Namespace(**{**vars(args), "one_name": True, "reports": 0}))
    series, dups = check_metrics(text)
    growth = (peak - before) / MIB
    names_growth = growth if control is None else growth - (control[5] - control[3]) / MIB
    per = {f: (len(s), len({dict(labels)["dependency"] for labels in s})) for f, s in sorted(series.items())}
    worst = max((d for _, d in per.values()), default=0)
    print(f"elapsed {elapsed:.1f} s: {args.names} NextAction (concurrency {args.concurrency}), then "
          f"{args.reports} ReportTraffic x 64 names; {stats['names']} names{' (NextAction: one)' if args.one_name else ', each distinct'}")
    print(f"NextAction: {dict(codes)}, failed {stats['failed']}, sent again {stats['pushed back']}")
    print(f"dependency_untracked: {stats['untracked']} of {args.names} answers; ReportTraffic: "
          + ", ".join(f"{k} {v}" for k, v in stats.items() if k.startswith(("reports", "paces"))))
    print(f"RSS before {before / MIB:.1f} MiB, after {after / MIB:.1f}, peak (VmHWM) {peak / MIB:.1f}; growth: "
          f"after {(after - before) / MIB:.1f} MiB, peak {growth:.1f} MiB")
    if control is not None:
        print(f"control (the same activities, one name, no report): peak growth "
              f"{(control[5] - control[3]) / MIB:.1f} MiB; the names add {names_growth:.1f} MiB (limit: under 64)")
    print("RSS MiB by names: " + ", ".join(f"{n}: {k / MIB:.1f}" for n, k in samples))
    print(f"metrics naming a dependency (max_dependencies default {MAX_DEPENDENCIES}, limit "
          f"{MAX_DEPENDENCIES + 8} dependencies a metric):"
          + "".join(f"\n  {f}: {n} series, {d} dependencies" for f, (n, d) in per.items()))
    print(f"duplicate series: {len(dups)} {dups[:5]}")
    bad = [why for why, b in [("the names' RSS growth >= 64 MiB", names_growth >= 64), ("duplicate series", dups),
                              (f"a metric names {worst} dependencies", worst > MAX_DEPENDENCIES + 8),
                              ("a NextAction failed", stats["failed"])] if b]
    print("FAIL: " + "; ".join(bad) if bad else "OK")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
