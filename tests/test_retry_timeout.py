"""Redelivery back-off kept by the broker (SPEC L6) and consumer timeouts that tell the
consumer (SPEC L7), with pika, aio-pika, raw AMQP frames and STOMP.

Why: task stacks retry with a delay ("in 30 s, then 2 min") and run long tasks; the
delay must not sit in a consumer's prefetch, and a stuck consumer must lose its
deliveries without its channel (and the other consumers on it) going down.

Reference: RabbitMQ 3.10 (here) has neither a delayed retry nor a per-consumer timeout
nor the basic.cancel on timeout: the back-off tests run on ackmq only and follow RabbitMQ
4.3's quorum-queue "delayed retry" documentation (x-delayed-retry-type/min/max; the
multiplier is LavinMQ's); the timeout tests follow RabbitMQ 4.3's documentation
(consumer_timeout_response = notify_consumer: basic.cancel to a client that advertised
consumer_cancel_notify, its deliveries returned, late acks ignored) and RabbitMQ 3.10's
channel close for other clients (its text, from rabbit_channel.erl, is checked below and
by test_liveness.py's H2 tests).
"""

from __future__ import annotations

import asyncio
import decimal
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from conftest import BrokerProcess
from pamqp import commands
from support.pikahelp import closed_with, uniq
from support.rawamqp import Message, RawConnection

from ackmq.broker.retry import Backoff, backoff_of, check_retry_argument

# RabbitMQ 3.10's text (rabbit_channel:handle_consumer_timed_out)
TIMEOUT_TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel {ch} timed out. "
                "Timeout value used: {ms} ms. This timeout value can be configured, see "
                "consumers doc guide to learn more")


@pytest.fixture
def ackmq_only(is_rabbitmq: bool) -> None:
    if is_rabbitmq:
        pytest.skip("RabbitMQ 3.10 has no delayed retry / per-consumer timeout / cancel on "
                    "timeout (RabbitMQ 4.3 documents them; checked here against ackmq)")


def _declare(ch: Any, q: str, **args: Any) -> None:
    ch.queue_declare(q, arguments=args or None)


