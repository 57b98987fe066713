"""The traffic reporter and the dependency budgets, against the real binary.

    pytest clients/python/test_traffic.py      # binary: target/debug/retry-budget

The servers run the adaptive default (no --dependency-rate): each
dependency is paced by what the service sees (20 retries a second to start
with, cut while granted retries fail, never below one a second), and the
successes the client reports by itself earn its tenant a tenth of them a
second as retries of its own, on top. A tenant's listing (ReportTraffic with
an empty request) shows its own dependencies only.
"""

from __future__ import annotations

import heapq
import logging
import os
import sys
import tempfile
import time
import uuid

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from retry_budget import RetryBudget, Settings, TrafficReporter, pb2, to_unix  # noqa: E402
from test_client import Server, _binary  # noqa: E402

# The service's defaults ([dependencies] ratio, floor and initial).
RATIO = 0.1
FLOOR = 1.0
INITIAL = 20.0


@pytest.fixture
def server():
    """A server of each test's own: a dependency's pace depends on every
    success it was ever told of, in a window of seconds."""
    with tempfile.TemporaryDirectory(prefix="retry-budget-py-traffic-") as workdir:
        srv = Server(_binary(), workdir)
        srv.start()
        yield srv
        rc = srv.stop()
        assert rc == 0, "server exited %s after SIGTERM:\n%s" % (rc, srv.log())


def fresh(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def paces(target: str, tenant: str | None = None) -> dict:
    """The pace of each dependency `tenant` used (the default tenant when
    None): ReportTraffic with an empty request."""
    with RetryBudget(target, tenant=tenant, traffic_interval=None) as rb:
        return {p.dependency: p for p in rb.report_traffic().dependencies}


def paced(target: str, *names: str, tenant: str | None = None, timeout: float = 3.0) -> dict:
    """`paces` once the service counts the successes it was told of for
    each of `names`: it recomputes a pace at most once a second."""
    deadline = time.monotonic() + timeout
    while True:
        seen = paces(target, tenant)
        if all(name in seen and seen[name].success_rate > 0 for name in names):
            return seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)


def wait_sent(reporter: TrafficReporter, *names: str, timeout: float = 5.0) -> None:
    """Until a report that named every one of `names` got its answer."""
    deadline = time.monotonic() + timeout
    while not set(names) <= set(reporter.paces) or reporter.pending():
        assert time.monotonic() < deadline, "not sent: %s, answered %s" % (
            reporter.pending(), sorted(reporter.paces))
        time.sleep(0.02)


def test_the_reporter_sends_counts_by_itself_and_the_service_paces_by_them(server):
    busy, quiet = fresh("busy"), fresh("quiet")
    tenant = fresh("py")
    with RetryBudget(server.target, tenant=tenant, traffic_interval=0.2) as rb:
        for _ in range(200):
            with rb.traffic.call(busy):
                pass
        for _ in range(10):
            with pytest.raises(ConnectionError):
                with rb.traffic.call(busy):
                    raise ConnectionError("refused")

        @rb.traffic.counted(quiet)
        def probe(ok: bool) -> None:
            if not ok:
                raise TimeoutError("slow")

        probe(True)
        probe(True)
        with pytest.raises(TimeoutError):
            probe(False)
        rb.record_call(quiet, False)
        # Nothing is sent by hand: the background thread does it.
        wait_sent(rb.traffic, busy, quiet)
        assert rb.traffic.dropped == 0

    seen = paced(server.target, busy, quiet, tenant=tenant)
    assert paces(server.target) == {}, "another tenant's listing shows none of them"
    b, q = seen[busy], seen[quiet]
    assert (b.calls, b.successes, b.failures) == (210, 200, 10)
    assert (q.calls, q.successes, q.failures) == (4, 2, 2)
    # 200 successes in one report, over a window of at most 5 s: at least
    # 40 a second, so a tenth of them is past the floor.
    assert b.success_rate >= 40
    # They earn the tenant a lane of its own, a tenth of them a second, and
    # are evidence of health: the shared allowance starts at the starting
    # allowance and rests at what the lane leaves of it, never higher.
    assert b.ratio == pytest.approx(RATIO)
    assert b.earned_rate == pytest.approx(RATIO * b.success_rate)
    rest = max(FLOOR, INITIAL - b.earned_rate)
    assert rest - 1e-6 <= b.allowed_rate <= INITIAL + 1e-6 and b.state == "healthy", b
    assert "more for this tenant (10% of its" in b.explanation, b.explanation
    assert q.earned_rate == pytest.approx(RATIO * q.success_rate)
    assert q.earned_rate < b.earned_rate


