"""retry-budget's Python client, and the glue for the frameworks workers use.

- `retry_budget.RetryBudget`: the client (one channel, one tenant), whose
  `traffic` (a `TrafficReporter`) counts calls to each dependency and sends
  them by itself.
- `retry_budget.temporal`: a decorator for Temporal activities.
- `retry_budget.celery`: a base class for Celery tasks.
- `retry_budget.dbos`: a step wrapper for DBOS workflows.

Each integration takes a `retry_budget.Settings` (the server, the tenant, the
dependency, the policy, how failures are classified); docs/integrations.md
has the few lines each one needs.
"""

from .client import (
    TERMINAL_CODES,
    RetryBudget,
    error_class,
    error_code,
    pb2,
    pb2_grpc,
    to_policy,
    to_timestamp,
    to_unix,
)
from .advisor import Advisor, Plan, Settings, classify_default
from .traffic import TrafficReporter, validate_dependency

__all__ = [
    "Advisor", "Plan", "RetryBudget", "Settings", "TERMINAL_CODES", "TrafficReporter",
    "classify_default", "error_class", "error_code", "pb2", "pb2_grpc", "to_policy",
    "to_timestamp", "to_unix", "validate_dependency",
]
