"""Turn runs into medians, ratios, a table, JSON and a plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ackmq.bench.stats import median, ratio, verdict
from ackmq.bench.workloads import WORKLOADS


def summarize(runs: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (workload, metric): per-broker median, runs, CPU; ratio A/B."""
    order: list[tuple[str, str]] = []
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    meta: dict[tuple[str, str], tuple[str, str]] = {}
    cpu: dict[tuple[str, str], dict[str, list[tuple[float, float | None]]]] = {}
    for run in runs:
        if not run.get("ok"):
            continue
        for m in run["metrics"]:
            own = m.get("wall_s") is not None
            wall = (m["wall_s"] if own else run["wall_s"]) or 1e-9
            ccpu = m["client_cpu_s"] if own else run["client_cpu_s"]
            bcpu = m["broker_cpu_s"] if own else run["broker_cpu_s"]
            key = (run["workload"], m["name"])
            if key not in values:
                order.append(key)
                values[key] = {}
                cpu[key] = {}
                meta[key] = (m["unit"], m["better"])
            values[key].setdefault(run["broker"], []).append(m["value"])
            cpu[key].setdefault(run["broker"], []).append(
                (100 * ccpu / wall, None if bcpu is None else 100 * bcpu / wall))
    rows = []
    for key in order:
        unit, better = meta[key]
        brokers = {}
        for label in labels:
            vals = values[key].get(label)
            if not vals:
                continue
            c = cpu[key][label]
            bc = [b for _, b in c if b is not None]
            brokers[label] = {"median": median(vals), "runs": len(vals), "values": vals,
                              "client_cpu_pct": median([a for a, _ in c]),
                              "broker_cpu_pct": median(bc) if bc else None}
        row: dict[str, Any] = {"workload": key[0], "metric": key[1], "unit": unit,
                               "better": better, "brokers": brokers,
                               "ratio": None, "ratio_of": None, "verdict": ""}
        if len(labels) == 2 and all(lb in brokers for lb in labels):
            a, b = labels
            r = ratio(brokers[a]["median"], brokers[b]["median"])
            row.update(ratio=r, ratio_of=f"{a}/{b}", verdict=verdict(r, better, a, b))
        rows.append(row)
    return rows


def fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def format_table(rows: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]],
                 labels: Sequence[str]) -> str:
    """A table per workload; the ratio is A/B with the better direction spelled out."""
    out: list[str] = []
    ratio_head = f"ratio {labels[0]}/{labels[1]}" if len(labels) == 2 else ""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    for wl in workloads:
        w = WORKLOADS.get(wl)
        counts = sorted({r["messages"] for r in runs if r.get("ok") and r["workload"] == wl})
        n = "/".join(f"{c:,}" for c in counts)
        out.append(f"\n== {wl} (n={n}): {w.summary if w else ''}")
        out.append(f"  {'metric':<26} {'broker':<10} {'median':>12} {'unit':<12} {'runs':>4}  "
                   f"{'cpu client/broker':>17}  {ratio_head}")
        for row in (r for r in rows if r["workload"] == wl):
            first = True
            for label, b in row["brokers"].items():
                rtxt = ""
                if first and row["ratio"] is not None:
                    rtxt = f"{row['ratio']:.2f} ({row['better']} is better: {row['verdict']})"
                cpu = f"{_pct(b['client_cpu_pct'])} / {_pct(b['broker_cpu_pct'])}"
                out.append(f"  {row['metric'] if first else '':<26} {label:<10} "
                           f"{fmt(b['median']):>12} {row['unit']:<12} {b['runs']:>4}  "
                           f"{cpu:>17}  {rtxt}")
                first = False
        out.extend(_notes(wl, runs, labels, rows))
    errors = [r for r in runs if not r.get("ok")]
    if errors:
        out.append("\nfailed runs:")
        for r in errors:
            out.append(f"  {r['workload']} on {r['broker']} round {r['round'] + 1}: {r['error']}")
    out.append("\ncpu = CPU time / wall time of the measured section (100% = one core busy); "
               "a side near 100% (client) or its core count (broker) was the bottleneck.")
    return "\n".join(out) + "\n"


