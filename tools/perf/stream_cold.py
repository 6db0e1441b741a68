"""Does a cold stream reader slow publishers? A stream of `--gib` GiB is filled, the page
cache dropped (root: /proc/sys/vm/drop_caches), then one publisher sends persistent
messages to another queue one at a time, each waiting for its confirm, for `--seconds`:
its confirm latencies (p50 / p99 / max) without a reader, and while a second process
reads the big stream from `first` (cold segment files, prefetch `--prefetch`, multiple
acks). ackmq reads segment files on its event loop; this says what that costs a
publisher on the same broker. The same run against RabbitMQ when it is up.

    python -m tools.perf.stream_cold [--gib 1] [--seconds 15] [--size 1024]
                                      [--rabbitmq URL | --no-rabbitmq]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
import uuid
from typing import Any

from pamqp import commands as C

from ackmq.bench.brokers import Target
from ackmq.client.lowlevel import open_connection
from tools.perf.streams import add_broker_args, broker_targets, delete, publish


def drop_caches() -> bool:
    """Write back and drop the page cache (needs root); False when not allowed."""
    try:
        import os

        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


async def confirm_latencies(url: str, queue: str, seconds: float, size: int) -> list[float]:
    """One publish at a time, each confirmed before the next: latencies in ms."""
    conn = await open_connection(url, connection_name="stream-cold-publisher")
    ch = await conn.channel()
    await ch.declare_queue(queue, durable=True)
    await ch.confirm_select()
    frame = ch.publish_bytes("", queue, b"p" * size, delivery_mode=2)
    loop = asyncio.get_running_loop()
    waiter: dict[str, asyncio.Future[None]] = {}

    def on_confirm(tag: int, multiple: bool, ack: bool) -> None:
        f = waiter.get("f")
        if f is not None and not f.done():
            f.set_result(None)

    ch.on_confirm = on_confirm
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        waiter["f"] = loop.create_future()
        t0 = time.perf_counter()
        conn.write(frame)
        await asyncio.wait_for(waiter["f"], 30)
        out.append((time.perf_counter() - t0) * 1000)
    await ch.call(C.Queue.Purge(queue=queue))
    await conn.close()
    return out


async def _read(url: str, stream: str, prefetch: int, seconds: float) -> int:
    conn = await open_connection(url, connection_name="stream-cold-reader")
    ch = await conn.channel()
    await ch.qos(prefetch)
    every = max(1, prefetch // 4)
    got = [0]

    def on_deliver(tag: int, redelivered: bool, body: bytes) -> None:
        got[0] += 1
        if got[0] % every == 0:
            conn.queue(ch.ack_bytes(tag, multiple=True))

    ch.on_deliver = on_deliver
    await ch.call(C.Basic.Consume(queue=stream, arguments={"x-stream-offset": "first"}))
    await asyncio.sleep(seconds)
    n = got[0]
    await conn.close()
    return n


def _reader_process(url: str, stream: str, prefetch: int, seconds: float, q: Any) -> None:
    q.put(asyncio.run(_read(url, stream, prefetch, seconds)))


def summary(ms: list[float]) -> str:
    s = sorted(ms)
    if not s:
        return "no samples"

    def pct(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return (f"{len(s)} confirms, p50 {pct(0.5):.2f} ms, p99 {pct(0.99):.2f} ms, "
            f"p99.9 {pct(0.999):.2f} ms, max {s[-1]:.1f} ms")


def run(target: Target, gib: float, size: int, seconds: float, prefetch: int,
        warm: bool = False) -> dict:
    stream = f"bench.cold.{uuid.uuid4().hex[:8]}"
    queue = f"bench.cold.pub.{uuid.uuid4().hex[:8]}"
    n = int(gib * 2**30 / size)
    t0 = time.perf_counter()
    asyncio.run(publish(target.url, stream, n, size, 1000))
    fill = time.perf_counter() - t0
    res: dict[str, Any] = {"fill": f"{n} x {size} B in {fill:.1f} s"}
    try:
        res["cold cache"] = not warm and drop_caches()
        res["alone"] = summary(asyncio.run(confirm_latencies(target.url, queue, seconds, size)))
        if not warm:
            drop_caches()
        q: Any = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(
            target=_reader_process, args=(target.url, stream, prefetch, seconds + 2, q))
        p.start()
        time.sleep(1.0)  # the reader is attached and reading cold segments
        res["with reader"] = summary(
            asyncio.run(confirm_latencies(target.url, queue, seconds, size)))
        read = q.get(timeout=120)
        p.join(30)
        res["reader"] = f"{read} messages in {seconds + 2:.0f} s ({read / (seconds + 2):.0f}/s)"
    finally:
        asyncio.run(delete(target.url, stream))
        asyncio.run(delete(target.url, queue))
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.perf.stream_cold", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="the stream's size")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=15.0, help="each latency phase")
    ap.add_argument("--prefetch", type=int, default=1000)
    add_broker_args(ap)
    ap.add_argument("--warm", action="store_true",
                    help="keep the page cache (the reader's cost without disk waits)")
    a = ap.parse_args(argv)
    targets = broker_targets(a)
    try:
        for t in targets:
            r = run(t, a.gib, a.size, a.seconds, a.prefetch, a.warm)
            for k, v in r.items():
                print(f"{t.label:9} {k:12} {v}", flush=True)
    finally:
        for t in targets:
            t.close()


if __name__ == "__main__":
    main()
