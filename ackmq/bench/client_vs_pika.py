"""ackmq.client against pika on the same broker: asynchronous publisher confirms and
confirm-each (SPEC J10's strategies), persistent messages to a durable queue.

    python -m ackmq.bench.client_vs_pika --url amqp://guest:guest@127.0.0.1:5672/ \\
        [--url ...] [--n 10000] [--each 2000] [--rounds 3]

Prints the median of each workload and ackmq.client's throughput as a multiple of pika's.
A first, small comparison; `ackmq bench` does not run it (yet).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

import pika

from ackmq.client import connect, connect_async

BODY = b"x" * 100
_cpu: list[float] = []


def _now() -> float:
    """Wall clock; the process's CPU time is noted alongside (client cost per message is
    steadier than throughput on a shared machine)."""
    _cpu.append(time.process_time())
    return time.perf_counter()


def _run(fn: Callable[[str, int], float], url: str, n: int) -> tuple[float, float]:
    """(msg/s, client CPU microseconds per message) of one run."""
    _cpu.clear()
    secs = fn(url, n)
    cpu = _cpu[-1] - _cpu[0] if len(_cpu) >= 2 else float("nan")
    return n / secs, cpu / n * 1e6


def _queue() -> str:
    return f"bench.client.{uuid.uuid4().hex[:8]}"


def _cleanup(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()


def client_async_confirms(url: str, n: int) -> float:
    """ackmq.client, sync API: publish() -> Future for all n, one wait_for_confirms()."""
    q = _queue()
    with connect(url) as conn:
        p = conn.session().producer(q)
        started = _now()
        for _ in range(n):
            p.publish(BODY)
        p.wait_for_confirms(timeout=120)
        secs = _now() - started
        assert not p.take_failed()
    _cleanup(url, q)
    return secs


def client_asyncio_confirms(url: str, n: int) -> float:
    """ackmq.client, asyncio API: the same."""
    q = _queue()

    async def run() -> float:
        async with await connect_async(url) as conn:
            p = await (await conn.session()).producer(q)
            started = _now()
            for _ in range(n):
                p.publish(BODY)
            await p.wait_for_confirms(timeout=120)
            secs = _now() - started
            assert not p.take_failed()
            return secs

    secs = asyncio.run(run())
    _cleanup(url, q)
    return secs


def pika_async_confirms(url: str, n: int) -> float:
    """pika's SelectConnection as its docs show async confirms: publish everything, track
    delivery tags in a sorted map, settle ranges on `multiple`."""
    q = _queue()
    props = pika.BasicProperties(delivery_mode=2)
    outstanding: OrderedDict[int, None] = OrderedDict()
    times: dict[str, float] = {}
    conn: pika.SelectConnection

    def on_confirm(frame: pika.frame.Method) -> None:
        m = frame.method
        if m.multiple:
            while outstanding and next(iter(outstanding)) <= m.delivery_tag:
                outstanding.popitem(last=False)
        else:
            outstanding.pop(m.delivery_tag, None)
        if not outstanding and "start" in times and "end" not in times:
            times["end"] = _now()
            conn.close()

    def start(ch: pika.channel.Channel) -> None:
        times["start"] = _now()
        for tag in range(1, n + 1):
            outstanding[tag] = None
            ch.basic_publish("", q, BODY, props)

    def on_channel(ch: pika.channel.Channel) -> None:
        ch.queue_declare(q, durable=True, callback=lambda _: ch.confirm_delivery(
            on_confirm, callback=lambda _: start(ch)))

    conn = pika.SelectConnection(pika.URLParameters(url),
                                 on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                 on_close_callback=lambda c, _: c.ioloop.stop())
    conn.ioloop.start()
    _cleanup(url, q)
    return times["end"] - times["start"]


def client_confirm_each(url: str, n: int) -> float:
    q = _queue()
    with connect(url) as conn:
        p = conn.session().producer(q)
        started = _now()
        for _ in range(n):
            p.send(BODY)
        secs = _now() - started
    _cleanup(url, q)
    return secs


def pika_confirm_each(url: str, n: int) -> float:
    q = _queue()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        started = _now()
        for _ in range(n):
            ch.basic_publish("", q, BODY, props, mandatory=True)
        secs = _now() - started
    finally:
        conn.close()
    _cleanup(url, q)
    return secs


WORKLOADS: list[tuple[str, str, Callable[[str, int], float]]] = [
    ("async confirms", "ackmq.client (sync)", client_async_confirms),
    ("async confirms", "ackmq.client (asyncio)", client_asyncio_confirms),
    ("async confirms", "pika SelectConnection", pika_async_confirms),
    ("confirm each", "ackmq.client send()", client_confirm_each),
    ("confirm each", "pika BlockingConnection", pika_confirm_each),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", action="append", help="broker URL (repeatable)")
    ap.add_argument("--n", type=int, default=10000, help="messages for async confirms")
    ap.add_argument("--each", type=int, default=2000, help="messages for confirm-each")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    args = ap.parse_args(argv)
    urls = args.url or ["amqp://guest:guest@127.0.0.1:5672/"]
    for url in urls:
        results: dict[str, list[float]] = {name: [] for _, name, _ in WORKLOADS}
        cpu: dict[str, list[float]] = {name: [] for _, name, _ in WORKLOADS}
        for _ in range(args.rounds):
            for kind, name, fn in WORKLOADS:
                n = args.n if kind == "async confirms" else args.each
                rate, us = _run(fn, url, n)
                results[name].append(rate)
                cpu[name].append(us)
        print(f"\n{url}  ({args.rounds} rounds, medians, persistent 100-byte messages)")
        medians = {name: statistics.median(v) for name, v in results.items()}
        for kind, name, _ in WORKLOADS:
            print(f"  {kind:15} {name:26} {medians[name]:10,.0f} msg/s   "
                  f"client CPU {statistics.median(cpu[name]):6.1f} us/msg")
        ratio_async = medians["ackmq.client (sync)"] / medians["pika SelectConnection"]
        ratio_aio = medians["ackmq.client (asyncio)"] / medians["pika SelectConnection"]
        ratio_each = medians["ackmq.client send()"] / medians["pika BlockingConnection"]
        print(f"  ackmq.client / pika: async confirms {ratio_async:.2f}x (sync API), "
              f"{ratio_aio:.2f}x (asyncio); confirm each {ratio_each:.2f}x")


if __name__ == "__main__":
    main()
