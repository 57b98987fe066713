"""The former single-file client, kept so `from retry_budget_client import ...` still works.

The client is now the `retry_budget` package (`pip install ./clients/python`);
import from there in new code.
"""

from retry_budget.client import *  # noqa: F401,F403
from retry_budget.client import __all__  # noqa: F401
