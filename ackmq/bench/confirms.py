"""Publisher-confirm strategies and transactions: 50,000 persistent messages, durable queue."""

from __future__ import annotations

from pamqp import commands

from ackmq.bench.context import RunContext, run_async
from ackmq.bench.floor import physical_floor
from ackmq.bench.pipeline import confirming_channel, publish_pipelined
from ackmq.client import connect
from ackmq.client.lowlevel import open_connection

PERSISTENT = 2
DEFAULT_N = 50_000
BATCH = 100


def confirms_individual(ctx: RunContext) -> None:
    """send(), wait for the confirm, repeat — with ackmq.client, exactly as a user writes
    it (until 2026-11-24 this was pika's BlockingConnection; `client-publish` compares)."""
    n = ctx.n(DEFAULT_N)
    q = ctx.name()
    body = b"x" * ctx.options.body_size
    with connect(ctx.target.url, heartbeat=0, connection_name="ackmq-bench") as conn:
        p = conn.session().producer(q)  # declares q durable; mandatory publishes
        with ctx.measure():
            for _ in range(n):
                p.send(body)  # raises NackError / ReturnedError / ConfirmTimeout
        ms = ctx.wall_s * 1e3
    ctx.messages = n
    ctx.add("confirms-individual", ms, "ms", "lower")
    floor_dir = ctx.options.floor_dir or (str(ctx.target.data_dir) if ctx.target.data_dir else None)
    ctx.extra["floor_in_data_dir"] = floor_dir is not None
    ctx.extra.update(physical_floor(n, floor_dir), msgs_per_s=n / ctx.wall_s)


async def _confirms_pipelined(ctx: RunContext, n: int, batch: int | None) -> None:
    q = ctx.name()
    body = b"x" * ctx.options.body_size
    conn = await open_connection(ctx.target.url, "ackmq-bench")
    try:
        ch, oc = await confirming_channel(conn, q)
        with ctx.measure():
            if batch is None:
                await publish_pipelined(ch, q, n, body, PERSISTENT, confirms=oc)
            else:
                one = ch.publish_bytes("", q, body, PERSISTENT)
                left = n
                while left:
                    k = min(batch, left)
                    for _ in range(k):
                        oc.add()
                    conn.write(one * k)
                    await oc.wait_all()  # wait_for_confirms: all of this batch
                    if oc.nacked:
                        left += len(oc.nacked)  # re-publish nacked messages
                        oc.nacked.clear()
                    left -= k
        ctx.extra["nacks"] = oc.next_seq - 1 - n
    finally:
        await conn.close()


def _pipelined_workload(ctx: RunContext, metric: str, batch: int | None) -> None:
    """Run `_confirms_pipelined` and record its total time (and the rate) as `metric`."""
    n = ctx.n(DEFAULT_N)
    run_async(_confirms_pipelined(ctx, n, batch))
    ctx.messages = n
    ctx.add(metric, ctx.wall_s * 1e3, "ms", "lower")
    ctx.extra["msgs_per_s"] = n / ctx.wall_s


def confirms_batch(ctx: RunContext) -> None:
    """Batches of 100, waiting for every confirm of the batch before the next."""
    _pipelined_workload(ctx, "confirms-batch", BATCH)


def confirms_async(ctx: RunContext) -> None:
    """Pipelined publishes; confirms tracked in a sorted map, `multiple` acks settle ranges."""
    _pipelined_workload(ctx, "confirms-async", None)


async def _tx(ctx: RunContext, n: int, per_commit: int) -> float:
    q = ctx.name()
    body = b"x" * ctx.options.body_size
    conn = await open_connection(ctx.target.url, "ackmq-bench")
    before = ctx.wall_s
    try:
        ch = await conn.channel()
        await ch.declare_queue(q, durable=True)
        await ch.tx_select()
        one = ch.publish_bytes("", q, body, PERSISTENT)
        commit = commands.Tx.Commit()
        with ctx.measure():
            left = n
            while left:
                k = min(per_commit, left)
                conn.write(one * k)
                await ch.call(commit)
                left -= k
    finally:
        await conn.close()
    return ctx.wall_s - before


def tx(ctx: RunContext) -> None:
    """T4: the same persistent publishes in transactions, a commit per message and per 100."""
    n = ctx.n(DEFAULT_N)

    async def both() -> None:
        for label, per_commit in (("each", 1), (str(BATCH), BATCH)):
            mark = ctx.mark()
            secs = await _tx(ctx, n, per_commit)
            ctx.add(f"tx/commit-{label}", secs * 1e3, "ms", "lower", since=mark)
            ctx.extra[f"commit_{label}_msgs_per_s"] = n / secs

    run_async(both())
    ctx.messages = n  # per commit mode
    ctx.extra["n_per_mode"] = n
