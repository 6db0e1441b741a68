"""The scaling report: ackmq against RabbitMQ as the work grows, in the same run.

Five sweeps, each point run on both brokers in turn (A B, then the next point):
throughput and the broker's CPU µs per message (its /proc user + system time over
the measured section ÷ messages). `--taskset` adds each broker pinned to one core
against both cores. PNG plots and a JSON of every point go to `--out`.

    python -m tools.perf.scaling --quick          # CI size, a few minutes
    python -m tools.perf.scaling --out docs       # the report's run

What each sweep does is in docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands as C

from ackmq.bench.brokers import (
    BenchSetupError,
    Target,
    ackmq_and_rabbitmq,
)
from ackmq.bench.context import Options, RunContext, run_async
from ackmq.bench.pipeline import OutstandingConfirms
from ackmq.client.lowlevel import RawChannel, RawConnection, open_connection
from ackmq.protocol.amqp import encode_ack

TRANSIENT = 1
CHUNK = 256
RPC_MS = 600_000  # 10,000 queue.declares behind one barrier can take minutes on a busy host


async def _open(url: str, name: str) -> RawConnection:
    return await open_connection(url, name, send_timeout=RPC_MS)


@dataclass
class Point:
    """One measurement: one sweep, one x, one broker."""

    sweep: str
    x: int
    broker: str
    messages: int
    wall_s: float
    broker_cpu_s: float | None
    client_cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_us(self) -> float | None:
        if self.broker_cpu_s is None or not self.messages:
            return None
        return self.broker_cpu_s / self.messages * 1e6


async def _pump(conn: RawConnection, frames: list[bytes], n: int,
                oc: OutstandingConfirms | None) -> None:
    """Publish n messages cycling through `frames` (one pre-encoded publish each), as
    fast as TCP allows, then wait for every confirm."""
    k = len(frames)
    i = 0
    while i < n:
        batch = min(CHUNK, n - i)
        if oc is not None:
            for _ in range(batch):
                oc.add()
        if k == 1:
            conn.write(frames[0] * batch)
        else:
            conn.write(b"".join(frames[(i + j) % k] for j in range(batch)))
        i += batch
        if conn.paused:
            await conn.drain()
        else:
            await asyncio.sleep(0)
    if oc is not None:
        await oc.wait_all()
        if oc.nacked:
            raise RuntimeError(f"{len(oc.nacked)} publishes nacked")


async def _confirming(conn: RawConnection) -> tuple[RawChannel, OutstandingConfirms]:
    ch = await conn.channel()
    await ch.confirm_select()
    oc = OutstandingConfirms()
    ch.on_confirm = oc.settle
    return ch, oc


async def _declare_many(ch: RawChannel, names: list[str], exclusive: bool) -> None:
    """queue.declare nowait for all, then one declare with a reply as the barrier."""
    for nm in names[:-1]:
        ch.send(C.Queue.Declare(queue=nm, exclusive=exclusive, nowait=True))
        if ch.conn.paused:
            await ch.conn.drain()
    await ch.call(C.Queue.Declare(queue=names[-1], exclusive=exclusive))


class Sweeps:
    """The workloads; each returns (messages, extra) and meters its section in ctx."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.body = b"x" * 100

    # -- queues 1 -> 10,000: publish with confirms round-robin over N queues ---------------
    async def queues(self, ctx: RunContext, n_queues: int) -> tuple[int, dict[str, Any]]:
        n = max(n_queues, 20_000 if self.quick else 50_000)
        conn = await _open(ctx.target.url, "ackmq-scaling-queues")
        extra: dict[str, Any] = {}
        try:
            ch, oc = await _confirming(conn)
            names = [f"{ctx.name()[:-9]}.{i}" for i in range(n_queues)]
            rss0 = _rss(ctx.target)
            t0 = time.perf_counter()
            await _declare_many(ch, names, exclusive=True)  # gone with the connection
            extra["declare_s"] = time.perf_counter() - t0
            await asyncio.sleep(1.0)
            rss1 = _rss(ctx.target)
            if rss0 is not None and rss1 is not None:
                extra["rss_per_queue_bytes"] = (rss1 - rss0) / n_queues
            extra["idle_cpu_pct"] = _idle_pct(ctx.target)  # with N queues and no traffic
            frames = [ch.publish_bytes("", nm, self.body, TRANSIENT) for nm in names]
            with ctx.measure():
                await _pump(conn, frames, n, oc)
        finally:
            await conn.close()
        return n, extra

    # -- connections 1 -> 1,000: each publishes its share with confirms to one queue --------
    async def connections(self, ctx: RunContext, n_conns: int) -> tuple[int, dict[str, Any]]:
        n = max(n_conns * 20, 20_000 if self.quick else 50_000)
        q = ctx.name()
        conns: list[RawConnection] = []
        extra: dict[str, Any] = {}
        try:
            t0 = time.perf_counter()
            for i in range(n_conns):
                conns.append(await _open(ctx.target.url, f"ackmq-scaling-c{i}"))
            extra["connect_ms_each"] = (time.perf_counter() - t0) / n_conns * 1e3
            chans = [await _confirming(c) for c in conns]
            await chans[0][0].declare_queue(q)
            share = n // n_conns
            n = share * n_conns
            with ctx.measure():
                await asyncio.gather(*(
                    _pump(c, [ch.publish_bytes("", q, self.body, TRANSIENT)], share, oc)
                    for c, (ch, oc) in zip(conns, chans, strict=True)))
        finally:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        return n, extra

    # -- message size 100 B -> 1 MiB: publish (confirms) and deliver (acks) end to end ------
    async def size(self, ctx: RunContext, size: int) -> tuple[int, dict[str, Any]]:
        budget = (20 if self.quick else 200) * 1024 * 1024
        n = max(100, min(50_000, budget // size))
        q = ctx.name()
        body = b"x" * size
        pub = await _open(ctx.target.url, "ackmq-scaling-size-pub")
        cons = await _open(ctx.target.url, "ackmq-scaling-size-cons")
        try:
            ch, oc = await _confirming(pub)
            await ch.declare_queue(q)
            got = 0
            done = asyncio.get_running_loop().create_future()
            cch = await cons.channel()
            await cch.qos(100)
            num = cch.number

            def on_deliver(tag: int, redelivered: bool, b: bytes) -> None:
                nonlocal got
                got += 1
                cons.queue(encode_ack(num, tag, False))
                if got >= n and not done.done():
                    done.set_result(None)

            cch.on_deliver = on_deliver
            await cch.consume(q)
            with ctx.measure():
                await _pump(pub, [ch.publish_bytes("", q, body, TRANSIENT)], n, oc)
                await asyncio.wait_for(done, 600)
        finally:
            await pub.close()
            await cons.close()
        return n, {"mb_per_s_is": "messages*size/wall"}

    # -- queue depth 0 -> 1 M: publish and drain at the head of a deep queue ----------------
    async def depth(self, ctx: RunContext, depth: int) -> tuple[int, dict[str, Any]]:
        n = 20_000 if self.quick else 50_000
        q = ctx.name()
        conn = await _open(ctx.target.url, "ackmq-scaling-depth")
        extra: dict[str, Any] = {}
        try:
            ch, oc = await _confirming(conn)
            await ch.declare_queue(q)
            frame = [ch.publish_bytes("", q, self.body, TRANSIENT)]
            t0 = time.perf_counter()
            await _pump(conn, frame, depth, oc)  # the fill, not measured
            extra["fill_s"] = time.perf_counter() - t0
            mark = ctx.mark()
            with ctx.measure():
                await _pump(conn, frame, n, oc)
            extra["publish_per_s"] = n / (ctx.wall_s - mark[0])
            cch = await conn.channel()
            await cch.qos(300)
            got = 0
            done = asyncio.get_running_loop().create_future()
            num = cch.number

            def on_deliver(tag: int, redelivered: bool, b: bytes) -> None:
                nonlocal got
                got += 1
                conn.queue(encode_ack(num, tag, False))
                if got >= n and not done.done():
                    done.set_result(None)

            cch.on_deliver = on_deliver
            mark2 = ctx.mark()
            with ctx.measure():
                tag = await cch.consume(q)
                await asyncio.wait_for(done, 600)
            extra["drain_per_s"] = n / (ctx.wall_s - mark2[0])
            await cch.cancel(tag)
        finally:
            await conn.close()
        return 2 * n, extra

    # -- consumers per queue 1 -> 100: drain a pre-filled queue, one channel each -----------
    async def consumers(self, ctx: RunContext, k: int) -> tuple[int, dict[str, Any]]:
        n = 20_000 if self.quick else 100_000
        q = ctx.name()
        conn = await _open(ctx.target.url, "ackmq-scaling-consumers")
        try:
            ch, oc = await _confirming(conn)
            await ch.declare_queue(q)
            await _pump(conn, [ch.publish_bytes("", q, self.body, TRANSIENT)], n, oc)
            got = 0
            done = asyncio.get_running_loop().create_future()
            chans = []
            for _ in range(k):
                cch = await conn.channel()
                await cch.qos(100)

                def on_deliver(tag: int, redelivered: bool, b: bytes,
                               num: int = cch.number) -> None:
                    nonlocal got
                    got += 1
                    conn.queue(encode_ack(num, tag, False))
                    if got >= n and not done.done():
                        done.set_result(None)

                cch.on_deliver = on_deliver
                chans.append(cch)
            with ctx.measure():
                for cch in chans:
                    cch.send(C.Basic.Consume(queue=q, nowait=True))
                await asyncio.wait_for(done, 600)
        finally:
            await conn.close()
        return n, {}


def _rss(target: Target) -> int | None:
    proc = target.process
    try:
        return proc.memory_info().rss if proc is not None else None
    except Exception:  # noqa: BLE001 - gone: no figure
        return None


def _idle_pct(target: Target, seconds: float = 1.0) -> float | None:
    proc = target.process
    if proc is None:
        return None
    a = proc.cpu_times()
    time.sleep(seconds)
    b = proc.cpu_times()
    return (b.user + b.system - a.user - a.system) / seconds * 100


SWEEPS: dict[str, tuple[list[int], list[int], str]] = {
    # name: (full points, --quick points, x label)
    "queues": ([1, 10, 100, 1000, 10_000], [1, 100, 1000], "queues"),
    "connections": ([1, 10, 100, 1000], [1, 10, 100], "publishing connections"),
    "size": ([100, 1024, 10_240, 102_400, 1_048_576], [100, 10_240, 1_048_576],
             "message size (bytes)"),
    "depth": ([0, 10_000, 100_000, 1_000_000], [0, 10_000, 100_000], "messages already queued"),
    "consumers": ([1, 10, 100], [1, 10, 100], "consumers on one queue"),
}


def run_point(sweeps: Sweeps, sweep: str, x: int, target: Target) -> Point:
    ctx = RunContext(f"scaling-{sweep}", target, Options())
    fn: Callable[[RunContext, int], Coroutine[Any, Any, tuple[int, dict[str, Any]]]] = \
        getattr(sweeps, sweep)
    try:
        msgs, extra = run_async(fn(ctx, x))
    finally:
        ctx.cleanup()
    return Point(sweep, x, target.label, msgs, ctx.wall_s, ctx.broker_cpu_s,
                 ctx.client_cpu_s, extra)


# -- one core against two --------------------------------------------------------------

def pin(target: Target, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of the broker (Erlang schedulers included)."""
    proc = target.process
    if proc is None:
        raise RuntimeError(f"{target.label}: no process to pin")
    for th in proc.threads():
        try:
            os.sched_setaffinity(th.id, cpus)
        except OSError:
            pass  # a thread that ended meanwhile


def taskset_runs(targets: list[Target], scale: float) -> list[dict[str, Any]]:
    """The CPU workloads (bench.cpu) on each broker at 1 core and at all cores."""
    from tools.perf.cpu import CPU_WORKLOADS, run_once

    every = set(range(os.cpu_count() or 1))
    out = []
    for name in ("publish", "deliver-ack", "confirm", "fanout"):
        for cores in ({0}, every):
            for t in targets:
                pin(t, cores)
                try:
                    r = run_once(CPU_WORKLOADS[name], t, scale)
                finally:
                    pin(t, every)
                r["cores"] = len(cores)
                out.append(r)
                print(f"taskset {name} on {t.label}, {len(cores)} core(s): "
                      f"{r['msgs_per_s']:,.0f} msgs/s, broker CPU {r['raw_us']:.1f} µs/msg, "
                      f"{r['broker_cpu_s'] / r['wall_s'] * 100:.0f}% of a core",
                      file=sys.stderr, flush=True)
    return out


# -- report --------------------------------------------------------------------------------

def plot(points: list[Point], sweep: str, xlabel: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, label in enumerate(dict.fromkeys(p.broker for p in points)):
        ps = sorted((p for p in points if p.broker == label), key=lambda p: p.x)
        xs = [max(p.x, 1) for p in ps]
        ys = [p.rate * (p.x if sweep == "size" else 1) / (1e6 if sweep == "size" else 1)
              for p in ps]
        color = f"C{i}"
        a1.plot(xs, ys, marker="o", color=color, label=label)
        a2.plot(xs, [p.cpu_us or 0 for p in ps], marker="o", color=color, label=label)
        a3.plot(xs, [100 * (p.broker_cpu_s or 0) / p.wall_s for p in ps], marker="o",
                color=color, label=f"{label} broker")
        a3.plot(xs, [100 * p.client_cpu_s / p.wall_s for p in ps], marker="x",
                linestyle="--", color=color, label=f"client (vs {label})")
    for ax in (a1, a2, a3):
        ax.set_xscale("symlog" if sweep == "depth" else "log")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    a1.set_ylabel("MB/s" if sweep == "size" else "msgs/s")
    a1.set_ylim(bottom=0)
    a2.set_ylabel("broker CPU µs / message")
    if sweep == "size":
        a2.set_yscale("log")
    else:
        a2.set_ylim(bottom=0)
    a3.set_ylabel("CPU, % of one core")
    a3.set_ylim(bottom=0)
    fig.suptitle(f"scaling: {xlabel}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(points: list[Point], labels: list[str]) -> str:
    lines = ["| sweep | x | " + " | ".join(f"{lb} msgs/s | {lb} µs/msg" for lb in labels)
             + " | ratio msgs/s |", "|---" * (3 + 2 * len(labels)) + "|"]
    for sweep in dict.fromkeys(p.sweep for p in points):
        for x in dict.fromkeys(p.x for p in points if p.sweep == sweep):
            cells, rates = [], []
            for lb in labels:
                p = next((p for p in points if p.sweep == sweep and p.x == x
                          and p.broker == lb), None)
                if p is None:
                    cells.append("– | –")
                    continue
                rates.append(p.rate)
                cpu = f"{p.cpu_us:.1f}" if p.cpu_us is not None else "n/a"
                cells.append(f"{p.rate:,.0f} | {cpu}")
            ratio = f"{rates[0] / rates[1]:.2f}" if len(rates) == 2 and rates[1] else "–"
            lines.append(f"| {sweep} | {x:,} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.perf.scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="*", help="default: " + ", ".join(SWEEPS)
                    + " (and taskset with --taskset); `taskset` alone runs only that")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller points (CI size)")
    ap.add_argument("--no-rabbitmq", action="store_true", help="ackmq alone")
    ap.add_argument("--taskset", action="store_true",
                    help="also run the CPU workloads on 1 core vs all cores per broker "
                         "(pins the running RabbitMQ's threads for a minute; restores them)")
    ap.add_argument("--out", type=Path, default=Path("."),
                    help="directory for scaling-<sweep>.png and scaling.json")
    args = ap.parse_args(argv)
    names = args.sweeps or list(SWEEPS)
    if "taskset" in names:
        args.taskset = True
        names.remove("taskset")
    bad = [s for s in names if s not in SWEEPS]
    if bad:
        print(f"unknown sweep(s): {', '.join(bad)}; choose from {', '.join(SWEEPS)}",
              file=sys.stderr)
        return 2
    try:
        targets = ackmq_and_rabbitmq(rabbitmq=not args.no_rabbitmq)
    except BenchSetupError as exc:
        print(f"scaling: {exc}", file=sys.stderr)
        return 2
    labels = [t.label for t in targets]
    sweeps = Sweeps(args.quick)
    points: list[Point] = []
    failures: list[str] = []
    tasks: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        for sweep in names:
            full, quick, xlabel = SWEEPS[sweep]
            for x in (quick if args.quick else full):
                for t in targets:
                    t0 = time.perf_counter()
                    try:
                        p = run_point(sweeps, sweep, x, t)
                    except Exception as exc:  # noqa: BLE001 - record it and go on
                        failures.append(f"{sweep} {x} on {t.label}: {type(exc).__name__}: {exc}")
                        print("FAILED " + failures[-1], file=sys.stderr, flush=True)
                        continue
                    points.append(p)
                    cpu = f"{p.cpu_us:.1f}" if p.cpu_us is not None else "n/a"
                    print(f"{sweep} {x:,} on {t.label}: {p.rate:,.0f} msgs/s, broker "
                          f"{cpu} µs/msg ({time.perf_counter() - t0:.0f} s with set-up)",
                          file=sys.stderr, flush=True)
            plot([p for p in points if p.sweep == sweep], sweep, xlabel,
                 args.out / f"scaling-{sweep}.png")
        if args.taskset:
            tasks = taskset_runs(targets, 0.2 if args.quick else 0.5)
    except KeyboardInterrupt:
        print("interrupted; reporting the points so far", file=sys.stderr)
    finally:
        for t in targets:
            t.close()
    print(table(points, labels), end="")
    for r in tasks:
        print(f"taskset {r['workload']} {r['broker']} {r['cores']} core(s): "
              f"{r['msgs_per_s']:,.0f} msgs/s, {r['raw_us']:.1f} µs/msg, "
              f"{r['broker_cpu_s'] / r['wall_s'] * 100:.0f}% CPU")
    for f in failures:
        print("failed: " + f)
    (args.out / "scaling.json").write_text(json.dumps({
        "command": " ".join(sys.argv), "started": started, "seconds": time.time() - started,
        "points": [asdict(p) | {"rate": p.rate, "cpu_us": p.cpu_us} for p in points],
        "taskset": tasks, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