def _notes(wl: str, runs: Sequence[dict[str, Any]], labels: Sequence[str],
           rows: Sequence[dict[str, Any]]) -> list[str]:
    notes = []
    ok = [r for r in runs if r.get("ok") and r["workload"] == wl]
    if wl == "confirms-individual" and ok:
        # prefer the floor measured in a broker's own data directory (--ackmq, --data-dir)
        run = next((r for r in ok if r["extra"].get("floor_in_data_dir")), ok[-1])
        e = run["extra"]
        notes.append(f"  physical floor for {run['messages']:,} one-at-a-time confirms: "
                     f"{fmt(e['floor_ms'])} ms = n × (loopback rtt {e['rtt_us']:.0f} µs + "
                     f"fdatasync {e['fdatasync_us']:.0f} µs in {e['floor_dir']}); without fsync "
                     f"{fmt(e['floor_no_fsync_ms'])} ms. A broker that confirms only after "
                     "fsync (ackmq; RabbitMQ 3.10 classic queues too) cannot beat it.")
    if wl == "tx":
        for label in labels:
            each = _median_of(rows, "tx", "tx/commit-each", label)
            asy = _median_of(rows, "confirms-async", "confirms-async", label)
            mine = [r for r in ok if r["broker"] == label]
            if each and asy and mine:
                per_each = each / mine[-1]["extra"]["n_per_mode"]
                per_async = asy / next(r["messages"] for r in runs if r.get("ok") and
                                       r["workload"] == "confirms-async" and r["broker"] == label)
                notes.append(f"  T4 on {label}: commit per message is {per_each / per_async:,.0f}× "
                             "slower per message than async confirms (published figure: 250×)")
    return notes


def _median_of(rows: Sequence[dict[str, Any]], wl: str, metric: str, label: str) -> float | None:
    for r in rows:
        if r["workload"] == wl and r["metric"] == metric and label in r["brokers"]:
            return r["brokers"][label]["median"]
    return None


def write_json(path: str | Path, meta: dict[str, Any], runs: Sequence[dict[str, Any]],
               rows: Sequence[dict[str, Any]]) -> None:
    Path(path).write_text(json.dumps({"meta": meta, "runs": list(runs), "summary": list(rows)},
                                     indent=2, default=str) + "\n")


def plot(path: str | Path, rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    """Prefetch sweep (msgs/s by prefetch) and latency percentiles, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    sweep = [r for r in rows if r["workload"] == "consume-prefetch"]
    if sweep:
        names = [r["metric"].split("/", 1)[1] for r in sweep]
        ticks = ["unlimited (0)" if n == "0" else n for n in names]
        for label in labels:
            ys = [r["brokers"].get(label, {}).get("median") for r in sweep]
            ax1.plot(range(len(ticks)), [y if y is not None else float("nan") for y in ys],
                     marker="o", label=label)
        ax1.set_xticks(range(len(ticks)), ticks)
        ax1.set_xlabel("prefetch (basic.qos prefetch-count)")
        ax1.set_ylabel("msgs/s (median)")
        ax1.legend()
    else:
        ax1.text(0.5, 0.5, "consume-prefetch not run", ha="center", va="center")
    ax1.set_title("Consumer throughput vs prefetch (manual acks)")
    lat = [r for r in rows if r["workload"] == "latency"]
    if lat:
        names = [r["metric"].split("/", 1)[1] for r in lat]
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            ys = [r["brokers"].get(label, {}).get("median", float("nan")) for r in lat]
            ax2.bar([x + i * width for x in range(len(names))], ys, width, label=label)
        ax2.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(names))], names)
        ax2.set_yscale("log")
        ax2.set_ylabel("ms (median of runs, log scale)")
        ax2.legend()
    else:
        ax2.text(0.5, 0.5, "latency not run", ha="center", va="center")
    ax2.set_title("End-to-end latency percentiles")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
