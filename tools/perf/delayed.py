"""Delayed delivery at scale (issue 27): N pending persistent delayed messages — the
broker's RSS and its growth per pending message, the publish rate, and lateness
(receipt minus due time) p50/p99/max while they fall due at a set rate; the same load on
RabbitMQ through a TTL+DLX ladder (plain RabbitMQ's only way to delay) side by side.

    python -m tools.perf.delayed -n 1000000 --due-rate 10000            # own ackmq
    python -m tools.perf.delayed -n 1000000 --due-rate 10000 --url amqp://...  # any ackmq
    python -m tools.perf.delayed -n 1000000 --due-rate 10000 --ladder \\
        --url amqp://guest:guest@127.0.0.1:5672/ --pid $(pgrep -f beam.smp)     # RabbitMQ

Every message is due within one window of N / due-rate seconds that starts --lead
seconds after the publishing is expected to end (--lead, default 60 s: the publish must
finish before the first is due, or the lateness measures the publisher). ackmq: one
durable `x-delayed-message` exchange, `x-delay` per message. The ladder: one queue per
whole second of delay (`x-message-ttl` = that delay, dead-lettering to the target
queue), each message to the queue of its delay rounded up — lateness then includes up to
one second of rounding, which is the ladder's cost, not noise. RSS is read from
/proc/<pid>/status (the broker's pid: own broker, or --pid). Prints one JSON line.
Not a timed test: run it on a quiet machine (the lead does, at the end of issue 27).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import aio_pika

X, Q = "perf.delayed.x", "perf.delayed.q"


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def rss(pid: int | None) -> int:
    if pid is None:
        return 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def setup(ch: aio_pika.abc.AbstractChannel, ladder: bool, seconds: int) -> None:
    q = await ch.declare_queue(Q, durable=True)
    if not ladder:
        ex = await ch.declare_exchange(X, "x-delayed-message", durable=True,
                                       arguments={"x-delayed-type": "direct"})
        await q.bind(ex, "k")
        return
    for s in range(1, seconds + 1):
        await ch.declare_queue(f"{Q}.ttl.{s}", durable=True, arguments={
            "x-message-ttl": s * 1000, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": Q})


async def run(args: argparse.Namespace, pid: int | None) -> dict:
    conn = await aio_pika.connect(args.url)
    ch = await conn.channel(publisher_confirms=True)
    window = args.n / args.due_rate
    expected_publish = args.n / args.publish_guess
    await setup(ch, args.ladder, math.ceil(expected_publish + args.lead + window) + 1)
    rss0 = rss(pid)
    start_due = time.time() + expected_publish + args.lead
    ex = ch.default_exchange if args.ladder else await ch.get_exchange(X)
    body_pad = b"x" * max(0, args.size - 20)
    t0 = time.time()
    for start in range(0, args.n, 1000):
        batch = []
        now = time.time()
        for i in range(start, min(args.n, start + 1000)):
            due = start_due + i / args.due_rate
            ms = max(1, int((due - now) * 1000))
            body = f"{due:.3f}".encode() + b" " + body_pad
            if args.ladder:
                secs = math.ceil(ms / 1000)
                batch.append(ex.publish(aio_pika.Message(
                    body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    f"{Q}.ttl.{secs}"))
            else:
                batch.append(ex.publish(aio_pika.Message(
                    body, headers={"x-delay": ms},
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "k"))
        await asyncio.gather(*batch)
        if (start + 1000) % 100_000 == 0:
            progress(f"published {start + 1000:,} ({(start + 1000) / (time.time() - t0):,.0f}/s)")
    publish_s = time.time() - t0
    progress(f"all {args.n:,} published in {publish_s:.1f} s; the first is due in "
             f"{start_due - time.time():.0f} s, the last in {start_due + window - time.time():.0f} s")
    rss1 = rss(pid)
    late: list[float] = []
    done = asyncio.Event()
    cch = await conn.channel()
    await cch.set_qos(prefetch_count=2000)
    q = await cch.get_queue(Q)

    async def on(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        late.append((time.time() - float(msg.body.split(b" ", 1)[0])) * 1000)
        await msg.ack()
        if len(late) >= args.n:
            done.set()

    await q.consume(on)

    async def report() -> None:
        while not done.is_set():
            await asyncio.sleep(10)
            progress(f"received {len(late):,} of {args.n:,}")

    reporter = asyncio.ensure_future(report())
    try:
        await asyncio.wait_for(done.wait(), start_due + window + 600 - time.time())
    except TimeoutError:
        pass
    reporter.cancel()
    await conn.close()
    late.sort()

    def pct(p: float) -> float:
        return round(late[min(len(late) - 1, int(p * len(late)))], 1) if late else 0.0

    return {"broker": "rabbitmq-ttl-ladder" if args.ladder else "ackmq-delayed-exchange",
            "n": args.n, "due_rate": args.due_rate, "publish_s": round(publish_s, 1),
            "publish_rate": round(args.n / publish_s), "received": len(late),
            "rss_before": rss0, "rss_pending": rss1,
            "rss_bytes_per_pending": round((rss1 - rss0) / args.n, 1) if pid else None,
            "late_ms_p50": pct(0.5), "late_ms_p99": pct(0.99),
            "late_ms_max": round(late[-1], 1) if late else None,
            "publish_finished_before_first_due": t0 + publish_s < start_due}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=1000000)
    ap.add_argument("--due-rate", type=float, default=10000.0, help="messages due per s")
    ap.add_argument("--lead", type=float, default=60.0)
    ap.add_argument("--publish-guess", type=float, default=20000.0,
                    help="expected publish rate (msg/s), to place the due window")
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    ap.add_argument("--url", default=None, help="a running broker (default: own ackmq)")
    ap.add_argument("--pid", type=int, default=None, help="its pid, for RSS")
    ap.add_argument("--ladder", action="store_true", help="RabbitMQ TTL+DLX ladder")
    args = ap.parse_args()
    own = None
    pid = args.pid
    if args.url is None:
        from tools.harness.ownbroker import OwnBroker
        own = OwnBroker([])
        args.url = own.start()
        pid = own.pid
    try:
        print(json.dumps(asyncio.run(run(args, pid))))
    finally:
        if own is not None:
            own.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