def _ready(ch: Any, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def _get_within(ch: Any, q: str, timeout: float, auto_ack: bool = True
                ) -> tuple[Any, Any, bytes, float]:
    """basic.get until a message comes; (method, props, body, when)."""
    deadline = time.monotonic() + timeout
    while True:
        m, p, b = ch.basic_get(q, auto_ack=auto_ack)
        if m is not None:
            return m, p, b, time.monotonic()
        assert time.monotonic() < deadline, f"nothing on {q} within {timeout} s"
        time.sleep(0.02)


# ---- L6: the rule ------------------------------------------------------------------------

def test_L6_backoff_formula_linear_exponential_capped() -> None:
    """Linear (RabbitMQ 4.3): min * n; with a multiplier: min * m ** (n - 1); max caps;
    a type picks which returns are delayed."""
    lin = Backoff("all", 100, 250, None)
    assert [lin.delay_ms(n, True) for n in (1, 2, 3, 4)] == [100, 200, 250, 250]
    exp = Backoff("all", 100, None, 2.0)
    assert [exp.delay_ms(n, False) for n in (1, 2, 3, 4)] == [100, 200, 400, 800]
    assert Backoff("all", 100, None, 1.0).delay_ms(9, True) == 100  # constant
    assert Backoff("all", 1, None, 10.0).delay_ms(500, True) == 2**32 - 1  # ~49.7 days cap
    failed = Backoff("failed", 100, None, None)
    assert failed.delay_ms(1, True) == 100 and failed.delay_ms(1, False) == 0
    returned = Backoff("returned", 100, None, None)
    assert returned.delay_ms(1, True) == 0 and returned.delay_ms(1, False) == 100
    # pika sends 1.5 as a decimal; a NaN (STOMP "nan") is refused, not a broken timer
    assert backoff_of({"x-delayed-retry-min": 10, "x-delayed-retry-multiplier":
                       decimal.Decimal("1.5")}).delay_ms(3, True) == 22
    assert check_retry_argument("x-delayed-retry-multiplier", float("nan"), {}) == \
        "{value_not_finite,nan}"


# ---- L6: on the wire ---------------------------------------------------------------------

def test_L6_nack_requeue_waits_out_backoff_while_others_flow(ackmq_only: None,
                                                            connection: Any) -> None:
    """A nacked message returns only after its delay; the next message is delivered at
    once meanwhile; the redelivery carries x-delivery-count (1)."""
    ch = connection.channel()
    q = uniq("l6.flow")
    _declare(ch, q, **{"x-delayed-retry-min": 700})
    for body in (b"a", b"b"):
        ch.basic_publish("", q, body)
    m, _p, body = ch.basic_get(q)
    assert body == b"a"
    nacked = time.monotonic()
    ch.basic_nack(m.delivery_tag, requeue=True)
    m2, _p, body2 = ch.basic_get(q, auto_ack=True)
    assert body2 == b"b"  # not blocked behind the delayed one
    assert _ready(ch, q) == 0  # waiting out its back-off: not ready
    _m, props, body3, when = _get_within(ch, q, 10)
    assert body3 == b"a" and _m.redelivered
    assert when - nacked >= 0.65  # never before its time (the timer may fire late)
    assert props.headers["x-delivery-count"] == 1
    ch.queue_delete(q)


def test_L6_exponential_backoff_grows_and_caps(ackmq_only: None, connection: Any) -> None:
    """min 150 ms, multiplier 2, max 400 ms: waits of at least 150, 300, 400 ms."""
    ch = connection.channel()
    q = uniq("l6.exp")
    _declare(ch, q, **{"x-delayed-retry-min": 150, "x-delayed-retry-multiplier": 2,
                       "x-delayed-retry-max": 400})
    ch.basic_publish("", q, b"x")
    m, _props, _b, _w = _get_within(ch, q, 5, auto_ack=False)
    waits = []
    for n in (1, 2, 3):
        ch.basic_nack(m.delivery_tag, requeue=True)
        nacked = time.monotonic()
        m, props, _b, when = _get_within(ch, q, 10, auto_ack=False)
        waits.append(when - nacked)
        assert props.headers["x-delivery-count"] == n
    assert all(w >= lo for w, lo in zip(waits, (0.14, 0.29, 0.39), strict=True)), waits
    ch.queue_delete(q)


def test_L6_connection_lost_is_delayed_for_type_all_not_failed(ackmq_only: None,
                                                               params: Any) -> None:
    """type all: a delivery returned by a lost connection waits too; type failed: only a
    client's nack/reject does, a return is ready at once."""
    for kind, delayed in (("all", True), ("failed", False)):
        c1, c2 = pika.BlockingConnection(params), pika.BlockingConnection(params)
        ch2 = c2.channel()
        q = uniq(f"l6.lost.{kind}")
        _declare(ch2, q, **{"x-delayed-retry-min": 2000, "x-delayed-retry-type": kind})
        ch2.basic_publish("", q, b"m")
        ch1 = c1.channel()
        m, _p, _b = ch1.basic_get(q)
        assert m is not None
        c1.close()  # unacked: returned (D8)
        time.sleep(0.3)
        assert _ready(ch2, q) == (0 if delayed else 1), kind
        _m, props, _b, _w = _get_within(ch2, q, 10)
        assert _m.redelivered and props.headers["x-delivery-count"] == 1
        ch2.queue_delete(q)
        c2.close()


def test_L6_consumer_argument_overrides_queue(ackmq_only: None, connection: Any) -> None:
    """x-delayed-retry-* as basic.consume arguments: that consumer's nacks wait, on a
    queue without a back-off of its own (how ackmq.client's RedeliveryPolicy asks)."""
    ch = connection.channel()
    q = uniq("l6.consumer")
    _declare(ch, q)
    ch.basic_publish("", q, b"m")
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m),
                     arguments={"x-delayed-retry-min": 600})
    connection.process_data_events(time_limit=0)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got
    ch.basic_nack(got[0].delivery_tag, requeue=True)
    t0 = time.monotonic()
    while len(got) < 2 and time.monotonic() < t0 + 10:
        connection.process_data_events(time_limit=0.05)
    assert len(got) == 2 and got[1].redelivered
    assert time.monotonic() - t0 >= 0.55
    ch.queue_delete(q)


