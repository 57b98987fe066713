"""Traffic counts: how a worker's calls to each dependency went, sent to the
service by themselves about once a second.

The service paces each dependency's retries by that dependency's successes
(a tenth of its successes a second, never below a floor of probes:
`ReportTraffic` in the proto). Failures reach it on their own, with every
`NextAction`; successes do not. A worker that never tells them leaves every
dependency at its floor, so the client counts its calls in memory and a
background thread sends the sums since the previous report, one
`ReportTraffic` an interval.

    rb = RetryBudget("127.0.0.1:50051", tenant="acme")   # rb.traffic counts
    with rb.traffic.call("payments-api"):                # a success unless it raises
        charge(card)
    rb.record_call("mail-relay", ok=False)               # or say it yourself
    rb.close()                                           # sends what is left

A send that fails keeps its counts for the next one and is logged (once
while the service stays away), never raised: counting must not be what
breaks a worker. Memory is bounded: at most `max_dependencies` names wait
to be sent, and a count saturates at the proto's uint64.
"""

from __future__ import annotations

import functools
import atexit
import inspect
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, TypeVar

import grpc

from ._pb import retry_budget_pb2 as pb2

if TYPE_CHECKING:
    from .client import RetryBudget

log = logging.getLogger("retry_budget")

#: How often counts are sent by default, in seconds: the pace of a
#: dependency is counted in one-second slots on the service.
DEFAULT_INTERVAL = 1.0
#: How long one report may take: a report held longer than a couple of
#: intervals is stale anyway, and `close()` must not hold a worker's
#: shutdown for the client's own 10 s.
DEFAULT_TIMEOUT = 2.0
#: Dependency names waiting to be sent at most (the service itself tracks
#: 64 one by one by default).
DEFAULT_MAX_DEPENDENCIES = 256
#: The service's bound on a dependency name (`invalid_dependency`).
MAX_DEPENDENCY_BYTES = 64
#: The largest count the proto carries (uint64).
_UINT64_MAX = 2**64 - 1

F = TypeVar("F", bound=Callable[..., Any])

#: Reporters not closed yet, sent one last time at exit: the sending thread
#: is a daemon, and an integration's client lives as long as the process.
_open: "weakref.WeakSet[TrafficReporter]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # Registered after grpc was imported, so it runs before grpc's own exit
    # handlers (atexit runs them last in, first out).
    for reporter in list(_open):
        reporter.close()


def validate_dependency(dependency: str) -> str:
    """`dependency` if the service accepts it as a name: up to 64 printable
    ASCII characters without spaces, or empty for the default dependency.

    Raises ValueError otherwise, here rather than later: one bad name in a
    batch would make the service refuse the whole report."""
    if not isinstance(dependency, str):
        raise TypeError("dependency must be a str, got %s" % type(dependency).__name__)
    if len(dependency) > MAX_DEPENDENCY_BYTES or not all("!" <= c <= "~" for c in dependency):
        raise ValueError("dependency %r: up to %d printable ASCII characters without spaces "
                         "(the service refuses it with invalid_dependency)"
                         % (dependency, MAX_DEPENDENCY_BYTES))
    return dependency


