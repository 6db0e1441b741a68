"""RabbitMQ's stream protocol (X1-X3) with rstream, ackmq against RabbitMQ's stream
plugin in the same run: publish `--messages` messages with confirms (rstream's
Producer.send, batched by its background task, confirms awaited at the end), then
consume the stream from `first` (rstream's Consumer, credit one chunk at a time as
rstream does). An `ackmq serve` of its own is started with a free stream port.

    python -m tools.perf.stream_protocol [--messages 100000] [--size 1024]
                                         [--rabbitmq-port 5552 | --no-rabbitmq]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
import uuid
from pathlib import Path

from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
)

from tools.harness.ownbroker import OwnBroker


async def publish(port: int, stream: str, n: int, size: int,
                  publisher_name: str | None = None) -> float:
    """N messages with confirms; `publisher_name`: as a named (deduplicated) publisher."""
    body = b"x" * size
    confirmed = 0
    done = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed
        confirmed += 1
        if confirmed == n:
            done.set()

    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.create_stream(stream, exists_ok=True)
        t0 = time.perf_counter()
        for _ in range(n):
            await p.send(stream, AMQPMessage(body=body), on_publish_confirm=on_confirm,
                         publisher_name=publisher_name)
        await asyncio.wait_for(done.wait(), 600)
        return time.perf_counter() - t0


async def consume(port: int, stream: str, n: int) -> float:
    got = 0
    done = asyncio.Event()

    async def on(_msg: bytes, _ctx: MessageContext) -> None:
        nonlocal got
        got += 1
        if got == n:
            done.set()

    c = Consumer("127.0.0.1", port=port, username="guest", password="guest")
    await c.start()
    t0 = time.perf_counter()
    await c.subscribe(stream, on, offset_specification=ConsumerOffsetSpecification(
        OffsetType.FIRST), initial_credit=10)
    await asyncio.wait_for(done.wait(), 600)
    took = time.perf_counter() - t0
    await c.close()
    return took


async def cleanup(port: int, stream: str) -> None:
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as p:
        await p.delete_stream(stream, missing_ok=True)


def run_one(label: str, port: int, n: int, size: int) -> tuple[float, float]:
    stream = f"perf-{uuid.uuid4().hex[:8]}"
    pub = asyncio.run(publish(port, stream, n, size))
    con = asyncio.run(consume(port, stream, n))
    asyncio.run(cleanup(port, stream))
    print(f"{label:10s} publish {n / pub:10,.0f} msg/s   consume from first "
          f"{n / con:10,.0f} msg/s", flush=True)
    return n / pub, n / con


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rabbitmq-port", type=int, default=5552)
    ap.add_argument("--no-rabbitmq", action="store_true")
    args = ap.parse_args()
    own = OwnBroker(["--stream-port", "0"], None, stomp=False)
    own.start()
    try:
        text = Path(own.log_path).read_text(errors="replace")
        port = int(re.findall(r"rabbitmq-stream://\S+:(\d+)", text)[-1])
        a = run_one("ackmq", port, args.messages, args.size)
        if not args.no_rabbitmq:
            r = run_one("RabbitMQ", args.rabbitmq_port, args.messages, args.size)
            print(f"ackmq / RabbitMQ: publish {a[0] / r[0]:.2f}x, consume {a[1] / r[1]:.2f}x")
    finally:
        own.stop()


if __name__ == "__main__":
    main()
