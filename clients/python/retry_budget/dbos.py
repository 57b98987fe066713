"""DBOS: a step wrapper whose retries retry-budget plans, with durable sleeps.

    from dbos import DBOS
    from retry_budget import Settings
    from retry_budget.dbos import budgeted_step, StepRetries

    BUDGET = Settings("retry-budget:50051", tenant="orders", dependency="inventory",
                      policy={"max_attempts": 5, "deadline_seconds": 600})

    @budgeted_step(BUDGET, fallback=StepRetries(max_attempts=3, interval_seconds=1.0))
    def reserve(sku: str) -> str: ...          # a plain function: do not also mark it @DBOS.step

    @DBOS.workflow()
    def order(sku: str) -> str:
        return reserve(sku)                      # called from a workflow

Each call runs the function as a DBOS step without DBOS's own retries. On
an exception a second step asks NextAction (activity id `<workflow
id>:<step name>`, the attempt counted by the wrapper) and checkpoints the
answer; then:

- a retry: `DBOS.sleep` until `not_before` (a durable sleep: a workflow
  recovered after a crash sleeps only what is left), then the next attempt;
- a deferral: a durable sleep until the booked slot, then the same attempt
  is asked again (the slot's token pays for it) before the next one runs;
- a stop: the step's exception is raised to the workflow.

A success records RecordSuccess (with `Settings.dependency`) in a step.
Every attempt is counted for the traffic reports, a failure in the step that
stamps its time, a success in the RecordSuccess step, so a recovered
workflow counts nothing twice. When the service cannot be
reached, the wrapper follows DBOS's own step-retry settings given as
`fallback` (`max_attempts`, `interval_seconds`, `backoff_rate`, the same
meaning as `@DBOS.step(retries_allowed=True, ...)`), logged once. Every
decision is a checkpointed step, so a recovered workflow replays the same
plan instead of asking again.

The activity id must name one call: call a wrapped step once per workflow,
or pass `key=`, a function of the step's arguments
(`key=lambda sku: "reserve-" + sku`), to tell its calls apart.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Optional, TypeVar

from dbos import DBOS

from .advisor import Advisor, Plan, Settings, advisor_for

R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class StepRetries:
    """DBOS's own step-retry settings, used while the service is down."""

    #: Attempts in all, the first one included.
    max_attempts: int = 3
    #: The first wait, in seconds.
    interval_seconds: float = 1.0
    #: Each wait is the previous one times this.
    backoff_rate: float = 2.0

    def delay(self, attempt: int) -> Optional[float]:
        """The wait after failed attempt `attempt`, None when none is left."""
        if attempt >= self.max_attempts:
            return None
        return self.interval_seconds * self.backoff_rate ** (attempt - 1)


def _failed_at(adv: Advisor) -> float:
    """When the attempt failed; the failed call is counted here, in the step
    that stamps it, so a recovered workflow (which replays the step's
    output) does not count it again, nor does a deferred attempt asked
    again."""
    adv.count_failure()
    return time.time()


def _decide(adv: Advisor, fallback: StepRetries, key: str, attempt: int, exc: BaseException,
            workflow_id: str, occurred_at: float) -> dict:
    """The checkpointed decision: a plain dict, so DBOS can store it."""
    plan = adv.failed(key, attempt, exc, workflow_id=workflow_id, occurred_at=occurred_at)
    if plan.kind == "fallback":
        wait = fallback.delay(attempt)
        if wait is None:
            plan = Plan("stop", attempt, "fallback_attempts_exhausted",
                        "the service is unreachable and DBOS's own max_attempts is used up")
        else:
            plan = dataclasses.replace(plan, not_before=time.time() + wait)
    return dataclasses.asdict(plan)


def budgeted_step(settings: Settings, *, name: Optional[str] = None,
                  fallback: StepRetries = StepRetries(),
                  key: Optional[Callable[..., str]] = None) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wraps a function into a retried DBOS step; call the result from a workflow."""
    adv = advisor_for(settings, "DBOS")

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        step_name = name or fn.__qualname__

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> R:
            workflow_id = DBOS.workflow_id
            if workflow_id is None:
                raise RuntimeError("%s: a budgeted step runs inside a DBOS workflow" % step_name)
            activity = "%s:%s" % (workflow_id, key(*args, **kwargs) if key else step_name)
            attempt = 1
            occurred_at: Optional[float] = None  # of a deferred attempt, asked again
            while True:
                try:
                    result = DBOS.run_step({"name": step_name, "retries_allowed": False},
                                           fn, *args, **kwargs)
                except Exception as exc:
                    while True:
                        at = occurred_at if occurred_at is not None else DBOS.run_step(
                            {"name": step_name + ".failed_at"}, lambda: _failed_at(adv))
                        # A closure: the step's arguments (the client, the
                        # exception) are not DBOS's to serialize.
                        plan = Plan(**DBOS.run_step(
                            {"name": step_name + ".retry_budget"},
                            lambda: _decide(adv, fallback, activity, attempt, exc,
                                            workflow_id, at)))
                        if plan.kind == "stop":
                            exc.add_note("retry-budget: %s (%s)" % (plan.code, plan.reason))
                            raise exc
                        DBOS.sleep(plan.delay())
                        if plan.kind != "defer":
                            break
                        occurred_at = at  # the same failure, asked again at the slot
                    occurred_at = None
                    attempt += 1
                    continue
                DBOS.run_step({"name": step_name + ".succeeded"}, lambda: adv.succeeded(activity))
                return result

        return run

    return decorate


__all__ = ["budgeted_step", "StepRetries"]
