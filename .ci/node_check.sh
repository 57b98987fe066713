#!/usr/bin/env bash
# Runs the Node.js client's tests (clients/node) against the real server
# binary: `npm ci` from the committed lockfile, then Node's test runner.
#
#   .ci/node_check.sh [path/to/retry-budget]   # default target/debug/retry-budget
set -euo pipefail

# shellcheck source=.ci/binary.sh
. "$(dirname "${BASH_SOURCE[0]}")/binary.sh" node_check "${1:-}"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "node_check: node and npm are required (Node.js 20 or later)" >&2
  exit 2
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if (( major < 20 )); then
  echo "node_check: Node.js 20 or later is required, found $(node --version)" >&2
  exit 2
fi
echo "node $(node --version), npm $(npm --version)"

cd "$ROOT/clients/node"
# Quiet: errors still go to stderr.
npm ci --no-audit --no-fund --loglevel=error >/dev/null

export RETRY_BUDGET_BIN="$BIN"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# spec: one line per test, failures repeated at the end. The runner picks
# test/**/*.js; the server helper lives in testing/ so it is not one.
set +e
node --test --test-reporter=spec 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
passed=$(sed -n 's/^ℹ pass \([0-9]*\)$/\1/p' "$out" | tail -1)
failed=$(sed -n 's/^ℹ fail \([0-9]*\)$/\1/p' "$out" | tail -1)
echo "node --test: ${passed:-0} passed, ${failed:-?} failed"
if (( status == 0 )) && [[ -z "$passed" || "$passed" == 0 ]]; then
  echo "node_check: no test ran" >&2
  exit 1
fi
exit "$status"
