"""Stream queues over AMQP 0-9-1 (SPEC R1-R3), the same scenario against ackmq and the
reference RabbitMQ 3.10: codes, texts, offsets and header types compared.

RabbitMQ refreshes a stream's message count every few seconds; ackmq's is current, so
counts are polled until they settle.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.compat
import pika.exceptions
import pytest
from conftest import BrokerProcess, rabbitmq_url

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def url(request: pytest.FixtureRequest, broker_url: str) -> str:
    if request.param == "ackmq":
        return broker_url
    return rabbitmq_url()


@pytest.fixture
def conn(url: str) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(pika.URLParameters(url))
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def stream(conn: pika.BlockingConnection) -> Iterator[str]:
    """A fresh stream (deleted afterwards)."""
    name = f"t.stream.{uuid.uuid4().hex[:10]}"
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    yield name
    if conn.is_open:
        conn.channel().queue_delete(name)
    else:
        c = pika.BlockingConnection(conn._impl.params)
        c.channel().queue_delete(name)
        c.close()


def publish(conn: pika.BlockingConnection, queue: str, n: int, start: int = 0) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(start, start + n):
        ch.basic_publish("", queue, f"m{i}".encode(), PERSISTENT)
    ch.close()


def consume(conn: pika.BlockingConnection, queue: str, offset: Any = None, n: int = 0,
            prefetch: int = 100, ack: bool = True, wait: float = 3.0,
            args: dict | None = None) -> list[tuple[Any, bytes]]:
    """(x-stream-offset header, body) of what one consumer gets: `n` deliveries, or
    whatever arrives within `wait` seconds when n is 0 or not reached."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[Any, bytes]] = []

    def on(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append(((p.headers or {}).get("x-stream-offset"), b))
        if ack:
            c.basic_ack(m.delivery_tag)

    a = dict(args or {})
    if offset is not None:
        a["x-stream-offset"] = offset
    ch.basic_consume(queue, on, arguments=a)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (not n or len(got) < n):
        conn.process_data_events(0.05)
    ch.close()
    return got


def refused(conn: pika.BlockingConnection, fn: Callable[[Any], Any]) -> tuple[str, int, str]:
    """Run fn on a new channel: ("channel"|"connection", code, text) of the refusal."""
    ch = conn.channel()
    try:
        fn(ch)
        conn.process_data_events(0.5)
        ch.basic_qos(prefetch_count=1)  # a round trip: a late close arrives first
    except pika.exceptions.ChannelClosedByBroker as e:
        return "channel", e.reply_code, e.reply_text
    except pika.exceptions.ConnectionClosedByBroker as e:
        return "connection", e.reply_code, e.reply_text
    raise AssertionError("not refused")


def declare(name: str, durable: bool = True, exclusive: bool = False,
            auto_delete: bool = False, **args: Any) -> Callable[[Any], Any]:
    return lambda ch: ch.queue_declare(name, durable=durable, exclusive=exclusive,
                                       auto_delete=auto_delete,
                                       arguments={"x-queue-type": "stream", **args})


def count(conn: pika.BlockingConnection, queue: str, want: int, timeout: float = 12.0) -> int:
    """Passive declare's message_count, polled until it is `want` (RabbitMQ: stats tick)."""
    deadline = time.monotonic() + timeout
    while True:
        ch = conn.channel()
        n = ch.queue_declare(queue, passive=True).method.message_count
        ch.close()
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.5)


# -- R1: declaration ------------------------------------------------------------------

@pytest.mark.parametrize("flags,prop", [
    ({"durable": False}, "non-durable"), ({"exclusive": True}, "exclusive-owner"),
    ({"auto_delete": True}, "auto-delete"), ({"exclusive": True, "auto_delete": True},
                                             "auto-delete")])
def test_R1_stream_needs_durable_non_exclusive_non_auto_delete(
        conn: pika.BlockingConnection, flags: dict, prop: str) -> None:
    name = f"t.s.{uuid.uuid4().hex[:8]}"
    assert refused(conn, declare(name, **flags)) == (
        "channel", 406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue "
                        f"'{name}' in vhost '/'")


