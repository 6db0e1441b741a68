"""STOMP workloads (`ackmq bench --stomp`): receipts, streams and consumers over STOMP 1.2.

Every message's body starts with its sequence number, so every run checks that each of
its n messages arrived exactly once (the send workloads drain their queue afterwards,
untimed): a broker that drops or duplicates fails the run instead of winning it.
Destinations are `/queue/ackmq-bench.<workload>.<id>`: a durable queue on ackmq,
RabbitMQ and ActiveMQ alike; "persistent" means the `persistent:true` header.
"""

from __future__ import annotations

import asyncio

from ackmq.bench.context import RUN_TIMEOUT, RunContext, run_async
from ackmq.bench.stomp_wire import StompWireConnection
from ackmq.bench.tally import Tally as _Tally
from ackmq.bench.tally import seq_body as _body
from ackmq.protocol.stomp import Frame, encode_frame

CHUNK = 256          # frames per socket write when streaming


def _url(ctx: RunContext) -> str:
    url = ctx.target.stomp_url
    if not url:
        raise RuntimeError(f"{ctx.target.label} has no STOMP listener known to the bench")
    return url


def _send_frame(dest: str, i: int, size: int, persistent: bool, receipt: str | None) -> bytes:
    """SEND bytes built by hand (the codec's encode_frame costs more per message); the
    bench's destinations and receipts need no escaping."""
    body = _body(i, size)
    head = [b"SEND\ndestination:", dest.encode(), b"\n"]
    if persistent:
        head.append(b"persistent:true\n")
    if receipt is not None:
        head += (b"receipt:", receipt.encode(), b"\n")
    head += (b"content-length:", str(len(body)).encode(), b"\n\n", body, b"\x00\n")
    return b"".join(head)


async def _stream(conn: StompWireConnection, dest: str, n: int, size: int, persistent: bool) -> None:
    """n SENDs as fast as TCP takes them; only the last asks for a receipt, which every
    broker here sends after the sends before it (one connection is processed in order)."""
    last = f"end-{n}"
    done = conn.expect_receipt(last)
    i = 0
    while i < n:
        k = min(CHUNK, n - i)
        frames = [_send_frame(dest, j, size, persistent, last if j == n - 1 else None)
                  for j in range(i, i + k)]
        conn.write(b"".join(frames))
        i += k
        if conn.paused:
            await conn.drain()
        else:
            await asyncio.sleep(0)
    await done


async def _drain(ctx: RunContext, dest: str, n: int, ack: str,
                 prefetch: int | None) -> tuple[float, _Tally]:
    """Subscribe to `dest` and take n messages (ACK each unless `ack` is auto).
    The measured section runs from SUBSCRIBE to the n-th message. Returns its seconds."""
    conn = await StompWireConnection.open(_url(ctx))
    tally = _Tally(n)
    done = asyncio.get_running_loop().create_future()
    individual = ack != "auto"
    queue_out = conn.queue

    def on_message(frame: Frame) -> None:
        tally.add(frame.body)
        if individual:
            queue_out(encode_frame("ACK", [("id", frame.headers["ack"])]))
        if tally.got >= n and not done.done():
            done.set_result(None)

    conn.on_message = on_message
    headers = [("id", "1"), ("destination", dest), ("ack", ack)]
    if prefetch is not None:  # RabbitMQ's header and ActiveMQ's; ackmq reads both
        headers += [("prefetch-count", str(prefetch)), ("activemq.prefetchSize", str(prefetch))]
    before = ctx.wall_s
    try:
        with ctx.measure():
            conn.write(encode_frame("SUBSCRIBE", headers))
            await done
        await conn.request(encode_frame("UNSUBSCRIBE", [("id", "1"), ("receipt", "unsub")]),
                           "unsub")
    finally:
        await conn.close()
    return ctx.wall_s - before, tally


