"""The real retry-budget binary for the framework tests.

Each server listens on 127.0.0.1:0 (the kernel picks the port; the address
is read from the server's `serving addr=` log line) with a temporary data
dir, and is stopped at the end. `stop()` and `start()` again keep the
address and the data dir, so a test can take the service away mid-run and
bring it back to read what it recorded.

The binary is RETRY_BUDGET_BIN, else target/debug/retry-budget.

Every server runs a static dependency rate at the global one
(`GLOBAL_BUDGET_ONLY`): these tests are about how each framework schedules
what the service plans, with retries back to back in one dependency, which
the adaptive default would hold to one a second for a dependency with no
successes yet (clients/python/test_traffic.py runs that default). The
traffic counts each integration sends are read with `traffic()`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)
REPO = os.path.abspath(os.path.join(PACKAGE, "..", ".."))
sys.path.insert(0, HERE)
try:  # the installed package (pip install ./clients/python), else this checkout's
    import retry_budget  # noqa: F401
except ImportError:
    sys.path.insert(0, PACKAGE)

SERVING = re.compile(r"\bserving addr=(\S+)")
#: The global bucket alone decides, as before dependencies had budgets.
GLOBAL_BUDGET_ONLY = ["--dependency-rate", "100"]


def binary() -> str:
    path = os.environ.get("RETRY_BUDGET_BIN") or os.path.join("target", "debug", "retry-budget")
    if not os.path.isabs(path):
        path = os.path.join(REPO, path)
    if not os.access(path, os.X_OK):
        pytest.fail("retry-budget binary not found at %s: run `cargo build` or set "
                    "RETRY_BUDGET_BIN" % path)
    return path


class Server:
    """One real server process; `target` is its host:port once started."""

    def __init__(self, extra_args=(), global_budget_only=True):
        # global_budget_only=False: the server's own dependency defaults.
        self.extra_args = (GLOBAL_BUDGET_ONLY if global_budget_only else []) + list(extra_args)
        self.workdir = tempfile.mkdtemp(prefix="retry-budget-integrations-")
        self.target = "127.0.0.1:0"
        self.proc = None
        self.lines: list = []

    def start(self) -> "Server":
        self.proc = subprocess.Popen(
            [binary(), "--listen", self.target, "--data-dir", os.path.join(self.workdir, "data"),
             "--drain-delay", "0s", "--grace-period", "5s"] + self.extra_args,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.workdir,
            env={**os.environ, "RUST_LOG": "info", "NO_COLOR": "1"})
        found = threading.Event()

        def read(proc=self.proc):
            for line in proc.stdout:
                self.lines.append(line.rstrip("\n"))
                m = SERVING.search(line)
                if m:
                    self.target = m.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 30
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("server did not serve:\n" + "\n".join(self.lines))
        return self

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def close(self) -> None:
        self.stop()
        import shutil
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def servers():
    """Three servers: `plain` (the defaults), `tight` (--retry-rate 1
    --retry-burst 1, to force deferrals) and `doomed` (stopped mid-run by
    the fallback tests)."""
    started = {
        "plain": Server().start(),
        "tight": Server(["--retry-rate", "1", "--retry-burst", "1"]).start(),
        "doomed": Server().start(),
    }
    yield started
    for srv in started.values():
        srv.close()


def fresh(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def drain(srv: Server, tenant: str) -> None:
    """Takes the one token of a --retry-burst 1 server with another activity."""
    from retry_budget import RetryBudget
    with RetryBudget(srv.target, tenant=tenant) as rb:
        d = rb.report_failure(fresh("drain"), 1, "transient")
        assert d.code in ("schedule_retry", "deferred"), d


# Policies of the tests: base 0 makes every planned delay the 1 s floor.
POLICY = {"max_attempts": 5, "deadline_seconds": 120, "base": 0, "cap": 0}
# How late a retry may start after the service's not_before (the broker's
# or the test's scheduling), and how early (clock reads a hair apart).
LATE = 1.5
EARLY = 0.05


def traffic(srv: Server, tenant: str, dependency: str, expected: tuple,
            timeout: float = 10.0) -> tuple:
    """The (calls, successes, failures, retries admitted) the service counted
    for `tenant`'s use of `dependency` (ReportTraffic with an empty request
    lists the caller's own dependencies), once they are
    `expected` or `timeout` has passed: an integration sends its counts
    about once a second, in the background. A retry is admitted by the
    budget of the dependency its NextAction named."""
    from retry_budget import RetryBudget
    deadline = time.monotonic() + timeout
    while True:
        with RetryBudget(srv.target, tenant=tenant, traffic_interval=None) as rb:
            paces = {p.dependency: p for p in rb.report_traffic().dependencies}
        p = paces.get(dependency)
        seen = (p.calls, p.successes, p.failures, p.retries_admitted) if p is not None else None
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def get_activity(srv: Server, tenant: str, activity_id: str):
    """GetActivity on a channel of its own: a server just started again at the
    same address is not behind the reconnect backoff that gRPC's shared
    subchannels keep for it."""
    import grpc
    from retry_budget import RetryBudget
    channel = grpc.insecure_channel(srv.target, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        with RetryBudget(srv.target, tenant=tenant, channel=channel) as rb:
            return rb.get_activity(activity_id)
    finally:
        channel.close()
