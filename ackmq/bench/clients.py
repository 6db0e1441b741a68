"""Client workloads: one broker driven by ackmq.client, pika and aio-pika.

- client-publish: SPEC J10's three strategies (wait for each confirm, batches of 100 with
  one wait, asynchronous confirm tracking), persistent messages to a durable queue,
  mandatory, with each client the way its documentation shows; the physical floor (RTT +
  fdatasync) beside confirm-each; the client's own CPU per message.
- client-consume: ackmq.client draining a pre-filled queue in each acknowledge mode (J1)
  with optimizeAcknowledge off and on (J3: it only changes AUTO).
- client-prefetch-ext: J8 in CLIENT mode: a consumer that acknowledges every P messages,
  with the 1.5 × P window against a window of P.

Ratios between clients are metrics of their own ("÷" in the name), so they are printed
and compared across brokers like any figure.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aio_pika
import pika

from ackmq.bench.context import RunContext, run_async
from ackmq.bench.floor import physical_floor
from ackmq.bench.pipeline import confirming_channel, publish_pipelined
from ackmq.client import AckMode, connect, connect_async
from ackmq.client.lowlevel import open_connection

PERSISTENT = 2
BATCH = 100
EACH_N = 5_000
ASYNC_N = 50_000
CONSUME_N = 20_000
EXT_N = 20_000


def _run(ctx: RunContext, name: str, n: int, fn: Callable[[RunContext, str, int], None]
         ) -> float:
    """One client's run on a fresh durable queue: msgs/s and client CPU µs/msg as metrics."""
    mark = ctx.mark()
    fn(ctx, ctx.name(), n)
    secs = ctx.wall_s - mark[0]
    cpu = ctx.client_cpu_s - mark[1]
    rate = n / secs
    ctx.add(name, rate, "msgs/s", "higher", since=mark)
    ctx.add(f"cpu {name}", cpu / n * 1e6, "µs/msg", "lower", since=mark)
    return rate


# -- ackmq.client -------------------------------------------------------------------------

@contextmanager
def _ackmq_producer(ctx: RunContext, q: str) -> Iterator[tuple[Any, bytes]]:
    """A producer for `q` on its own ackmq.client connection, and the body to send."""
    with connect(ctx.target.url, heartbeat=0) as conn:
        yield conn.session().producer(q), b"x" * ctx.options.body_size


def _ackmq_each(ctx: RunContext, q: str, n: int) -> None:
    with _ackmq_producer(ctx, q) as (p, body), ctx.measure():
        for _ in range(n):
            p.send(body)


def _ackmq_batch(ctx: RunContext, q: str, n: int) -> None:
    with _ackmq_producer(ctx, q) as (p, body), ctx.measure():
        left = n
        while left:
            k = min(BATCH, left)
            p.send_batch([body] * k)
            left -= k


def _ackmq_async(ctx: RunContext, q: str, n: int) -> None:
    with _ackmq_producer(ctx, q) as (p, body), ctx.measure():
        todo = n
        while todo:  # nacked ones are handed back and published again from here
            for _ in range(todo):
                p.publish(body)
            p.wait_for_confirms(timeout=600)
            todo = len(p.take_failed())


def _ackmq_asyncio(ctx: RunContext, q: str, n: int) -> None:
    body = b"x" * ctx.options.body_size

    async def go() -> None:
        async with await connect_async(ctx.target.url, heartbeat=0) as conn:
            p = await (await conn.session()).producer(q)
            with ctx.measure():
                todo = n
                while todo:
                    for _ in range(todo):
                        p.publish(body)
                    await p.wait_for_confirms(timeout=600)
                    todo = len(p.take_failed())

    run_async(go())


# -- pika ---------------------------------------------------------------------------------

