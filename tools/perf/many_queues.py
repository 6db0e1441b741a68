"""10,000 durable queues with a consumer each (issue 23): the broker's memory with them,
and its start-up time when it restarts with them on disk.

    python -m tools.perf.many_queues --queues 10000 --connections 100

Steps: an `ackmq serve` of our own (fsync on); RSS after start; `--connections`
connections declare the durable queues (each holding one persistent message) and
consume from them (one channel each, one consumer per queue, prefetch 1); RSS with
them; all closed; the broker stopped (SIGTERM) and started again on its data dir: the
time until it listens and its RSS then, and once more after a kill -9 (recovery).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from tools.harness.ownbroker import OwnBroker
from tools.harness.rawpeer import rss_of


async def load(url: str, queues: int, connections: int) -> tuple[float, int]:
    """Declare the queues and put a consumer on each; returns (seconds, deliveries)
    and keeps the connections until the caller's RSS sample (returned via a future)."""
    import aio_pika
    delivered = 0
    per = (queues + connections - 1) // connections
    conns = []

    async def one(c: int) -> None:
        nonlocal delivered
        conn = await aio_pika.connect(url, timeout=120)
        conns.append(conn)
        ch = await conn.channel(publisher_confirms=False)
        await ch.set_qos(prefetch_count=1)

        def got(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal delivered
            delivered += 1

        for i in range(c * per, min(queues, (c + 1) * per)):
            q = await ch.declare_queue(f"many.{i}", durable=True)
            await ch.default_exchange.publish(aio_pika.Message(
                b"m", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=q.name)
            await q.consume(got, no_ack=True)

    started = time.monotonic()
    sem = asyncio.Semaphore(20)

    async def limited(c: int) -> None:
        async with sem:
            await one(c)

    await asyncio.gather(*(limited(c) for c in range(connections)))
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 60
    while delivered < queues and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    load.conns = conns  # type: ignore[attr-defined]
    return elapsed, delivered


def rss_quiet(pid: int, seconds: float = 3.0) -> float:
    time.sleep(seconds)
    return round(rss_of(pid) / 2**20, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.perf.many_queues", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--connections", type=int, default=100)
    p.add_argument("--work-dir", help="data dir and log (default: new under /var/tmp)")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    from pathlib import Path
    own = OwnBroker([], Path(args.work_dir) if args.work_dir else None)
    out: dict[str, object] = {"queues": args.queues, "connections": args.connections}
    try:
        t0 = time.monotonic()
        url = own.start()
        out["first_start_s"] = round(time.monotonic() - t0, 2)
        out["rss_empty_mib"] = rss_quiet(own.pid)

        async def go() -> None:
            elapsed, delivered = await load(url, args.queues, args.connections)
            out["declare_and_consume_s"] = round(elapsed, 1)
            out["delivered"] = delivered
            out["rss_with_consumers_mib"] = await asyncio.to_thread(rss_quiet, own.pid)
            for c in load.conns:  # type: ignore[attr-defined]
                await c.close()

        asyncio.run(go())
        out["rss_after_close_mib"] = rss_quiet(own.pid)
        for how in ("stop", "kill"):
            if how == "stop":
                own.terminate()
            else:
                own.kill()
            t0 = time.monotonic()
            own.start(timeout=600)
            out[f"restart_after_{how}_s"] = round(time.monotonic() - t0, 2)
            out[f"rss_after_{how}_restart_mib"] = rss_quiet(own.pid)
    finally:
        own.stop()
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
