#!/usr/bin/env bash
# Runs the framework integrations (docs/integrations.md) against the real
# server binary and the real frameworks: Temporal's ActivityEnvironment,
# a Celery worker on Redis, DBOS on PostgreSQL (Python, pytest), and a
# BullMQ Worker and Queue on Redis (Node.js, node's test runner).
#
#   .ci/integrations_check.sh [path/to/retry-budget]   # default target/debug/retry-budget
#
# Installs the package with the extras docs/integrations.md names, and no
# other framework package, at pinned versions (the ones that document
# names, as a pip constraints file: a pin installs nothing by itself), so
# that a user's `pip install "./clients/python[celery]"` is what runs here;
# then starts Redis if `redis-cli ping` fails, and PostgreSQL (15, on
# 127.0.0.1:5432) if it does not answer. The DBOS test creates and drops a
# database of its own.
set -euo pipefail

# shellcheck source=.ci/binary.sh
. "$(dirname "${BASH_SOURCE[0]}")/binary.sh" integrations_check "${1:-}"
export RETRY_BUDGET_BIN="$BIN"
PY=${PYTHON:-python3}

# The frameworks, pinned: docs/integrations.md says the same versions.
TEMPORALIO=1.35.0
CELERY=5.7.0
REDIS_PY=8.2.0 # what celery[redis] installs, kombu's Redis transport's client
DBOS=3.4.0
GRPCIO_TOOLS=1.85.1 # the one that generated clients/python/retry_budget/_pb
PYTEST=9.2.0
MYPY=2.4.1

echo "--- services: Redis on 127.0.0.1:6379, PostgreSQL on 127.0.0.1:5432"
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if ! command -v redis-server >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server) >/dev/null 2>&1 \
      || echo "redis-server not installed (apt-get failed)"
  fi
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 >/dev/null
  for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
echo "redis: $(redis-cli -h 127.0.0.1 -p 6379 ping)"
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect 15 main start || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432

echo "--- Python: the package with the extras the docs name, installed as a user would"
constraints=$(mktemp)
printf '%s\n' "temporalio==$TEMPORALIO" "celery==$CELERY" "redis==$REDIS_PY" "dbos==$DBOS" \
  "grpcio-tools==$GRPCIO_TOOLS" "pytest==$PYTEST" >"$constraints"
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check -c "$constraints" \
  "$ROOT/clients/python[temporal,celery,dbos,test]"
rm -f "$constraints"
# mypy checks the package's types below; it is a tool of this check, not
# something the package or its tests import.
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check "mypy==$MYPY"
# From a folder without the checkout on sys.path: the installed package.
(cd / && "$PY" -c 'import retry_budget, retry_budget.temporal, retry_budget.celery, retry_budget.dbos, importlib.metadata as m
print("retry_budget", m.version("retry-budget"), "from", retry_budget.__file__)
print(" ".join("%s %s" % (n, m.version(n)) for n in ("temporalio", "celery", "redis", "packaging", "dbos", "grpcio", "protobuf")))')
"$PY" "$ROOT/clients/python/gen_stubs.py" --check
# The package is typed (py.typed, the stubs' .pyi): its annotations hold
# against the frameworks' own (celery has none: --ignore-missing-imports).
(cd "$ROOT/clients/python" && "$PY" -m mypy --ignore-missing-imports --no-incremental retry_budget)

echo "--- Node.js: the package installs, its BullMQ strategy imports"
cd "$ROOT/clients/node"
npm ci --no-audit --no-fund --loglevel=error >/dev/null
consumer=$(mktemp -d)
trap 'rm -rf "$consumer"' EXIT
(cd "$consumer" && npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error "$ROOT/clients/node" >/dev/null \
  && node --input-type=module -e "import { RetryBudgetBackoff } from 'retry-budget-client/bullmq'; \
import { RetryBudgetClient } from 'retry-budget-client'; console.log('retry-budget-client/bullmq:', typeof RetryBudgetBackoff, typeof RetryBudgetClient)")
echo "node $(node --version), bullmq $(node -p 'require("./node_modules/bullmq/package.json").version')"

echo "--- Temporal, Celery, DBOS (pytest)"
set +e
(cd "$ROOT" && "$PY" -m pytest clients/python/integration_tests -v -rfE --color=no -p no:cacheprovider)
py_status=$?

echo "--- BullMQ (node --test)"
out=$(mktemp)
node --test --test-reporter=spec integration_test/bullmq.js 2>&1 | tee "$out"
node_status=${PIPESTATUS[0]}
set -e
passed=$(sed -n 's/^ℹ pass \([0-9]*\)$/\1/p' "$out" | tail -1)
failed=$(sed -n 's/^ℹ fail \([0-9]*\)$/\1/p' "$out" | tail -1)
rm -f "$out"
echo "node --test: ${passed:-0} passed, ${failed:-?} failed"
if (( node_status == 0 )) && [[ -z "$passed" || "$passed" == 0 ]]; then
  echo "integrations_check: no BullMQ test ran" >&2
  node_status=1
fi
if (( py_status != 0 || node_status != 0 )); then
  echo "integrations_check: pytest exited $py_status, node --test exited $node_status" >&2
  exit 1
fi
