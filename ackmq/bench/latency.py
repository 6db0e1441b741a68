"""End-to-end latency at a fixed offered rate: publish → deliver (→ ack), and publish → confirm.

Messages are sent on a schedule (message i at t0 + i/rate, due ones written once per
1 ms tick) and stamped with the moment they are written: the latency is the broker's
and the network's, not the tick's (a scheduled-time stamp put the tick's phase, ~0.5-1
ms, into every message for either broker). The publisher never waits for the broker
(writes are buffered, confirms counted aside), so a stalled broker cannot hold sends
back unseen; how far the writes fell behind the schedule is reported beside
(`publish_lag_max_ms`: the client's pacing, for either broker). Persistent messages to
a durable queue with confirms, so the confirm latency shows the broker's fsync policy
(SPEC P8).
"""

from __future__ import annotations

import asyncio
import struct
import time

from ackmq.bench.context import RunContext, run_async
from ackmq.bench.pipeline import OutstandingConfirms
from ackmq.bench.stats import percentile
from ackmq.client.lowlevel import delivery_mode_properties, open_connection
from ackmq.protocol.amqp import encode_ack, encode_publish

_STAMP = struct.Struct(">d")
PREFETCH = 300
TICK = 0.001


async def _latency(ctx: RunContext, n: int, rate: float) -> tuple[list[float], list[float]]:
    q = ctx.name()
    size = max(ctx.options.body_size, _STAMP.size)
    pad = b"x" * (size - _STAMP.size)
    clock = time.perf_counter
    deliver_lat: list[float] = []
    confirm_lat: list[float] = []
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    cons = await open_connection(ctx.target.url, "ackmq-bench-latency-consumer")
    pub = await open_connection(ctx.target.url, "ackmq-bench-latency-publisher")
    try:
        cch = await cons.channel()
        cnum = cch.number
        await cch.declare_queue(q, durable=True)
        await cch.qos(PREFETCH)

        def on_deliver(tag: int, redelivered: bool, body: bytes) -> None:
            deliver_lat.append(clock() - _STAMP.unpack_from(body)[0])
            cons.queue(encode_ack(cnum, tag, False))
            if len(deliver_lat) >= n and not done.done():
                done.set_result(None)

        cch.on_deliver = on_deliver
        await cch.consume(q)
        pch = await pub.channel()
        pnum, persistent, frame_max = pch.number, delivery_mode_properties(2), pub.frame_max
        await pch.confirm_select()
        oc = OutstandingConfirms()
        oc.on_settle = lambda seq, sched, ack: confirm_lat.append(clock() - sched)  # type: ignore[operator]
        pch.on_confirm = oc.settle
        with ctx.measure():
            t0 = clock()
            sent = 0
            lag = 0.0
            while sent < n:
                now = clock()
                due = min(n, int((now - t0) * rate) + 1)
                if due > sent:
                    lag = max(lag, now - (t0 + sent / rate))
                    stamp = _STAMP.pack(now) + pad
                    frames = []
                    for _ in range(sent, due):
                        oc.add(now)
                        frames.append(encode_publish(pnum, "", q, False, False, persistent,
                                                     stamp, frame_max))
                    pub.write(b"".join(frames))
                    sent = due
                await asyncio.sleep(TICK)
            await asyncio.wait_for(done, 600)
            await oc.wait_all()
        ctx.extra["achieved_rate"] = n / ctx.wall_s
        ctx.extra["publish_lag_max_ms"] = lag * 1e3
    finally:
        await pub.close()
        await cons.close()
    return deliver_lat, confirm_lat


def latency(ctx: RunContext) -> None:
    """p50 / p99 / p99.9 of publish→deliver, and p50 / p99 of publish→confirm, in ms."""
    rate = ctx.options.rate
    n = ctx.n(int(rate * 10))
    deliver, confirm = run_async(_latency(ctx, n, rate))
    ctx.messages = n
    deliver.sort()
    confirm.sort()
    for p, label in ((50, "p50"), (99, "p99"), (99.9, "p99.9")):
        ctx.add(f"latency/deliver-{label}", percentile(deliver, p) * 1e3, "ms", "lower")
    for p, label in ((50, "p50"), (99, "p99")):
        ctx.add(f"latency/confirm-{label}", percentile(confirm, p) * 1e3, "ms", "lower")
    ctx.extra.update(offered_rate=rate, deliver_max_ms=deliver[-1] * 1e3,
                     confirm_max_ms=confirm[-1] * 1e3)
