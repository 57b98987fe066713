#!/usr/bin/env python3
"""Summarises a benches/soak.sh run: per minute, per 10 s, and the verdict.

    python3 benches/soak_summary.py OUT_DIR

Reads OUT_DIR/run.json, minutes.jsonl (one open-loop generator run a
minute), rss.tsv (VmRSS every 10 s) and metrics/*.txt (the server's
/metrics every 10 s, and final.txt). Prints per minute the requests a
second, the client's p50/p99/max (from each request's due time), errors,
the generator's own lag and the RSS at the minute's end; the server's
NextAction p99 each 10 s from its histogram (to a bucket's precision,
interpolated as histogram_quantile does); the mix from the final scrape;
and the verdict: RSS at the end within 10% of its value after the warm-up
(the first 2 minutes), no error. Writes OUT_DIR/summary.json; exits 1 if
the verdict fails.
"""

import json
import re
import sys
from pathlib import Path

WARMUP_S = 120
FLAT = 0.10
SAMPLE = re.compile(r'^(retry_budget_[a-z_]+)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse(text):
    """{(name, frozenset(labels)): value} of a scrape."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = frozenset(LABEL.findall(m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def total(scrape, name, **want):
    return sum(
        v for (n, labels), v in scrape.items()
        if n == name and all((k, w) in labels for k, w in want.items())
    )


def buckets(scrape, name, **want):
    """[(le, cumulative count)] of a histogram, ascending."""
    out = {}
    for (n, labels), v in scrape.items():
        if n != name + "_bucket":
            continue
        d = dict(labels)
        if all(d.get(k) == w for k, w in want.items()):
            le = float("inf") if d["le"] == "+Inf" else float(d["le"])
            out[le] = out.get(le, 0) + v
    return sorted(out.items())


def quantile(q, before, after):
    """histogram_quantile over the difference of two cumulative bucket lists."""
    prev = dict(before)
    delta = [(le, c - prev.get(le, 0)) for le, c in after]
    if not delta or delta[-1][1] <= 0:
        return None
    rank = q * delta[-1][1]
    lower_le, lower_c = 0.0, 0.0
    for le, c in delta:
        if c >= rank:
            if le == float("inf"):
                return lower_le
            return lower_le + (le - lower_le) * (rank - lower_c) / max(c - lower_c, 1e-12)
        lower_le, lower_c = le, c
    return None


def main(out):
    out = Path(out)
    run = json.loads((out / "run.json").read_text())
    minutes = [json.loads(line) for line in (out / "minutes.jsonl").read_text().splitlines() if line.strip()]
    rss = []
    for line in (out / "rss.tsv").read_text().splitlines()[1:]:
        t, r, h = line.split("\t")
        rss.append((int(t), float(r), float(h)))

    def rss_at(t):
        before = [r for s, r, _ in rss if s <= t]
        return before[-1] if before else None

    print(f"saturation (closed loop, {run['concurrency']} streams): {run['saturation_rps']:.0f} requests/s; "
          f"soak at {run['rate']}/s open loop, retry rate {run['retry_rate']}/s, "
          f"{run['tenants']} tenants, {run['attempts']} failures then a success an activity; {run['cpu']}")
    print()
    # From due times, the p99 holds the generator's lateness; from send
    # times (newer runs) it does not. The machine's busy cores and the time
    # the generator waited for a CPU say whether the machine was full.
    print("| minute | requests/s | p50 us | p99 us | p99 from send us | max us | errors | generator lag p99 us "
          "| generator run-queue wait s | machine busy cores | server CPU cores | RSS MiB at end |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    errors = 0
    for i, m in enumerate(minutes, 1):
        errors += m["errors"]
        lat = m["latency_us"]
        from_send = m.get("latency_from_send_us", {}).get("p99", "-")
        wait = m.get("client_runqueue_wait_ms")
        print(f"| {i} | {m['throughput_rps']:.0f} | {lat['p50']} | {lat['p99']} | {from_send} | {lat['max']} | {m['errors']}"
              f"{' ' + json.dumps(m['error_codes']) if m['errors'] else ''} | {m.get('pacer_lag_us', {}).get('p99')} | "
              f"{'-' if wait is None else f'{wait / 1000:.1f}'} | {m.get('system_busy_cores') or 0:.2f} | "
              f"{m.get('server_cpu_cores') or 0:.2f} | {rss_at(i * 60)} |")

    # A results folder kept in the repository holds the final scrape only.
    snaps = sorted((out / "metrics").glob("[0-9]*.txt")) if (out / "metrics").is_dir() else []
    tens = []
    prev = None
    for path in snaps:
        scrape = parse(path.read_text())
        b = buckets(scrape, "retry_budget_rpc_duration_seconds", method="NextAction", code="OK")
        if prev is not None:
            p99 = quantile(0.99, prev[1], b)
            tens.append((int(path.stem), None if p99 is None else round(p99 * 1e6)))
        prev = (path, b)
    print()
    if not tens and (out / "summary.json").exists():
        tens = list(enumerate(json.loads((out / "summary.json").read_text())["server_p99_us_10s"]))
    print("server NextAction p99 (us) each 10 s, from its histogram:",
          " ".join(f"{p}" for _, p in tens))

    final_path = out / "metrics" / "final.txt"
    if not final_path.exists():
        final_path = out / "final-metrics.txt"
    final = parse(final_path.read_text())
    mix = {
        "retries granted": total(final, "retry_budget_decisions_total", action="ACTION_SCHEDULE_RETRY"),
        "deferrals": total(final, "retry_budget_decisions_total", action="ACTION_DEFERRED"),
        "successes": total(final, "retry_budget_rpc_calls_total", method="RecordSuccess", code="OK"),
        "refusals": total(final, "retry_budget_rpc_refusals_total"),
        "store saves": total(final, "retry_budget_store_saves_total"),
        "tenants tracked": total(final, "retry_budget_bucket_tracked_tenants"),
    }
    reasons = {dict(labels)["reason"]: v for (n, labels), v in final.items()
               if n == "retry_budget_deferrals_total"}
    print("mix (server counters):", ", ".join(f"{k} {v:,.0f}" for k, v in mix.items()),
          "; deferrals by reason:", ", ".join(f"{k} {v:,.0f}" for k, v in sorted(reasons.items())))

    warm = rss_at(WARMUP_S)
    # The last sample under load, not the idle one after the last minute.
    load_end = len(minutes) * 60
    end = rss_at(load_end)
    after = [r for s, r, _ in rss if WARMUP_S <= s <= load_end]
    flat = warm is not None and end is not None and abs(end - warm) <= FLAT * warm
    p99s = [m["latency_us"]["p99"] for m in minutes]
    ok = flat and errors == 0
    print()
    print(f"RSS after warm-up ({WARMUP_S} s) {warm} MiB, at the end {end} MiB "
          f"({(end - warm) / warm * 100:+.1f}%), {min(after, default=0)} to {max(after, default=0)} MiB after warm-up; "
          f"peak (VmHWM) {rss[-1][2] if rss else None} MiB; errors {errors}; "
          f"p99 by minute {min(p99s, default=0)} to {max(p99s, default=0)} us: {'PASS' if ok else 'FAIL'}")
    summary = {
        **run,
        "minutes_p99_us": p99s,
        "minutes_rps": [round(m["throughput_rps"]) for m in minutes],
        "server_p99_us_10s": [p for _, p in tens],
        "rss_after_warmup_mib": warm,
        "rss_end_mib": end,
        "rss_max_after_warmup_mib": max(after, default=None),
        "errors": errors,
        "mix": mix,
        "deferral_reasons": reasons,
        "pass": ok,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
