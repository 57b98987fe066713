"""The retry-budget client: a thin wrapper over the generated stubs.

    from retry_budget import RetryBudget
    rb = RetryBudget("127.0.0.1:50051", tenant="acme")
    d = rb.report_failure("charge-42", attempt=1, error_class="transient",
                          policy={"max_attempts": 5, "deadline_seconds": 600})
    if d.code == "schedule_retry":
        sleep until d.not_before, run attempt 2 ...

`rb.traffic` counts the worker's calls to each dependency and sends the
counts by itself about once a second (`retry_budget.traffic`): the service
paces each dependency's retries by its successes, which only the worker
sees. `traffic_interval=None` turns it off.

The stubs are committed in `retry_budget._pb` (clients/python/gen_stubs.py
makes them from proto/ and checks they match), so nothing is generated at
import time and no proto/ directory is needed.

Every method returns the protobuf response unchanged; errors are raised as
grpc.RpcError. Use `error_code(err)` to read the stable snake_case code at the
start of the error message (match on it, never on the explanation).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping, Optional, Tuple, Union, cast

import grpc
from google.protobuf import timestamp_pb2

from ._pb import retry_budget_pb2 as pb2
from ._pb import retry_budget_pb2_grpc as pb2_grpc
from .traffic import DEFAULT_INTERVAL, TrafficReporter, validate_dependency

# Action codes that end an activity: a worker stops on any of them.
TERMINAL_CODES = frozenset(
    {"attempts_exhausted", "deadline_exceeded", "fail_permanent", "manual_review"}
)

ErrorClassLike = Union[str, int]
TimeLike = Union[None, _dt.datetime, float, int, "timestamp_pb2.Timestamp"]


def error_class(value: ErrorClassLike) -> "pb2.ErrorClass":
    """'transient' | 'permanent' | 'unknown' (or the enum value) -> enum value."""
    if isinstance(value, int):
        return cast("pb2.ErrorClass", value)
    name = value.strip().upper()
    if not name.startswith("ERROR_CLASS_"):
        name = "ERROR_CLASS_" + name
    return cast("pb2.ErrorClass", pb2.ErrorClass.Value(name))


# The methods' parameter is named `error_class`, as in the proto and the
# Node client, and hides the function above inside them.
_error_class_value = error_class


def _chosen_class(method: str, value: Optional[ErrorClassLike],
                  alias: Optional[ErrorClassLike]) -> "pb2.ErrorClass":
    """`error_class`, or `error_class_`, its former name, kept as an alias
    so that code written against it still runs: exactly one of them."""
    if value is not None and alias is not None:
        raise TypeError(f"{method}() got both error_class and its alias error_class_")
    if value is None and alias is None:
        raise TypeError(f"{method}() missing required argument: 'error_class'")
    return _error_class_value(cast(ErrorClassLike, value if value is not None else alias))


def to_timestamp(value: TimeLike) -> Optional["timestamp_pb2.Timestamp"]:
    """None, an aware datetime, a Unix time in seconds, or a Timestamp."""
    if value is None:
        return None
    if isinstance(value, timestamp_pb2.Timestamp):
        return value
    ts = timestamp_pb2.Timestamp()
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise ValueError("occurred_at must be timezone-aware")
        ts.FromDatetime(value.astimezone(_dt.timezone.utc))
    else:
        ns = int(round(float(value) * 1e9))
        ts.seconds, ts.nanos = divmod(ns, 1_000_000_000)
    return ts


def to_unix(ts: "timestamp_pb2.Timestamp") -> float:
    """A Timestamp as Unix seconds (for time.sleep arithmetic)."""
    return ts.seconds + ts.nanos / 1e9


def to_policy(value: Union[None, Mapping[str, Any], Any]):
    """None, a dict (max_attempts, deadline_seconds, base, cap) or a Policy."""
    if value is None or isinstance(value, pb2.Policy):
        return value
    return pb2.Policy(**dict(value))


def error_code(err: grpc.RpcError) -> str:
    """The stable code at the start of a service error's message."""
    details = err.details() or ""
    return details.split(":", 1)[0].strip()


