"""retry-budget's Python client, and the glue for the frameworks workers use.

- `retry_budget.RetryBudget`: the client (one channel, one tenant).
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

__all__ = [
    "Advisor", "Plan", "RetryBudget", "Settings", "TERMINAL_CODES", "classify_default",
    "error_class", "error_code", "pb2", "pb2_grpc", "to_policy", "to_timestamp", "to_unix",
]
