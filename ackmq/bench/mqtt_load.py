"""MQTT workloads (`ackmq bench --mqtt`), MQTT 3.1.1 on each broker's MQTT listener:
ackmq's own (`--mqtt-port 0`), Mosquitto 2.0 (`--mosquitto`, 127.0.0.1:1884) and
RabbitMQ 3.10's plugin (`--rabbitmq-mqtt`, 127.0.0.1:1883) in the same run.

    mqtt-publish-qos0     QoS 0 PUBLISHes to a topic one QoS 0 subscriber holds, timed
                          until it has all n (msgs/s in -> out)
    mqtt-publish-qos1     QoS 1, each PUBACK awaited before the next PUBLISH (msgs/s)
    mqtt-publish-qos1-window  QoS 1 with up to WINDOW unacknowledged (msgs/s)
    mqtt-publish-qos2     QoS 2 with up to QOS2_WINDOW unfinished, PUBCOMP awaited (msgs/s);
                          RabbitMQ 3.10 downgrades QoS 2 to 1 (PUBACK): `downgraded`
    mqtt-fanout           QoS 1 publishes (window) to SUBSCRIBERS QoS 1 subscribers, each
                          delivery PUBACKed, timed until each has all n (deliveries/s)

The publish rows run with a persistent (clean session 0) QoS 1/2 subscription to their
topic, offline, so each message is kept for it: on ackmq PUBACK and PUBREC wait for its
fsync, as they would for a device's data. Bodies start with their sequence number; the
subscriber rows check that each message arrived exactly once (QoS 0 may lose: the run
fails then, saying how many arrived).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ackmq.bench.context import RUN_TIMEOUT, RunContext, run_async, run_rate
from ackmq.bench.mqtt_wire import MqttConnection
from ackmq.bench.tally import Tally
from ackmq.bench.tally import seq_body as body

WINDOW = 100
#: QoS 2 in flight: Mosquitto 2.0 takes at most 20 unfinished QoS 2 PUBLISHes from a 3.1.1
#: client (its max_inflight_messages; MQTT 5 says it in CONNACK as Receive Maximum) and
#: leaves those beyond unanswered, so every broker gets 20
QOS2_WINDOW = 20
SUBSCRIBERS = 10
CHUNK = 256  # QoS 0 PUBLISHes per socket write
STALL_S = 30.0  # a subscriber that gets nothing for this long: the run fails


def _url(ctx: RunContext) -> str:
    url = ctx.target.mqtt_url
    if not url:
        raise RuntimeError(f"{ctx.target.label} has no MQTT listener known to the bench")
    return url


def _topic(ctx: RunContext) -> str:
    return f"ackmq-bench/{ctx.workload}/{uuid.uuid4().hex[:8]}"


def _cid(ctx: RunContext, role: str) -> str:
    return f"ackmq-bench-{role}-{uuid.uuid4().hex[:10]}"


async def _publish(c: MqttConnection, topic: str, n: int, size: int, qos: int,
                   window: int) -> None:
    """n PUBLISHes at `qos`; QoS 1/2: at most `window` not completed, returns once every
    one is (PUBACK / PUBCOMP); QoS 0: written in chunks, returns after a PINGRESP."""
    if qos == 0:
        i = 0
        while i < n:
            k = min(CHUNK, n - i)
            c.write(b"".join(c.publish_bytes(topic, body(j, size), 0) for j in range(i, i + k)))
            i += k
            await c.drain()
        await c.ping()
        return
    state = {"done": 0}
    room = asyncio.Event()
    finished = asyncio.Event()

    def on_acked(k: int) -> None:
        state["done"] += k
        room.set()
        if state["done"] >= n:
            finished.set()

    async def wait(ev: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(ev.wait(), STALL_S)
        except TimeoutError:
            raise RuntimeError(f"QoS {qos}: {state['done']:,} of {sent:,} publishes "
                               f"acknowledged, then nothing for {STALL_S:.0f} s") from None

    c.on_acked = on_acked
    sent = 0
    while sent < n:
        while sent - state["done"] >= window:
            room.clear()
            await wait(room)
        k = min(window - (sent - state["done"]), n - sent)
        c.write(b"".join(c.publish_bytes(topic, body(j, size), qos)
                         for j in range(sent, sent + k)))
        sent += k
        await c.drain()
    await wait(finished)


async def _wait_all(tallies: list[Tally], n: int, what: str) -> None:
    """Until each subscriber has n messages; a subscriber stalled for STALL_S fails."""
    last, since = -1, time.monotonic()
    while True:
        got = sum(t.got for t in tallies)
        if all(t.got >= n for t in tallies):
            return
        if got != last:
            last, since = got, time.monotonic()
        elif time.monotonic() - since > STALL_S:
            for t in tallies:
                t.check(what)
        await asyncio.sleep(0.005)


async def _with_session(ctx: RunContext, qos: int,
                        run: Callable[[str], Awaitable[None]]) -> None:
    """`run(topic)` while an offline persistent session subscribed to the topic at
    `qos` keeps what is published; the session is removed after (clean session 1)."""
    url, topic, cid = _url(ctx), _topic(ctx), _cid(ctx, "session")
    s = await MqttConnection.open(url, cid, clean=False)
    granted = await s.subscribe(topic, qos)
    await s.close()
    ctx.extra["session_qos"] = granted
    try:
        await run(topic)
    finally:
        s = await MqttConnection.open(url, cid, clean=True)  # drops the session and its queue
        await s.close()


async def _run_qos0(ctx: RunContext, n: int) -> None:
    url, topic = _url(ctx), _topic(ctx)
    sub = await MqttConnection.open(url, _cid(ctx, "sub"))
    pub = await MqttConnection.open(url, _cid(ctx, "pub"))
    try:
        tally = Tally(n)
        sub.on_message = tally.add
        await sub.subscribe(topic, 0)
        with ctx.measure():
            await _publish(pub, topic, n, ctx.options.body_size, 0, 1)
            await _wait_all([tally], n, "mqtt-publish-qos0")
        tally.check("mqtt-publish-qos0")
    finally:
        await pub.close()
        await sub.close()


def _run_publish(qos: int, window: int
                 ) -> Callable[[RunContext, int], Coroutine[Any, Any, None]]:
    async def run(ctx: RunContext, n: int) -> None:
        async def publish(topic: str) -> None:
            pub = await MqttConnection.open(_url(ctx), _cid(ctx, "pub"))
            try:
                with ctx.measure():
                    await _publish(pub, topic, n, ctx.options.body_size, qos, window)
                if qos == 2:
                    ctx.extra["downgraded"] = pub.downgraded  # PUBACKs for QoS 2
            finally:
                await pub.close()

        await _with_session(ctx, qos, publish)
    return run


async def _run_fanout(ctx: RunContext, n: int) -> None:
    url, topic = _url(ctx), _topic(ctx)
    subs = [await MqttConnection.open(url, _cid(ctx, f"sub{i}")) for i in range(SUBSCRIBERS)]
    pub = await MqttConnection.open(url, _cid(ctx, "pub"))
    try:
        tallies = [Tally(n) for _ in subs]
        for s, t in zip(subs, tallies, strict=True):
            s.on_message = t.add
            await s.subscribe(topic, 1)
        with ctx.measure():
            await _publish(pub, topic, n, ctx.options.body_size, 1, WINDOW)
            await _wait_all(tallies, n, "mqtt-fanout")
        for t in tallies:
            t.check("mqtt-fanout")
    finally:
        await pub.close()
        for s in subs:
            await s.close()


def publish_qos0(ctx: RunContext) -> None:
    run_rate(ctx, "mqtt-publish-qos0", 50_000, _run_qos0)


def publish_qos1(ctx: RunContext) -> None:
    run_rate(ctx, "mqtt-publish-qos1", 5_000, _run_publish(1, 1))


def publish_qos1_window(ctx: RunContext) -> None:
    run_rate(ctx, "mqtt-publish-qos1-window", 20_000, _run_publish(1, WINDOW))


def publish_qos2(ctx: RunContext) -> None:
    run_rate(ctx, "mqtt-publish-qos2", 20_000, _run_publish(2, QOS2_WINDOW))


def fanout(ctx: RunContext) -> None:
    """Deliveries/s: n publishes × SUBSCRIBERS."""
    n = ctx.n(5_000)
    run_async(asyncio.wait_for(_run_fanout(ctx, n), RUN_TIMEOUT))
    ctx.messages = n
    ctx.add("mqtt-fanout", n * SUBSCRIBERS / ctx.wall_s, "deliveries/s", "higher")
