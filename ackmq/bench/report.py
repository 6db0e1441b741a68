"""Turn runs into medians, ratios, a table, JSON and a plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ackmq.bench.floor import MEMORY_FS
from ackmq.bench.stats import median, ratio, verdict
from ackmq.bench.workloads import WORKLOADS

# The broker's CPU time comes from psutil (/proc/PID/stat), counted in 10 ms clock ticks;
# under 50 ms (5 ticks) a section's figure is mostly rounding, so it is shown as "<res".
# (The client's comes from getrusage, which Linux reports to the microsecond.)
CPU_RES_S = 0.05


def summarize(runs: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (workload, metric): per-broker median, runs, CPU; ratio A/B."""
    order: list[tuple[str, str]] = []
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    meta: dict[tuple[str, str], tuple[str, str]] = {}
    cpu: dict[tuple[str, str], dict[str, list[tuple[float, float | None, bool]]]] = {}
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
                (100 * ccpu / wall, None if bcpu is None else 100 * bcpu / wall,
                 bcpu is not None and bcpu < CPU_RES_S))
    rows = []
    for key in order:
        unit, better = meta[key]
        brokers: dict[str, dict[str, Any]] = {}
        for label in labels:
            vals = values[key].get(label)
            if not vals:
                continue
            c = cpu[key][label]
            bc = [b for _, b, _ in c if b is not None]
            # one run under the tick resolution makes the median unreadable: say so
            below = any(low for _, _, low in c)
            brokers[label] = {"median": median(vals), "runs": len(vals), "values": vals,
                              "client_cpu_pct": median([a for a, _, _ in c]),
                              "broker_cpu_pct": median(bc) if bc and not below else None,
                              "broker_cpu_below_resolution": below}
        row: dict[str, Any] = {"workload": key[0], "metric": key[1], "unit": unit,
                               "better": better, "brokers": brokers,
                               "ratio": None, "ratio_of": None, "verdict": "", "ratios": []}
        # A (the first broker) against each other one; `ratio` is A/B, the first of them
        a = labels[0] if labels else ""
        for b in labels[1:]:
            if a in brokers and b in brokers:
                r = ratio(brokers[a]["median"], brokers[b]["median"])
                row["ratios"].append({"of": f"{a}/{b}", "against": b, "ratio": r,
                                      "verdict": verdict(r, better, a, b)})
        if len(labels) >= 2 and row["ratios"] and row["ratios"][0]["against"] == labels[1]:
            first = row["ratios"][0]
            row.update(ratio=first["ratio"], ratio_of=first["of"], verdict=first["verdict"])
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


def _pct(v: float | None, below_resolution: bool = False) -> str:
    if below_resolution:
        return "<res"
    return "n/a" if v is None else f"{v:.0f}%"


def format_table(rows: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]],
                 labels: Sequence[str]) -> str:
    """A table per workload; the ratio is A/B with the better direction spelled out."""
    out: list[str] = []
    many = len(labels) > 2  # then each other broker's line carries A/that broker
    ratio_head = (f"ratio {labels[0]}/{labels[1]}" if len(labels) == 2 else
                  f"ratio {labels[0]}/broker" if many else "")
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
            against = {x["against"]: x for x in row.get("ratios", []) if x["ratio"] is not None}
            for label, b in row["brokers"].items():
                rtxt = ""
                if many:
                    if label in against:
                        x = against[label]
                        rtxt = f"{x['ratio']:.2f} ({row['better']} is better: {x['verdict']})"
                elif first and row["ratio"] is not None:
                    rtxt = f"{row['ratio']:.2f} ({row['better']} is better: {row['verdict']})"
                cpu = (f"{_pct(b['client_cpu_pct'])} / "
                       f"{_pct(b['broker_cpu_pct'], b.get('broker_cpu_below_resolution', False))}")
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
    if any(b.get("broker_cpu_below_resolution") for r in rows for b in r["brokers"].values()):
        out.append(f"<res = in some run the broker used under {CPU_RES_S * 1e3:.0f} ms of CPU, "
                   "below what its 10 ms clock ticks resolve; run more messages to measure it.")
    return "\n".join(out) + "\n"


