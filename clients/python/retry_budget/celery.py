"""Celery: a task base class that lets retry-budget plan a task's retries.

    from retry_budget import Settings
    from retry_budget.celery import RetryBudgetTask

    BUDGET = Settings("retry-budget:50051", tenant="billing", dependency="smtp",
                      policy={"max_attempts": 5, "deadline_seconds": 600})

    @app.task(base=RetryBudgetTask, retry_budget=BUDGET,
              max_retries=3, retry_backoff=True)        # used only while the service is down
    def send_invoice(invoice_id): ...

On an exception the task asks NextAction (activity id `<task name>:<task
id>`, which stays the same across Celery's retries; the attempt is
`request.retries + 1`) and then:

- a retry: `self.retry(eta=not_before)`, so the broker hands the task back
  at the service's time;
- a deferral: the same, at the booked slot; that run asks the deferred
  attempt again before it starts (`Advisor.begin`), and is put back once
  more, without running, if the slot is not there yet;
- a stop: the exception is raised, the task fails (state FAILURE) with no
  retry.

A success calls RecordSuccess with `Settings.dependency`; every run of the
task's body is counted for the traffic reports (a success or a failure of
that dependency; a `self.retry`, `Ignore` or `Reject` the task raises
itself is neither), sent in the background. When the service cannot be reached, the task
retries with Celery's own settings, as `autoretry_for` would: `max_retries`,
`retry_backoff`, `retry_backoff_max`, `retry_jitter`, or
`default_retry_delay` (logged once). Do not also set `autoretry_for` on the
task: it retries before this class sees the exception, and the two multiply.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Optional

import celery
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.time import get_exponential_backoff_interval

from .advisor import Advisor, Settings, advisor_for


class RetryBudgetStopped(Exception):
    """A re-run stopped before it started: the service closed or parked the
    activity (`code`) while the task waited for its slot."""

    def __init__(self, code: str, reason: str):
        super().__init__("retry-budget stopped the task: %s (%s)" % (code, reason))
        self.code = code
        self.reason = reason


def _eta(not_before: Optional[float]) -> _dt.datetime:
    now = _dt.datetime.now(_dt.timezone.utc)
    if not_before is None:
        return now
    return max(now, _dt.datetime.fromtimestamp(not_before, _dt.timezone.utc))


class RetryBudgetTask(celery.Task):
    """Base class of tasks whose retries retry-budget plans.

    Set `retry_budget` (a `retry_budget.Settings`) as a task option."""

    #: The service's settings; required.
    retry_budget: Optional[Settings] = None

    def _advisor(self) -> Advisor:
        if self.retry_budget is None:
            raise TypeError("task %s: RetryBudgetTask needs the task option retry_budget="
                            "Settings(...)" % self.name)
        return advisor_for(self.retry_budget, "Celery")

    def activity_key(self) -> str:
        """The activity id sent to the service: `<task name>:<task id>`."""
        return "%s:%s" % (self.name, self.request.id)

    def _fallback_retry(self, exc: Exception) -> Retry:
        """What `autoretry_for` would do with this task's own settings."""
        retries = self.request.retries
        if self.max_retries is not None and retries >= self.max_retries:
            raise exc
        if self.retry_backoff:
            countdown = get_exponential_backoff_interval(
                factor=int(self.retry_backoff), retries=retries,
                maximum=self.retry_backoff_max, full_jitter=self.retry_jitter)
        else:
            countdown = self.default_retry_delay
        return self.retry(exc=exc, countdown=countdown)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        adv = self._advisor()
        req = self.request
        key = self.activity_key()
        framework_attempt = req.retries + 1
        attempt = framework_attempt
        workflow_id = req.root_id if req.root_id and req.root_id != req.id else ""

        if framework_attempt > 1:
            gate = adv.begin(key, framework_attempt)
            if gate.kind == "defer":
                # Put back until the booked slot; this run does not count.
                raise self.retry(eta=_eta(gate.not_before), max_retries=req.retries + 1)
            if gate.kind == "stop":
                raise RetryBudgetStopped(gate.code, gate.reason)
            if gate.kind == "run":
                attempt = gate.attempt

        try:
            result = super().__call__(*args, **kwargs)
        except (Retry, Ignore, Reject):
            raise  # the task asked for this itself
        except Exception as exc:
            adv.count_failure()
            plan = adv.failed(key, attempt, exc, workflow_id=workflow_id,
                              framework_attempt=framework_attempt)
            if plan.kind == "fallback":
                raise self._fallback_retry(exc)
            if plan.kind == "stop":
                raise
            # The service decides how many: Celery's own max_retries is the
            # fallback's, so this retry is always allowed.
            raise self.retry(exc=exc, eta=_eta(plan.not_before), max_retries=req.retries + 1)
        adv.succeeded(key)
        return result


__all__ = ["RetryBudgetTask", "RetryBudgetStopped"]
