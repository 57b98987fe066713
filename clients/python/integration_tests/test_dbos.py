"""retry_budget.dbos in DBOS's real runtime, on the local PostgreSQL
(127.0.0.1:5432, user postgres; RB_PG_URL overrides), in a database of its
own that the test creates and drops, against the real server."""

from __future__ import annotations

import logging
import os
import time
import uuid

import pytest

pytest.importorskip("dbos")
psycopg = pytest.importorskip("psycopg")

from dbos import DBOS  # noqa: E402

from conftest import EARLY, LATE, POLICY, drain, fresh, get_activity, traffic  # noqa: E402
from retry_budget import Settings, to_unix  # noqa: E402
from retry_budget.dbos import StepRetries, budgeted_step  # noqa: E402

PG = os.environ.get("RB_PG_URL", "postgresql://postgres@127.0.0.1:5432")
TENANT = fresh("dbos")
DEPENDENCY = fresh("inventory")  # the "counted" flow's: its counts are this module's alone
STARTS: dict = {}  # key -> the start time of each run


def flaky(key: str, failures: int, kind: str = "transient") -> str:
    runs = STARTS.setdefault(key, [])
    runs.append(time.time())
    if len(runs) <= failures:
        raise (ValueError if kind == "permanent" else ConnectionError)("call %d" % len(runs))
    return "ok after %d" % len(runs)


@pytest.fixture(scope="module")
def dbos(servers):
    db = "rb_dbos_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG + "/postgres", autocommit=True) as conn:
        conn.execute("CREATE DATABASE " + db)
    flows = {}
    for name, srv, dependency in (("plain", "plain", "inventory"), ("tight", "tight", "inventory"),
                                  ("doomed", "doomed", "inventory"),
                                  ("counted", "plain", DEPENDENCY)):
        settings = Settings(servers[srv].target, tenant=TENANT, dependency=dependency,
                            policy=POLICY, timeout=1.0)
        step = budgeted_step(settings, name="reserve_" + name,
                             fallback=StepRetries(max_attempts=6, interval_seconds=0.3,
                                                  backoff_rate=1.0))(flaky)
        flows[name] = DBOS.workflow(name="order_" + name)(
            lambda key, failures, kind="transient", step=step: step(key, failures, kind))
    DBOS(config={"name": "retry-budget-test", "system_database_url": "%s/%s" % (PG, db)})
    DBOS.launch()
    yield flows
    DBOS.destroy(destroy_registry=True)
    with psycopg.connect(PG + "/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % db)


def activity(srv, workflow_id, name):
    return get_activity(srv, TENANT, "%s:reserve_%s" % (workflow_id, name))


def run(flow, key, failures, kind="transient"):
    handle = DBOS.start_workflow(flow, key, failures, kind)
    return handle, handle.get_workflow_id()


def test_two_transient_failures_then_success_after_durable_sleeps(servers, dbos):
    key = fresh("dbos-ok")
    handle, wf = run(dbos["plain"], key, 2)
    assert handle.get_result() == "ok after 3"
    runs = STARTS[key]
    act = activity(servers["plain"], wf, "plain")
    decisions = [e for e in act.events if e.kind == "decision"]
    assert [(e.attempt, e.code) for e in decisions] == [(1, "schedule_retry"), (2, "schedule_retry")]
    assert act.closed_code == "succeeded" and act.workflow_id == wf
    for event, start in zip(decisions, runs[1:]):
        nb = to_unix(event.not_before)
        assert nb - EARLY <= start <= nb + LATE, (nb, start)
    steps = [s["function_name"] for s in DBOS.list_workflow_steps(wf)]
    assert steps.count("reserve_plain") == 3 and steps.count("DBOS.sleep") == 2, steps


def test_each_attempt_is_counted_for_its_dependency_and_sent_by_itself(servers, dbos):
    key = fresh("dbos-counted")
    handle, wf = run(dbos["counted"], key, 2)
    assert handle.get_result() == "ok after 3"
    # Three attempts, two failed; the success counted by the RecordSuccess
    # that named the dependency, once; both retries taken from its budget.
    assert traffic(servers["plain"], TENANT, DEPENDENCY, (3, 1, 2, 2)) == (3, 1, 2, 2)


def test_a_permanent_failure_raises_at_once(servers, dbos):
    key = fresh("dbos-perm")
    handle, wf = run(dbos["plain"], key, 5, "permanent")
    with pytest.raises(ValueError) as e:
        handle.get_result()
    assert any("fail_permanent" in n for n in getattr(e.value, "__notes__", [])), e.value
    assert len(STARTS[key]) == 1
    assert activity(servers["plain"], wf, "plain").closed_code == "fail_permanent"


def test_with_the_budget_exhausted_the_step_sleeps_until_the_booked_slot(servers, dbos):
    key = fresh("dbos-defer")
    drain(servers["tight"], TENANT)
    handle, wf = run(dbos["tight"], key, 1)
    assert handle.get_result() == "ok after 2"
    act = activity(servers["tight"], wf, "tight")
    events = [(e.kind, e.attempt, e.code) for e in act.events]
    assert events[:2] == [("decision", 1, "deferred"), ("decision", 1, "schedule_retry")], events
    assert act.events[0].slot_booked and act.events[1].token_taken
    slot = to_unix(act.events[0].not_before)
    runs = STARTS[key]
    assert len(runs) == 2 and slot - EARLY <= runs[1] <= slot + LATE, (slot, runs)


def test_service_down_mid_run_falls_back_to_dbos_own_step_retries(servers, dbos, caplog):
    caplog.set_level(logging.INFO, logger="retry_budget")
    srv = servers["doomed"]
    key = fresh("dbos-down")
    handle, wf = run(dbos["doomed"], key, 3)
    deadline = time.monotonic() + 20
    while len(STARTS.get(key, [])) < 1 or not _decided(srv, wf):
        assert time.monotonic() < deadline, "no decision recorded"
        time.sleep(0.05)
    srv.stop()
    try:
        assert handle.get_result() == "ok after 4"  # the workflow completed
    finally:
        srv.start()
    assert len(STARTS[key]) == 4
    down = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(down) == 1 and "DBOS's own retry settings" in down[0].getMessage()
    act = activity(srv, wf, "doomed")
    assert [(e.attempt, e.code) for e in act.events][0] == (1, "schedule_retry")


def _decided(srv, wf) -> bool:
    try:
        return bool(activity(srv, wf, "doomed").events)
    except Exception:  # noqa: BLE001 - not recorded yet
        return False
