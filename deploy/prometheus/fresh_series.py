#!/usr/bin/env python3
"""The alerts' unit tests, fed what a freshly started server exports.

    python3 deploy/prometheus/fresh_series.py SCRAPE TESTS > fed.test.yaml
    promtool test rules fed.test.yaml

SCRAPE is a freshly started server's /metrics (a URL, waited for up to
10 s, or a file); TESTS is deploy/prometheus/retry-budget.rules.test.yaml.
Its input series are written as a counter's story from a process's start:
a series whose values start at 0 says "this counter, at 0 when the process
started". `rate()` and `increase()` see the first event only as a rise from
a sample before it, so that 0 must be what the server exports. For every
such series of the service's (`retry_budget_*`, a counter, or a histogram's
`_bucket`, `_count` or `_sum`), this prints the tests with the series as
the server really exports it: unchanged where the fresh scrape holds it at
0; where it does not, its leading 0 samples become absent (`_`), as
Prometheus would see a counter that appears at its first increment. Series
that start above 0 (a process that has run a while) and gauges are left as
written. `rule_files` are made absolute, so the output can be anywhere.

Names each counter series the fresh server does not export at 0 on stderr,
and exits 1 if there is one: every counter an alert reads must be there
from the start, for each of its known labels.
"""

import re
import sys
import time
import urllib.request
from pathlib import Path

import yaml

SERIES = re.compile(r'^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$')
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
# Labels Prometheus adds at the scrape, not the server.
TARGET_LABELS = {"job", "instance"}


def read_scrape(source: str) -> str:
    if not source.startswith("http"):
        return Path(source).read_text()
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(source, timeout=2) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def labels_of(text: str) -> frozenset:
    return frozenset((m.group(1), m.group(2)) for m in LABEL.finditer(text or ""))


def parse_scrape(text: str):
    """The samples {(name, labels): value} and the names of counter samples."""
    samples, counters = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(None, 3)
            if kind == "counter":
                counters.add(family + "_total")
            elif kind == "histogram":
                counters.update(family + suffix for suffix in ("_bucket", "_count", "_sum"))
            continue
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        m = SERIES.match(head)
        if m:
            samples[(m.group(1), labels_of(m.group(2)))] = float(value)
    return samples, counters


def expand(values: str) -> list:
    """promtool's expanding notation, one entry a sample ('_' absent)."""
    out = []
    for token in values.split():
        m = re.fullmatch(r"(_|stale|-?[0-9.e+]+?)(?:([+-])([0-9.e+]+))?x([0-9]+)", token)
        if not m:
            out.append(token)
            continue
        start, sign, step, n = m.group(1), m.group(2), m.group(3), int(m.group(4))
        if start in ("_", "stale"):
            out.extend([start] * n)
            continue
        a, b = float(start), float(step or 0) * (-1 if sign == "-" else 1)
        out.extend(fmt(a + k * b) for k in range(n + 1))
    return out


def fmt(x: float) -> str:
    return str(int(x)) if x == int(x) else repr(x)


def is_counter(name: str, counters: set) -> bool:
    return name.startswith("retry_budget_") and (
        name in counters or name.endswith("_total")
        or any(name.endswith(s) for s in ("_bucket", "_count", "_sum")))


def main(argv) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    samples, counters = parse_scrape(read_scrape(argv[1]))
    tests_path = Path(argv[2]).resolve()
    tests = yaml.safe_load(tests_path.read_text())
    tests["rule_files"] = [str((tests_path.parent / f).resolve()) for f in tests["rule_files"]]
    missing, fed = [], 0
    for test in tests["tests"]:
        for series in test.get("input_series", []):
            m = SERIES.match(series["series"])
            name, labels = m.group(1), labels_of(m.group(2))
            if not is_counter(name, counters):
                continue
            values = expand(str(series["values"]))
            if not values or values[0] != "0":
                continue
            fed += 1
            own = frozenset(kv for kv in labels if kv[0] not in TARGET_LABELS)
            if samples.get((name, own)) == 0.0:
                continue
            shown = "%s{%s}" % (name, ",".join('%s="%s"' % kv for kv in sorted(own)))
            missing.append(f"{test['name']}: {shown}")
            k = 0
            while k < len(values) and values[k] == "0":
                values[k] = "_"
                k += 1
            series["values"] = " ".join(values)
    for line in missing:
        print(f"not exported at 0 by a fresh server: {line}", file=sys.stderr)
    print(f"fresh_series: {fed} counter series of the tests start at 0; "
          f"{fed - len(missing)} of them as a fresh server exports them, {len(missing)} not",
          file=sys.stderr)
    yaml.safe_dump(tests, sys.stdout, sort_keys=False, width=1000)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