def test_an_async_call_is_counted_and_a_cancellation_is_not(server):
    import asyncio

    dep = fresh("async")
    rb = RetryBudget(server.target, traffic_interval=0.2)

    @rb.traffic.counted(dep)
    async def fetch(fail: bool) -> str:
        await asyncio.sleep(0)
        if fail:
            raise ConnectionResetError("reset")
        return "ok"

    async def main() -> None:
        assert await fetch(False) == "ok"
        with pytest.raises(ConnectionResetError):
            await fetch(True)
        async with rb.traffic.call(dep):
            await asyncio.sleep(0)
        task = asyncio.ensure_future(fetch(False))
        task.cancel()  # cancelled before it ran: the worker's doing, not the dependency's
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert rb.traffic.pending() == {dep: (3, 2, 1)}
    rb.close()  # sends what is left
    assert rb.traffic.pending() == {}
    p = paces(server.target)[dep]
    assert (p.calls, p.successes, p.failures) == (3, 2, 1)


def test_a_failed_send_keeps_its_counts_and_never_raises(server, caplog):
    caplog.set_level(logging.INFO, logger="retry_budget")
    dep = fresh("kept")
    rb = RetryBudget(server.target, timeout=1.0, traffic_interval=0.1)
    rb.record_call(dep, True)
    wait_sent(rb.traffic, dep)
    assert server.stop() == 0
    try:
        for ok in (True, True, False):
            rb.record_call(dep, ok)  # counting goes on while the service is away
        time.sleep(0.5)  # several sends fail in the background
        assert rb.traffic.pending() == {dep: (3, 2, 1)}
        assert rb.traffic.flush() is None  # by hand too: no exception
        down = [r for r in caplog.records if "cannot reach" in r.getMessage()]
        assert len(down) == 1, [r.getMessage() for r in caplog.records]
    finally:
        server.start(server.target)  # the same address: the client's channel reconnects
    wait_sent(rb.traffic, dep, timeout=10)
    rb.close()
    # This server is a new process: it knows only what the kept report told it.
    p = paces(server.target)[dep]
    assert (p.calls, p.successes, p.failures) == (3, 2, 1)
    assert any("reach" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)


def test_memory_is_bounded_and_bad_names_are_refused_where_they_are_written(server):
    with RetryBudget(server.target, traffic_interval=60) as rb:
        rb.traffic.max_dependencies = 2
        for name in ("a", "b", "c", "d"):
            rb.record_call(name, True)
        assert sorted(rb.traffic.pending()) == ["a", "b"] and rb.traffic.dropped == 2
        for bad in ("has space", "x" * 65, "caf\u00e9"):
            with pytest.raises(ValueError, match="printable ASCII"):
                rb.record_call(bad, True)
            with pytest.raises(ValueError):
                Settings(server.target, dependency=bad)
        rb.record_call("", True)  # the default dependency
        assert rb.traffic.pending().get("") is None  # past the bound too
    with RetryBudget(server.target, traffic_interval=None) as off:
        off.record_call("a", True)
        assert off.traffic.pending() == {} and not off.traffic.enabled


def test_the_dependency_goes_with_next_action_and_record_success(server):
    dep = fresh("payments")
    tenant = fresh("py")
    with RetryBudget(server.target, tenant=tenant, traffic_interval=None) as rb:
        aid = fresh("charge")
        d = rb.report_failure(aid, 1, "transient", dependency=dep)
        assert d.code == "schedule_retry" and d.dependency == dep
        assert rb.get_activity(aid).events[0].dependency == dep
        # Every RecordSuccess counts one success of its dependency.
        rb.record_success(aid, dependency=dep)
        rb.record_success(fresh("never-failed"), dependency=dep)
        assert rb.report_failure(fresh("charge"), 1, "transient").dependency == "default"
        with pytest.raises(grpc.RpcError) as e:
            rb.report_failure(fresh("charge"), 1, "transient", dependency="has space")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("invalid_dependency")
    p = paces(server.target, tenant)[dep]
    assert (p.successes, p.retries_admitted) == (2, 1)


# -- two dependencies, one down ----------------------------------------------

POLICY = {"max_attempts": 100, "deadline_seconds": 600, "base": 0, "cap": 0}
# "up" starts at the starting allowance (20 a second) and its granted
# retries succeed: it is never cut. "down" always fails: its granted retries
# fail, and it is cut by half a second towards the floor. Reports four times
# a second add the tenant's own earned lane on "up".
REPORT_EVERY = 0.25
WARMUP = 6.0
MEASURE = 4.0
UP_EVERY = 0.01  # "up" is called 100 times a second...
UP_FAILS_ONE_IN = 20  # ...and fails one call in 20 (95% succeed)
DOWN_ACTIVITIES = 3  # "down" always fails: three activities retry it


