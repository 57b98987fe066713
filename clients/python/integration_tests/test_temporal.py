"""retry_budget.temporal against temporalio's own ActivityEnvironment and the real server.

No Temporal server can be run here, so `run_like_temporal` plays its part
from what the worker would send it: each failure is converted with
temporalio's DefaultFailureConverter into the Failure proto the server
reads, and the next attempt is scheduled from `application_failure_info`
(`non_retryable`, `next_retry_delay`) exactly as Temporal's server does,
else from the activity's RetryPolicy (a plain exception: the fallback).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from datetime import timedelta

import pytest

temporalio = pytest.importorskip("temporalio")

from temporalio import activity  # noqa: E402
from temporalio.api.failure.v1 import Failure  # noqa: E402
from temporalio.common import RetryPolicy  # noqa: E402
from temporalio.converter import DataConverter, DefaultFailureConverter  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.testing import ActivityEnvironment  # noqa: E402

from conftest import EARLY, LATE, POLICY, Server, drain, fresh, get_activity, traffic  # noqa: E402
from retry_budget import RetryBudget, Settings, pb2, to_unix  # noqa: E402
from retry_budget.temporal import with_retry_budget  # noqa: E402

# The activity's own policy: Temporal's server applies it only to failures
# that are not ApplicationErrors with next_retry_delay (the fallback).
OWN_POLICY = RetryPolicy(initial_interval=timedelta(milliseconds=300), backoff_coefficient=1.0,
                         maximum_attempts=10)


class Dependency:
    """Fails `failures` times with `error`, then answers."""

    def __init__(self, failures: int, error: type = ConnectionError):
        self.failures, self.error = failures, error
        self.starts: list = []

    async def call(self) -> str:
        self.starts.append(time.time())
        if len(self.starts) <= self.failures:
            raise self.error("dependency failed (call %d)" % len(self.starts))
        return "ok"


def to_failure(err: BaseException) -> Failure:
    """What the worker sends Temporal's server for this exception."""
    failure = Failure()
    DefaultFailureConverter().to_failure(err, DataConverter.default.payload_converter, failure)
    return failure


async def run_like_temporal(fn, workflow_id: str, activity_id: str, between=None):
    """Runs `fn` attempt after attempt as Temporal's server schedules them.
    Returns (result or None, [(attempt, Failure, planned start of the next)])."""
    env = ActivityEnvironment()
    failures = []
    attempt = 1
    while attempt <= OWN_POLICY.maximum_attempts:
        env.info = dataclasses.replace(env.info, attempt=attempt, workflow_id=workflow_id,
                                       activity_id=activity_id, retry_policy=OWN_POLICY)
        try:
            result = env.run(fn)  # a sync activity's result, or an async one's awaitable
            return (await result if inspect.isawaitable(result) else result), failures
        except Exception as err:  # noqa: BLE001 - the server sees every failure
            failed_at = time.time()
            failure = to_failure(err)
            info = failure.application_failure_info
            if failure.HasField("application_failure_info") and info.non_retryable:
                failures.append((attempt, failure, None))
                return None, failures
            if failure.HasField("application_failure_info") and info.HasField("next_retry_delay"):
                delay = info.next_retry_delay.ToTimedelta().total_seconds()
            else:
                delay = OWN_POLICY.initial_interval.total_seconds()
            failures.append((attempt, failure, failed_at + delay))
            if between:
                between(attempt)
            await asyncio.sleep(max(0.0, failed_at + delay - time.time()))
            attempt += 1
    return None, failures


def planned_not_before(failure: Failure) -> float:
    """The service's not_before, carried in the ApplicationError's details."""
    details = DataConverter.default.payload_converter.from_payloads(
        failure.application_failure_info.details.payloads)
    return details[0]["not_before"]


def settings(srv, tenant, dependency="payments-api", **kw) -> Settings:
    return Settings(srv.target, tenant=tenant, dependency=dependency, policy=POLICY, **kw)


