"""kill -9 with persistent delayed messages pending (issue 27, SPEC L2): publish N
confirmed persistent messages to a durable `x-delayed-message` exchange with delays
spread over [min, max] seconds, kill -9 the broker while most are pending, restart it
on the same data dir and drain the queue: every message must arrive exactly once, and
none before its due time (those due after the kill, which only the restarted broker can
fire). The suite runs a 3,000-message version (tests/test_delayed_durability.py).

    python -m tools.robustness.delaykill -n 100000 --min 1 --max 60 [--kills 1]

Prints one JSON line: published, received, lost, duplicates, early, lateness
percentiles (receipt minus due time, ms: includes the restart and the drain; not a
speed figure on a busy machine). Exit 1 when anything was lost, duplicated or early.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import aio_pika

from tools.harness.ownbroker import OwnBroker, log_trouble

EXCHANGE, QUEUE = "delaykill.x", "delaykill.q"


async def publish(url: str, n: int, lo: float, hi: float, seed: int) -> list[float]:
    """Publish n messages (confirmed, 1,000 in flight); returns each one's due time."""
    rnd = random.Random(seed)
    conn = await aio_pika.connect(url)
    ch = await conn.channel(publisher_confirms=True)
    ex = await ch.declare_exchange(EXCHANGE, "x-delayed-message", durable=True,
                                   arguments={"x-delayed-type": "direct"})
    q = await ch.declare_queue(QUEUE, durable=True)
    await q.bind(ex, "k")
    due: list[float] = []
    for start in range(0, n, 1000):
        batch = []
        for i in range(start, min(n, start + 1000)):
            ms = rnd.randint(int(lo * 1000), int(hi * 1000))
            due.append(time.time() + ms / 1000.0)
            batch.append(ex.publish(aio_pika.Message(
                str(i).encode(), headers={"x-delay": ms},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "k"))
        await asyncio.gather(*batch)
    await conn.close()
    return due


async def drain(url: str, n: int, until: float, got: dict[int, float],
                dups: list[int], leftover: list[int]) -> None:
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=1000)
    q = await ch.declare_queue(QUEUE, durable=True)
    done = asyncio.Event()

    async def on(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        i = int(msg.body)
        if i in got:
            dups.append(i)
        got.setdefault(i, time.time())
        await msg.ack()
        if len(got) >= n:
            done.set()

    await q.consume(on)
    last, last_n = time.time(), 0
    while len(got) < n:  # until all came, or none for a minute once all are due
        await asyncio.sleep(1.0)
        if len(got) != last_n:
            last, last_n = time.time(), len(got)
        elif time.time() > until and time.time() - last > 60:
            break
    await asyncio.sleep(2.0)  # anything more is a duplicate
    left = await ch.declare_queue(QUEUE, durable=True, passive=True)
    leftover.append(left.declaration_result.message_count)
    await conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100000)
    ap.add_argument("--min", type=float, default=1.0, help="shortest delay, s")
    ap.add_argument("--max", type=float, default=60.0, help="longest delay, s")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--kill-after", type=float, default=0.5,
                    help="seconds after the last confirm")
    args = ap.parse_args()
    b = OwnBroker([])
    try:
        url = b.start()
        t0 = time.time()
        due = asyncio.run(publish(url, args.n, args.min, args.max, args.seed))
        published_s = time.time() - t0
        time.sleep(args.kill_after)
        killed_at = time.time()
        b.kill()
        url = b.start(timeout=600)
        got: dict[int, float] = {}
        dups: list[int] = []
        leftover: list[int] = []
        asyncio.run(drain(url, args.n, max(due) + 5, got, dups, leftover))
        early = [i for i, at in got.items() if due[i] > killed_at and at < due[i] - 0.002]
        late = sorted((at - due[i]) * 1000 for i, at in got.items())

        def pct(p: float) -> float:
            return round(late[min(len(late) - 1, int(p * len(late)))], 1) if late else 0.0

        out = {"published": args.n, "publish_s": round(published_s, 1),
               "received": len(got), "lost": args.n - len(got), "duplicates": len(dups),
               "left_in_queue": leftover[0] if leftover else None,
               "early": len(early), "late_ms_p50": pct(0.5), "late_ms_p99": pct(0.99),
               "late_ms_max": round(late[-1], 1) if late else 0.0,
               "log_trouble": log_trouble(b.log_path)[:5]}
        print(json.dumps(out))
        return 1 if out["lost"] or dups or early or out["log_trouble"] else 0
    finally:
        b.stop()


if __name__ == "__main__":
    sys.exit(main())