async def _prefill(ctx: RunContext, dest: str, n: int) -> None:
    """n transient messages, all in the queue (the last one's receipt) before timing."""
    conn = await StompWireConnection.open(_url(ctx))
    try:
        await _stream(conn, dest, n, ctx.options.body_size, persistent=False)
    finally:
        await conn.close()


async def _verify(ctx: RunContext, dest: str, n: int) -> None:
    """After a send workload: drain the queue (untimed) and check each message once."""
    mark = ctx.wall_s, ctx.client_cpu_s, ctx.broker_cpu_s
    _, tally = await _drain(ctx, dest, n, "auto", None)
    ctx.wall_s, ctx.client_cpu_s, ctx.broker_cpu_s = mark  # not part of the result
    tally.check("after sending")
    ctx.extra["received_once"] = tally.got


def _dest(ctx: RunContext) -> str:
    return "/queue/" + ctx.name()


def send_receipt(ctx: RunContext) -> None:
    """Persistent SEND, wait for its RECEIPT, repeat: STOMP's confirms-individual (the
    receipt comes after fsync on ackmq, after the publisher confirm on RabbitMQ)."""
    n = ctx.n(10_000)
    size = ctx.options.body_size

    async def go() -> None:
        dest = _dest(ctx)
        frames = [_send_frame(dest, i, size, True, str(i)) for i in range(n)]
        conn = await StompWireConnection.open(_url(ctx))
        try:
            with ctx.measure():
                for i, frame in enumerate(frames):
                    fut = conn.expect_receipt(str(i))
                    conn.write(frame)
                    await fut
        finally:
            await conn.close()
        await _verify(ctx, dest, n)

    run_async(asyncio.wait_for(go(), RUN_TIMEOUT))
    ctx.messages = n
    ctx.add("stomp-send-receipt", ctx.wall_s * 1e3, "ms", "lower")


def send_stream(ctx: RunContext) -> None:
    """Persistent SENDs pipelined, one receipt on the last: the time until it arrives."""
    n = ctx.n(100_000)

    async def go() -> None:
        dest = _dest(ctx)
        conn = await StompWireConnection.open(_url(ctx))
        try:
            with ctx.measure():
                await _stream(conn, dest, n, ctx.options.body_size, persistent=True)
        finally:
            await conn.close()
        await _verify(ctx, dest, n)

    run_async(asyncio.wait_for(go(), RUN_TIMEOUT))
    ctx.messages = n
    ctx.add("stomp-send-stream", n / ctx.wall_s, "msgs/s", "higher")


def consume_auto(ctx: RunContext) -> None:
    """SUBSCRIBE ack:auto to a pre-filled queue until all n are in."""
    n = ctx.n(50_000)

    async def go() -> float:
        dest = _dest(ctx)
        await _prefill(ctx, dest, n)
        secs, tally = await _drain(ctx, dest, n, "auto", None)
        tally.check("consume-auto")
        return secs

    secs = run_async(asyncio.wait_for(go(), RUN_TIMEOUT))
    ctx.messages = n
    ctx.add("stomp-consume-auto", n / secs, "msgs/s", "higher")


def consume_individual(ctx: RunContext) -> None:
    """ack:client-individual, one ACK per message, at each prefetch of the sweep
    (`prefetch-count` and `activemq.prefetchSize` both sent); n per prefetch value."""
    n = ctx.n(20_000)
    sweep = ctx.options.stomp_prefetch

    async def go() -> None:
        for p in sweep:
            mark = ctx.mark()
            dest = _dest(ctx)
            await _prefill(ctx, dest, n)
            secs, tally = await _drain(ctx, dest, n, "client-individual", p or None)
            tally.check(f"prefetch {p}")
            ctx.add(f"stomp-consume-ci/{p}", n / secs, "msgs/s", "higher", since=mark)

    run_async(asyncio.wait_for(go(), RUN_TIMEOUT))
    ctx.messages = n  # per prefetch value
