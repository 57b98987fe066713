#!/usr/bin/env python3
"""The PostgreSQL targets of one benches/pg.sh run, from its results file.

    pg_summary.py RESULTS.jsonl

Prints, each judged within one round of the run (windows minutes apart):
- service / pgbench: durable NextAction's decisions a second over the best
  tps pgbench reached (1 to 64 clients, one single-row upsert a transaction)
  in the same round; target >= 1.5;
- big / small stored: the throughput of each big-store window over the
  small-store window just before it, on PostgreSQL and on the embedded
  store; target >= 0.8;
- the CPU a decision (or a pgbench transaction) took on each side: the
  server, every postgres process, the generator, the rest of the machine.
A target is met by the run when the median of its rounds' ratios is.
"""

import json
import statistics
import sys

SERVICE_VS_PGBENCH = 1.5
BIG_VS_SMALL = 0.8


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def per_unit(row, rate):
    """Microseconds of CPU a unit of work, each side, from a window's cores
    at a rate. The generator's own figure (client_cpu_cores, over its exact
    window) stands for it: it exits at its window's end, before a sampler
    outside it reads it again."""
    cores = dict(row["cores"])
    if "client_cpu_cores" in row:
        cores["loadgen"] = row["client_cpu_cores"]
    named = [k for k in cores if k not in ("busy", "seconds", "other")]
    cores["other"] = cores["busy"] - sum(cores[k] for k in named)
    return {k: cores[k] * 1e6 / rate for k in named + ["other", "busy"]}


def pgbench_rounds(rows):
    """Each round's service rate, best pgbench (tps, clients, cores)."""
    service = [r for r in rows if r.get("label") == "pg/durable"]
    rounds = []
    for i, s in enumerate(service, 1):
        sweep = [r for r in rows if r.get("kind") == "pgbench" and r["round"] == i and r["tps"]]
        if not sweep:
            continue
        best = max(sweep, key=lambda r: r["tps"])
        rounds.append({"service": s, "best": best, "ratio": s["throughput_rps"] / best["tps"]})
    return rounds


def stored_pairs(rows, prefix):
    """(small, big, ratio) for each big-store window and the small one before it."""
    pairs, small = [], None
    for r in rows:
        if r.get("label") == f"{prefix}/stored-small":
            small = r
        elif r.get("label") == f"{prefix}/stored-big" and small is not None:
            pairs.append((small, r, r["throughput_rps"] / small["throughput_rps"]))
            small = None
    return pairs


def verdict(ratios, bound):
    if not ratios:
        return "not measured"
    median = statistics.median(ratios)
    return f"median {median:.2f} ({'met' if median >= bound else 'MISSED'}, target >= {bound})"


def split_text(u):
    keys = [k for k in ("server", "postgres", "loadgen", "pgbench", "other") if k in u]
    return ", ".join(f"{k} {u[k]:.1f}" for k in keys) + f"; machine {u['busy']:.1f} us"


def report(rows):
    lines = []
    rounds = pgbench_rounds(rows)
    if rounds:
        lines.append("service / best pgbench (one single-row upsert a transaction):")
        for i, r in enumerate(rounds, 1):
            s, b = r["service"], r["best"]
            lines.append(
                f"  round {i}: {s['throughput_rps']:,.0f} decisions/s / {b['tps']:,.0f} tps "
                f"(-c {b['clients']}) = {r['ratio']:.2f}")
            sweep = [x for x in rows if x.get("kind") == "pgbench" and x["round"] == i]
            lines.append("    pgbench by clients: " + ", ".join(
                f"{x['clients']}: {x['tps'] or 0:,.0f}" for x in sweep))
        lines.append("  " + verdict([r["ratio"] for r in rounds], SERVICE_VS_PGBENCH))
        s, b = rounds[0]["service"], rounds[0]["best"]
        if s.get("cores"):
            lines.append("  CPU a decision (us): " + split_text(per_unit(s, s["throughput_rps"])))
        if b.get("cores"):
            lines.append("  CPU a pgbench transaction (us): " + split_text(per_unit(b, b["tps"])))
    for prefix, name in (("pg", "PostgreSQL"), ("embedded", "embedded")):
        pairs = stored_pairs(rows, prefix)
        if not pairs:
            continue
        big_n = pairs[0][1].get("stored_activities")
        small_n = pairs[0][0].get("stored_activities")
        lines.append(f"{name}: {big_n:,} / {small_n:,} stored activities (uniform next attempts):")
        for small, big, ratio in pairs:
            lines.append(
                f"  {big['throughput_rps']:,.0f} / {small['throughput_rps']:,.0f} decisions/s = {ratio:.2f}"
                f" (mean attempt {big.get('mean_attempt', 0):.1f} / {small.get('mean_attempt', 0):.1f};"
                f" errors {big['errors']} / {small['errors']})")
        lines.append("  " + verdict([p[2] for p in pairs], BIG_VS_SMALL))
        for label, r in (("small", pairs[0][0]), ("big", pairs[0][1])):
            if r.get("cores"):
                lines.append(f"  CPU a decision, {label} (us): "
                             + split_text(per_unit(r, r["throughput_rps"])))
    for r in rows:
        if r.get("scenario") == "preload":
            lines.append(f"{r['label']}: {r['activities']:,} activities in {r['seconds']:.0f} s, "
                         f"{r['activities_per_s']:,.0f}/s")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(report(load(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