def test_L6_delivery_limit_dead_letters_instead_of_waiting(ackmq_only: None,
                                                           connection: Any) -> None:
    """Past x-delivery-limit the message is dead-lettered at once, not delayed."""
    ch = connection.channel()
    q, dlq = uniq("l6.limit"), uniq("l6.limit.dlq")
    _declare(ch, dlq)
    _declare(ch, q, **{"x-delayed-retry-min": 100, "x-delivery-limit": 1,
                       "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"m")
    m, _p, _b, _w = _get_within(ch, q, 5, auto_ack=False)
    ch.basic_nack(m.delivery_tag, requeue=True)  # delivery count 1: waits 100 ms
    m, _p, _b, _w = _get_within(ch, q, 10, auto_ack=False)
    ch.basic_nack(m.delivery_tag, requeue=True)  # count 2 > limit 1: dead-lettered now
    assert _ready(ch, dlq) == 1 and _ready(ch, q) == 0
    ch.queue_delete(q)
    ch.queue_delete(dlq)


@pytest.mark.parametrize("key,value,error", [
    ("x-delayed-retry-min", -1, "{value_negative,-1}"),
    ("x-delayed-retry-min", "soon", "{unacceptable_type,longstr}"),
    ("x-delayed-retry-min", 2**32, "{value_too_large,4294967296}"),
    ("x-delayed-retry-type", "sometimes", "invalid_delayed_retry_type"),
    ("x-delayed-retry-multiplier", 0, "{value_too_small,0}"),
])
def test_L6_invalid_arguments_refused_406(ackmq_only: None, connection: Any, key: str,
                                          value: Any, error: str) -> None:
    """RabbitMQ's texts for a bad queue argument (rabbit_amqqueue's style)."""
    ch = connection.channel()
    q = uniq("l6.bad")
    closed_with(lambda: ch.queue_declare(q, arguments={key: value}), 406,
                f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{q}' in vhost '/': "
                f"{error}")


def test_L6_max_below_min_refused(ackmq_only: None, connection: Any) -> None:
    ch = connection.channel()
    q = uniq("l6.bad")
    closed_with(lambda: ch.queue_declare(q, arguments={"x-delayed-retry-min": 500,
                                                      "x-delayed-retry-max": 100}), 406,
                f"PRECONDITION_FAILED - invalid arg 'x-delayed-retry-max' for queue '{q}' in "
                "vhost '/': {max_less_than_min,100,500}")


def test_L6_management_counts_delayed_apart_from_ready(ackmq_mgmt: Any) -> None:
    """GET /api/queues: `messages_delayed_retry` counts the waiting ones; they are not in
    `messages_ready` (nor in queue.declare-ok's count) but are in `messages`."""
    from support.mgmthelp import Target
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    conn = pika.BlockingConnection(pika.URLParameters(ackmq_mgmt.url))
    try:
        ch = conn.channel()
        q = uniq("l6.mgmt")
        _declare(ch, q, **{"x-delayed-retry-min": 60_000})
        ch.basic_publish("", q, b"m")
        ch.basic_publish("", q, b"n")
        m, _p, _b = ch.basic_get(q)
        ch.basic_nack(m.delivery_tag, requeue=True)
        r = t.call("GET", f"/api/queues/%2F/{q}")
        assert r.status == 200
        assert (r.body["messages_delayed_retry"], r.body["messages_ready"],
                r.body["messages_unacknowledged"], r.body["messages"]) == (1, 1, 0, 2)
        assert _ready(ch, q) == 1
        assert ch.queue_purge(q).method.message_count == 2  # the waiting one too
        r = t.call("GET", f"/api/queues/%2F/{q}")
        assert (r.body["messages_delayed_retry"], r.body["messages"]) == (0, 0)
        ch.queue_delete(q)
    finally:
        conn.close()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """An ackmq of this test's own: restarted, or with --consumer-timeout-ms."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("needs its own ackmq")
    b = BrokerProcess(tmp_path)
    yield b
    b.stop()


@pytest.mark.slow
def test_L6_after_restart_a_waiting_message_is_ready_at_once(own_broker: BrokerProcess) -> None:
    """The back-off lives in memory: a persistent message waiting out a 10-minute delay
    is ready as soon as the broker is back (it was on disk in its queue all along)."""
    url = own_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq("l6.restart")
    ch.queue_declare(q, durable=True, arguments={"x-delayed-retry-min": 600_000})
    ch.basic_publish("", q, b"m", pika.BasicProperties(delivery_mode=2))
    m, _p, _b = ch.basic_get(q)
    ch.basic_nack(m.delivery_tag, requeue=True)
    assert _ready(ch, q) == 0
    conn.close()
    own_broker.stop()
    url = own_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        m, props, body = ch.basic_get(q, auto_ack=True)
        assert body == b"m" and m.redelivered
        assert props.headers["x-delivery-count"] == 1
    finally:
        conn.close()


async def test_L6_aio_pika_reject_requeue_comes_back_after_delay(ackmq_only: None,
                                                                 broker_url: str) -> None:
    """aio-pika's `message.reject(requeue=True)` inside an iterator: the message comes
    back after the queue's delay, with x-delivery-count; a second message is not held."""
    async with asyncio.timeout(30):
        conn = await aio_pika.connect(broker_url)
        try:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.declare_queue(uniq("l6.aio"), arguments={"x-delayed-retry-min": 500})
            for body in (b"a", b"b"):
                await ch.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
            seen: list[tuple[bytes, float, Any]] = []
            async with q.iterator() as it:
                async for msg in it:
                    seen.append((msg.body, time.monotonic(), msg.headers.get("x-delivery-count")))
                    if len(seen) == 1:
                        await msg.reject(requeue=True)
                    else:
                        await msg.ack()
                    if len(seen) == 3:
                        break
            assert [s[0] for s in seen] == [b"a", b"b", b"a"]
            assert seen[2][2] == 1
            assert seen[2][1] - seen[0][1] >= 0.45
            assert seen[1][1] - seen[0][1] < seen[2][1] - seen[0][1]
            await q.delete()
        finally:
            await conn.close()


def test_L6_stomp_nack_waits_out_backoff(ackmq_only: None, ackmq_target: Any) -> None:
    """STOMP: a NACK on a queue with a back-off is redelivered after the delay."""
    c = ackmq_target.pika()
    ch = c.channel()
    q = uniq("l6.stomp")
    _declare(ch, q, **{"x-delayed-retry-min": 600})
    ch.basic_publish("", q, b"m")
    r = ackmq_target.raw()
    try:
        r.subscribe(f"/amq/queue/{q}", "s1", ack="client-individual")
        msg = r.expect("MESSAGE")
        r.send("NACK", {"id": msg.headers["ack"]})
        t0 = time.monotonic()
        again = r.expect("MESSAGE", timeout=10)
        assert time.monotonic() - t0 >= 0.55
        assert again.body == b"m" and again.headers.get("redelivered") == "true"
        r.send("ACK", {"id": again.headers["ack"]})
    finally:
        r.close()
        ch.queue_delete(q)
        c.close()


def test_L6_L7_stomp_subscription_headers(ackmq_only: None, ackmq_target: Any) -> None:
    """STOMP SUBSCRIBE headers `x-delayed-retry-min` and `x-consumer-timeout` are that
    subscription's consume arguments: its NACK waits out the delay; a message it then
    holds past the timeout ends it with an ERROR naming it, the connection stays."""
    c = ackmq_target.pika()
    ch = c.channel()
    q = uniq("l67.stomp")
    _declare(ch, q)
    ch.basic_publish("", q, b"m")
    r = ackmq_target.raw()
    try:
        r.subscribe(f"/amq/queue/{q}", "s1", ack="client-individual",
                    **{"x-delayed-retry-min": "500", "x-consumer-timeout": "1500"})
        msg = r.expect("MESSAGE")
        r.send("NACK", {"id": msg.headers["ack"]})
        t0 = time.monotonic()
        again = r.expect("MESSAGE", timeout=10)
        assert time.monotonic() - t0 >= 0.45 and again.headers.get("redelivered") == "true"
        err = r.expect("ERROR", timeout=10)  # held past 1.5 s
        assert err.headers["subscription"] == "s1" and b"consumer timeout" in err.body
        r.send("ACK", {"id": again.headers["ack"]})  # late: ignored
        r.send("SEND", {"destination": f"/amq/queue/{q}", "receipt": "r1"}, b"n")
        assert r.expect("RECEIPT").headers["receipt-id"] == "r1"
    finally:
        r.close()
        ch.queue_delete(q)
        c.close()


def test_L7_stomp_bad_timeout_header_refused(ackmq_only: None, ackmq_target: Any) -> None:
    c = ackmq_target.pika()
    ch = c.channel()
    q = uniq("l7.stomp.bad")
    _declare(ch, q)
    r = ackmq_target.raw()
    try:
        r.subscribe(f"/amq/queue/{q}", "s1", ack="client", receipt=False,
                    **{"x-consumer-timeout": "soon"})
        err = r.expect("ERROR")
        assert b"x-consumer-timeout" in err.body + err.headers.get("message", "").encode()
    finally:
        r.close()
        ch.queue_delete(q)
        c.close()


# ---- L7 ----------------------------------------------------------------------------------

def _take(conn: RawConnection, n: int, timeout: float = 5.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        _, frame = conn.recv(max(0.01, deadline - time.monotonic()))
        assert isinstance(frame, Message), frame
        out.append(frame)
    return out


def _fill(conn: RawConnection, q: str, n: int, **args: Any) -> None:
    conn.rpc(1, commands.Queue.Declare(queue=q, arguments=args), commands.Queue.DeclareOk)
    for i in range(n):
        conn.publish(1, "", q, str(i).encode())


def test_L7_consumer_timeout_cancels_capable_consumer(ackmq_only: None, broker_url: str) -> None:
    """RabbitMQ 4.3 (notify_consumer): a consumer whose client advertised
    consumer_cancel_notify gets basic.cancel when a delivery overruns its
    x-consumer-timeout; its unacked deliveries go back (redelivered); the channel and its
    other consumer stay; a late ack of a taken-back delivery is ignored."""
    conn = RawConnection.open(broker_url)
    q, q2 = uniq("l7.cancel"), uniq("l7.other")
    try:
        conn.open_channel(1)
        conn.open_channel(2)
        _fill(conn, q, 2)
        _fill(conn, q2, 0)
        conn.rpc(1, commands.Basic.Consume(queue=q2, consumer_tag="patient"),
                 commands.Basic.ConsumeOk)
        conn.rpc(1, commands.Basic.Consume(queue=q, consumer_tag="slow",
                                           arguments={"x-consumer-timeout": 400}),
                 commands.Basic.ConsumeOk)
        got = _take(conn, 2)
        cancel = conn.expect(commands.Basic.Cancel, timeout=10, channel=1)
        assert cancel.consumer_tag == "slow"
        conn.send(1, commands.Basic.Ack(got[0].delivery_tag))  # late: ignored
        conn.rpc(1, commands.Basic.Qos(0, 0), commands.Basic.QosOk)  # channel still open
        conn.publish(1, "", q2, b"p")
        assert _take(conn, 1)[0].body == b"p"  # the other consumer still served
        conn.send(2, commands.Basic.Get(queue=q, no_ack=True))
        back = _take(conn, 1)
        assert back[0].redelivered and back[0].body == b"0"
    finally:
        conn.close()


def test_L7_a_consumer_already_cancelled_loses_its_deliveries_quietly(
        ackmq_only: None, broker_url: str) -> None:
    """The client cancelled its consumer but still holds a delivery past the timeout:
    the delivery goes back, no basic.cancel for a consumer the client no longer has, the
    channel stays open (RabbitMQ 4.4 closes it: rabbitmq-server discussion 18207 calls
    that an oversight), and the late ack is ignored."""
    conn = RawConnection.open(broker_url)
    q = uniq("l7.gone")
    try:
        conn.open_channel(1)
        _fill(conn, q, 1)
        conn.rpc(1, commands.Basic.Consume(queue=q, consumer_tag="c",
                                           arguments={"x-consumer-timeout": 300}),
                 commands.Basic.ConsumeOk)
        [m] = _take(conn, 1)
        conn.rpc(1, commands.Basic.Cancel(consumer_tag="c"), commands.Basic.CancelOk)
        deadline = time.monotonic() + 10
        while True:  # basic.get until the message is back (redelivered)
            conn.send(1, commands.Basic.Get(queue=q, no_ack=True))
            _, frame = conn.recv(5)
            assert not isinstance(frame, (commands.Basic.Cancel, commands.Channel.Close)), frame
            if isinstance(frame, Message):
                assert frame.redelivered and frame.body == b"0"
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        conn.send(1, commands.Basic.Ack(m.delivery_tag))  # late: ignored
        conn.rpc(1, commands.Basic.Qos(0, 0), commands.Basic.QosOk)
    finally:
        conn.close()


def test_L7_consumer_timeout_closes_channel_for_other_clients(ackmq_only: None,
                                                              broker_url: str) -> None:
    """A client without consumer_cancel_notify keeps RabbitMQ 3.10's behaviour: 406 on
    the channel, with RabbitMQ's text and the timeout used (the consumer's own here)."""
    conn = RawConnection.open(broker_url, capabilities={"consumer_cancel_notify": False})
    q = uniq("l7.close")
    try:
        conn.open_channel(1)
        _fill(conn, q, 1, **{"x-consumer-timeout": 60_000})
        conn.rpc(1, commands.Basic.Consume(queue=q, consumer_tag="slow",
                                           arguments={"x-consumer-timeout": 300}),
                 commands.Basic.ConsumeOk)
        _take(conn, 1)
        close = conn.wait_close(10)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.reply_text) == (406, TIMEOUT_TEXT.format(ch=1, ms=300))
    finally:
        conn.close()


def test_L7_bad_consumer_timeout_argument_refused(ackmq_only: None, connection: Any) -> None:
    ch = connection.channel()
    q = uniq("l7.bad")
    ch.queue_declare(q)
    closed_with(lambda: ch.basic_consume(q, lambda *a: None,
                                         arguments={"x-consumer-timeout": -5}), 406,
                f"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue '{q}' in "
                "vhost '/': {value_negative,-5}")
    connection.channel().queue_delete(q)


def test_L7_pika_on_cancel_callback_runs(ackmq_only: None, connection: Any) -> None:
    """pika (advertises consumer_cancel_notify): the consumer's cancel callback runs; the
    message is consumed again by a new consumer on the same channel."""
    ch = connection.channel()
    q = uniq("l7.pika")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    got: list[Any] = []
    tag = ch.basic_consume(q, lambda c, m, p, b: got.append(m),
                           arguments={"x-consumer-timeout": 300})
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert cancelled == [tag] and len(got) == 1
    m, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"m" and m.redelivered
    ch.queue_delete(q)


@pytest.mark.slow
def test_L7_global_timeout_stomp_error_names_subscription(own_broker: BrokerProcess) -> None:
    """STOMP (broker-wide --consumer-timeout-ms): an ERROR names the subscription and the
    reason; the connection and its other subscriptions stay (as for a deleted queue,
    RabbitMQ's STOMP); the message goes back to the queue."""
    from support.stomphelp import Raw
    own_broker.extra = ("--consumer-timeout-ms", "400", "--no-fsync")
    url = own_broker.start()
    host, port = own_broker.stomp_url.split("//", 1)[1].rsplit(":", 1)
    c = pika.BlockingConnection(pika.URLParameters(url))
    ch = c.channel()
    q = uniq("l7.stomp")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    r = Raw.open(host, int(port))
    try:
        r.connect("1.2", host="/")
        r.subscribe(f"/amq/queue/{q}", "s1", ack="client-individual")
        msg = r.expect("MESSAGE")
        err = r.expect("ERROR", timeout=10)
        assert err.headers["subscription"] == "s1"
        assert b"consumer timeout" in err.body
        r.send("ACK", {"id": msg.headers["ack"]})  # late: ignored, no second ERROR
        r.send("SEND", {"destination": f"/amq/queue/{q}", "receipt": "r1"}, b"n")
        assert r.expect("RECEIPT").headers["receipt-id"] == "r1"
        assert not r.closed(0.3)
        m, _p, body = ch.basic_get(q, auto_ack=True)
        assert body == b"m" and m.redelivered
    finally:
        r.close()
        c.close()


async def test_L7_aio_pika_cancelled_consumer_messages_return(ackmq_only: None,
                                                              broker_url: str) -> None:
    """aio-pika: after the broker's basic.cancel the channel still works and the
    message is taken again by another consumer, redelivered."""
    async with asyncio.timeout(30):
        conn = await aio_pika.connect(broker_url)
        try:
            ch = await conn.channel()
            q = await ch.declare_queue(uniq("l7.aio"))
            await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=q.name)
            first: asyncio.Queue[Any] = asyncio.Queue()
            await q.consume(first.put, arguments={"x-consumer-timeout": 300})
            msg = await first.get()
            assert not msg.redelivered
            ch2 = await conn.channel()
            q2 = await ch2.get_queue(q.name)
            again = None
            deadline = time.monotonic() + 10
            while again is None and time.monotonic() < deadline:
                again = await q2.get(no_ack=True, fail=False)
                if again is None:
                    await asyncio.sleep(0.05)
            assert again is not None and again.body == b"m" and again.redelivered
            await ch.declare_queue(q.name, passive=True)  # the first channel is open
            await q2.delete()
        finally:
            await conn.close()


@pytest.mark.slow
def test_L7_close_channel_response_closes_even_capable_clients(own_broker: BrokerProcess,
                                                               tmp_path: Path) -> None:
    """`consumer_timeout_response = close_channel` in the config file (RabbitMQ 4.3.7's
    key): RabbitMQ 3.x's channel close for every client, with the global timeout."""
    conf = tmp_path / "ackmq.conf"
    conf.write_text("consumer_timeout = 400\nconsumer_timeout_response = close_channel\n")
    own_broker.extra = ("--config", str(conf), "--no-fsync")
    url = own_broker.start()
    conn = RawConnection.open(url)  # advertises consumer_cancel_notify
    q = uniq("l7.closeall")
    try:
        conn.open_channel(1)
        _fill(conn, q, 1)
        conn.rpc(1, commands.Basic.Consume(queue=q, consumer_tag="slow"),
                 commands.Basic.ConsumeOk)
        _take(conn, 1)
        close = conn.wait_close(10)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.reply_text) == (406, TIMEOUT_TEXT.format(ch=1, ms=400))
    finally:
        conn.close()


