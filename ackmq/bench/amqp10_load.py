"""AMQP 1.0 workloads (`ackmq bench amqp10-*`), on the AMQP port of the broker under test
(ackmq, and RabbitMQ with its AMQP 1.0 plugin: `--rabbitmq`). Durable queues are declared
over 0-9-1 and addressed as `/amq/queue/<name>` (RabbitMQ 3's v1 form, which ackmq reads
too). Every message is durable; the send workloads check the queue holds all n after.

    amqp10-send-outcome   unsettled durable transfers, wait for each outcome (total ms)
    amqp10-send-stream    unsettled durable transfers within link credit, every outcome
                          awaited at the end (msgs/s)
    amqp10-receive        a pre-filled queue drained with link credit 500, accepting in
                          ranges of 100 (msgs/s)
"""

from __future__ import annotations

import asyncio

from ackmq.bench.amqp10_wire import Amqp10Connection
from ackmq.bench.context import RUN_TIMEOUT, RunContext, run_async, run_rate
from ackmq.protocol.amqp10 import Composite
from ackmq.protocol.amqp10.message import DATA, Message10

RECEIVE_CREDIT = 500


def _payload(size: int) -> bytes:
    return Message10(header=Composite("header", durable=True),
                     body=[(DATA, b"x" * size)]).encode()


async def _declare(ctx: RunContext) -> str:
    q = ctx.name()
    async with ctx.channel() as ch:
        await ch.declare_queue(q)
    return q


async def _count(ctx: RunContext, q: str) -> int:
    async with ctx.channel() as ch:
        return await ch.queue_count(q)


async def _send(ctx: RunContext, n: int, wait_each: bool) -> None:
    q = await _declare(ctx)
    payload = _payload(ctx.options.body_size)
    c = await Amqp10Connection.open(ctx.target.url)
    try:
        await c.attach_sender(f"/amq/queue/{q}")
        with ctx.measure():
            futs = []
            for _ in range(n):
                fut = await c.send(payload)
                if wait_each:
                    if await fut != "accepted":
                        raise RuntimeError(f"outcome {fut.result()}")
                else:
                    futs.append(fut)
            outcomes = await asyncio.gather(*futs)
        if any(o != "accepted" for o in outcomes):
            raise RuntimeError("not every message was accepted")
    finally:
        await c.close()
    count = await _count(ctx, q)
    ctx.extra["queued"] = count
    if count != n:
        raise RuntimeError(f"sent {n}, queue holds {count}")


def send_outcome(ctx: RunContext) -> None:
    n = ctx.n(5_000)
    run_async(asyncio.wait_for(_send(ctx, n, True), RUN_TIMEOUT))
    ctx.messages = n
    ctx.add("amqp10-send-outcome", ctx.wall_s * 1e3, "ms", "lower")


def send_stream(ctx: RunContext) -> None:
    run_rate(ctx, "amqp10-send-stream", 50_000, lambda c, n: _send(c, n, False))


async def _receive(ctx: RunContext, n: int) -> None:
    q = await _declare(ctx)
    payload = _payload(ctx.options.body_size)
    c = await Amqp10Connection.open(ctx.target.url)
    try:  # prefill over 1.0, untimed
        await c.attach_sender(f"/amq/queue/{q}")
        await asyncio.gather(*[await c.send(payload) for _ in range(n)])
        done = asyncio.get_running_loop().create_future()
        got = 0
        first: int | None = None  # the first delivery not yet accepted

        def on_transfer(p: Composite, _payload: bytes) -> None:
            nonlocal got, first
            did = int(p.delivery_id)
            if first is None:
                first = did
            got += 1
            if got % 100 == 0 or got == n:
                c.accept(first, did)
                first = None
            if got % (RECEIVE_CREDIT // 2) == 0:
                c.flow(RECEIVE_CREDIT, got)
            if got >= n and not done.done():
                done.set_result(None)

        c.on_transfer = on_transfer
        with ctx.measure():
            c.attach_receiver(f"/amq/queue/{q}", RECEIVE_CREDIT)
            await done
    finally:
        await c.close()


def receive(ctx: RunContext) -> None:
    run_rate(ctx, "amqp10-receive", 50_000, _receive)
