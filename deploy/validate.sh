#!/usr/bin/env bash
# Cheap static checks of deploy/ (no docker daemon, no cluster, no network):
#   - both Kubernetes manifests (the embedded StatefulSet and the PostgreSQL
#     Deployment) against the API schemas, strictly (unknown fields are
#     errors), with kubernetes-validate (PyPI; it bundles the schemas), for
#     the oldest and newest Kubernetes versions checked;
#   - what they promise (deploy/promises.py): the embedded one replica, the
#     PostgreSQL three with a rollout that keeps three ready and a
#     PodDisruptionBudget of the same pods, gRPC probes, the drain (and the
#     preStop sleep) inside terminationGracePeriodSeconds, the database URL
#     from the Secret, the replica id from the pod's name, the ConfigMap's
#     config.toml equal to deploy/config.toml, Services that never mix the
#     two stores' pods; and deploy/haproxy.cfg's (HTTP/2 on both sides, round
#     robin, its gRPC health check byte for byte, its servers the compose
#     replicas, a drain noticed before it ends);
#   - deploy/haproxy.cfg with `haproxy -c` where HAProxy is installed, as
#     compose runs it and as a test with loopback replicas would;
#   - deploy/compose.yaml and deploy/compose-postgres.yaml with
#     `docker-compose config` or `docker compose config`.
#   - deploy/prometheus/: `promtool check rules`, `promtool check config` of
#     the example prometheus.yml; deploy/grafana/check.py on the dashboard
#     (its form, panels and datasource input) and on every metric name the
#     dashboard and the rules use; and, where the binary is built
#     (RETRY_BUDGET_BIN, by default target/debug/retry-budget, after cargo
#     test), a freshly started server: `promtool test rules` (the alerts'
#     unit tests) fed what its first scrape exports
#     (deploy/prometheus/fresh_series.py: a counter the tests start at 0
#     must be exported at 0 from the start), then a real Prometheus scraping
#     it, which must be up, and running every query of the dashboard and the
#     rules (deploy/prometheus/scrape_check.py); before it scrapes, the
#     server is asked about dependencies named as a careless or hostile
#     client names them (one named `other`, more than the metrics show by
#     name), and each of their series must be one series: Prometheus fails
#     a whole scrape that writes a series twice.
#     (`promtool check metrics` is not used: it reads only the classic text
#     format, and the server writes OpenMetrics, with an info type.)
# A missing haproxy, compose tool or promtool skips its checks, and says so.
# Ends with "deploy-validate: N passed, M failed"; exits non-zero on a failure.
#
#   bash deploy/validate.sh      # K8S_VERSIONS="1.27.0 1.37.0" by default
set -euo pipefail
cd "$(dirname "$0")/.."

MANIFESTS="deploy/kubernetes/retry-budget.yaml deploy/kubernetes/retry-budget-postgres.yaml"
K8S_VERSIONS=${K8S_VERSIONS:-"1.27.0 1.37.0"}
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   - $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $1" >&2; }

if ! command -v kubernetes-validate >/dev/null 2>&1; then
  echo "deploy-validate: installing kubernetes-validate (PyPI)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check kubernetes-validate
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
  hash -r
fi

# --- schemas ----------------------------------------------------------------------
for manifest in $MANIFESTS; do
  for version in $K8S_VERSIONS; do
    if out=$(kubernetes-validate --strict -k "$version" "$manifest" 2>&1); then
      echo "$out"
      pass "kubernetes-validate --strict -k $version $manifest"
    else
      echo "$out" >&2
      fail "kubernetes-validate --strict -k $version $manifest"
    fi
  done
done

# --- what the files promise -------------------------------------------------------------
for what in embedded postgres haproxy; do
  if out=$(python3 deploy/promises.py "$what" 2>&1); then
    echo "$out"
    pass "what the $what deployment promises (deploy/promises.py $what)"
  else
    echo "$out" >&2
    fail "what the $what deployment promises (deploy/promises.py $what)"
  fi
done

# --- haproxy -c ---------------------------------------------------------------------------
if ! command -v haproxy >/dev/null 2>&1; then
  echo "skip - deploy/haproxy.cfg: haproxy is not installed (Debian package haproxy)"