def test_two_transient_failures_then_success_at_the_services_times(servers, caplog):
    caplog.set_level(logging.INFO, logger="retry_budget")
    tenant, wf = fresh("temporal"), fresh("wf")
    dep = Dependency(2)

    @activity.defn
    @with_retry_budget(settings(servers["plain"], tenant))
    async def charge() -> str:
        return await dep.call()

    result, failures = asyncio.run(run_like_temporal(charge, wf, "1"))
    assert result == "ok" and len(dep.starts) == 3
    assert [a for a, _, _ in failures] == [1, 2]
    with RetryBudget(servers["plain"].target, tenant=tenant) as rb:
        act = rb.get_activity(wf + ":1")
    assert act.workflow_id == wf and act.closed_code == "succeeded" and act.attempts == 2
    assert [(e.kind, e.attempt, e.code) for e in act.events] == [
        ("decision", 1, "schedule_retry"), ("decision", 2, "schedule_retry"),
        ("success", 3, "succeeded")]
    for (attempt, failure, _), event, start in zip(failures, act.events, dep.starts[1:]):
        info = failure.application_failure_info
        assert not info.non_retryable and info.type == "ConnectionError"
        assert planned_not_before(failure) == pytest.approx(to_unix(event.not_before))
        # Temporal's server runs the next attempt at the service's not_before.
        assert to_unix(event.not_before) - EARLY <= start <= to_unix(event.not_before) + LATE
    logged = [r.getMessage() for r in caplog.records if "schedule_retry" in r.getMessage()]
    assert len(logged) == 2 and all("dependency=payments-api" in m and "reason=" in m
                                    for m in logged), logged


def test_each_attempt_is_counted_for_its_dependency_and_sent_by_itself(servers):
    tenant, wf, dependency = fresh("temporal"), fresh("wf"), fresh("payments")
    dep = Dependency(2)

    @activity.defn
    @with_retry_budget(settings(servers["plain"], tenant, dependency))
    async def charge() -> str:
        return await dep.call()

    result, _ = asyncio.run(run_like_temporal(charge, wf, "1"))
    assert result == "ok"
    # Three calls, two failed; the success counted by the RecordSuccess that
    # named the dependency, once; both retries taken from its budget.
    assert traffic(servers["plain"], dependency, (3, 1, 2, 2)) == (3, 1, 2, 2)


def test_a_permanent_failure_is_non_retryable_at_once(servers):
    tenant, wf = fresh("temporal"), fresh("wf")
    dep = Dependency(5, ValueError)

    @activity.defn
    @with_retry_budget(settings(servers["plain"], tenant))
    async def validate() -> str:
        return await dep.call()

    result, failures = asyncio.run(run_like_temporal(validate, wf, "7"))
    assert result is None and len(dep.starts) == 1
    (attempt, failure, _), = failures
    assert failure.application_failure_info.non_retryable
    with RetryBudget(servers["plain"].target, tenant=tenant) as rb:
        act = rb.get_activity(wf + ":7")
    assert act.status == pb2.ACTIVITY_STATUS_CLOSED and act.closed_code == "fail_permanent"


def test_a_raw_failure_is_classified_by_the_services_rules(servers):
    tenant, wf = fresh("temporal"), fresh("wf")
    dep = Dependency(5, RuntimeError)
    # The classifier hands over the raw failure: an HTTP 404 from the dependency.
    budget = settings(servers["plain"], tenant, classify=lambda exc: {"http_status": 404})

    @activity.defn
    @with_retry_budget(budget)
    async def fetch() -> str:
        return await dep.call()

    result, failures = asyncio.run(run_like_temporal(fetch, wf, "4"))
    assert result is None and len(dep.starts) == 1
    assert failures[0][1].application_failure_info.non_retryable
    with RetryBudget(servers["plain"].target, tenant=tenant) as rb:
        event = rb.get_activity(wf + ":4").events[0]
    assert event.code == "fail_permanent" and event.rule, event
    assert event.error_class == pb2.ERROR_CLASS_PERMANENT


def test_a_sync_activity_is_wrapped_too(servers):
    tenant, wf = fresh("temporal"), fresh("wf")
    calls = []

    @activity.defn
    @with_retry_budget(settings(servers["plain"], tenant))
    def lookup() -> str:
        calls.append(activity.info().attempt)
        if len(calls) == 1:
            raise TimeoutError("slow")
        return "found"

    result, failures = asyncio.run(run_like_temporal(lookup, wf, "2"))
    assert result == "found" and calls == [1, 2]
    assert failures[0][1].application_failure_info.HasField("next_retry_delay")