ARG_CASES = [
    ("x-max-length-bytes", 1000, None),
    ("x-max-length-bytes", -1, "{value_negative,-1}"),
    ("x-max-length-bytes", "x", '"expected integer, got longstr"'),
    ("x-max-age", "7D", None), ("x-max-age", "12h", None), ("x-max-age", "30m", None),
    ("x-max-age", "10s", None), ("x-max-age", "1Y", None), ("x-max-age", "1M", None),
    ("x-max-age", "5x", "invalid_max_age"), ("x-max-age", "0D", "invalid_max_age"),
    ("x-max-age", "1.5h", "invalid_max_age"), ("x-max-age", 10, "{unacceptable_type,signedint}"),
    ("x-stream-max-segment-size-bytes", 1_000_000, None),
    ("x-stream-max-segment-size-bytes", -5, "{value_negative,-5}"),
    ("x-initial-cluster-size", 3, None), ("x-initial-cluster-size", 0, "{value_zero,0}"),
    ("x-queue-leader-locator", "client-local", None),
    ("x-queue-leader-locator", "bogus", "invalid_queue_locator_arg"),
    ("x-consumer-timeout", 1000, None), ("x-foo", 1, None),
] + [(k, v, "type") for k, v in [
    ("x-dead-letter-exchange", "dlx"), ("x-dead-letter-routing-key", "rk"),
    ("x-message-ttl", 1000), ("x-expires", 1000), ("x-max-length", 10),
    ("x-overflow", "reject-publish"), ("x-max-priority", 5),
    ("x-single-active-consumer", True), ("x-queue-mode", "lazy"), ("x-delivery-limit", 5),
    ("x-max-in-memory-length", 5), ("x-quorum-initial-group-size", 3),
    ("x-queue-master-locator", "min-masters"), ("x-dead-letter-strategy", "at-least-once"),
    ("x-queue-version", 2)]]


@pytest.mark.parametrize("key,value,error", ARG_CASES)
def test_R1_stream_declare_arguments_as_rabbitmq(conn: pika.BlockingConnection, key: str,
                                                  value: Any, error: str | None) -> None:
    name = f"t.s.{uuid.uuid4().hex[:8]}"
    try:
        if error is None:
            ok = conn.channel().queue_declare(name, durable=True, arguments={
                "x-queue-type": "stream", key: value})
            assert ok.method.message_count == 0
            return
        if error == "type":
            text = (f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost "
                    "'/' of queue type rabbit_stream_queue")
        else:
            text = f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/': {error}"
        assert refused(conn, declare(name, **{key: value})) == ("channel", 406, text)
    finally:
        conn.channel().queue_delete(name)


def test_R1_stream_declare_checks_in_rabbitmq_order(conn: pika.BlockingConnection) -> None:
    name = f"t.s.{uuid.uuid4().hex[:8]}"
    # a value check before an argument of another type, both before the properties
    assert refused(conn, declare(name, durable=False, **{"x-message-ttl": 5, "x-max-age": "5x"}))[2] \
        == f"PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '{name}' in vhost '/': invalid_max_age"
    assert refused(conn, declare(name, durable=False, **{"x-message-ttl": 5}))[2] == (
        f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{name}' in vhost '/' "
        "of queue type rabbit_stream_queue")
    assert refused(conn, declare(name, **{"x-stream-max-segment-size-bytes": 3_000_000_001})) \
        == ("channel", 406, "PRECONDITION_FAILED - Exceeded max value for "
                            "x-stream-max-segment-size-bytes")
    assert refused(conn, declare("")) == (
        "channel", 406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
                        "rabbit_stream_queue")
    # RabbitMQ 3.10 crashes on a max-age without digits: 541, the connection closes
    assert refused(conn, declare(name, **{"x-max-age": "D"})) == (
        "connection", 541, "INTERNAL_ERROR")


def test_R1_stream_redeclare_equivalence(conn: pika.BlockingConnection, stream: str) -> None:
    ch = conn.channel()
    assert ch.queue_declare(stream, durable=True, arguments={
        "x-queue-type": "stream", "x-message-ttl": 5}).method.queue == stream  # not compared
    assert refused(conn, declare(stream, **{"x-max-age": "1D"}))[1:] == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue '{stream}' in "
             "vhost '/': received the value '1D' of type 'longstr' but current is none")
    assert refused(conn, lambda c: c.queue_declare(stream, durable=True))[1:] == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{stream}' in "
             "vhost '/': received none but current is the value 'stream' of type 'longstr'")


