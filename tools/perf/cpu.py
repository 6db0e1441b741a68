"""Broker CPU µs per message, ackmq against RabbitMQ: the steady figure on a busy machine.

Wall-clock throughput on a shared machine says how busy the neighbours were; the CPU a
broker's process spends per message (its /proc user + system time over the measured
section, divided by the messages) barely moves with them. Each workload reuses a bench
driver (`ackmq.bench.throughput`, `confirms`), alternating brokers A B A B …

A shared RabbitMQ also works for others: its idle CPU rate is sampled before each run
and `net` subtracts that rate × the run's wall time (`raw` keeps it in). With
`--pyspy DIR`, one extra run per workload records ackmq under py-spy (never a measured
run: sampling costs the broker CPU) and prints its top functions.

    python -m tools.perf.cpu --rounds 3 --pyspy /tmp/prof
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ackmq.bench import confirms, throughput
from ackmq.bench.brokers import (
    BenchSetupError,
    Target,
    ackmq_and_rabbitmq,
)
from ackmq.bench.context import Options, RunContext


@dataclass(frozen=True)
class CpuWorkload:
    """A bench driver, its default count, and what one 'message' is for it."""

    name: str
    run: Callable[[RunContext], None]
    default_n: int
    per: int = 1  # deliveries per published message (fanout: 10)
    prefetch: tuple[int, ...] = (300,)


CPU_WORKLOADS = {w.name: w for w in (
    CpuWorkload("publish", throughput.publish, 100_000),
    CpuWorkload("deliver-ack", throughput.consume_prefetch, 50_000),
    CpuWorkload("deliver-noack", throughput.consume_auto, 50_000),
    CpuWorkload("confirm", confirms.confirms_async, 50_000),
    CpuWorkload("fanout", throughput.fanout, 20_000, per=throughput.FANOUT_QUEUES),
)}


def idle_rate(target: Target, seconds: float = 1.0) -> float:
    """CPU seconds per wall second the broker spends with no load from us."""
    proc = target.process
    if proc is None:
        return 0.0
    t0 = proc.cpu_times()
    time.sleep(seconds)
    t1 = proc.cpu_times()
    return max(0.0, (t1.user + t1.system - t0.user - t0.system) / seconds)


def run_once(w: CpuWorkload, target: Target, scale: float) -> dict[str, Any]:
    """One measured run: broker CPU µs per message, raw and net of the idle rate."""
    idle = idle_rate(target)
    ctx = RunContext(w.name, target, Options(scale=scale, prefetch=w.prefetch))
    try:
        w.run(ctx)
    finally:
        ctx.cleanup()
    msgs = ctx.messages * w.per
    cpu = ctx.broker_cpu_s or 0.0
    return {"workload": w.name, "broker": target.label, "messages": msgs,
            "wall_s": ctx.wall_s, "broker_cpu_s": cpu, "idle_rate": idle,
            "raw_us": cpu / msgs * 1e6,
            "net_us": max(0.0, cpu - idle * ctx.wall_s) / msgs * 1e6,
            "msgs_per_s": msgs / ctx.wall_s if ctx.wall_s else 0.0,
            "client_cpu_s": ctx.client_cpu_s}


def _frame(f: str) -> str:
    """'func (path/file.py:123)' -> 'func file.py' (by function, not by line)."""
    fn, _, where = f.partition(" (")
    return f"{fn} {where.rsplit('/', 1)[-1].split(':')[0].rstrip(')')}"


def top_costs(raw_file: Path, n: int = 15) -> list[tuple[str, float, float]]:
    """(function, self %, inclusive %) from py-spy's collapsed-stack ('raw') output."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw_file.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    if not total:
        return []
    return [(f, 100 * c / total, 100 * incl[f] / total) for f, c in own.most_common(n)]