# ---- kombu (Celery's transport, py-amqp) ---------------------------------------------------

def test_L6_kombu_requeue_waits_out_the_queue_backoff(ackmq_only: None, broker_url: str) -> None:
    """kombu, as Celery declares and consumes (`queue_arguments`, `message.requeue()`,
    what `Reject(requeue=True)` and a lost worker do under acks_late): the requeued
    message comes back after the queue's delay, with x-delivery-count."""
    import kombu
    name = uniq("l6.kombu")
    queue = kombu.Queue(name, routing_key=name, queue_arguments={"x-delayed-retry-min": 600})
    with kombu.Connection(broker_url) as conn:
        producer = conn.Producer()
        producer.publish(b"task", exchange="", routing_key=name, declare=[queue])
        seen: list[tuple[float, Any]] = []

        def on_message(body: Any, message: Any) -> None:
            seen.append((time.monotonic(), message.headers.get("x-delivery-count")))
            if len(seen) == 1:
                message.requeue()
            else:
                message.ack()

        with conn.Consumer(queue, callbacks=[on_message], accept=None):
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
        assert len(seen) == 2 and seen[1][1] == 1
        assert seen[1][0] - seen[0][0] >= 0.55
        queue(conn.default_channel).delete()


def test_L7_kombu_sees_consumer_cancelled(ackmq_only: None, broker_url: str) -> None:
    """kombu/py-amqp advertise consumer_cancel_notify; with no cancel callback py-amqp
    raises `ConsumerCancelled` (a RecoverableConnectionError: Celery then reconnects)
    from drain_events; the held message is back in the queue, redelivered."""
    import amqp.exceptions
    import kombu
    name = uniq("l7.kombu")
    queue = kombu.Queue(name, routing_key=name,
                        consumer_arguments={"x-consumer-timeout": 300})
    with kombu.Connection(broker_url) as conn:
        conn.Producer().publish(b"long task", exchange="", routing_key=name, declare=[queue])
        held: list[Any] = []
        with pytest.raises(amqp.exceptions.ConsumerCancelled):  # noqa: PT012
            with conn.Consumer(queue, callbacks=[lambda b, m: held.append(m)], accept=None):
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
        assert len(held) == 1
    with kombu.Connection(broker_url) as conn:
        ch = conn.default_channel
        m = ch.basic_get(name, no_ack=True)
        assert m is not None and m.body == b"long task" and m.delivery_info["redelivered"]
        queue(ch).delete()