def test_R1_messages_stay_after_consumption(conn: pika.BlockingConnection, stream: str) -> None:
    publish(conn, stream, 5)
    first = consume(conn, stream, "first", n=5)
    assert [b for _o, b in first] == [f"m{i}".encode() for i in range(5)]
    again = consume(conn, stream, "first", n=5)
    assert again == first
    assert count(conn, stream, 5) == 5
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    seen: list[bytes] = []
    ch.basic_consume(stream, lambda c, m, p, b: seen.append(b),
                     arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:  # dispatched: pika would reject a
        conn.process_data_events(0.05)               # pending one at teardown (540)
    ok = conn.channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    assert ok.method.consumer_count == 0  # RabbitMQ's stat counts no stream consumers


def test_R1_retention_drops_whole_old_segments(conn: pika.BlockingConnection) -> None:
    name = f"t.s.{uuid.uuid4().hex[:8]}"
    conn.channel().queue_declare(name, durable=True, arguments={
        "x-queue-type": "stream", "x-max-length-bytes": 3000,
        "x-stream-max-segment-size-bytes": 1000})
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", name, b"x" * 100 + str(i).encode(), PERSISTENT)
        deadline = time.monotonic() + 15
        while True:  # RabbitMQ applies retention asynchronously
            got = consume(conn, name, "first", n=200, wait=1.5)
            offsets = [o for o, _b in got]
            if offsets and offsets[0] > 0 or time.monotonic() > deadline:
                break
        assert offsets[0] > 100, offsets[:3]  # whole old segments went
        assert offsets == sorted(set(offsets))  # RabbitMQ's skip its tracking chunks
        first = int(got[0][1][100:])
        assert [b for _o, b in got] == [b"x" * 100 + str(i).encode()
                                        for i in range(first, 200)]  # the newest, in order
    finally:
        conn.channel().queue_delete(name)


# -- R2: consumers --------------------------------------------------------------------

def test_R2_basic_get_on_stream_refused(conn: pika.BlockingConnection, stream: str) -> None:
    for no_ack in (False, True):
        c = pika.BlockingConnection(conn._impl.params)
        assert refused(c, lambda ch, na=no_ack: ch.basic_get(stream, auto_ack=na)) == (
            "connection", 540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues "
                               f"queue '{stream}' in vhost '/'")


def _consume_with(stream: str, prefetch: int | None, auto_ack: bool = False,
                  args: dict | None = None) -> Callable[[Any], Any]:
    def fn(ch: Any) -> None:
        if prefetch is not None:
            ch.basic_qos(prefetch_count=prefetch)
        ch.basic_consume(stream, lambda *a: None, auto_ack=auto_ack, arguments=args)
    return fn


def test_R2_consumer_needs_prefetch_and_manual_acks(url: str, stream: str) -> None:
    def fresh() -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(url))
    no_prefetch = ("channel", 406, "PRECONDITION_FAILED - consumer prefetch count is not set "
                                   f"for 'queue '{stream}' in vhost '/''")
    assert refused(fresh(), _consume_with(stream, None)) == no_prefetch
    assert refused(fresh(), _consume_with(stream, 0)) == no_prefetch
    assert refused(fresh(), _consume_with(stream, None, auto_ack=True)) == no_prefetch
    assert refused(fresh(), _consume_with(stream, 10, auto_ack=True)) == (
        "connection", 540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by "
                           f"stream queues queue '{stream}' in vhost '/'")


@pytest.mark.parametrize("offset,error", [
    ("5", '{invalid_stream_offset_arg,{longstr,<<"5">>}}'),
    ("0D", '{invalid_stream_offset_arg,{longstr,<<"0D">>}}'),
    ("bogus", None), (True, None), ({"a": 1}, None)])
def test_R2_bad_stream_offset_refused(url: str, stream: str, offset: Any,
                                      error: str | None) -> None:
    c = pika.BlockingConnection(pika.URLParameters(url))
    got = refused(c, _consume_with(stream, 10, args={"x-stream-offset": offset}))
    if error is None:  # RabbitMQ 3.10's channel crashes on these
        assert got == ("connection", 541, "INTERNAL_ERROR")
    else:
        assert got == ("channel", 406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' "
                                       f"for queue '{stream}' in vhost '/': {error}")


