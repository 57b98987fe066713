"""What every framework integration asks the service, in one place.

A framework (Temporal, Celery, DBOS) runs an attempt; the integration tells
the `Advisor` how it ended and gets a `Plan` back:

- `failed()` after an exception: NextAction, durable form. The plan is a
  retry at `not_before`, a deferral (the global budget is exhausted: come
  back at `not_before`, same attempt), a stop with its stable code, or a
  fallback (the service could not answer: use the framework's own retry
  settings; said once in the log, not on every failure).
- `begin()` before a framework's re-run (its attempt 2, 3, ...): the attempt
  the service expects next. After a deferral the framework comes back at the
  booked slot; asking the deferred attempt again here takes that slot's
  token before the attempt runs, as the service's worker loop says.
- `succeeded()`: RecordSuccess.

Each also counts the call the framework ran for the traffic reports
(`retry_budget.traffic`): `count_failure()` after a failed one,
`succeeded()` after a successful one. The service paces each dependency's
retries by its successes, so a worker that did not count them would leave
its dependency at the floor.

Attempts are the framework's own (Temporal's `activity.info().attempt`,
Celery's `request.retries + 1`). The service counts attempts without gaps
and a deferral consumes none, so after a deferral or a period when the
service was down the framework's number runs ahead of the service's; the
service's next attempt (from GetActivity) is reported then, and the log
line names both.

`Settings.dependency` (what the activity calls) goes into every log line,
every NextAction and RecordSuccess, and the traffic counts.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional, Union

import grpc

from ._pb import error_detail_pb2
from .client import RetryBudget, error_class, error_code, pb2, to_policy, to_timestamp, to_unix
from .traffic import DEFAULT_INTERVAL, validate_dependency

log = logging.getLogger("retry_budget")

#: What a classifier returns: a class name ("transient", "permanent",
#: "unknown"), an ErrorClass value, or the raw failure as an ErrorDetail
#: mapping ({"http_status": 503, "retry_after": "2"}) for the service's
#: rules to classify.
Classification = Union[str, int, Mapping[str, Any]]

#: gRPC codes that mean the service did not decide: fall back.
_UNREACHABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED,
})

#: Exceptions that are, by default, worth trying again.
TRANSIENT_TYPES: tuple = (ConnectionError, TimeoutError)
#: Exceptions that will fail again the same way.
PERMANENT_TYPES: tuple = (ValueError, TypeError, LookupError, PermissionError, NotImplementedError)


def classify_default(exc: BaseException) -> Classification:
    """Connection errors and timeouts are transient; ValueError, TypeError,
    LookupError, PermissionError and NotImplementedError permanent; anything
    else unknown (the service parks it for review). An exception may also
    say it itself with a `retry_budget_class` attribute."""
    own = getattr(exc, "retry_budget_class", None)
    if isinstance(own, str):
        return own
    if isinstance(exc, TRANSIENT_TYPES):
        return "transient"
    if isinstance(exc, PERMANENT_TYPES):
        return "permanent"
    return "unknown"


@dataclasses.dataclass(frozen=True, eq=False)
class Settings:
    """The caller's configuration of an integration (compared and hashed by
    identity: one Settings object, one shared channel)."""

    #: host:port of the retry-budget server.
    target: str
    #: Sent as x-tenant-id; None means the server's default tenant.
    tenant: Optional[str] = None
    #: The dependency the activity calls ("payments-api"; up to 64
    #: printable ASCII characters without spaces): named in every
    #: NextAction and RecordSuccess, so a retry takes a token of its budget,
    #: and in the traffic counts that pace it. "" is the default dependency.
    dependency: str = ""
    #: The activity's policy on its first report: max_attempts,
    #: deadline_seconds, base, cap. None means the server's defaults.
    policy: Optional[Mapping[str, int]] = None
    #: Exception -> class name or ErrorDetail mapping.
    classify: Callable[[BaseException], Classification] = classify_default
    #: How long one call to the service may take before the framework's own
    #: retry settings are used instead (seconds).
    timeout: float = 2.0
    #: Sent as `authorization: Bearer <key>` to a server run with --auth api-keys.
    api_key: Optional[str] = None
    #: How often the calls counted are sent (ReportTraffic), in seconds;
    #: None turns counting off.
    traffic_interval: Optional[float] = DEFAULT_INTERVAL

    def __post_init__(self) -> None:
        # A name the service refuses would make every report fail: say so
        # where the settings are written, not on the first failure.
        validate_dependency(self.dependency)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the framework should do next."""

    #: "run" (begin only), "retry", "defer", "stop" or "fallback".
    kind: str
    #: The attempt the plan is about: for "run", the one about to run.
    attempt: int
    #: The service's stable code (schedule_retry, deferred, fail_permanent,
    #: ..., activity_closed), or "unreachable" for a fallback.
    code: str = ""
    #: The service's sentence for people.
    reason: str = ""
    #: Unix seconds: when the next attempt (retry) or the next question
    #: (defer) may come.
    not_before: Optional[float] = None

    def delay(self, now: Optional[float] = None) -> float:
        """Seconds from now until not_before (0 when it has passed or is unset)."""
        if self.not_before is None:
            return 0.0
        return max(0.0, self.not_before - (time.time() if now is None else now))


