#!/usr/bin/env bash
# Runs the Python worker client's tests (clients/python) against the real
# server binary.
#
#   .ci/python_check.sh [path/to/retry-budget]   # default target/debug/retry-budget
set -euo pipefail

# shellcheck source=.ci/binary.sh
. "$(dirname "${BASH_SOURCE[0]}")/binary.sh" python_check "${1:-}"

PY=${PYTHON:-python3}
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/clients/python/requirements.txt"

export RETRY_BUDGET_BIN="$BIN"
# -v: one line per test; -rfE: failures and errors repeated in the summary;
# pytest's closing "N passed" line stays the last line of the output. The
# framework tests (integration_tests/) need Redis, PostgreSQL and the
# frameworks: .ci/integrations_check.sh runs them.
exec "$PY" -m pytest "$ROOT/clients/python" --ignore "$ROOT/clients/python/integration_tests" \
  -v -rfE --color=no
