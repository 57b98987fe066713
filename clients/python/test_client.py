"""End-to-end tests of the Python client against the real retry-budget binary.

    pytest clients/python                       # binary: target/debug/retry-budget
    RETRY_BUDGET_BIN=target/release/retry-budget pytest clients/python

The server is started on a free loopback port with a temporary data dir,
checked for health SERVING before the tests, and stopped with SIGTERM at the
end (it must exit 0).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

from retry_budget import RetryBudget, error_code, pb2, to_unix  # noqa: E402
import worker_example  # noqa: E402

# The article's printed outputs.
ARTICLE_DELAYS = [
    "flight-1 [1, 2, 4, 11, 16, 35]",
    "flight-2 [1, 2, 4, 15, 19, 54]",
]
ARTICLE_NEXT_ACTIONS = [
    ((1, 3, 5, 30), "transient", "schedule_retry", pb2.ACTION_SCHEDULE_RETRY),
    ((3, 3, 5, 30), "transient", "attempts_exhausted", pb2.ACTION_ATTEMPTS_EXHAUSTED),
    ((1, 3, 31, 30), "transient", "deadline_exceeded", pb2.ACTION_DEADLINE_EXCEEDED),
    ((1, 3, 5, 30), "permanent", "fail_permanent", pb2.ACTION_FAIL_PERMANENT),
    ((1, 3, 5, 30), "unknown", "manual_review", pb2.ACTION_MANUAL_REVIEW),
]


def _binary() -> str:
    path = os.environ.get("RETRY_BUDGET_BIN") or os.path.join("target", "debug", "retry-budget")
    if not os.path.isabs(path):
        path = os.path.join(REPO, path)
    if not os.access(path, os.X_OK):
        pytest.fail("retry-budget binary not found at %s: run `cargo build` first "
                    "or set RETRY_BUDGET_BIN" % path)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health_status(target: str, timeout: float = 1.0) -> int:
    """grpc.health.v1.Health/Check for service "", without extra packages.

    The request is an empty HealthCheckRequest; the response's field 1 is the
    status enum (1 = SERVING), encoded as b"\\x08\\x01".
    """
    with grpc.insecure_channel(target) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
        raw = check(b"", timeout=timeout)
    if len(raw) >= 2 and raw[0] == 0x08:
        return raw[1]
    return 0  # UNKNOWN


class Server:
    def __init__(self, binary: str, workdir: str, extra_args=()):
        self.binary = binary
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.proc = None
        self.target = None
        self.log_path = os.path.join(workdir, "server.log")

    def start(self, target: str = "") -> None:
        """Starts on a free port, or on `target` (a server started again
        where its clients already point)."""
        for _ in range(1 if target else 3):  # a port picked free may be taken by the time we bind
            self.target = target or "127.0.0.1:%d" % _free_port()
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                [self.binary, "--listen", self.target,
                 "--data-dir", os.path.join(self.workdir, "data"), "--drain-delay", "0s"]
                + self.extra_args,
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            )
            log.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if _health_status(self.target) == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("server not SERVING within 30 s:\n" + self.log())
        raise RuntimeError("server exited before serving:\n" + self.log())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


# These tests are about the durable form, whose retries come back to back
# in one dependency: a static dependency rate at the global one leaves the
# global bucket alone in charge, as before dependencies had budgets. Under
# the adaptive default a dependency with no successes allows one retry a
# second (test_traffic.py runs that default).
GLOBAL_BUDGET_ONLY = ["--dependency-rate", "100"]


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory(prefix="retry-budget-py-") as workdir:
        srv = Server(_binary(), workdir, GLOBAL_BUDGET_ONLY)
        srv.start()
        yield srv
        rc = srv.stop()
        assert rc == 0, "server exited %s after SIGTERM:\n%s" % (rc, srv.log())


@pytest.fixture
def client(server):
    # A fresh tenant per test: durable tests never see each other's activities.
    with RetryBudget(server.target, tenant="py-" + uuid.uuid4().hex[:8]) as c:
        yield c


def test_health_serving(server):
    assert _health_status(server.target) == 1


@pytest.mark.parametrize("line", ARTICLE_DELAYS, ids=lambda l: l.split(" ", 1)[0])
def test_retry_delay_reproduces_article_line(client, line):
    activity_id = line.split(" ", 1)[0]
    delays = []
    for attempt in range(1, 7):
        r = client.retry_delay(activity_id, attempt)
        # the millisecond jitter stays within the reference's second
        assert r.delay_ms // 1000 == r.delay_seconds
        delays.append(r.delay_seconds)
    assert "%s %s" % (activity_id, delays) == line


@pytest.mark.parametrize("budget,klass,code,action", ARTICLE_NEXT_ACTIONS,
                         ids=[c[2] for c in ARTICLE_NEXT_ACTIONS])
def test_next_action_pure_reproduces_article(client, budget, klass, code, action):
    r = client.next_action_pure(*budget, klass)
    assert (r.code, r.action) == (code, action)
    assert not r.replayed


def test_attempt_zero_is_invalid(client):
    with pytest.raises(grpc.RpcError) as e:
        client.retry_delay("flight-1", 0)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(e.value) == "attempt_must_be_positive"


def test_unspecified_error_class_is_invalid(client):
    with pytest.raises(grpc.RpcError) as e:
        client.next_action_pure(1, 3, 5, 30, pb2.ERROR_CLASS_UNSPECIFIED)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(e.value) == "unknown_error_class"


def test_error_class_by_its_proto_name_and_its_former_alias(client):
    # `error_class=`, as the proto and the Node client name it; `error_class_=`,
    # the name before it, still works; both, or neither, is a TypeError.
    assert client.next_action_pure(1, 3, 5, 30, error_class="transient").code == "schedule_retry"
    assert client.next_action_pure(1, 3, 5, 30, error_class_="permanent").code == "fail_permanent"
    aid = "alias-" + uuid.uuid4().hex[:8]
    assert client.report_failure(aid, 1, error_class="transient").attempt == 1
    assert client.report_failure(aid, 1, error_class_="transient").replayed
    with pytest.raises(TypeError, match="both error_class and its alias"):
        client.report_failure(aid, 1, error_class="transient", error_class_="transient")
    with pytest.raises(TypeError, match="missing required argument: 'error_class'"):
        client.report_failure(aid, 1)


def test_durable_report_replay_order_success_and_history(client):
    aid = "charge-" + uuid.uuid4().hex[:8]
    # A minute ago, to the second: the server refuses times far from its clock.
    t0 = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=1)
    policy = {"max_attempts": 4, "deadline_seconds": 3600}

    # 1. the first report creates the activity and decides
    first = client.report_failure(aid, 1, "transient", policy=policy, occurred_at=t0,
                                  workflow_id="wf-1")
    assert first.code == "schedule_retry" and first.action == pb2.ACTION_SCHEDULE_RETRY
    assert first.attempt == 1 and not first.replayed and not first.policy_conflict
    expected = client.retry_delay(aid, 1)  # default base 2, cap 60
    assert (first.delay_seconds, first.delay_ms) == (expected.delay_seconds, expected.delay_ms)
    assert to_unix(first.not_before) == pytest.approx(t0.timestamp() + first.delay_ms / 1000)
    assert first.policy.max_attempts == 4 and first.policy.deadline_seconds == 3600

    # 2. the same attempt again replays the recorded decision, even with another time
    again = client.report_failure(aid, 1, "transient", policy=policy,
                                  occurred_at=t0 + dt.timedelta(seconds=99))
    assert again.replayed
    assert again.code == first.code and again.not_before == first.not_before
    assert again.delay_ms == first.delay_ms

    # 3. skipping an attempt is refused, naming the expected one
    with pytest.raises(grpc.RpcError) as e:
        client.report_failure(aid, 3, "transient", occurred_at=t0 + dt.timedelta(seconds=10))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details().startswith("attempt_out_of_order")
    assert error_code(e.value) == "attempt_out_of_order"

    # 4. the next attempt in order is decided on the recorded budget
    t2 = t0 + dt.timedelta(seconds=10)
    second = client.report_failure(aid, 2, "transient", occurred_at=t2)
    assert second.code == "schedule_retry" and second.attempt == 2 and not second.replayed
    assert to_unix(second.not_before) == pytest.approx(t2.timestamp() + second.delay_ms / 1000)

    # 5. success closes it, idempotently
    done = client.record_success(aid, occurred_at=t0 + dt.timedelta(seconds=20))
    assert done.status == pb2.ACTIVITY_STATUS_CLOSED and done.changed
    done2 = client.record_success(aid)
    assert done2.status == pb2.ACTIVITY_STATUS_CLOSED and not done2.changed

    # 6. a report after closing is refused
    with pytest.raises(grpc.RpcError) as e:
        client.report_failure(aid, 3, "transient", occurred_at=t0 + dt.timedelta(seconds=30))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_code(e.value) == "activity_closed"

    # 7. the history explains every step
    act = client.get_activity(aid)
    assert act.activity_id == aid and act.workflow_id == "wf-1"
    assert act.tenant == client.tenant
    assert act.attempts == 2
    assert act.status == pb2.ACTIVITY_STATUS_CLOSED and act.closed_code == "succeeded"
    assert act.started_at.ToDatetime(tzinfo=dt.timezone.utc) == t0
    assert [(e.kind, e.code) for e in act.events] == [
        ("decision", "schedule_retry"),
        ("decision", "schedule_retry"),
        ("success", "succeeded"),
    ]
    d1, d2 = act.events[0], act.events[1]
    assert (d1.attempt, d1.not_before, d1.delay_ms) == (1, first.not_before, first.delay_ms)
    assert (d2.attempt, d2.not_before, d2.elapsed_seconds) == (2, second.not_before, 10)
    assert d1.error_class == pb2.ERROR_CLASS_TRANSIENT
    assert d1.reason and d2.reason


def test_tenants_do_not_mix(server, client):
    aid = "shared-" + uuid.uuid4().hex[:8]
    client.report_failure(aid, 1, "permanent")
    with RetryBudget(server.target, tenant="other-" + uuid.uuid4().hex[:8]) as other:
        with pytest.raises(grpc.RpcError) as e:
            other.get_activity(aid)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert client.get_activity(aid).closed_code == "fail_permanent"


def test_an_api_key_proves_the_tenant():
    # A key as `retry-budget keys add` makes them; the server keeps its SHA-256.
    key = "rb_" + base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    with tempfile.TemporaryDirectory(prefix="retry-budget-py-keys-") as workdir:
        keys = os.path.join(workdir, "keys")
        with open(keys, "w") as f:
            f.write("acme:%s\n" % hashlib.sha256(key.encode()).hexdigest())
        srv = Server(_binary(), workdir, ["--auth", "api-keys", "--api-keys-file", keys])
        srv.start()
        try:
            with RetryBudget(srv.target, api_key=key) as c:
                c.report_failure("py-auth-1", 1, "permanent")
                assert c.get_activity("py-auth-1").tenant == "acme"
            with RetryBudget(srv.target, tenant="acme") as anonymous:
                with pytest.raises(grpc.RpcError) as e:
                    anonymous.get_activity("py-auth-1")
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert error_code(e.value) == "unauthenticated"
        finally:
            rc = srv.stop()
        assert rc == 0, srv.log()


def test_worker_example_runs_to_success(server):
    aid = "example-" + uuid.uuid4().hex[:8]
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, os.path.join(HERE, "worker_example.py"),
         "--target", server.target, "--activity-id", aid, "--failures", "2"],
        capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "done: succeeded after 3 call(s)" in res.stdout
    assert time.monotonic() - started < 30

    with RetryBudget(server.target) as c:  # the example uses the default tenant
        act = c.get_activity(aid)
    assert act.attempts == 2 and act.closed_code == "succeeded"
    assert [e.kind for e in act.events] == ["decision", "decision", "success"]


def test_worker_example_stops_on_terminal_action(client):
    aid = "example-" + uuid.uuid4().hex[:8]
    dep = worker_example.FlakyDependency(failures=100)
    lines = []
    code = worker_example.run_activity(
        client, aid, dep, {"max_attempts": 2, "deadline_seconds": 60, "base": 0, "cap": 0},
        log=lines.append)
    assert code == "attempts_exhausted", lines
    assert dep.calls == 2
    # a restarted worker does not reset the budget: the activity stays closed
    code = worker_example.run_activity(client, aid, worker_example.FlakyDependency(0), {},
                                       log=lines.append)
    assert code == "attempts_exhausted" and dep.calls == 2
