#!/usr/bin/env python3
"""A real Prometheus against a real server: is the target up, do the queries run?

    python3 deploy/prometheus/scrape_check.py PROMETHEUS_URL [DASHBOARD] [RULES]

Waits (up to 30 s) for Prometheus at PROMETHEUS_URL to have scraped its one
target, and fails unless the target is up (the scrape's error is printed:
a series written twice, as a dependency named `other` once made, fails the
scrape). With SERIES_EXPECTED set (one PromQL selector a line), each must
match exactly one series: deploy/validate.sh names a dependency `other` and
more dependencies than the metrics show by name.
Then runs every query of the Grafana dashboard (its variables set to match
anything, $__rate_interval to 1m) and every expression of the rules file
through Prometheus' query API, and fails on any that Prometheus rejects.
deploy/validate.sh starts the server and Prometheus around it.
"""

import json
import os
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path


def get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def query(base, expr):
    """None if Prometheus runs it, else its error."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        body = get(url)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    except OSError as e:
        return str(e)
    return None if body.get("status") == "success" else body.get("error", "failed")


def main(argv):
    base = argv[1].rstrip("/")
    dashboard = argv[2] if len(argv) > 2 else "deploy/grafana/retry-budget.json"
    rules = argv[3] if len(argv) > 3 else "deploy/prometheus/retry-budget.rules.yaml"
    problems = []
    target = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            targets = get(f"{base}/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            targets = []
        if targets and targets[0]["health"] != "unknown":
            target = targets[0]
            break
        time.sleep(0.5)
    if target is None:
        problems.append("Prometheus never scraped the server")
    elif target["health"] != "up":
        problems.append(f"Prometheus cannot scrape {target['scrapeUrl']}: {target['lastError']}")
    else:
        print(f"scraped {target['scrapeUrl']}: up")

    for selector in filter(None, os.environ.get("SERIES_EXPECTED", "").splitlines()):
        deadline = time.monotonic() + 10
        while True:
            try:
                found = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": selector}))
                count = len(found["data"]["result"])
            except OSError:
                count = 0
            if count == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if count == 1:
            print(f"one series: {selector}")
        else:
            problems.append(f"{count} series, not one: {selector}")

    exprs = []
    dash = json.loads(Path(dashboard).read_text())
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            expr = (t["expr"].replace("$__rate_interval", "1m")
                    .replace("$job", ".*").replace("$instance", ".*"))
            exprs.append((f"{dashboard}: {panel['title']}", expr))
    try:
        import yaml

        for group in yaml.safe_load(Path(rules).read_text())["groups"]:
            for rule in group["rules"]:
                exprs.append((f"{rules}: {rule.get('record') or rule.get('alert')}", rule["expr"]))
    except ImportError:
        print(f"skip - {rules}: PyYAML is not installed, its expressions not run")
    for where, expr in exprs:
        error = query(base, expr)
        if error:
            problems.append(f"{where}: {error}: {expr}")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{len(exprs)} queries run by Prometheus without error")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
