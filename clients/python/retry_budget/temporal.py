"""Temporal (temporalio): a decorator that lets retry-budget plan an activity's retries.

    from temporalio import activity
    from retry_budget import Settings
    from retry_budget.temporal import with_retry_budget

    BUDGET = Settings("retry-budget:50051", tenant="checkout", dependency="payments-api",
                      policy={"max_attempts": 5, "deadline_seconds": 600})

    @activity.defn
    @with_retry_budget(BUDGET)
    async def charge(order_id: str) -> str: ...

On an exception the activity asks NextAction (activity id
`<workflow id>:<activity id>`, the attempt from `activity.info().attempt`,
the failure classified by `Settings.classify`) and raises Temporal's
`ApplicationError` in its place:

- a retry: `next_retry_delay` = the planned wait, so Temporal's server runs
  the next attempt at the service's `not_before` instead of its own backoff;
- a deferral (the global budget is exhausted): a retry at `not_before`, the
  slot the service booked; that attempt asks the deferred one again before
  it runs, which takes the slot's token (`Advisor.begin`);
- a stop: `non_retryable=True`, so Temporal's server retries no more.

A success calls RecordSuccess with `Settings.dependency`; every attempt
that ran is counted for the traffic reports (a success or a failure of that
dependency), sent in the background. When the service cannot be reached, the
original exception is raised unchanged and the activity's own RetryPolicy
applies (logged once). Keep the RetryPolicy for that case only: its
`maximum_attempts` at or above the service's `max_attempts` (0, unlimited,
is fine: the service stops), so that the two do not multiply.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import functools
import inspect
from typing import Any, Callable, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from .advisor import Advisor, Plan, Settings, advisor_for

F = TypeVar("F", bound=Callable[..., Any])

#: The ApplicationError `type` of a retry or deferral the service planned
#: whose cause is not itself an exception type worth naming.
DEFERRED_TYPE = "RetryBudgetDeferred"
#: The ApplicationError `type` of an attempt stopped before it ran.
STOPPED_TYPE = "RetryBudgetStopped"

# Temporal treats a zero next_retry_delay as unset (its own backoff): a
# not_before that has already passed becomes the smallest real delay.
_MIN_DELAY = _dt.timedelta(milliseconds=1)


def activity_key() -> str:
    """The activity id sent to the service: `<workflow id>:<activity id>`."""
    info = activity.info()
    return "%s:%s" % (info.workflow_id, info.activity_id) if info.workflow_id else info.activity_id


def _details(plan: Plan) -> dict:
    return {"code": plan.code, "reason": plan.reason, "attempt": plan.attempt,
            "not_before": plan.not_before}


def to_application_error(plan: Plan, exc: BaseException | None = None) -> ApplicationError:
    """The ApplicationError that makes Temporal's server do what `plan` says."""
    message = str(exc) if exc is not None else "retry-budget: %s (%s)" % (plan.code, plan.reason)
    err_type = type(exc).__name__ if exc is not None else (
        STOPPED_TYPE if plan.kind == "stop" else DEFERRED_TYPE)
    if plan.kind == "stop":
        return ApplicationError(message, _details(plan), type=err_type, non_retryable=True)
    delay = max(_dt.timedelta(seconds=plan.delay()), _MIN_DELAY)
    return ApplicationError(message, _details(plan), type=err_type, next_retry_delay=delay)


def _before(adv: Advisor) -> tuple[str, int, str]:
    info = activity.info()
    key = activity_key()
    plan = adv.begin(key, info.attempt)
    if plan.kind in ("defer", "stop"):
        raise to_application_error(plan)
    attempt = info.attempt if plan.kind == "fallback" else plan.attempt
    return key, attempt, info.workflow_id or ""


def _after_failure(adv: Advisor, key: str, attempt: int, workflow_id: str,
                   exc: Exception) -> BaseException:
    adv.count_failure()
    plan = adv.failed(key, attempt, exc, workflow_id=workflow_id,
                      framework_attempt=activity.info().attempt)
    if plan.kind == "fallback":
        return exc  # the activity's own RetryPolicy decides
    return to_application_error(plan, exc)


def with_retry_budget(settings: Settings) -> Callable[[F], F]:
    """Decorates an activity function (async or sync), under `@activity.defn`."""
    adv = advisor_for(settings, "Temporal")

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                key, attempt, wf = await asyncio.to_thread(_before, adv)
                try:
                    result = await fn(*args, **kwargs)
                except Exception as exc:
                    err = await asyncio.to_thread(_after_failure, adv, key, attempt, wf, exc)
                    if err is exc:
                        raise
                    raise err from exc
                await asyncio.to_thread(adv.succeeded, key)
                return result
            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            key, attempt, wf = _before(adv)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                err = _after_failure(adv, key, attempt, wf, exc)
                if err is exc:
                    raise
                raise err from exc
            adv.succeeded(key)
            return result
        return run  # type: ignore[return-value]

    return decorate


__all__ = ["with_retry_budget", "to_application_error", "activity_key", "DEFERRED_TYPE",
           "STOPPED_TYPE"]
