"""Throughput workloads: raw publish, consume (auto-ack and a prefetch sweep), fanout."""

from __future__ import annotations

import asyncio

from pamqp import commands

from ackmq.bench.context import RunContext, run_async
from ackmq.bench.pipeline import OutstandingConfirms, publish_pipelined
from ackmq.client.lowlevel import RawChannel, open_connection
from ackmq.protocol.amqp import encode_ack

TRANSIENT = 1


async def _wait_count(ch: RawChannel, q: str, n: int, timeout: float = 120.0) -> int:
    """Poll queue.declare(passive) until the queue holds n messages (or time runs out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    count = await ch.queue_count(q)
    while count < n and loop.time() < deadline:
        await asyncio.sleep(0.005)
        count = await ch.queue_count(q)
    return count


async def _publish(ctx: RunContext, n: int) -> None:
    q = ctx.name()
    body = b"x" * ctx.options.body_size
    async with ctx.channel() as ch:
        await ch.declare_queue(q)
        with ctx.measure():
            await publish_pipelined(ch, q, n, body, TRANSIENT)
            count = await _wait_count(ch, q, n)  # done = the broker holds them all
        ctx.extra["queued"] = count
        if count != n:
            raise RuntimeError(f"published {n}, queue holds {count}")


def publish(ctx: RunContext) -> None:
    """Transient 100-byte messages, no confirms, until the queue holds them all."""
    n = ctx.n(100_000)
    run_async(_publish(ctx, n))
    ctx.messages = n
    ctx.add("publish", n / ctx.wall_s, "msgs/s", "higher")


async def _prefill(ch: RawChannel, q: str, n: int, body: bytes) -> None:
    """Fill q with n transient messages, confirmed, so they are all there before timing."""
    await ch.declare_queue(q)
    await ch.confirm_select()
    oc = OutstandingConfirms()
    ch.on_confirm = oc.settle
    await publish_pipelined(ch, q, n, body, TRANSIENT, confirms=oc)


async def _drain(ctx: RunContext, q: str, n: int, prefetch: int | None) -> float:
    """Consume n messages from a pre-filled q; prefetch None = no-ack. Returns seconds."""
    body = b"x" * ctx.options.body_size
    pub = await open_connection(ctx.target.url, "ackmq-bench-prefill")
    try:
        await _prefill(await pub.channel(), q, n, body)
    finally:
        await pub.close()
    conn = await open_connection(ctx.target.url, "ackmq-bench-consumer")
    before = ctx.wall_s
    try:
        ch = await conn.channel()
        no_ack = prefetch is None
        if not no_ack:
            await ch.qos(prefetch or 0)
        done = asyncio.get_running_loop().create_future()
        got = 0
        queue_out = conn.queue
        num = ch.number

        def on_deliver(tag: int, redelivered: bool, body: bytes) -> None:
            nonlocal got
            got += 1
            if not no_ack:
                queue_out(encode_ack(num, tag, False))  # one ack per message, flushed per read
            if got >= n and not done.done():
                done.set_result(None)

        ch.on_deliver = on_deliver
        with ctx.measure():
            tag = await ch.consume(q, no_ack=no_ack)
            await asyncio.wait_for(done, 600)
        await ch.cancel(tag)
    finally:
        await conn.close()
    return ctx.wall_s - before


def consume_auto(ctx: RunContext) -> None:
    """Automatic acknowledgement (no-ack) from a pre-filled queue."""
    n = ctx.n(50_000)
    secs = run_async(_drain(ctx, ctx.name(), n, None))
    ctx.messages = n
    ctx.add("consume-auto", n / secs, "msgs/s", "higher")


def consume_prefetch(ctx: RunContext) -> None:
    """Manual acks (one per message) at each prefetch of the sweep; 0 = unlimited."""
    n = ctx.n(20_000)

    async def sweep() -> None:
        for p in ctx.options.prefetch:
            mark = ctx.mark()
            secs = await _drain(ctx, ctx.name(), n, p)
            ctx.add(f"consume-prefetch/{p}", n / secs, "msgs/s", "higher", since=mark)

    run_async(sweep())
    ctx.messages = n  # per prefetch value


FANOUT_QUEUES = 10


async def _fanout(ctx: RunContext, n: int) -> None:
    x = ctx.name("x")
    queues = [ctx.name() for _ in range(FANOUT_QUEUES)]
    body = b"x" * ctx.options.body_size
    cons = await open_connection(ctx.target.url, "ackmq-bench-consumers")
    pub = await open_connection(ctx.target.url, "ackmq-bench-publisher")
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    total = n * FANOUT_QUEUES
    got = 0
    try:
        pch = await pub.channel()
        await pch.call(commands.Exchange.Declare(exchange=x, exchange_type="fanout"))
        for q in queues:
            ch = await cons.channel()
            await ch.declare_queue(q)
            await ch.call(commands.Queue.Bind(queue=q, exchange=x))
            await ch.qos(300)

            def on_deliver(tag: int, redelivered: bool, body: bytes,
                           num: int = ch.number) -> None:
                nonlocal got
                got += 1
                cons.queue(encode_ack(num, tag, False))
                if got >= total and not done.done():
                    done.set_result(None)

            ch.on_deliver = on_deliver
            await ch.consume(q)
        with ctx.measure():
            await publish_pipelined(pch, "", n, body, TRANSIENT, exchange=x)
            await asyncio.wait_for(done, 600)
    finally:
        await pub.close()
        await cons.close()


def fanout(ctx: RunContext) -> None:
    """One publish to a fanout exchange reaches 10 queues, each with its own consumer."""
    n = ctx.n(20_000)
    run_async(_fanout(ctx, n))
    ctx.messages = n
    ctx.add("fanout", n * FANOUT_QUEUES / ctx.wall_s, "deliveries/s", "higher")
    ctx.extra["publishes_per_s"] = n / ctx.wall_s
