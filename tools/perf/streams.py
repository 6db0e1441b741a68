"""Stream queues (R1-R3) over AMQP 0-9-1, ackmq against RabbitMQ in the same run:
publish with confirms (a window of unconfirmed publishes), then consume the whole
stream from `first` with a prefetch and multiple acks; plus the broker's RSS before
and after filling the stream (a stream must cost no memory per message).

    python -m tools.perf.streams [--messages 200000] [--size 1024] [--window 1000]
                                  [--prefetch 1000] [--rabbitmq URL | --no-rabbitmq]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from pamqp import commands as C

from ackmq.bench.brokers import Target, local_rabbitmq, start_ackmq
from ackmq.client.lowlevel import open_connection


async def publish(url: str, stream: str, n: int, size: int, window: int,
                  queue_type: str = "stream") -> float:
    """Seconds to publish `n` persistent messages, all confirmed."""
    conn = await open_connection(url, connection_name="stream-bench-publish")
    ch = await conn.channel()
    await ch.declare_queue(stream, durable=True, arguments={"x-queue-type": queue_type})
    await ch.confirm_select()
    done = asyncio.get_running_loop().create_future()
    state = {"sent": 0, "confirmed": 0}
    frame = ch.publish_bytes("", stream, b"x" * size, delivery_mode=2)
    batch = 100

    def fill() -> None:
        room = window - (state["sent"] - state["confirmed"])
        k = min(room, n - state["sent"])
        if k >= batch or (k > 0 and state["sent"] + k == n):
            conn.write(frame * k)
            state["sent"] += k

    def on_confirm(tag: int, multiple: bool, ack: bool) -> None:
        if not ack:
            raise RuntimeError("a publish was nacked")
        state["confirmed"] = tag if multiple else max(state["confirmed"], tag)
        if state["confirmed"] >= n:
            if not done.done():
                done.set_result(None)
        else:
            fill()

    ch.on_confirm = on_confirm
    t0 = time.perf_counter()
    fill()
    await asyncio.wait_for(done, 600)
    dt = time.perf_counter() - t0
    await conn.close()
    return dt


async def consume(url: str, stream: str, n: int, prefetch: int,
                  queue_type: str = "stream") -> float:
    """Seconds to read `n` messages from `first`, acking every prefetch/4."""
    conn = await open_connection(url, connection_name="stream-bench-consume")
    ch = await conn.channel()
    await ch.qos(prefetch)
    done = asyncio.get_running_loop().create_future()
    every = max(1, prefetch // 4)
    state = {"got": 0}

    def on_deliver(tag: int, redelivered: bool, body: bytes) -> None:
        state["got"] += 1
        if state["got"] % every == 0 or state["got"] >= n:
            conn.queue(ch.ack_bytes(tag, multiple=True))
        if state["got"] >= n and not done.done():
            done.set_result(None)

    ch.on_deliver = on_deliver
    t0 = time.perf_counter()
    args = {"x-stream-offset": "first"} if queue_type == "stream" else {}
    await ch.call(C.Basic.Consume(queue=stream, arguments=args))
    await asyncio.wait_for(done, 600)
    dt = time.perf_counter() - t0
    await conn.close()
    return dt


async def delete(url: str, stream: str) -> None:
    conn = await open_connection(url)
    ch = await conn.channel()
    await ch.call(C.Queue.Delete(queue=stream))
    await conn.close()


def rss_mib(target: Target) -> float | None:
    p = target.process
    return None if p is None else p.memory_info().rss / 2**20


async def run(target: Target, n: int, size: int, window: int, prefetch: int,
              queue_type: str = "stream") -> dict[str, Any]:
    stream = f"bench.{queue_type}.{uuid.uuid4().hex[:8]}"
    rss0 = rss_mib(target)
    pub = await publish(target.url, stream, n, size, window, queue_type)
    rss1 = rss_mib(target)
    con = await consume(target.url, stream, n, prefetch, queue_type)
    rss2 = rss_mib(target)
    await delete(target.url, stream)
    return {"publish": n / pub, "consume": n / con, "rss": (rss0, rss1, rss2)}


def add_broker_args(ap: argparse.ArgumentParser) -> None:
    """--ackmq / --rabbitmq / --no-rabbitmq, shared by the stream benches."""
    ap.add_argument("--ackmq", default="", help="an ackmq URL (default: start one)")
    ap.add_argument("--rabbitmq", default="", help="RabbitMQ's URL (default: local 5672)")
    ap.add_argument("--no-rabbitmq", action="store_true")


def broker_targets(a: argparse.Namespace) -> list[Target]:
    """ackmq (the given URL, or one started here), then the local RabbitMQ unless
    --no-rabbitmq."""
    targets: list[Target] = []
    ack = Target(a.ackmq, label="ackmq") if a.ackmq else start_ackmq()
    ack.label = "ackmq"
    targets.append(ack)
    if not a.no_rabbitmq:
        rmq = local_rabbitmq(url=a.rabbitmq or None)
        rmq.label = "RabbitMQ"
        targets.append(rmq)
    return targets


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.perf.streams", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=1000, help="unconfirmed publishes at most")
    ap.add_argument("--prefetch", type=int, default=1000)
    add_broker_args(ap)
    ap.add_argument("--queue-type", default="stream", choices=("stream", "classic"),
                    help="classic: the same run on a classic queue, for comparison")
    a = ap.parse_args(argv)
    targets = broker_targets(a)
    results = {}
    try:
        for t in targets:
            results[t.label] = asyncio.run(run(t, a.messages, a.size, a.window, a.prefetch,
                                                 a.queue_type))
            r = results[t.label]
            rss = ", ".join("-" if x is None else f"{x:.0f}" for x in r["rss"])
            print(f"{t.label:9} publish+confirm {r['publish']:>9,.0f} msg/s   consume from "
                  f"first {r['consume']:>9,.0f} msg/s   RSS MiB before/filled/read {rss}",
                  flush=True)
    finally:
        for t in targets:
            t.close()
    if len(results) == 2:
        x, y = results["ackmq"], results["RabbitMQ"]
        print(f"ackmq / RabbitMQ: publish {x['publish'] / y['publish']:.2f}x, consume "
              f"{x['consume'] / y['consume']:.2f}x ({a.messages:,} x {a.size} B, window "
              f"{a.window}, prefetch {a.prefetch})")


if __name__ == "__main__":
    main()