@pytest.mark.parametrize("arg", ["x-priority", "x-cancel-on-ha-failover"])
def test_R2_other_types_consume_arguments_refused(conn: pika.BlockingConnection, stream: str,
                                                  arg: str) -> None:
    value = 3 if arg == "x-priority" else True
    assert refused(conn, _consume_with(stream, 10, args={arg: value})) == (
        "channel", 406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{stream}' in "
                        "vhost '/' of queue type rabbit_stream_queue")


def test_R2_classic_queue_refuses_x_stream_offset(conn: pika.BlockingConnection) -> None:
    name = f"t.c.{uuid.uuid4().hex[:8]}"
    conn.channel().queue_declare(name)
    try:
        assert refused(conn, _consume_with(name, 10, args={"x-stream-offset": "first"})) == (
            "channel", 406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue "
                            f"'{name}' in vhost '/' of queue type rabbit_classic_queue")
    finally:
        conn.channel().queue_delete(name)


def test_R2_offset_specs_as_rabbitmq(conn: pika.BlockingConnection, stream: str) -> None:
    publish(conn, stream, 10)
    all_ = [(i, f"m{i}".encode()) for i in range(10)]
    assert consume(conn, stream, "first", n=10) == all_
    assert consume(conn, stream, 0, n=10) == all_
    assert consume(conn, stream, -1, n=10) == all_
    assert consume(conn, stream, 3, n=7) == all_[3:]
    assert consume(conn, stream, 9, n=1) == all_[9:]
    assert consume(conn, stream, "last", wait=1.5) == all_[9:]
    assert consume(conn, stream, "next", wait=1.0) == []
    assert consume(conn, stream, None, wait=1.0) == []  # next by default
    assert consume(conn, stream, 10, wait=1.0) == []
    assert consume(conn, stream, "1h", n=10) == all_  # an interval: from now - 1h
    hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    assert consume(conn, stream, hour_ago, n=10) == all_
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    assert consume(conn, stream, soon, wait=1.0) == []


def test_R2_offset_header_is_a_signed_long_and_replaces_the_publishers(
        conn: pika.BlockingConnection, stream: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", stream, b"a", pika.BasicProperties(
        delivery_mode=1, message_id="id-a", headers={"x-stream-offset": "spoof", "k": 1}))
    got = []
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=5)
    ch2.basic_consume(stream, lambda c, m, p, b: got.append((m, p, b)),
                      arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 3
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    m, p, b = got[0]
    assert b == b"a" and not m.redelivered and m.routing_key == stream and m.exchange == ""
    assert p.message_id == "id-a" and p.delivery_mode == 1
    assert p.headers["x-stream-offset"] == 0
    assert type(p.headers["x-stream-offset"]) is pika.compat.long  # AMQP 'l', signed 64
    assert p.headers["k"] == 1


def test_R2_prefetch_is_credit_acks_release_it(conn: pika.BlockingConnection,
                                                stream: str) -> None:
    publish(conn, stream, 10)
    assert len(consume(conn, stream, "first", prefetch=2, ack=False, wait=1.5)) == 2
    assert len(consume(conn, stream, "first", n=10, prefetch=2, ack=True)) == 10


@pytest.mark.parametrize("how", ["nack", "nack-norequeue", "reject"])
def test_R2_nack_and_reject_on_stream_refused(url: str, stream: str, how: str) -> None:
    c = pika.BlockingConnection(pika.URLParameters(url))
    publish(c, stream, 1)
    tags = []

    def fn(ch: Any) -> None:
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(stream, lambda cc, m, p, b: tags.append(m.delivery_tag),
                         arguments={"x-stream-offset": "first"})
        while not tags:
            c.process_data_events(0.05)
        if how == "reject":
            ch.basic_reject(tags[0], requeue=True)
        else:
            ch.basic_nack(tags[0], requeue=how == "nack")
    assert refused(c, fn) == ("connection", 540, "NOT_IMPLEMENTED - basic.nack and "
                              f"basic.reject not supported by stream queues queue '{stream}' "
                              "in vhost '/'")


# -- R3: independent readers, admin ----------------------------------------------------

def test_R3_independent_consumers_identical_replays(conn: pika.BlockingConnection,
                                                     stream: str) -> None:
    publish(conn, stream, 20)
    ch1, ch2 = conn.channel(), conn.channel()
    got1: list[Any] = []
    got2: list[Any] = []
    for ch, got, pf in ((ch1, got1, 3), (ch2, got2, 7)):
        ch.basic_qos(prefetch_count=pf)
        ch.basic_consume(stream, lambda c, m, p, b, g=got: (
            g.append((p.headers["x-stream-offset"], b)), c.basic_ack(m.delivery_tag)),
            arguments={"x-stream-offset": 5})
    publish(conn, stream, 5, start=20)
    deadline = time.monotonic() + 5
    while (len(got1) < 20 or len(got2) < 20) and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    want = [(i, f"m{i}".encode()) for i in range(5, 25)]
    assert got1 == want and got2 == want
    assert consume(conn, stream, 5, n=20) == want


def test_R3_purge_refused(conn: pika.BlockingConnection, stream: str) -> None:
    assert refused(conn, lambda ch: ch.queue_purge(stream)) == (
        "connection", 540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues "
                           f"queue '{stream}' in vhost '/'")


def test_R3_delete_ignores_if_empty_and_cancels_consumers(url: str) -> None:
    c = pika.BlockingConnection(pika.URLParameters(url))
    name = f"t.s.{uuid.uuid4().hex[:8]}"
    c.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    publish(c, name, 3)
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda f: cancelled.append(f.method.consumer_tag))
    tag = ch.basic_consume(name, lambda *a: None, arguments={"x-stream-offset": "first"})
    other = pika.BlockingConnection(pika.URLParameters(url))
    ok = other.channel().queue_delete(name, if_empty=True, if_unused=True)
    assert ok.method.message_count == 0
    deadline = time.monotonic() + 3
    while not cancelled and time.monotonic() < deadline:
        c.process_data_events(0.05)
    assert cancelled == [tag]
    other.close()
    c.close()


