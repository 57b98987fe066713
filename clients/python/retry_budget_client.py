"""A small Python client for the retry-budget service (retrybudget.v1).

Copy this file next to your worker. It needs `grpcio` and `grpcio-tools`
(see requirements.txt) and the `proto/` directory of the retry-budget
repository: the stubs are generated from it with grpcio-tools the first time
this module is imported (and again whenever the .proto changes), so they can
never drift from the service's contract.

Where the protos are looked up, first match wins:
  1. the environment variable RETRY_BUDGET_PROTO_DIR;
  2. ../../proto relative to this file (its place in the repository).

Every .proto under that directory is compiled (so imports between them
resolve). Where the stubs are written: ./retrybudget/v1/ next to this file
(gitignored), or a temporary directory when that one is not writable.

    from retry_budget_client import RetryBudget
    rb = RetryBudget("127.0.0.1:50051", tenant="acme")
    d = rb.report_failure("charge-42", attempt=1, error_class="transient",
                          policy={"max_attempts": 5, "deadline_seconds": 600})
    if d.code == "schedule_retry":
        sleep until d.not_before, run attempt 2 ...

Every method returns the protobuf response unchanged; errors are raised as
grpc.RpcError. Use `error_code(err)` to read the stable snake_case code at the
start of the error message (match on it, never on the explanation).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Mapping, Optional, Union

import grpc

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTO_REL = os.path.join("retrybudget", "v1", "retry_budget.proto")


def _proto_dir() -> str:
    candidates = []
    env = os.environ.get("RETRY_BUDGET_PROTO_DIR")
    if env:
        candidates.append(env)
    candidates.append(os.path.join(_HERE, "..", "..", "proto"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, _PROTO_REL)):
            return os.path.abspath(c)
    raise RuntimeError(
        "retry_budget_client: cannot find %s; set RETRY_BUDGET_PROTO_DIR to the "
        "retry-budget repository's proto/ directory (looked in %s)" % (_PROTO_REL, candidates)
    )


def _proto_files(proto_dir: str) -> list:
    """Every .proto under proto_dir (imports between them must resolve)."""
    found = []
    for root, _dirs, files in os.walk(proto_dir):
        for n in files:
            if n.endswith(".proto"):
                found.append(os.path.relpath(os.path.join(root, n), proto_dir))
    return sorted(found)


def _generate(proto_dir: str, files: list, out_dir: str, digest: str) -> None:
    """Runs protoc from grpcio-tools into out_dir; writes a stamp last."""
    os.makedirs(out_dir, exist_ok=True)
    # `python -m grpc_tools.protoc` adds the well-known types
    # (google/protobuf/timestamp.proto) to the include path by itself.
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        "-I", proto_dir,
        "--python_out=" + out_dir,
        "--grpc_python_out=" + out_dir,
    ] + files
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=proto_dir)
    if res.returncode != 0:
        raise RuntimeError(
            "retry_budget_client: protoc failed (%d): %s%s"
            % (res.returncode, res.stdout, res.stderr)
        )
    with open(os.path.join(out_dir, "retrybudget", "v1", ".stamp"), "w") as f:
        f.write(digest)


def _load_stubs():
    proto_dir = _proto_dir()
    files = _proto_files(proto_dir)
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0")
        with open(os.path.join(proto_dir, rel), "rb") as f:
            h.update(f.read() + b"\0")
    digest = h.hexdigest()

    out_dir = _HERE
    stamp = os.path.join(out_dir, "retrybudget", "v1", ".stamp")
    try:
        with open(stamp) as f:
            fresh = f.read().strip() == digest
    except OSError:
        fresh = False
    if not fresh:
        try:
            # Generate into a scratch directory of our own, then move the
            # files in place, so two processes importing at once never see a
            # half-written module.
            scratch = tempfile.mkdtemp(prefix=".gen-", dir=_HERE)
            try:
                _generate(proto_dir, files, scratch, digest)
                stamp_src = os.path.join(scratch, "retrybudget", "v1", ".stamp")
                for root, _dirs, names in os.walk(scratch):
                    dst = os.path.join(out_dir, os.path.relpath(root, scratch))
                    os.makedirs(dst, exist_ok=True)
                    for n in names:
                        if os.path.join(root, n) != stamp_src:
                            os.replace(os.path.join(root, n), os.path.join(dst, n))
                os.replace(stamp_src, stamp)  # last: the stubs are complete
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        except OSError:
            # Read-only checkout: generate into a temporary directory instead.
            out_dir = tempfile.mkdtemp(prefix="retry-budget-stubs-")
            _generate(proto_dir, files, out_dir, digest)

    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    # The generated code imports `retrybudget.v1.retry_budget_pb2` (an
    # implicit namespace package), hence the sys.path entry above.
    pb2 = importlib.import_module("retrybudget.v1.retry_budget_pb2")
    pb2_grpc = importlib.import_module("retrybudget.v1.retry_budget_pb2_grpc")
    return pb2, pb2_grpc


pb2, pb2_grpc = _load_stubs()

from google.protobuf import timestamp_pb2  # noqa: E402  (after the stubs, on purpose)

# Action codes that end an activity: a worker stops on any of them.
TERMINAL_CODES = frozenset(
    {"attempts_exhausted", "deadline_exceeded", "fail_permanent", "manual_review"}
)

ErrorClassLike = Union[str, int]
TimeLike = Union[None, _dt.datetime, float, int, "timestamp_pb2.Timestamp"]


def error_class(value: ErrorClassLike) -> int:
    """'transient' | 'permanent' | 'unknown' (or the enum value) -> enum value."""
    if isinstance(value, int):
        return value
    name = value.strip().upper()
    if not name.startswith("ERROR_CLASS_"):
        name = "ERROR_CLASS_" + name
    return pb2.ErrorClass.Value(name)


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
    left out, or must name the same tenant)."""

    def __init__(
        self,
        target: str,
        tenant: Optional[str] = None,
        timeout: float = 10.0,
        channel: Optional[grpc.Channel] = None,
        api_key: Optional[str] = None,
    ):
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

    # -- plumbing -----------------------------------------------------------
    def _call(self, method: str, request):
        return getattr(self.stub, method)(request, timeout=self.timeout, metadata=self._metadata)

    def close(self) -> None:
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
                         error_class_: ErrorClassLike, activity_id: str = ""):
        """NextAction, pure form: the article's next_action on the given budget."""
        req = pb2.NextActionRequest(
            budget=pb2.Budget(attempts=attempts, max_attempts=max_attempts,
                              elapsed=elapsed, deadline=deadline),
            error_class=error_class(error_class_),
            activity_id=activity_id,
        )
        return self._call("NextAction", req)

    # -- durable calls ------------------------------------------------------
    def report_failure(self, activity_id: str, attempt: int, error_class_: ErrorClassLike,
                       policy=None, occurred_at: TimeLike = None, workflow_id: str = ""):
        """NextAction, durable form: report attempt `attempt` failed; get the decision.

        `policy` is read on the activity's first report only. `occurred_at`
        should come from the worker's own history so a replay is exact.
        """
        req = pb2.NextActionRequest(
            activity_id=activity_id,
            attempt=attempt,
            error_class=error_class(error_class_),
            workflow_id=workflow_id,
        )
        p = to_policy(policy)
        if p is not None:
            req.policy.CopyFrom(p)
        ts = to_timestamp(occurred_at)
        if ts is not None:
            req.occurred_at.CopyFrom(ts)
        return self._call("NextAction", req)

    def record_success(self, activity_id: str, occurred_at: TimeLike = None):
        """RecordSuccess: close the activity (idempotent)."""
        req = pb2.RecordSuccessRequest(activity_id=activity_id)
        ts = to_timestamp(occurred_at)
        if ts is not None:
            req.occurred_at.CopyFrom(ts)
        return self._call("RecordSuccess", req)

    def resolve_activity(self, activity_id: str, resolution: Union[str, int], note: str = ""):
        """ResolveActivity: 'fail' or 'retry' for an activity parked for review."""
        if isinstance(resolution, str):
            resolution = pb2.Resolution.Value("RESOLUTION_" + resolution.upper())
        req = pb2.ResolveActivityRequest(activity_id=activity_id, resolution=resolution, note=note)
        return self._call("ResolveActivity", req)

    def get_activity(self, activity_id: str):
        """GetActivity: the budget and every recorded decision."""
        return self._call("GetActivity", pb2.GetActivityRequest(activity_id=activity_id))


__all__ = [
    "RetryBudget", "pb2", "pb2_grpc", "TERMINAL_CODES", "error_class", "error_code",
    "to_timestamp", "to_unix", "to_policy",
]