def run_two_dependencies(target: str, tenant: str) -> list:
    """A worker loop over "up" and "down" for WARMUP + MEASURE seconds: each
    failed call is reported (NextAction with its dependency), a retry runs at
    not_before, a deferral is asked again at not_before; every call is
    counted by the client's reporter, which sends the counts by itself.
    Returns [(seconds since start, dependency, NextActionResponse)]."""
    answers = []
    due: list = []  # (when, seq, job): a job is [dependency, activity, attempt, failed_at]
    seq = 0
    up_calls = 0

    def later(when: float, job: list) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(due, (when, seq, job))

    with RetryBudget(target, tenant=tenant, traffic_interval=REPORT_EVERY) as rb:
        start = time.time()
        for _ in range(DOWN_ACTIVITIES):
            later(start, ["down", fresh("down"), 1, None])
        next_up = start
        while time.time() - start < WARMUP + MEASURE:
            now = time.time()
            while next_up <= now:
                later(next_up, ["up", fresh("up"), 1, None])
                next_up += UP_EVERY
            while due and due[0][0] <= now:
                _, _, job = heapq.heappop(due)
                dependency, activity, attempt, failed_at = job
                if failed_at is None:  # the call itself
                    if dependency == "up":
                        up_calls += 1
                        ok = up_calls % UP_FAILS_ONE_IN != 0
                    else:
                        ok = False
                    if ok:
                        if attempt > 1:  # close what was reported; the service counts the success
                            rb.record_success(activity, dependency=dependency)
                        rb.record_call(dependency, True, success_recorded=attempt > 1)
                        continue
                    rb.record_call(dependency, False)
                    failed_at = job[3] = time.time()
                d = rb.report_failure(activity, attempt, "transient", policy=POLICY,
                                      occurred_at=failed_at, dependency=dependency)
                answers.append((time.time() - start, dependency, d))
                if d.code == "schedule_retry":
                    later(to_unix(d.not_before), [dependency, activity, attempt + 1, None])
                elif d.code == "deferred":  # the same attempt, asked again then
                    later(to_unix(d.not_before), job)
                else:
                    raise AssertionError("unexpected stop: %s" % d)
            wake = min(next_up, due[0][0] if due else next_up)
            time.sleep(max(0.0, wake - time.time()))
    return answers


def test_a_failing_dependency_is_cut_and_a_healthy_one_is_not(server):
    tenant = fresh("py-deps")
    answers = run_two_dependencies(server.target, tenant)
    seen = paces(server.target, tenant)
    measured = [(dep, d) for t, dep, d in answers if t >= WARMUP]
    up = [d for dep, d in measured if dep == "up"]
    down = [d for dep, d in measured if dep == "down"]
    summary = "\n".join("%.2f %s %s %s %s" % (t, dep, d.code, d.defer_reason, d.reason)
                        for t, dep, d in answers)

    # "up" succeeds 19 calls in 20 and its retries succeed: none of them
    # waits, and the successes reported earn the tenant a tenth of them.
    assert len(up) >= 10, summary
    assert [d.code for d in up if d.code != "schedule_retry"] == [], summary
    assert all(d.dependency == "up" for d in up)
    u = seen["up"]
    assert u.state in ("no_evidence", "healthy"), u
    # Never cut: at the starting allowance, or on its way down to what the
    # tenant's own lane leaves of it (its resting allowance).
    # (within the 1 a second the rest moves by with the lane before the
    # next step follows it).
    rest = max(FLOOR, INITIAL - u.earned_rate)
    assert rest - 1 <= u.allowed_rate <= INITIAL + 1e-6, u
    assert u.earned_rate == pytest.approx(RATIO * u.success_rate), u

    # "down" has no success and its granted retries fail: it is cut towards
    # the floor, and each deferral says whose budget ran out, in numbers.
    deferred = [d for d in down if d.code == "deferred"]
    granted = [d for d in down if d.code == "schedule_retry"]
    assert deferred, summary
    assert len(granted) <= 2 * MEASURE + 2, summary
    for d in deferred:
        assert d.dependency == "down"
        assert d.defer_reason == "dependency_budget_exhausted", d
        assert "down: " in d.reason and "retries/s allowed" in d.reason, d
        assert d.waiting_since.seconds > 0, "a durable deferral keeps its place in line"
    dn = seen["down"]
    assert dn.state == "trouble" and dn.allowed_rate <= 2.5, dn
    assert "granted in the last 10 s failed" in dn.explanation, dn
    assert dn.successes == 0 and dn.failures == dn.calls > 0
    assert dn.retries_deferred > 0