def test_a_deferral_becomes_a_retry_at_the_booked_slot(servers):
    tenant, wf = fresh("temporal"), fresh("wf")
    drain(servers["tight"], tenant)
    dep = Dependency(1)

    @activity.defn
    @with_retry_budget(settings(servers["tight"], tenant))
    async def ship() -> str:
        return await dep.call()

    result, failures = asyncio.run(run_like_temporal(ship, wf, "3"))
    assert result == "ok" and len(dep.starts) == 2, failures
    with RetryBudget(servers["tight"].target, tenant=tenant) as rb:
        act = rb.get_activity(wf + ":3")
    assert [(e.kind, e.attempt, e.code) for e in act.events][:2] == [
        ("decision", 1, "deferred"), ("decision", 1, "schedule_retry")]
    deferral, granted = act.events[0], act.events[1]
    assert deferral.slot_booked and granted.token_taken, act
    slot = to_unix(deferral.not_before)
    assert planned_not_before(failures[0][1]) == pytest.approx(slot)
    # Attempt 2 ran at the booked slot, after the service granted it.
    assert slot - EARLY <= dep.starts[1] <= slot + LATE
    assert act.closed_code == "succeeded"


def test_a_deferral_with_no_slot_is_asked_again_before_the_activity_runs():
    # A server of its own: how many slots can be booked depends on what
    # the bucket has booked already.
    srv = Server(["--retry-rate", "1", "--retry-burst", "1"]).start()
    try:
        _deferral_with_no_slot(srv)
    finally:
        srv.close()


def _deferral_with_no_slot(srv):
    tenant, wf = fresh("temporal"), fresh("wf")
    drain(srv, tenant)
    with RetryBudget(srv.target, tenant=tenant) as rb:
        for _ in range(2):  # the tenant's slots are booked as far ahead as the bucket books
            assert rb.report_failure(fresh("booked"), 1, "transient").slot_booked
    dep = Dependency(1)

    @activity.defn
    @with_retry_budget(settings(srv, tenant))
    async def pack() -> str:
        return await dep.call()

    result, failures = asyncio.run(run_like_temporal(pack, wf, "6"))
    assert result == "ok" and len(dep.starts) == 2, failures
    with RetryBudget(srv.target, tenant=tenant) as rb:
        act = rb.get_activity(wf + ":6")
    events = [(e.kind, e.attempt, e.code, e.slot_booked) for e in act.events]
    # Temporal's attempt 2 came at the first deferral's not_before, asked
    # again, was deferred to a booked slot and did not run; attempt 3 ran on
    # the slot's token.
    assert events == [("decision", 1, "deferred", False), ("decision", 1, "deferred", True),
                      ("decision", 1, "schedule_retry", False), ("success", 2, "succeeded", False)]
    assert [a for a, _, _ in failures] == [1, 2]
    assert failures[1][1].application_failure_info.type == "RetryBudgetDeferred"
    slot = to_unix(act.events[1].not_before)
    assert act.events[2].token_taken and slot - EARLY <= dep.starts[1] <= slot + LATE


def test_service_down_mid_run_falls_back_to_the_retry_policy(servers, caplog):
    caplog.set_level(logging.INFO, logger="retry_budget")
    srv = servers["doomed"]
    tenant, wf = fresh("temporal"), fresh("wf")
    dep = Dependency(4)

    @activity.defn
    @with_retry_budget(settings(srv, tenant, timeout=1.0))
    async def notify() -> str:
        return await dep.call()

    def stop_after_first(attempt):
        if attempt == 1:
            srv.stop()

    try:
        result, failures = asyncio.run(run_like_temporal(notify, wf, "5", between=stop_after_first))
    finally:
        srv.start()  # same address, same data
    # No attempt lost: the activity succeeded on Temporal's own policy.
    assert result == "ok" and len(dep.starts) == 5
    first = failures[0][1]
    assert first.application_failure_info.HasField("next_retry_delay")
    for _, failure, _ in failures[1:]:
        # A plain exception: the server applies the activity's RetryPolicy.
        assert not failure.application_failure_info.HasField("next_retry_delay")
    down = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(down) == 1, [r.getMessage() for r in caplog.records]
    assert "Temporal's own retry settings" in down[0].getMessage()
    act = get_activity(srv, tenant, wf + ":5")
    assert [(e.attempt, e.code) for e in act.events][0] == (1, "schedule_retry")
