"""RabbitMQ's stream protocol workloads (`ackmq bench stream-*`), on the stream listener
of each broker under test: ackmq's own (`--stream-port 0`, from its log line) and
RabbitMQ's stream plugin (5552 on its AMQP host). Messages are AMQP 1.0 encoded (one
data section, as stream clients send them); the stream is created fresh and deleted
after.

    stream-publish   a publisher sends Publish frames of 100 messages within a window
                     of 10,000 unconfirmed, every confirm awaited (msgs/s)
    stream-consume   a pre-filled stream read from `first` with credit 10, one credit
                     back per chunk, as rstream does (msgs/s)
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote, urlsplit

from ackmq.bench.context import RunContext, run_rate
from ackmq.bench.stream_wire import StreamConnection
from ackmq.bench.wire import parse_url
from ackmq.protocol.amqp10.message import DATA, Message10

BATCH = 100
WINDOW = 10_000
CREDIT = 10
RABBITMQ_STREAM_PORT = 5552


def _url(ctx: RunContext) -> str:
    """The target's stream listener with its AMQP URL's user, password and vhost."""
    t = ctx.target
    amqp = parse_url(t.url)
    if t.stream_url:
        u = urlsplit(t.stream_url)
        host, port = u.hostname or amqp.host, u.port or RABBITMQ_STREAM_PORT
    elif "rabbitmq" in (t.product or t.label).lower():
        host, port = amqp.host, RABBITMQ_STREAM_PORT
    else:
        raise RuntimeError(f"{t.label} has no stream-protocol listener known to the bench")
    return (f"rabbitmq-stream://{quote(amqp.user, safe='')}:{quote(amqp.password, safe='')}"
            f"@{host}:{port}/{quote(amqp.vhost, safe='')}")


async def _publish(c: StreamConnection, stream: str, n: int, size: int) -> None:
    """n messages in Publish frames of BATCH, at most WINDOW unconfirmed; returns once
    every one is confirmed."""
    payload = Message10(body=[(DATA, b"x" * size)]).encode()
    state = {"confirmed": 0}
    room = asyncio.Event()
    done = asyncio.Event()

    def on_confirm(k: int) -> None:
        state["confirmed"] += k
        room.set()
        if state["confirmed"] >= n:
            done.set()

    c.on_confirm = on_confirm
    await c.declare_publisher(1, stream)
    sent = 0
    while sent < n:
        while sent - state["confirmed"] >= WINDOW:
            room.clear()
            await room.wait()
        k = min(BATCH, n - sent)
        c.publish(1, sent + 1, [payload] * k)
        sent += k
        await c.drain()
    await done.wait()


async def _run_publish(ctx: RunContext, n: int) -> None:
    stream = ctx.name()
    c = await StreamConnection.open(_url(ctx))
    try:
        await c.create(stream)
        with ctx.measure():
            await _publish(c, stream, n, ctx.options.body_size)
        await c.delete(stream)
    finally:
        await c.close()


async def _run_consume(ctx: RunContext, n: int) -> None:
    stream = ctx.name()
    c = await StreamConnection.open(_url(ctx))
    try:
        await c.create(stream)
        await _publish(c, stream, n, ctx.options.body_size)  # untimed
        got = {"n": 0}
        done = asyncio.Event()

        def on_chunk(sub: int, records: int) -> None:
            got["n"] += records
            c.credit(sub)
            if got["n"] >= n:
                done.set()

        c.on_chunk = on_chunk
        with ctx.measure():
            await c.subscribe(1, stream, CREDIT)
            await done.wait()
        ctx.extra["consumed"] = got["n"]
        await c.delete(stream)
    finally:
        await c.close()


def publish(ctx: RunContext) -> None:
    run_rate(ctx, "stream-publish", 50_000, _run_publish)


def consume(ctx: RunContext) -> None:
    run_rate(ctx, "stream-consume", 50_000, _run_consume)
