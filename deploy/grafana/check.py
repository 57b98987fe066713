#!/usr/bin/env python3
"""Static checks of the Grafana dashboard and the Prometheus rules' queries.

    python3 deploy/grafana/check.py [deploy/grafana/retry-budget.json] [deploy/prometheus/retry-budget.rules.yaml]

The dashboard must be valid JSON in Grafana's export form: a recent
schemaVersion, the DS_PROMETHEUS input that every panel and query uses, a
job variable, the panels operations need, and no two panels on one spot.
Every retry_budget_* name a query of the dashboard or the rules uses must be
one the service exports (METRICS, below; a histogram's _bucket, _sum and
_count included) or a recording rule the rules file defines. Prints one line
a problem and exits 1 if there is any.
"""

import json
import re
import sys
from pathlib import Path

# What src/metrics.rs and src/metrics/{rpc,collect}.rs register (the TLS
# ones only when TLS is on), with the
# names Prometheus stores (counters with _total, info with _info).
METRICS = {
    "retry_budget_build_info",
    "retry_budget_config_info",
    "retry_budget_rpc_calls_total",
    "retry_budget_rpc_duration_seconds",
    "retry_budget_rpc_refusals_total",
    "retry_budget_rpc_in_flight",
    "retry_budget_decisions_total",
    "retry_budget_deferrals_total",
    "retry_budget_shadow_would_defer_total",
    "retry_budget_replays_total",
    "retry_budget_conflicts_total",
    "retry_budget_config_reloads_total",
    "retry_budget_store_commit_size",
    "retry_budget_store_commit_seconds",
    "retry_budget_store_commits_total",
    "retry_budget_store_saves_total",
    "retry_budget_bucket_rate",
    "retry_budget_bucket_burst",
    "retry_budget_bucket_tokens",
    "retry_budget_bucket_tokens_granted_total",
    "retry_budget_bucket_deposits_total",
    "retry_budget_bucket_tracked_tenants",
    "retry_budget_bucket_admissions_refused_total",
    "retry_budget_tenant_tokens",
    "retry_budget_tenant_weight",
    "retry_budget_coordination_rate",
    "retry_budget_coordination_target",
    "retry_budget_coordination_replicas",
    "retry_budget_coordination_status",
    "retry_budget_tls_reloads_total",
    "retry_budget_tls_certificate_expiry_timestamp_seconds",
    "retry_budget_connections_refused_total",
}
HISTOGRAMS = {
    "retry_budget_rpc_duration_seconds",
    "retry_budget_store_commit_size",
    "retry_budget_store_commit_seconds",
}

# The panels docs/operations.md promises, by a word each title must hold.
PANELS = [
    "Decisions by action",
    "Deferral ratio",
    "Tokens granted per tenant",
    "Bucket level vs burst",
    "RPC latency p50 / p99 by method",
    "Refusals by stable code",
    "Store commit latency p99",
    "Store commit size",
    "In flight",
    "Coordination rate per replica",
    "Coordination status",
]

NAME = re.compile(r"\b(retry_budget(?::[a-z0-9_]+)+|retry_budget_[a-z0-9_]+)\b")


def known(name, recorded):
    if name in METRICS or name in recorded:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return True
    return False


def rules_exprs(path):
    """(recorded names, [(where, expr)]) of a rules file; None without PyYAML."""
    try:
        import yaml
    except ImportError:
        return None
    doc = yaml.safe_load(Path(path).read_text())
    recorded, exprs = set(), []
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                recorded.add(rule["record"])
            where = rule.get("record") or rule.get("alert")
            exprs.append((f"{path}: {where}", rule["expr"]))
    return recorded, exprs


def dashboard_problems(dash, recorded):
    problems = []
    if dash.get("schemaVersion", 0) < 36:
        problems.append(f"schemaVersion {dash.get('schemaVersion')} is older than 36")
    inputs = [i.get("name") for i in dash.get("__inputs", [])]
    if inputs != ["DS_PROMETHEUS"]:
        problems.append(f"__inputs {inputs}, expected exactly DS_PROMETHEUS")
    names = [v.get("name") for v in dash.get("templating", {}).get("list", [])]
    if "job" not in names:
        problems.append("no job variable")
    titles = [p.get("title", "") for p in dash["panels"]]
    for want in PANELS:
        if want not in titles:
            problems.append(f"no panel titled {want!r}")
    spots = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in spots:
                    problems.append(f"panels {spots[(x, y)]!r} and {p['title']!r} overlap")
                    break
                spots[(x, y)] = p["title"]
            else:
                continue
            break
        if g["x"] + g["w"] > 24:
            problems.append(f"panel {p['title']!r} is wider than the grid")
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
            problems.append(f"panel {p['title']!r} does not use ${{DS_PROMETHEUS}}")
        if not p.get("targets"):
            problems.append(f"panel {p['title']!r} has no query")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                problems.append(f"a query of {p['title']!r} does not use ${{DS_PROMETHEUS}}")
            expr = t.get("expr", "")
            if not NAME.search(expr):
                problems.append(f"a query of {p['title']!r} names no retry_budget metric: {expr}")
            for name in NAME.findall(expr):
                if not known(name, recorded):
                    problems.append(f"panel {p['title']!r}: unknown metric {name}")
    return problems


def main(argv):
    dash_path = argv[1] if len(argv) > 1 else "deploy/grafana/retry-budget.json"
    rules_path = argv[2] if len(argv) > 2 else "deploy/prometheus/retry-budget.rules.yaml"
    try:
        dash = json.loads(Path(dash_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"{dash_path}: {e}")
        return 1
    rules = rules_exprs(rules_path)
    recorded = rules[0] if rules else set()
    problems = dashboard_problems(dash, recorded)
    if rules is None:
        print(f"skip - {rules_path}: PyYAML is not installed, its metric names not checked")
    else:
        for where, expr in rules[1]:
            for name in NAME.findall(expr):
                if not known(name, recorded):
                    problems.append(f"{where}: unknown metric {name}")
    for problem in problems:
        print(problem)
    queries = sum(len(p.get("targets", [])) for p in dash["panels"])
    if problems:
        return 1
    print(
        f"{dash_path}: {len(dash['panels'])} panels, {queries} queries; "
        f"{rules_path}: {len(rules[1]) if rules else '?'} rules; every metric name known"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