class RetryBudget:
    """A thin wrapper over the generated stub: one channel, one tenant.

    ``api_key`` is sent as ``authorization: Bearer <key>`` to a server run
    with ``--auth api-keys``; the tenant is then the key's (``tenant`` may be
    left out, or must name the same tenant).

    ``traffic_interval`` is how often ``traffic`` (a ``TrafficReporter``)
    sends the calls counted with ``record_call`` or ``traffic.call()``, in
    seconds; None turns counting off. ``close()`` sends what is left."""

    def __init__(
        self,
        target: str,
        tenant: Optional[str] = None,
        timeout: float = 10.0,
        channel: Optional[grpc.Channel] = None,
        api_key: Optional[str] = None,
        traffic_interval: Optional[float] = DEFAULT_INTERVAL,
    ):
        self.target = target
        self._own_channel = channel is None
        self.channel = channel if channel is not None else grpc.insecure_channel(target)
        self.stub = pb2_grpc.RetryBudgetStub(self.channel)
        self.tenant = tenant
        self.timeout = timeout
        metadata = []
        if tenant:
            metadata.append(("x-tenant-id", tenant))
        if api_key:
            metadata.append(("authorization", "Bearer " + api_key))
        self._metadata = tuple(metadata) or None
        #: Counts calls per dependency and sends them (ReportTraffic).
        self.traffic = TrafficReporter(self, interval=traffic_interval)

    # -- plumbing -----------------------------------------------------------
    def _call(self, method: str, request, timeout: Optional[float] = None):
        return getattr(self.stub, method)(
            request, timeout=self.timeout if timeout is None else timeout,
            metadata=self._metadata)

    def close(self) -> None:
        """Sends the traffic counts left, then closes the channel (if it is
        the client's own)."""
        self.traffic.close()
        if self._own_channel:
            self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- pure calls ---------------------------------------------------------
    def retry_delay(self, activity_id: str, attempt: int, base: Optional[int] = None,
                    cap: Optional[int] = None):
        """RetryDelay: .delay_seconds (the article's value) and .delay_ms."""
        req = pb2.RetryDelayRequest(activity_id=activity_id, attempt=attempt)
        if base is not None:
            req.base = base
        if cap is not None:
            req.cap = cap
        return self._call("RetryDelay", req)

    def next_action_pure(self, attempts: int, max_attempts: int, elapsed: int, deadline: int,
                         error_class: Optional[ErrorClassLike] = None, activity_id: str = "",
                         dependency: str = "", *, error_class_: Optional[ErrorClassLike] = None):
        """NextAction, pure form: the article's next_action on the given budget.

        `error_class` is 'transient', 'permanent', 'unknown' or the enum
        value; `error_class_` is its former name, still accepted."""
        req = pb2.NextActionRequest(
            budget=pb2.Budget(attempts=attempts, max_attempts=max_attempts,
                              elapsed=elapsed, deadline=deadline),
            error_class=_chosen_class("next_action_pure", error_class, error_class_),
            activity_id=activity_id,
            dependency=dependency,
        )
        return self._call("NextAction", req)

    # -- durable calls ------------------------------------------------------
    def report_failure(self, activity_id: str, attempt: int,
                       error_class: Optional[ErrorClassLike] = None, policy=None,
                       occurred_at: TimeLike = None, workflow_id: str = "",
                       dependency: str = "", *, error_class_: Optional[ErrorClassLike] = None):
        """NextAction, durable form: report attempt `attempt` failed; get the decision.

        `error_class` is 'transient', 'permanent', 'unknown' or the enum
        value, as the proto's field; `error_class_` is its former name, still
        accepted (give one of them).

        `policy` is read on the activity's first report only. `occurred_at`
        should come from the worker's own history so a replay is exact.
        `dependency` names what the failed call went to ("payments-api"; ""
        is the default dependency): a retry takes a token of its budget.
        """
        req = pb2.NextActionRequest(
            activity_id=activity_id,
            attempt=attempt,
            error_class=_chosen_class("report_failure", error_class, error_class_),
            workflow_id=workflow_id,
            dependency=dependency,
        )
        p = to_policy(policy)
        if p is not None:
            req.policy.CopyFrom(p)
        ts = to_timestamp(occurred_at)
        if ts is not None:
            req.occurred_at.CopyFrom(ts)
        return self._call("NextAction", req)

    def record_success(self, activity_id: str, occurred_at: TimeLike = None,
                       dependency: str = ""):
        """RecordSuccess: close the activity (idempotent).

        The service counts every RecordSuccess as one success of
        `dependency` ("" is the default one): count that call with
        `record_call(dependency, True, success_recorded=True)`, or its
        success is counted twice."""
        req = pb2.RecordSuccessRequest(activity_id=activity_id, dependency=dependency)
        ts = to_timestamp(occurred_at)
        if ts is not None:
            req.occurred_at.CopyFrom(ts)
        return self._call("RecordSuccess", req)

    def resolve_activity(self, activity_id: str, resolution: Union[str, int], note: str = ""):
        """ResolveActivity: 'fail' or 'retry' for an activity parked for review."""
        if isinstance(resolution, str):
            resolution = pb2.Resolution.Value("RESOLUTION_" + resolution.upper())
        req = pb2.ResolveActivityRequest(activity_id=activity_id,
                                         resolution=cast("pb2.Resolution", resolution), note=note)
        return self._call("ResolveActivity", req)

    def get_activity(self, activity_id: str):
        """GetActivity: the budget and every recorded decision."""
        return self._call("GetActivity", pb2.GetActivityRequest(activity_id=activity_id))

    # -- dependencies -------------------------------------------------------
    def report_traffic(self, counts: Optional[Mapping[str, Tuple[int, int, int]]] = None):
        """ReportTraffic: `{dependency: (calls, successes, failures)}` since
        the last report, answered with each one's pace (`allowed_rate`,
        `success_rate`, `rule`, `explanation`, ...). None or {} reads the
        pace of every dependency the service tracks and counts nothing.

        `traffic` sends these by itself; call this to read the paces, or to
        report counts kept elsewhere."""
        req = pb2.ReportTrafficRequest(dependencies=[
            pb2.DependencyTraffic(dependency=validate_dependency(name), calls=calls,
                                  successes=successes, failures=failures)
            for name, (calls, successes, failures) in (counts or {}).items()
        ])
        return self._call("ReportTraffic", req)

    def record_call(self, dependency: str, ok: bool, *, success_recorded: bool = False) -> None:
        """Counts one call to `dependency` for the next traffic report
        (`TrafficReporter.record_call`)."""
        self.traffic.record_call(dependency, ok, success_recorded=success_recorded)


__all__ = [
    "RetryBudget", "pb2", "pb2_grpc", "TERMINAL_CODES", "error_class", "error_code",
    "to_timestamp", "to_unix", "to_policy", "TrafficReporter", "validate_dependency",
]