# -- R1/R3 durability: kill -9 (ackmq only: the test owns the broker process) ---------

@pytest.mark.slow
def test_R1_R3_stream_survives_kill_9_with_offsets(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        c = pika.BlockingConnection(pika.URLParameters(b.url))
        c.channel().queue_declare("events", durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4000})
        publish(c, "events", 300)  # confirmed: fsynced
        before = consume(c, "events", 120, n=180)
        # one publish into a stream and a classic queue: confirmed once both are synced
        ch = c.channel()
        ch.queue_declare("classic", durable=True)
        ch.queue_bind("events", "amq.fanout")
        ch.queue_bind("classic", "amq.fanout")
        ch.confirm_delivery()
        ch.basic_publish("amq.fanout", "", b"both", PERSISTENT)
        b.kill()
        b.start()
        c = pika.BlockingConnection(pika.URLParameters(b.url))
        assert c.channel().queue_declare("classic", passive=True).method.message_count == 1
        assert consume(c, "events", 300, n=1) == [(300, b"both")]
        c.channel().queue_unbind("events", "amq.fanout")
        assert c.channel().queue_declare("events", passive=True).method.message_count == 301
        assert consume(c, "events", 120, n=181)[:180] == before
        publish(c, "events", 2, start=301)
        got = consume(c, "events", "first", n=303)
        assert got == [(i, f"m{i}".encode() if i != 300 else b"both") for i in range(303)]
        c.close()
    finally:
        b.stop()


def test_R2_last_is_the_newest_chunk(conn: pika.BlockingConnection, stream: str) -> None:
    """`last` starts at the newest batch written together (RabbitMQ: osiris' last chunk):
    after confirmed publishes, one at a time, that is the last message."""
    publish(conn, stream, 3)
    assert consume(conn, stream, "last", wait=1.0) == [(2, b"m2")]
    ch = conn.channel()  # a burst without confirms: the last chunk holds the newest ones
    for i in range(3, 40):
        ch.basic_publish("", stream, f"m{i}".encode(), PERSISTENT)
    ch.close()
    time.sleep(0.5)
    got = consume(conn, stream, "last", wait=1.5)
    assert got and got[-1] == (39, b"m39")
    assert [o for o, _b in got] == list(range(got[0][0], 40))
