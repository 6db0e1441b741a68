"""Broker resident memory per queued message (1 million 100-byte messages waiting)."""

from __future__ import annotations

import asyncio

from ackmq.bench.context import RunContext, run_async
from ackmq.bench.pipeline import OutstandingConfirms, publish_pipelined
from ackmq.bench.wire import Connection

SETTLE_S = 1.0


def _rss(ctx: RunContext) -> int:
    proc = ctx.target.process
    if proc is None:
        raise RuntimeError("memory: the broker's process is unknown (no local listener found "
                           "for the URL's port); it can only be measured on this machine")
    return proc.memory_info().rss


async def _fill(ctx: RunContext, n: int) -> tuple[int, int]:
    q = ctx.name()
    body = b"x" * ctx.options.body_size
    conn = await Connection.open(ctx.target.url)
    try:
        ch = await conn.channel(1)
        await ch.declare_queue(q)
        await ch.confirm_select()
        oc = OutstandingConfirms()
        ch.on_confirm = oc.settle
        await asyncio.sleep(SETTLE_S)
        before = _rss(ctx)
        with ctx.measure():
            await publish_pipelined(ch, q, n, body, 1, confirms=oc)
        await asyncio.sleep(SETTLE_S)  # let the broker finish GC / bookkeeping
        after = _rss(ctx)
        count = await ch.queue_count(q)
        if count != n:
            raise RuntimeError(f"memory: published {n}, queue holds {count}")
    finally:
        await conn.close()
    return before, after


def memory(ctx: RunContext) -> None:
    """RSS growth of the broker process divided by the messages it holds."""
    n = ctx.n(1_000_000)
    before, after = run_async(_fill(ctx, n))
    ctx.messages = n
    ctx.add("memory", (after - before) / n, "bytes/msg", "lower")
    ctx.extra.update(rss_before=before, rss_after=after, fill_msgs_per_s=n / ctx.wall_s)