else
  version=$(haproxy -v | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p')
  # As compose-postgres.yaml runs it (its replicas' names need not resolve
  # here: init-addr none), then as a test of three replicas on loopback would.
  for env in "" "LB_LISTEN=127.0.0.1:50050 LB_SERVER_1=127.0.0.1:50051 LB_SERVER_2=127.0.0.1:50052 LB_SERVER_3=127.0.0.1:50053"; do
    # $env unquoted: a list of NAME=VALUE words, or none.
    # shellcheck disable=SC2086
    if out=$(env $env haproxy -c -f deploy/haproxy.cfg 2>&1); then
      pass "${env:+$env }haproxy -c -f deploy/haproxy.cfg (HAProxy $version)"
    else
      echo "$out" >&2
      fail "${env:+$env }haproxy -c -f deploy/haproxy.cfg (HAProxy $version)"
    fi
  done
fi

# --- compose ----------------------------------------------------------------------------
compose=()
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
fi
if [[ ${#compose[@]} -eq 0 ]]; then
  echo "skip - deploy/compose.yaml, deploy/compose-postgres.yaml: neither docker-compose nor docker compose is installed"
else
  for file in deploy/compose.yaml deploy/compose-postgres.yaml; do
    if out=$("${compose[@]}" -f "$file" config -q 2>&1); then
      pass "${compose[*]} -f $file config -q"
    else
      echo "$out" >&2
      fail "${compose[*]} -f $file config -q"
    fi
  done
fi

# --- prometheus and grafana -------------------------------------------------------------
# check.py needs only python3; the rest needs promtool (Debian's prometheus).
if out=$(python3 deploy/grafana/check.py 2>&1); then
  echo "$out"
  pass "the dashboard and the rules name only metrics the service exports (deploy/grafana/check.py)"
else
  echo "$out" >&2
  fail "the dashboard and the rules name only metrics the service exports (deploy/grafana/check.py)"
fi
if ! command -v promtool >/dev/null 2>&1; then
  echo "skip - deploy/prometheus/: promtool is not installed (Debian package prometheus)"
else
  version=$(promtool --version 2>&1 | sed -n '1s/^promtool, version \([^ ]*\).*/\1/p')
  for check in "check rules deploy/prometheus/retry-budget.rules.yaml" \
    "check config deploy/prometheus/prometheus.yml"; do
    # $check unquoted: promtool's subcommand and file, as words.
    # shellcheck disable=SC2086
    if out=$(promtool $check 2>&1); then
      pass "promtool $check (promtool $version)"
    else
      echo "$out" >&2
      fail "promtool $check (promtool $version)"
    fi
  done
  server=${RETRY_BUDGET_BIN:-target/debug/retry-budget}
  if [[ ! -x $server ]]; then
    echo "skip - promtool test rules and a real Prometheus: they need a fresh server, and $server is not built (cargo build, or RETRY_BUDGET_BIN)"
  else
    scratch=$(mktemp -d)
    free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    metrics_port=$(free_port)
    prom_port=$(free_port)
    grpc_port=$(free_port)
    "$server" --listen "127.0.0.1:$grpc_port" --data-dir "$scratch/data" --metrics-listen "127.0.0.1:$metrics_port" \
      --drain-delay 0s 2>"$scratch/server.log" &
    server_pid=$!
    # The alerts' unit tests, fed the first scrape of this fresh server.
    if python3 deploy/prometheus/fresh_series.py "http://127.0.0.1:$metrics_port/metrics" \
      deploy/prometheus/retry-budget.rules.test.yaml >"$scratch/rules.test.yaml" \
      && out=$(promtool test rules "$scratch/rules.test.yaml" 2>&1); then
      echo "$out"
      pass "promtool test rules deploy/prometheus/retry-budget.rules.test.yaml, fed a fresh server's scrape (promtool $version)"
    else
      echo "${out:-}" >&2
      fail "promtool test rules deploy/prometheus/retry-budget.rules.test.yaml, fed a fresh server's scrape (promtool $version)"
    fi
  fi
  if [[ ! -x $server ]]; then
    :
  elif ! command -v prometheus >/dev/null 2>&1; then
    echo "skip - a real Prometheus scraping the server: prometheus is missing"
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    rm -rf "$scratch"
  else
    printf '%s\n' "global: {scrape_interval: 1s, evaluation_interval: 1s}" \
      "rule_files: [$PWD/deploy/prometheus/retry-budget.rules.yaml]" \
      "scrape_configs: [{job_name: retry-budget, static_configs: [{targets: ['127.0.0.1:$metrics_port']}]}]" \
      >"$scratch/prometheus.yml"
    # Dependencies as a hostile or careless client names them: one named
    # `other`, and more than the metrics show by name (the rest are summed
    # under "other dependencies"), each with a failure asked about. Each
    # series must stay one series (a duplicate fails the whole scrape).
    expected=""
    if command -v grpcurl >/dev/null 2>&1; then
      # `other` three times, so it is among the busiest, shown by name.
      for name in other other other payments-api db cache search mail queue ledger; do
        grpcurl -plaintext -max-time 5 -H 'x-tenant-id: validate' \
          -d "{\"activity_id\": \"validate-$name-$RANDOM\", \"attempt\": 1, \"error_class\": \"ERROR_CLASS_TRANSIENT\", \"dependency\": \"$name\"}" \
          "127.0.0.1:$grpc_port" retrybudget.v1.RetryBudget/NextAction >/dev/null
      done
      expected=$(printf '%s\n' 'retry_budget_dependency_allowed_rate{dependency="other"}' \
        'retry_budget_dependency_retries_admitted_total{dependency="other"}' \
        'retry_budget_dependency_retries_admitted_total{dependency="other dependencies"}')
    else
      echo "skip - a dependency named other in the scrape: grpcurl is missing"
    fi
    prometheus --config.file="$scratch/prometheus.yml" --storage.tsdb.path="$scratch/tsdb" \
      --web.listen-address="127.0.0.1:$prom_port" >"$scratch/prometheus.log" 2>&1 &
    prom_pid=$!
    if out=$(SERIES_EXPECTED="$expected" python3 deploy/prometheus/scrape_check.py "http://127.0.0.1:$prom_port" 2>&1); then
      echo "$out"
      pass "Prometheus $version scrapes $server and runs the dashboard's and the rules' queries"
    else
      echo "$out" >&2
      fail "Prometheus $version scrapes $server and runs the dashboard's and the rules' queries"
    fi
    kill "$prom_pid" "$server_pid" 2>/dev/null || true
    wait "$prom_pid" "$server_pid" 2>/dev/null || true
    rm -rf "$scratch"
  fi
fi

echo "deploy-validate: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
