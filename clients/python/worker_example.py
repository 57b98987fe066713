"""The loop a durable-execution worker follows with retry-budget.

    python clients/python/worker_example.py --target 127.0.0.1:50051

It runs one activity against a flaky fake dependency that fails with a
transient error the first N times (--failures), and for each failure:

  1. reports it (NextAction, durable form: activity_id, attempt, error_class,
     policy, occurred_at, and the dependency the call went to) -- the
     service counts the attempts, decides, and makes the decision durable
     before it replies;
  2. on schedule_retry, sleeps until `not_before`, then runs the next attempt;
     on deferred, sleeps until `not_before` and asks again for the same
     attempt; on anything else (attempts_exhausted, deadline_exceeded,
     fail_permanent, manual_review) stops: the activity is closed or parked;
  3. on success, RecordSuccess closes the activity; with the dependency, it
     also counts one success of it.

Every call is counted in the client (`client.record_call`), which sends the
counts by itself about once a second (ReportTraffic): the service allows a
dependency's retries in proportion to its successes.

The attempt counter is not trusted to worker memory: on start the worker asks
GetActivity whether the activity already has failures recorded (a restarted
worker) and continues from there. In a real worker, attempt and occurred_at
come from the workflow's own history, so a replay gets the same plan.

Exit status: 0 when the activity succeeded, 1 when it stopped on a terminal
action, 2 on a usage or connection error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from retry_budget import RetryBudget, error_code, pb2, to_unix, validate_dependency  # noqa: E402


class TransientError(Exception):
    """A failure that may succeed when tried again (timeout, 503, reset)."""


class PermanentError(Exception):
    """A failure that will fail again (validation, auth, not found)."""


class FlakyDependency:
    """A fake downstream service: fails `failures` times, then succeeds."""

    def __init__(self, failures: int, error: type = TransientError, name: str = "flaky-api"):
        #: What NextAction, RecordSuccess and the traffic counts call it.
        self.name = name
        self.failures = failures
        self.error = error
        self.calls = 0

    def call(self, payload: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error("dependency unavailable (call %d)" % self.calls)
        return "ok: %s" % payload


def classify(exc: Exception) -> str:
    """`except Exception` is not a classification: map what you know."""
    if isinstance(exc, TransientError):
        return "transient"
    if isinstance(exc, PermanentError):
        return "permanent"
    return "unknown"


def sleep_until(unix_time: float, log) -> None:
    wait = unix_time - time.time()
    if wait > 0:
        log("  sleeping %.3f s until not_before" % wait)
        time.sleep(wait)


def run_activity(client: RetryBudget, activity_id: str, dependency: FlakyDependency,
                 policy: dict, log=print) -> str:
    """Runs the activity to its end; returns the closing code."""
    attempt = 1
    try:
        known = client.get_activity(activity_id)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.NOT_FOUND:
            raise
        known = None
    if known is not None:
        if known.status != pb2.ACTIVITY_STATUS_OPEN:
            log("activity %s is already %s (%s)" % (
                activity_id, pb2.ActivityStatus.Name(known.status), known.closed_code))
            return known.closed_code or "parked"
        # A restarted worker: continue after the last recorded failure.
        attempt = known.attempts + 1
        last = [e for e in known.events if e.kind == "decision"]
        if last and last[-1].HasField("not_before"):
            sleep_until(to_unix(last[-1].not_before), log)
        log("resuming activity %s at attempt %d" % (activity_id, attempt))

    while True:
        log("attempt %d: calling the dependency" % attempt)
        try:
            result = dependency.call(activity_id)
        except Exception as exc:  # noqa: BLE001 - classified just below
            client.record_call(dependency.name, False)
            klass = classify(exc)
            occurred_at = time.time()  # in a real worker: from the history
            log("attempt %d failed (%s): %s" % (attempt, klass, exc))
            while True:
                decision = client.report_failure(
                    activity_id, attempt, klass, policy=policy, occurred_at=occurred_at,
                    dependency=dependency.name)
                log("  decision: %s%s -- %s" % (
                    decision.code, " (replayed)" if decision.replayed else "", decision.reason))
                if decision.code != "deferred":
                    break
                # The dependency's budget or the global one is exhausted for
                # now: ask again for the same attempt when the booked slot
                # comes, not in a busy loop.
                log("  deferred: %s" % decision.defer_reason)
                sleep_until(to_unix(decision.not_before), log)
            if decision.code != "schedule_retry":
                log("stopping: %s" % decision.code)
                return decision.code
            sleep_until(to_unix(decision.not_before), log)
            attempt += 1
            continue

        log("attempt %d succeeded: %s" % (attempt, result))
        done = client.record_success(activity_id, dependency=dependency.name)
        # The service counted the success with RecordSuccess: the call only.
        client.record_call(dependency.name, True, success_recorded=True)
        log("recorded success: %s" % pb2.ActivityStatus.Name(done.status))
        return "succeeded"


def dependency_name(text: str) -> str:
    try:
        return validate_dependency(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="127.0.0.1:50051", help="host:port of retry-budget")
    ap.add_argument("--tenant", default=None, help="x-tenant-id (absent: default)")
    ap.add_argument("--api-key", default=os.environ.get("RETRY_BUDGET_API_KEY"),
                    help="bearer key for a server run with --auth api-keys "
                         "(default: $RETRY_BUDGET_API_KEY)")
    ap.add_argument("--activity-id", default=None, help="default: a fresh example-<uuid>")
    ap.add_argument("--failures", type=int, default=2,
                    help="how many times the fake dependency fails first (default 2)")
    ap.add_argument("--dependency", default="flaky-api", type=dependency_name,
                    help="the fake dependency's name (default flaky-api)")
    ap.add_argument("--error", choices=["transient", "permanent"], default="transient",
                    help="how the fake dependency fails")
    ap.add_argument("--max-attempts", type=int, default=5)
    ap.add_argument("--deadline", type=int, default=60, help="schedule-to-close, seconds")
    # Seconds. Base 0 makes every delay the 1 s floor (no jitter), so the
    # example finishes in a few seconds; production policies keep the default
    # base 2 / cap 60 by leaving these out.
    ap.add_argument("--base", type=int, default=0)
    ap.add_argument("--cap", type=int, default=1)
    args = ap.parse_args(argv)

    activity_id = args.activity_id or "example-" + uuid.uuid4().hex[:12]
    policy = {"max_attempts": args.max_attempts, "deadline_seconds": args.deadline,
              "base": args.base, "cap": args.cap}
    error = TransientError if args.error == "transient" else PermanentError
    dependency = FlakyDependency(args.failures, error, args.dependency)

    print("activity %s, policy %s, dependency fails %d time(s)" % (
        activity_id, policy, args.failures))
    try:
        with RetryBudget(args.target, tenant=args.tenant, api_key=args.api_key) as client:
            code = run_activity(client, activity_id, dependency, policy)
    except grpc.RpcError as err:
        print("retry-budget call failed: %s %s (code %s)" % (
            err.code().name, err.details(), error_code(err)), file=sys.stderr)
        return 2
    print("done: %s after %d call(s) to the dependency" % (code, dependency.calls))
    return 0 if code == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