def test_L6_redeclare_with_another_backoff_is_inequivalent(ackmq_only: None,
                                                          connection: Any) -> None:
    """The back-off arguments are compared on redeclare, as RabbitMQ compares a queue
    type's own arguments (406 inequivalent arg)."""
    ch = connection.channel()
    q = uniq("l6.redeclare")
    _declare(ch, q, **{"x-delayed-retry-min": 500})
    _declare(ch, q, **{"x-delayed-retry-min": 500})  # the same: fine
    text = closed_with(lambda: ch.queue_declare(q, arguments={"x-delayed-retry-min": 600}),
                       406)
    assert "inequivalent arg 'x-delayed-retry-min'" in text
    connection.channel().queue_delete(q)


# ---- L6 by policy (M5): RabbitMQ 4.3's policy keys for its delayed-retry arguments ---------

def test_L6_M5_policy_sets_the_backoff_live_and_clearing_it_ends_it(ackmq_mgmt: Any) -> None:
    """`delayed-retry-min` (and -type/-max, ackmq's -multiplier) in a policy give a queue
    declared without them its back-off at once (M7: live), as RabbitMQ 4.3's policy keys
    do; the queue's own `x-delayed-retry-*` argument wins over the policy's (M6: for
    every key that is not a numeric limit); clearing the policy ends the back-off."""
    from support.mgmthelp import Target
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    conn = pika.BlockingConnection(pika.URLParameters(ackmq_mgmt.url))
    q, own = uniq("l6.pol"), uniq("l6.pol.own")
    path = f"/api/policies/%2F/{q}"
    try:
        ch = conn.channel()
        _declare(ch, q)
        _declare(ch, own, **{"x-delayed-retry-min": 60_000})
        r = t.call("PUT", path, {"pattern": f"^{q}", "apply-to": "queues", "definition": {
            "delayed-retry-min": 600, "delayed-retry-type": "failed"}})
        assert r.status == 201, r.body
        r = t.call("GET", f"/api/queues/%2F/{q}")
        assert r.body["effective_policy_definition"] == {"delayed-retry-min": 600,
                                                         "delayed-retry-type": "failed"}
        ch.basic_publish("", q, b"a")
        m, _p, _b = ch.basic_get(q)
        nacked = time.monotonic()
        ch.basic_nack(m.delivery_tag, requeue=True)
        assert _ready(ch, q) == 0  # waiting out the policy's back-off
        _m, props, body, when = _get_within(ch, q, 10)
        assert body == b"a" and when - nacked >= 0.55
        assert props.headers["x-delivery-count"] == 1
        # the queue's own argument (60 s) wins over the policy's 600 ms
        ch.basic_publish("", own, b"o")
        m, _p, _b = ch.basic_get(own)
        ch.basic_nack(m.delivery_tag, requeue=True)
        assert t.call("GET", f"/api/queues/%2F/{own}").body["messages_delayed_retry"] == 1
        assert t.call("DELETE", path).status == 204
        ch.basic_publish("", q, b"b")
        m, _p, _b = ch.basic_get(q)
        ch.basic_nack(m.delivery_tag, requeue=True)
        assert _ready(ch, q) == 1  # no policy, no argument: back at once
        ch.queue_delete(q)
        ch.queue_delete(own)
    finally:
        t.call("DELETE", path)
        conn.close()