def _notes(wl: str, runs: Sequence[dict[str, Any]], labels: Sequence[str],
           rows: Sequence[dict[str, Any]]) -> list[str]:
    notes = []
    ok = [r for r in runs if r.get("ok") and r["workload"] == wl]
    if wl == "confirms-individual" and ok:
        f = floor_summary(ok)
        if f:
            notes.append(_floor_note(f))
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


def floor_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The physical floor from every confirms-individual run: the median loopback RTT of
    all runs and the median fdatasync of the runs that measured on the same filesystem
    as the preferred one (a broker's own data directory, --ackmq or --data-dir), so one
    outlier run cannot set the floor and runs on different disks are not mixed."""
    runs = [r for r in runs if r.get("ok") and "rtt_us" in r.get("extra", {})]
    if not runs:
        return None
    pref_run = next((r for r in runs if r["extra"].get("floor_in_data_dir")), runs[-1])
    pref, n = pref_run["extra"], pref_run["messages"]
    mount = pref.get("floor_mount")
    same = [r for r in runs if r["extra"].get("floor_mount") == mount]
    rtt = median([r["extra"]["rtt_us"] for r in runs])
    sync = median([r["extra"]["fdatasync_us"] for r in same])
    app = [r["extra"]["fdatasync_append_us"] for r in same if "fdatasync_append_us" in r["extra"]]
    return {"messages": n, "rtt_us": rtt, "rtt_runs": len(runs),
            "fdatasync_us": sync, "fdatasync_runs": len(same),
            "fdatasync_append_us": median(app) if app else None,
            "floor_ms": n * (rtt + sync) / 1e3, "floor_no_fsync_ms": n * rtt / 1e3,
            "floor_dir": pref.get("floor_dir", "?"), "floor_mount": mount or "?",
            "floor_fstype": pref.get("floor_fstype", "unknown")}


def _floor_note(f: dict[str, Any]) -> str:
    runs = (f"median of {f['rtt_runs']} run{'s' if f['rtt_runs'] > 1 else ''}"
            if f["rtt_runs"] == f["fdatasync_runs"] else
            f"medians of {f['rtt_runs']} runs (rtt) and {f['fdatasync_runs']} (fdatasync)")
    append = ("" if f["fdatasync_append_us"] is None else
              f"; an append + fdatasync costs {f['fdatasync_append_us']:.0f} µs")
    note = (f"  physical floor for {f['messages']:,} one-at-a-time confirms: "
            f"{fmt(f['floor_ms'])} ms = n × (loopback rtt {f['rtt_us']:.0f} µs + fdatasync "
            f"{f['fdatasync_us']:.0f} µs), {runs}; fdatasync of a 128-byte overwrite in a "
            f"flushed file in {f['floor_dir']} ({f['floor_fstype']} on {f['floor_mount']})"
            f"{append}; without fsync {fmt(f['floor_no_fsync_ms'])} ms. A broker that confirms "
            "only after fsync (ackmq; RabbitMQ 3.10 classic queues too) cannot beat it.")
    if f["floor_fstype"] in MEMORY_FS:
        note += (f"\n  WARNING: {f['floor_dir']} is on {f['floor_fstype']} (memory): fdatasync "
                 "there costs nothing, so this floor is too low for a broker on disk; pass "
                 "--data-dir DIR on the broker's disk.")
    return note


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

    client_rows = [r for r in rows if r["workload"] == "client-publish"
                   and r["unit"] == "msgs/s" and "/" in r["metric"]]
    if client_rows and not any(r["workload"] in ("consume-prefetch", "stomp-consume-ci",
                                                 "latency") for r in rows):
        fig, ax = plt.subplots(1, 1, figsize=(11, 4.5))  # only client workloads ran
        _plot_clients(ax, client_rows, labels)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return
    if client_rows:
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(21, 4.5))
        _plot_clients(ax3, client_rows, labels)
    else:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    sweep = ([r for r in rows if r["workload"] == "consume-prefetch"]
             or [r for r in rows if r["workload"] == "stomp-consume-ci"])
    stomp = bool(sweep) and sweep[0]["workload"] == "stomp-consume-ci"
    if sweep:
        names = [r["metric"].split("/", 1)[1] for r in sweep]
        ticks = ["unlimited (0)" if n == "0" else n for n in names]
        for label in labels:
            ys = [r["brokers"].get(label, {}).get("median") for r in sweep]
            ax1.plot(range(len(ticks)), [y if y is not None else float("nan") for y in ys],
                     marker="o", label=label)
        ax1.set_xticks(range(len(ticks)), ticks)
        ax1.set_xlabel("prefetch (STOMP prefetch-count / activemq.prefetchSize)" if stomp
                       else "prefetch (basic.qos prefetch-count)")
        ax1.set_ylabel("msgs/s (median)")
        ax1.legend()
    else:
        ax1.text(0.5, 0.5, "consume-prefetch not run", ha="center", va="center")
    ax1.set_title("STOMP consumer throughput vs prefetch (client-individual)" if stomp
                  else "Consumer throughput vs prefetch (manual acks)")
    lat = [r for r in rows if r["workload"] == "latency"]
    speed = [r for r in rows if r.get("ratios") and r["workload"].startswith("stomp-")]
    if not lat and speed:
        _plot_speedups(ax2, speed, labels)
    elif lat:
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
    if lat or not speed:
        ax2.set_title("End-to-end latency percentiles")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_speedups(ax: Any, rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    """How many times better A is than each other broker, per STOMP metric (>1: A wins),
    so rows in ms and in msgs/s read the same way."""
    names = [r["metric"].removeprefix("stomp-") for r in rows]
    others = list(labels[1:])
    width = 0.8 / max(1, len(others))
    for i, other in enumerate(others):
        ys = []
        for r in rows:
            x = next((x for x in r["ratios"] if x["against"] == other), None)
            v = x["ratio"] if x else None
            ys.append(float("nan") if not v else (1 / v if r["better"] == "lower" else v))
        ax.bar([k + i * width for k in range(len(names))], ys, width, label=f"vs {other}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([k + width * (len(others) - 1) / 2 for k in range(len(names))], names,
                  rotation=20, fontsize=8)
    ax.set_ylabel(f"{labels[0]} speed-up (× better; 1 = even)")
    ax.legend()
    ax.set_title(f"STOMP: {labels[0]} against each reference")


def _plot_clients(ax: Any, rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    """client-publish: msgs/s per J10 strategy and client, one bar group per strategy,
    one bar per (client, broker); the physical floor as a line over confirm-each."""
    strategies = list(dict.fromkeys(r["metric"].split("/")[0] for r in rows))
    clients = list(dict.fromkeys(r["metric"].split("/")[1] for r in rows
                                 if not r["metric"].endswith("/floor")))
    series = [(c, b) for c in clients for b in labels]
    width = 0.8 / max(1, len(series))
    by = {r["metric"]: r for r in rows}
    for i, (client, label) in enumerate(series):
        ys = [by.get(f"{st}/{client}", {}).get("brokers", {}).get(label, {}).get(
            "median", float("nan")) for st in strategies]
        name = {"ackmq": "ackmq.client", "ackmq-aio": "ackmq.client asyncio"}.get(client, client)
        ax.bar([k + i * width for k in range(len(strategies))], ys, width,
               label=f"{name} → {label}" if len(labels) > 1 else name)
    floor = by.get("each/floor")
    if floor and "each" in strategies:
        k = strategies.index("each")
        for j, (label, b) in enumerate(floor["brokers"].items()):
            ax.hlines(b["median"], k - width / 2, k + width * (len(series) - 0.5),
                      colors="black", linestyles=["dashed", "dotted"][j % 2],
                      label=f"physical floor (rtt + fdatasync), run on {label}")
    ax.set_xticks([k + width * (len(series) - 1) / 2 for k in range(len(strategies))],
                  ["confirm each" if st == "each" else "batches of 100" if st == "batch"
                   else "async confirms" for st in strategies])
    ax.set_yscale("log")
    ax.set_ylabel("msgs/s (median, log scale)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("J10 publish strategies by client (persistent)")