class Advisor:
    """One integration's link to the service: a client, the settings, and
    whether the service was last seen down (to say so once).

    Thread-safe: Celery and Temporal run attempts on several threads."""

    def __init__(self, settings: Settings, framework: str):
        self.settings = settings
        #: Named in the fallback message: whose own retry settings apply.
        self.framework = framework
        self._client: Optional[RetryBudget] = None
        self._lock = threading.Lock()
        self._down = False

    # -- plumbing -----------------------------------------------------------
    @property
    def client(self) -> RetryBudget:
        with self._lock:
            if self._client is None:
                s = self.settings
                self._client = RetryBudget(s.target, tenant=s.tenant, timeout=s.timeout,
                                           api_key=s.api_key,
                                           traffic_interval=s.traffic_interval)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _reached(self) -> None:
        if self._down:
            with self._lock:
                was, self._down = self._down, False
            if was:
                log.warning("retry-budget at %s answers again: its decisions apply again "
                            "(dependency=%s)", self.settings.target, self.settings.dependency)

    def _unreachable(self, err: grpc.RpcError, activity_id: str) -> None:
        with self._lock:
            first, self._down = not self._down, True
        if first:
            log.warning(
                "retry-budget at %s cannot be reached (%s: %s): falling back to %s's own retry "
                "settings until it answers (activity=%s dependency=%s)",
                self.settings.target, err.code().name, err.details(), self.framework,
                activity_id, self.settings.dependency)

    def _fallback(self, err: grpc.RpcError, activity_id: str, attempt: int) -> Plan:
        if err.code() in _UNREACHABLE:
            self._unreachable(err, activity_id)
        else:
            # A refusal the integration did not expect (a bug on our side):
            # the workers go on with their own settings, loudly.
            log.error("retry-budget refused activity=%s attempt=%d (%s: %s): falling back to "
                      "%s's own retry settings (dependency=%s)", activity_id, attempt,
                      err.code().name, err.details(), self.framework, self.settings.dependency)
        return Plan("fallback", attempt, "unreachable", err.details() or "")

    def _log(self, activity_id: str, plan: Plan, framework_attempt: int) -> None:
        nb = ("" if plan.not_before is None else
              _dt.datetime.fromtimestamp(plan.not_before, _dt.timezone.utc).isoformat())
        seen = "" if framework_attempt == plan.attempt else " %s_attempt=%d" % (
            self.framework.lower(), framework_attempt)
        log.info("retry-budget %s: activity=%s attempt=%d%s dependency=%s code=%s "
                 "not_before=%s reason=%s", plan.kind, activity_id, plan.attempt, seen,
                 self.settings.dependency, plan.code, nb, plan.reason)

    # -- requests -----------------------------------------------------------
    def _request(self, activity_id: str, attempt: int, classification: Classification,
                 occurred_at: Any, workflow_id: str):
        req = pb2.NextActionRequest(activity_id=activity_id, attempt=attempt,
                                    workflow_id=workflow_id or "",
                                    dependency=self.settings.dependency)
        if isinstance(classification, (str, int)):
            req.error_class = error_class(classification)
        else:
            req.error.CopyFrom(error_detail_pb2.ErrorDetail(**dict(classification)))
        policy = to_policy(self.settings.policy)
        if policy is not None:
            req.policy.CopyFrom(policy)
        ts = to_timestamp(occurred_at if occurred_at is not None else time.time())
        assert ts is not None  # a time that is given always converts
        req.occurred_at.CopyFrom(ts)
        return req

    def _ask(self, req) -> Plan:
        r = self.client._call("NextAction", req)
        not_before = to_unix(r.not_before) if r.HasField("not_before") else None
        if r.action == pb2.ACTION_SCHEDULE_RETRY:
            kind = "retry"
        elif r.action == pb2.ACTION_DEFERRED:
            kind = "defer"
        else:
            kind = "stop"
        return Plan(kind, req.attempt, r.code, r.reason, not_before)

    @staticmethod
    def _pending_deferral(act) -> Any:
        """The deferral the activity waits on, if its last decision is one:
        a deferral consumes no attempt, so it is about attempts + 1."""
        decisions = [e for e in act.events if e.kind == "decision"]
        last = decisions[-1] if decisions else None
        if last is not None and last.attempt == act.attempts + 1 and last.code == "deferred":
            return last
        return None

    def _redeem(self, act, deferral, activity_id: str) -> Plan:
        """Asks the deferred attempt again, with its class and time (a booked
        slot pays for it)."""
        req = self._request(activity_id, deferral.attempt, deferral.error_class,
                            deferral.occurred_at, act.workflow_id)
        return self._ask(req)

    @staticmethod
    def _slot(act, deferral) -> float:
        """When the deferred attempt may be asked again: the booked slot, or
        the deferral's not_before when nothing could be booked."""
        if act.HasField("reservation_not_before"):
            return to_unix(act.reservation_not_before)
        return to_unix(deferral.not_before)

    # -- the three questions ------------------------------------------------
    def begin(self, activity_id: str, framework_attempt: int) -> Plan:
        """Before the framework's attempt `framework_attempt` runs: "run"
        with the service's attempt number, "defer" (come back at
        not_before without running), "stop", or "fallback" (run)."""
        try:
            return self._begin(activity_id, framework_attempt)
        except Exception as err:  # noqa: BLE001 - never stop a worker
            return self._broken(err, activity_id, framework_attempt)

    def failed(self, activity_id: str, attempt: int, exc: BaseException, *,
               workflow_id: str = "", occurred_at: Any = None,
               framework_attempt: Optional[int] = None) -> Plan:
        """After attempt `attempt` failed with `exc`: the service's plan."""
        try:
            return self._failed(activity_id, attempt, exc, workflow_id, occurred_at,
                                attempt if framework_attempt is None else framework_attempt)
        except Exception as err:  # noqa: BLE001 - never stop a worker
            return self._broken(err, activity_id, attempt)

    def _broken(self, err: Exception, activity_id: str, attempt: int) -> Plan:
        """A failure of the integration itself (a classifier that raised, a
        policy the client refuses): the framework's own settings apply."""
        log.exception("retry-budget integration failed for activity=%s attempt=%d: falling back "
                      "to %s's own retry settings (dependency=%s)", activity_id, attempt,
                      self.framework, self.settings.dependency)
        return Plan("fallback", attempt, "integration_error", repr(err))

    def _begin(self, activity_id: str, framework_attempt: int) -> Plan:
        if framework_attempt <= 1:
            return Plan("run", 1)
        try:
            act = self.client.get_activity(activity_id)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                self._reached()
                return Plan("run", 1)  # no failure recorded (or only while it was down)
            plan = self._fallback(err, activity_id, framework_attempt)
            return dataclasses.replace(plan, attempt=framework_attempt)
        self._reached()
        if act.status == pb2.ACTIVITY_STATUS_PARKED:
            plan = Plan("stop", act.attempts, "manual_review", "parked for manual review")
            self._log(activity_id, plan, framework_attempt)
            return plan
        if act.status == pb2.ACTIVITY_STATUS_CLOSED and act.closed_code != "succeeded":
            plan = Plan("stop", act.attempts, act.closed_code, "the activity is closed")
            self._log(activity_id, plan, framework_attempt)
            return plan
        deferral = self._pending_deferral(act)
        if deferral is not None:
            slot = self._slot(act, deferral)
            if time.time() < slot:
                return Plan("defer", deferral.attempt, "deferred", "the deferral's slot is ahead",
                            slot)
            try:
                plan = self._redeem(act, deferral, activity_id)
            except grpc.RpcError as err:
                return dataclasses.replace(self._fallback(err, activity_id, framework_attempt),
                                           attempt=framework_attempt)
            self._log(activity_id, plan, framework_attempt - 1)
            if plan.kind != "retry":
                return plan
            return Plan("run", plan.attempt + 1, plan.code, plan.reason, plan.not_before)
        return Plan("run", act.attempts + 1)

    def _failed(self, activity_id: str, attempt: int, exc: BaseException, workflow_id: str,
                occurred_at: Any, seen: int) -> Plan:
        classification = self.settings.classify(exc)
        if occurred_at is None:
            occurred_at = time.time()
        try:
            try:
                plan = self._ask(self._request(activity_id, attempt, classification,
                                               occurred_at, workflow_id))
            except grpc.RpcError as err:
                if error_code(err) != "attempt_out_of_order":
                    raise
                # The service's count is behind the framework's (a deferral,
                # or failures while it was down): report its next attempt.
                act = self.client.get_activity(activity_id)
                attempt = act.attempts + 1
                deferral = self._pending_deferral(act)
                if deferral is not None:
                    redeemed = self._redeem(act, deferral, activity_id)
                    if redeemed.kind != "retry":
                        self._reached()
                        self._log(activity_id, redeemed, seen)
                        return redeemed
                    attempt += 1
                plan = self._ask(self._request(activity_id, attempt, classification,
                                               occurred_at, workflow_id))
        except grpc.RpcError as err:
            code = error_code(err)
            if code in ("activity_closed", "activity_parked"):
                self._reached()
                plan = Plan("stop", attempt, code, err.details() or "")
                self._log(activity_id, plan, seen)
                return plan
            return self._fallback(err, activity_id, attempt)
        self._reached()
        self._log(activity_id, plan, seen)
        return plan

    def count_failure(self) -> None:
        """Counts one failed call to the dependency for the traffic reports.
        Called once per failed attempt, not per question about it."""
        self.client.record_call(self.settings.dependency, False)

    def succeeded(self, activity_id: str) -> None:
        """RecordSuccess, and the successful call counted; a service that
        cannot be reached is logged, never raised."""
        dependency = self.settings.dependency
        req = pb2.RecordSuccessRequest(activity_id=activity_id, dependency=dependency)
        try:
            r = self.client._call("RecordSuccess", req)
        except grpc.RpcError as err:
            # Not counted by the service: the traffic report carries it.
            self.client.record_call(dependency, True)
            self._fallback(err, activity_id, 0)
            return
        # The service counted the success with the RecordSuccess (every one
        # counts a success of its dependency): the report adds the call only.
        self.client.record_call(dependency, True, success_recorded=True)
        self._reached()
        log.info("retry-budget success: activity=%s dependency=%s status=%s changed=%s",
                 activity_id, self.settings.dependency, pb2.ActivityStatus.Name(r.status),
                 r.changed)


_advisors: dict = {}
_advisors_lock = threading.Lock()


def advisor_for(settings: Settings, framework: str) -> Advisor:
    """One Advisor per (settings, framework) in a process, so the channel and
    the "said once" state are shared by every task that uses them."""
    key = (settings, framework)
    with _advisors_lock:
        adv = _advisors.get(key)
        if adv is None:
            adv = _advisors[key] = Advisor(settings, framework)
        return adv