@pytest.mark.parametrize("definition, text", [
    ({"delayed-retry-min": -1}, "-1 is not a valid delayed retry minimum delay"),
    ({"delayed-retry-min": "1s"}, '<<"1s">> is not a valid delayed retry minimum delay'),
    ({"delayed-retry-max": 2**32}, "4294967296 is not a valid delayed retry maximum delay"),
    ({"delayed-retry-min": 500, "delayed-retry-max": 100},
     "delayed-retry-max 100 is less than delayed-retry-min 500"),
    ({"delayed-retry-type": "sometimes"},
     '<<"sometimes">> is not a valid delayed retry type'),
    ({"delayed-retry-multiplier": 0.5}, "0.5 is not a valid delayed retry multiplier"),
])
def test_L6_M5_bad_backoff_policy_values_refused(ackmq_mgmt: Any, definition: dict[str, Any],
                                                 text: str) -> None:
    """Refused as RabbitMQ refuses a policy value (400, `Validation failed\\n\\n<text>\\n`),
    never taken as no back-off."""
    from support.mgmthelp import Target, escaped
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    r = t.call("PUT", "/api/policies/%2F/l6bad", {"pattern": "^l6bad",
                                                   "definition": definition})
    assert r.status == 400  # the reason HTML-escaped, as RabbitMQ's API sends it
    assert r.body["reason"] == escaped(f"Validation failed\n\n{text}\n")
