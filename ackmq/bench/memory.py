"""Broker resident memory per queued message (1 million 100-byte messages waiting).

The figure is the RSS slope over the second half of the fill: a broker that has run
other workloads first holds freed memory it reuses (Python's allocator, Erlang's heaps),
so growth from an empty queue undercounts, even below zero; by the second half that
slack is used up and what remains is the cost of one more queued message."""

from __future__ import annotations

import asyncio

from ackmq.bench.context import RunContext, run_async
from ackmq.bench.pipeline import OutstandingConfirms, publish_pipelined

SETTLE_S = 1.0


def _rss(ctx: RunContext) -> int:
    proc = ctx.target.process
    if proc is None:
        raise RuntimeError("memory: the broker's process is unknown (no local listener found "
                           "for the URL's port); it can only be measured on this machine")
    return proc.memory_info().rss


async def _fill(ctx: RunContext, n: int) -> tuple[int, int, int]:
    q = ctx.name()
    body = b"x" * ctx.options.body_size
    async with ctx.channel() as ch:
        await ch.declare_queue(q)
        await ch.confirm_select()
        oc = OutstandingConfirms()
        ch.on_confirm = oc.settle
        await asyncio.sleep(SETTLE_S)
        before = _rss(ctx)
        half = n // 2
        with ctx.measure():
            await publish_pipelined(ch, q, half, body, 1, confirms=oc)
            await asyncio.sleep(SETTLE_S)  # let the broker finish GC / bookkeeping
            mid = _rss(ctx)
            await publish_pipelined(ch, q, n - half, body, 1, confirms=oc)
        await asyncio.sleep(SETTLE_S)
        after = _rss(ctx)
        count = await ch.queue_count(q)
        if count != n:
            raise RuntimeError(f"memory: published {n}, queue holds {count}")
    return before, mid, after


def memory(ctx: RunContext) -> None:
    """RSS growth of the broker over the second half of the fill, per message added."""
    n = ctx.n(1_000_000)
    before, mid, after = run_async(_fill(ctx, n))
    ctx.messages = n
    ctx.add("memory", (after - mid) / (n - n // 2), "bytes/msg", "lower")
    ctx.extra.update(rss_before=before, rss_mid=mid, rss_after=after,
                     whole_fill_bytes_per_msg=(after - before) / n,
                     fill_msgs_per_s=n / max(ctx.wall_s - SETTLE_S, 1e-9))