def profile(w: CpuWorkload, target: Target, scale: float, out_dir: Path) -> Path | None:
    """Run w once with py-spy recording the broker; returns the collapsed-stack file."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists() or target.pid is None:
        print("py-spy not found (pip install py-spy); no profile", file=sys.stderr)
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"{w.name}.txt"
    svg = out_dir / f"{w.name}.svg"
    procs = [subprocess.Popen([spy, "record", "-p", str(target.pid), "-r", "250", "-f", fmt,
                               "-o", str(path), "--nonblocking"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for fmt, path in (("raw", raw), ("flamegraph", svg))]
    time.sleep(1.0)  # py-spy attaches
    try:
        run_once(w, target, scale)
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        errors = []
        for p in procs:
            try:
                errors.append(p.communicate(timeout=60)[1])
            except subprocess.TimeoutExpired:
                p.kill()
    if raw.exists():
        return raw
    # e.g. not root and kernel.yama.ptrace_scope=1: py-spy may not attach to a sibling
    print(f"py-spy recorded nothing for {w.name}: {errors[0].strip()[-300:] if errors else ''}",
          file=sys.stderr)
    return None


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def summarize(runs: list[dict[str, Any]], labels: list[str]) -> str:
    """One row per workload: each broker's median net and raw µs/msg, and their ratio."""
    lines = [f"{'workload':<14} " + " ".join(f"{lb + ' net':>14} {lb + ' raw':>14}"
                                            for lb in labels)
             + ("   ratio (net, ackmq/other)" if len(labels) > 1 else "")]
    for name in dict.fromkeys(r["workload"] for r in runs):
        med = {}
        cells = []
        for lb in labels:
            rs = [r for r in runs if r["workload"] == name and r["broker"] == lb]
            if not rs:
                cells.append(f"{'-':>14} {'-':>14}")
                continue
            med[lb] = _median([r["net_us"] for r in rs])
            raw = _median([r["raw_us"] for r in rs])
            cells.append(f"{med[lb]:>11.1f} µs {raw:>11.1f} µs")
        row = f"{name:<14} " + " ".join(cells)
        if len(labels) > 1 and all(lb in med for lb in labels) and med[labels[1]]:
            row += f"   {med[labels[0]] / med[labels[1]]:.2f}"
        lines.append(row)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.perf.cpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", help="default: " + ", ".join(CPU_WORKLOADS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the message counts")
    ap.add_argument("--no-rabbitmq", action="store_true", help="ackmq alone")
    ap.add_argument("--url", help="an ackmq already running (else one is started)")
    ap.add_argument("--pid", type=int, help="its process id, with --url")
    ap.add_argument("--pyspy", type=Path, metavar="DIR",
                    help="also profile ackmq under each workload (raw + flamegraph in DIR)")
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    names = args.workloads or list(CPU_WORKLOADS)
    bad = [w for w in names if w not in CPU_WORKLOADS]
    if bad:
        print(f"unknown workload(s): {', '.join(bad)}; choose from {', '.join(CPU_WORKLOADS)}",
              file=sys.stderr)
        return 2
    try:
        targets = ackmq_and_rabbitmq(args.url, args.pid, not args.no_rabbitmq)
    except BenchSetupError as exc:
        print(f"ackmq bench cpu: {exc}", file=sys.stderr)
        return 2
    labels = [t.label for t in targets]
    runs: list[dict[str, Any]] = []
    tops: dict[str, list[tuple[str, float, float]]] = {}
    try:
        for name in names:
            w = CPU_WORKLOADS[name]
            for rnd in range(args.rounds):
                for t in targets:
                    r = run_once(w, t, args.scale)
                    r["round"] = rnd
                    runs.append(r)
                    print(f"{name} on {t.label} round {rnd + 1}: {r['net_us']:.1f} µs/msg net "
                          f"({r['raw_us']:.1f} raw, idle {r['idle_rate'] * 100:.0f}%), "
                          f"{r['msgs_per_s']:,.0f} msgs/s", file=sys.stderr, flush=True)
            if args.pyspy:
                raw = profile(w, targets[0], args.scale, args.pyspy)
                if raw is not None:
                    tops[name] = top_costs(raw)
    finally:
        for t in targets:
            t.close()
    print(summarize(runs, labels), end="")
    for name, top in tops.items():
        print(f"\npy-spy, ackmq under {name} (self %, inclusive %):")
        for fn, own, incl in top:
            print(f"  {own:5.1f} {incl:5.1f}  {fn}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "runs": runs,
                                         "top": tops}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
