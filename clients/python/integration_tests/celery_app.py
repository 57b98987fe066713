"""The Celery app the tests run in a real worker process.

Configured from the environment the test sets: the broker (RB_BROKER, Redis
on 127.0.0.1:6379 by default), the queue (RB_QUEUE, one per test run), and
the three retry-budget servers (RB_PLAIN, RB_TIGHT, RB_DOOMED), and the
dependency whose traffic counts a test reads (RB_DEPENDENCY). Each task
counts its runs in Redis under the key it is given, with each run's start
time, so the test can compare them with the service's not_before.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from retry_budget import Settings
from retry_budget.celery import RetryBudgetTask

BROKER = os.environ.get("RB_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("RB_QUEUE", "retry-budget-test")
POLICY = {"max_attempts": 5, "deadline_seconds": 120, "base": 0, "cap": 0}

app = Celery("retry_budget_test", broker=BROKER, backend=BROKER)
app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True,
                result_expires=600)
store = redis.Redis.from_url(BROKER)


def _settings(env: str, dependency: str = "smtp", **kw) -> Settings:
    return Settings(os.environ.get(env, "127.0.0.1:1"), tenant=os.environ.get("RB_TENANT"),
                    dependency=dependency, policy=POLICY, timeout=1.0, **kw)


def _broken_classifier(exc: BaseException) -> str:
    raise RuntimeError("classifier bug")


def _run(key: str, failures: int, kind: str) -> str:
    n = store.rpush(key, repr(time.time()))
    store.expire(key, 600)
    if n <= failures:
        raise (ValueError if kind == "permanent" else ConnectionError)("call %d failed" % n)
    return "ok after %d" % n


# Celery's own settings (max_retries, default_retry_delay) are used only
# while the service cannot be reached.
OWN = dict(base=RetryBudgetTask, max_retries=6, default_retry_delay=0.3, retry_backoff=False)


@app.task(name="flaky", retry_budget=_settings("RB_PLAIN"), **OWN)
def flaky(key: str, failures: int, kind: str = "transient") -> str:
    return _run(key, failures, kind)


@app.task(name="flaky_tight", retry_budget=_settings("RB_TIGHT"), **OWN)
def flaky_tight(key: str, failures: int, kind: str = "transient") -> str:
    return _run(key, failures, kind)


@app.task(name="flaky_doomed", retry_budget=_settings("RB_DOOMED"), **OWN)
def flaky_doomed(key: str, failures: int, kind: str = "transient") -> str:
    return _run(key, failures, kind)


@app.task(name="flaky_counted",
          retry_budget=_settings("RB_PLAIN", os.environ.get("RB_DEPENDENCY", "smtp")), **OWN)
def flaky_counted(key: str, failures: int, kind: str = "transient") -> str:
    return _run(key, failures, kind)


@app.task(name="flaky_misclassified", retry_budget=_settings("RB_PLAIN", classify=_broken_classifier),
          **OWN)
def flaky_misclassified(key: str, failures: int, kind: str = "transient") -> str:
    return _run(key, failures, kind)