class TrafficReporter:
    """Counts calls, successes and failures per dependency, and sends them
    with one `ReportTraffic` every `interval` seconds from a daemon thread.

    Thread-safe; counting takes a lock for a few dictionary operations and
    never waits on the network, so it may be called from an event loop too.
    The thread starts with the first count (a client that counts nothing
    runs none) and again in a forked child, which starts with no counts:
    the parent sends its own.

    `interval=None` turns counting off: every count is ignored and nothing
    is sent."""

    def __init__(self, client: "RetryBudget", interval: Optional[float] = DEFAULT_INTERVAL,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_dependencies: int = DEFAULT_MAX_DEPENDENCIES):
        if interval is not None and not interval > 0:
            raise ValueError("traffic interval must be a positive number of seconds or None "
                             "(off), got %r" % (interval,))
        if max_dependencies < 1:
            raise ValueError("max_dependencies must be at least 1, got %r" % (max_dependencies,))
        self._client = client
        #: Seconds between reports; None when counting is off.
        self.interval = interval
        self.timeout = timeout
        self.max_dependencies = max_dependencies
        #: The pace of each dependency, as the last report that got through
        #: answered it.
        self.paces: Dict[str, "pb2.DependencyPace"] = {}
        #: Calls not counted: to names past `max_dependencies`, or in a
        #: report the service refused as invalid.
        self.dropped = 0
        self._reset_after_fork()
        if interval is not None:
            _open.add(self)

    def _reset_after_fork(self) -> None:
        # A lock held by another thread at fork time would stay held in the
        # child forever: the child makes its own.
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._counts: Dict[str, List[int]] = {}
        self._thread: Optional[threading.Thread] = None
        self._wake = threading.Event()
        self._closed = False
        self._failing = False
        self._pid = os.getpid()
        self._said_full = False

    @property
    def enabled(self) -> bool:
        """Whether counts are kept and sent (an interval is set)."""
        return self.interval is not None

    # -- counting -----------------------------------------------------------
    def record_call(self, dependency: str, ok: bool, *, success_recorded: bool = False) -> None:
        """Counts one call to `dependency` ("" is the default one).

        `success_recorded=True` for a success also sent with
        `RecordSuccess(dependency=...)`: the service counts each of those as
        a success of its dependency, so only the call is counted here and
        the success is not counted twice."""
        validate_dependency(dependency)
        if ok:
            self._count(dependency, 1, 0 if success_recorded else 1, 0)
        else:
            self._count(dependency, 1, 0, 1)

    def _count(self, dependency: str, calls: int, successes: int, failures: int) -> None:
        if self.interval is None or self._closed:
            return
        if self._pid != os.getpid():
            self._reset_after_fork()
        with self._lock:
            counts = self._counts.get(dependency)
            if counts is None:
                if len(self._counts) >= self.max_dependencies:
                    self._drop(dependency)
                    return
                counts = self._counts[dependency] = [0, 0, 0]
            counts[0] = min(counts[0] + calls, _UINT64_MAX)
            counts[1] = min(counts[1] + successes, _UINT64_MAX)
            counts[2] = min(counts[2] + failures, _UINT64_MAX)
            if self._thread is None:
                self._start()

    def _drop(self, dependency: str) -> None:
        """A name past the bound (called with the lock held)."""
        self.dropped += 1
        if not self._said_full:
            self._said_full = True
            log.warning("retry-budget traffic: %d dependencies already wait to be sent; calls to "
                        "%r and other new names are not counted until the next report "
                        "(max_dependencies=%d)", len(self._counts), dependency,
                        self.max_dependencies)

    def call(self, dependency: str) -> "_Call":
        """A context manager around one call to `dependency`: a success when
        the block ends normally, a failure when it raises an Exception (which
        goes on up). Works with `with` and `async with`."""
        validate_dependency(dependency)
        return _Call(self, dependency)

    def counted(self, dependency: str) -> Callable[[F], F]:
        """A decorator: every call of the function (sync or async) is a call
        to `dependency`, counted as `call()` does."""
        validate_dependency(dependency)

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    with _Call(self, dependency):
                        return await fn(*args, **kwargs)
                return run_async  # type: ignore[return-value]

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                with _Call(self, dependency):
                    return fn(*args, **kwargs)
            return run  # type: ignore[return-value]

        return decorate

    def pending(self) -> Dict[str, tuple]:
        """The counts not sent yet: dependency -> (calls, successes, failures)."""
        with self._lock:
            return {name: tuple(c) for name, c in self._counts.items()}

    # -- sending ------------------------------------------------------------
    def _start(self) -> None:
        """Starts the sending thread (called with the lock held)."""
        self._thread = threading.Thread(target=self._run, name="retry-budget-traffic",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.interval is not None  # no thread is started when off
        while not self._wake.wait(self.interval):
            self.flush()

    def flush(self) -> Optional["pb2.ReportTrafficResponse"]:
        """Sends the counts now: the service's answer, or None when there
        was nothing to send or the send failed (its counts are then kept for
        the next one). Never raises."""
        with self._send_lock:
            with self._lock:
                batch, self._counts = self._counts, {}
                self._said_full = False
            if not batch:
                return None
            req = pb2.ReportTrafficRequest(dependencies=[
                pb2.DependencyTraffic(dependency=name, calls=c[0], successes=c[1], failures=c[2])
                for name, c in batch.items()
            ])
            try:
                r = self._client._call("ReportTraffic", req, timeout=self.timeout)
            except grpc.RpcError as err:
                self._failed(batch, err)
                return None
            except Exception:  # noqa: BLE001 - the worker's code path must not see it
                log.exception("retry-budget traffic: the report could not be sent; its counts are "
                              "kept for the next one")
                self._keep(batch)
                return None
            if self._failing:
                self._failing = False
                log.info("retry-budget traffic: reports reach %s again", self._client.target)
            self.paces.update((p.dependency, p) for p in r.dependencies)
            return r

    def _failed(self, batch: Dict[str, List[int]], err: grpc.RpcError) -> None:
        if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
            # The service will refuse this batch however often it is sent:
            # sending it again would block every later count behind it.
            self.dropped += sum(c[0] for c in batch.values())
            log.error("retry-budget traffic: the service refused a report (%s: %s); its counts "
                      "are dropped", err.code().name, err.details())
            return
        self._keep(batch)
        if not self._failing:
            self._failing = True
            log.warning("retry-budget traffic: reports cannot reach %s (%s: %s); counts are kept "
                        "and sent when it answers", self._client.target, err.code().name,
                        err.details())

    def _keep(self, batch: Dict[str, List[int]]) -> None:
        """Puts a batch that was not sent back in front of what was counted
        since, within the bound."""
        with self._lock:
            for name, c in batch.items():
                counts = self._counts.get(name)
                if counts is None:
                    if len(self._counts) >= self.max_dependencies:
                        self.dropped += c[0]
                        continue
                    counts = self._counts[name] = [0, 0, 0]
                for i in range(3):
                    counts[i] = min(counts[i] + c[i], _UINT64_MAX)

    def close(self) -> None:
        """Stops the thread and sends what is left, once. Never raises."""
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and \
                self._pid == os.getpid():
            thread.join(self.timeout + 1.0)
        if self.enabled:
            self.flush()


class _Call:
    """One call to a dependency, counted when it ends (`TrafficReporter.call`)."""

    def __init__(self, reporter: TrafficReporter, dependency: str):
        self._reporter = reporter
        self._dependency = dependency

    def _end(self, exc: Optional[BaseException]) -> None:
        if exc is None:
            self._reporter.record_call(self._dependency, True)
        elif isinstance(exc, Exception):
            self._reporter.record_call(self._dependency, False)
        # A cancellation or an interrupt is the worker's own doing: not counted.

    def __enter__(self) -> "_Call":
        return self

    def __exit__(self, _type: Any, exc: Optional[BaseException], _tb: Any) -> None:
        self._end(exc)

    async def __aenter__(self) -> "_Call":
        return self

    async def __aexit__(self, _type: Any, exc: Optional[BaseException], _tb: Any) -> None:
        self._end(exc)


__all__ = ["TrafficReporter", "validate_dependency", "DEFAULT_INTERVAL", "DEFAULT_TIMEOUT",
           "DEFAULT_MAX_DEPENDENCIES", "MAX_DEPENDENCY_BYTES"]
