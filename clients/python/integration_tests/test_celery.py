"""retry_budget.celery in a real Celery worker, on a real broker (Redis on
127.0.0.1:6379, or RB_BROKER), against the real server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("celery")
redis = pytest.importorskip("redis")

from conftest import EARLY, HERE, LATE, drain, fresh, get_activity, traffic  # noqa: E402
import retry_budget  # noqa: E402
from retry_budget import to_unix  # noqa: E402

BROKER = os.environ.get("RB_BROKER", "redis://127.0.0.1:6379/0")
TENANT = fresh("celery")
DEPENDENCY = fresh("smtp")  # flaky_counted's: its counts are this module's alone


@pytest.fixture(scope="module")
def worker(servers, tmp_path_factory):
    """A real `celery worker` process on its own queue, stopped at the end."""
    queue = "rb-test-" + uuid.uuid4().hex[:8]
    env = {**os.environ, "RB_BROKER": BROKER, "RB_QUEUE": queue, "RB_TENANT": TENANT,
           "RB_PLAIN": servers["plain"].target, "RB_TIGHT": servers["tight"].target,
           "RB_DOOMED": servers["doomed"].target, "RB_DEPENDENCY": DEPENDENCY,
           # celery_app, and retry_budget as the tests import it (installed or not).
           "PYTHONPATH": os.pathsep.join([HERE, os.path.dirname(os.path.dirname(
               retry_budget.__file__)), os.environ.get("PYTHONPATH", "")])}
    os.environ.update({k: env[k] for k in ("RB_BROKER", "RB_QUEUE", "RB_TENANT")})
    log_path = tmp_path_factory.mktemp("celery") / "worker.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool", "solo",
         "--concurrency", "1", "--queues", queue, "--hostname", queue + "@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
        cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while "ready." not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("celery worker did not start:\n" + log_path.read_text())
        time.sleep(0.2)
    import celery_app
    yield celery_app, log_path
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def starts(app, key):
    return [float(x) for x in app.store.lrange(key, 0, -1)]


def activity(srv, result, task="flaky"):
    return get_activity(srv, TENANT, "%s:%s" % (task, result.id))


def test_two_transient_failures_then_success_at_the_services_times(servers, worker):
    app, log_path = worker
    key = fresh("celery-ok")
    result = app.flaky.apply_async((key, 2))
    assert result.get(timeout=30) == "ok after 3"
    runs = starts(app, key)
    assert len(runs) == 3
    act = activity(servers["plain"], result)
    assert act.closed_code == "succeeded" and act.attempts == 2
    decisions = [e for e in act.events if e.kind == "decision"]
    assert [(e.attempt, e.code) for e in decisions] == [(1, "schedule_retry"), (2, "schedule_retry")]
    for event, start in zip(decisions, runs[1:]):
        nb = to_unix(event.not_before)
        assert nb - EARLY <= start <= nb + LATE, (nb, start)
    text = log_path.read_text()
    assert "retry-budget retry: activity=flaky:%s attempt=1 dependency=smtp code=schedule_retry" % (
        result.id) in text, text[-3000:]


def test_each_run_is_counted_for_its_dependency_and_sent_by_itself(servers, worker):
    app, _ = worker
    key = fresh("celery-counted")
    result = app.flaky_counted.apply_async((key, 2))
    assert result.get(timeout=30) == "ok after 3"
    # Three runs, two failed; the success counted by the RecordSuccess that
    # named the dependency, once; both retries taken from its budget. The
    # worker's reporter sends the counts.
    assert traffic(servers["plain"], TENANT, DEPENDENCY, (3, 1, 2, 2)) == (3, 1, 2, 2)


def test_a_permanent_failure_fails_the_task_at_once(servers, worker):
    app, _ = worker
    key = fresh("celery-perm")
    result = app.flaky.apply_async((key, 5, "permanent"))
    with pytest.raises(ValueError):
        result.get(timeout=30)
    assert result.state == "FAILURE"
    time.sleep(0.5)  # nothing else runs
    assert len(starts(app, key)) == 1
    assert activity(servers["plain"], result).closed_code == "fail_permanent"


def test_with_the_budget_exhausted_the_task_waits_for_the_booked_slot(servers, worker):
    app, _ = worker
    key = fresh("celery-defer")
    drain(servers["tight"], TENANT)
    result = app.flaky_tight.apply_async((key, 1))
    assert result.get(timeout=30) == "ok after 2"
    runs = starts(app, key)
    act = activity(servers["tight"], result, "flaky_tight")
    events = [(e.kind, e.attempt, e.code) for e in act.events]
    assert events[:2] == [("decision", 1, "deferred"), ("decision", 1, "schedule_retry")], events
    assert act.events[0].slot_booked and act.events[1].token_taken
    slot = to_unix(act.events[0].not_before)
    assert len(runs) == 2 and slot - EARLY <= runs[1] <= slot + LATE, (slot, runs)
    assert act.closed_code == "succeeded"


def test_service_down_mid_run_falls_back_to_celerys_own_retries(servers, worker):
    app, log_path = worker
    srv = servers["doomed"]
    key = fresh("celery-down")
    result = app.flaky_doomed.apply_async((key, 3))
    # Wait for the first decision, then take the service away.
    deadline = time.monotonic() + 20
    while True:
        try:
            if activity(srv, result, "flaky_doomed").events:
                break
        except Exception:  # noqa: BLE001 - not recorded yet
            pass
        assert time.monotonic() < deadline, "no decision recorded"
        time.sleep(0.05)
    srv.stop()
    try:
        assert result.get(timeout=30) == "ok after 4"  # no task lost
    finally:
        srv.start()
    assert len(starts(app, key)) == 4
    text = log_path.read_text()
    assert text.count("cannot be reached") == 1, text[-4000:]
    assert "Celery's own retry settings" in text
    act = activity(srv, result, "flaky_doomed")
    assert [(e.attempt, e.code) for e in act.events][0] == (1, "schedule_retry")


def test_a_classifier_that_raises_falls_back_and_loses_no_task(worker):
    app, log_path = worker
    key = fresh("celery-bug")
    result = app.flaky_misclassified.apply_async((key, 1))
    assert result.get(timeout=30) == "ok after 2"
    text = log_path.read_text()
    assert "retry-budget integration failed" in text and "classifier bug" in text, text[-3000:]