def _pika_each(ctx: RunContext, q: str, n: int) -> None:
    """BlockingConnection with confirm_delivery: basic_publish waits for the confirm."""
    body = b"x" * ctx.options.body_size
    props = pika.BasicProperties(delivery_mode=PERSISTENT)
    conn = pika.BlockingConnection(pika.URLParameters(ctx.target.url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        with ctx.measure():
            for _ in range(n):
                ch.basic_publish("", q, body, props, mandatory=True)
    finally:
        conn.close()


def _pika_select(ctx: RunContext, q: str, n: int, batch: int | None) -> None:
    """SelectConnection as pika's docs show asynchronous confirms: delivery tags in a
    sorted map, `multiple` settles a prefix; with `batch`, the next batch goes out when
    the previous one is all confirmed."""
    body = b"x" * ctx.options.body_size
    props = pika.BasicProperties(delivery_mode=PERSISTENT)
    outstanding: OrderedDict[int, None] = OrderedDict()
    state = {"sent": 0, "tag": 0}
    meter = ctx.measure()
    failed: list[str] = []

    def send(ch: Any) -> None:
        k = n - state["sent"] if batch is None else min(batch, n - state["sent"])
        for _ in range(k):
            state["tag"] += 1
            outstanding[state["tag"]] = None
            ch.basic_publish("", q, body, props, mandatory=True)
        state["sent"] += k

    def on_confirm(frame: Any) -> None:
        m = frame.method
        if isinstance(m, pika.spec.Basic.Nack):
            failed.append("nack")
        if m.multiple:
            while outstanding and next(iter(outstanding)) <= m.delivery_tag:
                outstanding.popitem(last=False)
        else:
            outstanding.pop(m.delivery_tag, None)
        if not outstanding:
            if state["sent"] < n:
                send(chan[0])
            else:
                meter.__exit__(None, None, None)
                conn.close()

    chan: list[Any] = []

    def start(ch: Any) -> None:
        chan.append(ch)
        meter.__enter__()
        send(ch)

    def on_channel(ch: Any) -> None:
        ch.add_on_return_callback(lambda *a: failed.append("returned"))
        ch.queue_declare(q, durable=True, callback=lambda _: ch.confirm_delivery(
            on_confirm, callback=lambda _: start(ch)))

    conn = pika.SelectConnection(pika.URLParameters(ctx.target.url),
                                 on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                 on_close_callback=lambda c, _: c.ioloop.stop())
    conn.ioloop.start()
    if failed:
        raise RuntimeError(f"pika: {len(failed)} publishes nacked or returned")
    if state["sent"] != n or outstanding:
        raise RuntimeError(f"pika: {len(outstanding)} of {n} publishes never confirmed")


def _pika_batch(ctx: RunContext, q: str, n: int) -> None:
    _pika_select(ctx, q, n, BATCH)


def _pika_async(ctx: RunContext, q: str, n: int) -> None:
    _pika_select(ctx, q, n, None)


# -- aio-pika -----------------------------------------------------------------------------

def _aio_pika(ctx: RunContext, q: str, n: int, batch: int) -> None:
    """aio-pika with publisher confirms (its default): `await exchange.publish(...)`
    returns on the confirm; batch 1 awaits each, otherwise asyncio.gather per batch."""
    body = b"x" * ctx.options.body_size

    async def go() -> None:
        conn = await aio_pika.connect(ctx.target.url)
        try:
            ch = await conn.channel()
            await ch.declare_queue(q, durable=True)
            ex = ch.default_exchange
            with ctx.measure():
                left = n
                while left:
                    k = min(batch, left)
                    if k == 1:
                        await ex.publish(aio_pika.Message(body, delivery_mode=PERSISTENT), q,
                                         mandatory=True)
                    else:
                        await asyncio.gather(*(ex.publish(
                            aio_pika.Message(body, delivery_mode=PERSISTENT), q,
                            mandatory=True) for _ in range(k)))
                    left -= k
        finally:
            await conn.close()

    run_async(go())


def _aio_each(ctx: RunContext, q: str, n: int) -> None:
    _aio_pika(ctx, q, n, 1)


def _aio_batch(ctx: RunContext, q: str, n: int) -> None:
    _aio_pika(ctx, q, n, BATCH)


def _aio_async(ctx: RunContext, q: str, n: int) -> None:
    _aio_pika(ctx, q, n, n)


STRATEGIES: dict[str, list[tuple[str, Callable[[RunContext, str, int], None]]]] = {
    "each": [("ackmq", _ackmq_each), ("pika", _pika_each), ("aio-pika", _aio_each)],
    "batch": [("ackmq", _ackmq_batch), ("pika", _pika_batch), ("aio-pika", _aio_batch)],
    "async": [("ackmq", _ackmq_async), ("ackmq-aio", _ackmq_asyncio), ("pika", _pika_async),
              ("aio-pika", _aio_async)],
}


def client_publish(ctx: RunContext) -> None:
    """J10's strategies with each client; ratios ackmq.client ÷ pika and ÷ the floor."""
    n_each, n_async = ctx.n(EACH_N), ctx.n(ASYNC_N)
    rates: dict[str, float] = {}
    for strategy, clients in STRATEGIES.items():
        n = n_each if strategy == "each" else n_async
        for client, fn in clients:
            rates[f"{strategy}/{client}"] = _run(ctx, f"{strategy}/{client}", n, fn)
    floor_dir = ctx.options.floor_dir or (str(ctx.target.data_dir) if ctx.target.data_dir else None)
    floor = physical_floor(n_each, floor_dir)
    floor_rate = 1e6 / (float(floor["rtt_us"]) + float(floor["fdatasync_us"]))
    ctx.add("each/floor", floor_rate, "msgs/s", "higher")
    for strategy in STRATEGIES:
        ctx.add(f"{strategy} ackmq÷pika", rates[f"{strategy}/ackmq"] / rates[f"{strategy}/pika"],
                "×", "higher")
    ctx.add("async ackmq-aio÷pika", rates["async/ackmq-aio"] / rates["async/pika"], "×", "higher")
    ctx.add("each ackmq÷floor", rates["each/ackmq"] / floor_rate, "×", "higher")
    ctx.add("each pika÷floor", rates["each/pika"] / floor_rate, "×", "higher")
    ctx.messages = n_async
    ctx.extra.update(floor, n_each=n_each, n_batch_async=n_async)


# -- consuming ----------------------------------------------------------------------------

def _prefill(ctx: RunContext, q: str, n: int) -> None:
    """n transient messages in a durable queue, all confirmed before timing starts."""
    body = b"x" * ctx.options.body_size

    async def go() -> None:
        conn = await open_connection(ctx.target.url, "ackmq-bench-prefill")
        try:
            ch, oc = await confirming_channel(conn, q)
            await publish_pipelined(ch, q, n, body, 1, confirms=oc)
        finally:
            await conn.close()

    run_async(go())


def _drain(ctx: RunContext, q: str, n: int, mode: AckMode | None, optimize: bool,
           prefetch: int, ack_every: int = 1) -> None:
    """Receive n messages in `mode` (None: transacted, commit every BATCH);
    CLIENT/INDIVIDUAL acknowledge every `ack_every`-th message."""
    with connect(ctx.target.url, heartbeat=0, optimize_acknowledge=optimize,
                 queue_prefetch=prefetch) as conn:
        s = conn.session(transacted=True) if mode is None else conn.session(ack_mode=mode)
        c = s.consumer(q)
        acks = mode in (AckMode.CLIENT, AckMode.INDIVIDUAL)
        with ctx.measure():
            for i in range(1, n + 1):
                m = c.receive(timeout=60)
                if m is None:
                    raise RuntimeError(f"{q}: message {i} of {n} did not come within 60 s")
                if acks and i % ack_every == 0:
                    m.acknowledge()
                elif mode is None and i % BATCH == 0:
                    s.commit()
            if mode is None:
                s.commit()
            elif acks and n % ack_every:
                assert m is not None  # n > 0: the loop above received it
                m.acknowledge()
            c.close()  # DUPS_OK / optimizeAcknowledge: the last lazy ack goes out


MODES: list[tuple[str, AckMode | None]] = [
    ("auto", AckMode.AUTO), ("client", AckMode.CLIENT), ("dups_ok", AckMode.DUPS_OK),
    ("individual", AckMode.INDIVIDUAL), ("transacted", None)]
CONSUME_PREFETCH = 1000  # J4's default


def client_consume(ctx: RunContext) -> None:
    """ackmq.client's receive() throughput per acknowledge mode, optimizeAcknowledge off
    and on (CLIENT/INDIVIDUAL ack each message, transacted commits every 100)."""
    n = ctx.n(CONSUME_N)
    rates: dict[str, float] = {}
    for label, mode in MODES:
        for optimize in (False, True):
            name = f"{label}{'+optack' if optimize else ''}"
            q = ctx.name()
            _prefill(ctx, q, n)
            mark = ctx.mark()
            _drain(ctx, q, n, mode, optimize, CONSUME_PREFETCH)
            rates[name] = n / (ctx.wall_s - mark[0])
            ctx.add(name, rates[name], "msgs/s", "higher", since=mark)
    ctx.add("auto optack on÷off", rates["auto+optack"] / rates["auto"], "×", "higher")
    ctx.messages = n  # per mode
    ctx.extra["prefetch"] = CONSUME_PREFETCH


EXT_PREFETCH = (12, 100)


def _no_ext_prefetch(p: int) -> int:
    """The prefetch whose J8 window (p + ⌈p/2⌉) is closest to p itself: a CLIENT
    consumer with it has (about) a window of p and no extension."""
    return min(range(1, p + 1), key=lambda x: (abs(x + math.ceil(x / 2) - p), -x))


def client_prefetch_ext(ctx: RunContext) -> None:
    """J8: CLIENT mode, acknowledging every P messages; the 1.5 × P window keeps messages
    flowing while the ack is on its way, a window of P stalls for a round trip each P."""
    n = ctx.n(EXT_N)
    for p in EXT_PREFETCH:
        results = {}
        for label, prefetch in (("1.5p", p), ("p", _no_ext_prefetch(p))):
            window = prefetch + math.ceil(prefetch / 2)
            q = ctx.name()
            _prefill(ctx, q, n)
            mark = ctx.mark()
            _drain(ctx, q, n, AckMode.CLIENT, False, prefetch, ack_every=p)
            results[label] = n / (ctx.wall_s - mark[0])
            ctx.add(f"P={p} window {window}", results[label], "msgs/s", "higher", since=mark)
        ctx.add(f"P={p} 1.5p÷p", results["1.5p"] / results["p"], "×", "higher")
    ctx.messages = n  # per window
    ctx.extra["prefetch"] = list(EXT_PREFETCH)
