"""Idempotent publishing (issue 23): the message-deduplication plugin's interface,
durable across kill -9 (docs/dedup.md).

The model is driven directly for the cache rules; everything else goes over the wire
with pika against a real `ackmq serve`. RabbitMQ 3.10 here has no dedup plugin: the
comparison is that it refuses the exchange type (503) and stores every copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.pikahelp import closed_with, drain_ints, uniq, wait_ready

from ackmq.broker.dedup import DedupCache, QueueIds

PERSISTENT = 2


def props(i: object, ttl: int | None = None, mode: int = PERSISTENT) -> pika.BasicProperties:
    headers: dict = {"x-deduplication-header": i}
    if ttl is not None:
        headers["x-cache-ttl"] = ttl
    return pika.BasicProperties(delivery_mode=mode, headers=headers)


# -- the model -------------------------------------------------------------------------
def test_dedup_cache_remembers_until_evicted_oldest_first() -> None:
    c = DedupCache(size=3)
    assert [c.insert(k, now=1.0) for k in (b"a", b"b", b"c")] == [True] * 3
    assert not c.insert(b"a", now=2.0)
    assert c.insert(b"d", now=2.0)  # full: the oldest (a) goes
    assert len(c) == 3
    assert c.insert(b"a", now=2.0) and not c.insert(b"c", now=2.0)


def test_dedup_cache_ttl_default_and_per_message() -> None:
    c = DedupCache(size=10, ttl_ms=1000)
    assert c.insert(b"a", now=0.0)
    assert not c.insert(b"a", now=0.9)
    assert c.insert(b"a", now=1.5)  # expired: remembered afresh
    assert c.insert(b"b", ttl_ms=100, now=2.0)
    assert c.insert(b"b", now=2.2)
    assert not c.insert(b"b", now=2.3)


def test_queue_ids_leave_with_their_message() -> None:
    ids = QueueIds()
    ids.add(b"a", 1)
    ids.add(b"b", 2)
    assert b"a" in ids
    ids.discard_seq(1)
    assert b"a" not in ids and b"b" in ids
    ids.discard_seq(99)  # a message without an id
    assert len(ids) == 1


@pytest.mark.parametrize("headers, kw", [
    ({"x-deduplication-header": "abc"}, {}),
    ({"a": 1, "b": "x" * 300, "c": [1, "y"], "d": {"e": 2.5}, "t": True,
      "x-deduplication-header": "é-id"}, {"content_type": "text/plain",
                                          "content_encoding": "gzip"}),
    ({"x-deduplication-header": 42}, {}),
    ({"x-deduplication-header": {"nested": 1}}, {}),
    ({"x-deduplication-header-not": "a"}, {}),
    ({"other": "x-deduplication-header"}, {"message_id": "m"}),
])
def test_dedup_id_fast_path_equals_the_full_parse(headers: dict, kw: dict) -> None:
    """The id is read by stepping over the header entries before it; whatever the table
    holds, the result is the one the full headers parse gives."""
    from ackmq.broker.dedup import HEADER, message_id
    from ackmq.broker.message import Message
    from ackmq.protocol.amqp.client_codec import encode_basic_properties

    raw = encode_basic_properties(delivery_mode=2, headers=headers, **kw)
    full = Message("", "q", raw, b"").headers.get(HEADER)
    if isinstance(full, str):
        full = full.encode()
    if isinstance(full, dict | list):
        full = None
    assert message_id(Message("", "q", raw, b"")) == full


# -- declare-time checks ------------------------------------------------------------------
@pytest.mark.parametrize("args, text", [
    ({}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": 0},
     "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": "many"},
     "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
    ({"x-cache-size": 10, "x-cache-ttl": -1},
     "Invalid argument, 'x-cache-ttl' must be an integer greater than 0"),
    ({"x-cache-size": 10, "x-cache-persistence": "tape"},
     "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'"),
])
def test_dedup_exchange_arguments_checked(channel, args: dict, text: str) -> None:
    closed_with(lambda: channel.exchange_declare(uniq("dx"), "x-message-deduplication",
                                                 arguments=args),
                406, "PRECONDITION_FAILED - " + text)


def test_dedup_exchange_string_arguments_accepted(channel) -> None:
    x = uniq("dx")
    channel.exchange_declare(x, "x-message-deduplication", auto_delete=True,
                             arguments={"x-cache-size": "10", "x-cache-ttl": "1000",
                                        "x-cache-persistence": "disk"})
    channel.exchange_delete(x)


def test_dedup_queue_argument_must_be_bool(channel, qname: str) -> None:
    closed_with(lambda: channel.queue_declare(qname, arguments={"x-message-deduplication": "yes"}),
                406, f"PRECONDITION_FAILED - invalid arg 'x-message-deduplication' for queue "
                     f"'{qname}' in vhost '/': {{unacceptable_type,longstr}}")


# -- exchange level -----------------------------------------------------------------------
def test_dedup_exchange_routes_each_id_once_and_confirms_duplicates(channel, qname: str) -> None:
    x = uniq("dx")
    channel.exchange_declare(x, "x-message-deduplication", auto_delete=True,
                             arguments={"x-cache-size": 100})
    channel.queue_declare(qname, auto_delete=True)
    channel.queue_bind(qname, x, routing_key="ignored")  # routes as fanout
    channel.confirm_delivery()
    for i in [1, 2, 1, 3, 2, 1]:
        channel.basic_publish(x, "any", str(i).encode(), props(f"id-{i}"))  # raises on nack
    channel.basic_publish(x, "any", b"4", pika.BasicProperties(delivery_mode=2))  # no id
    channel.basic_publish(x, "any", b"4", pika.BasicProperties(delivery_mode=2))
    wait_ready(channel, qname, 5)
    assert drain_ints(channel, qname) == [1, 2, 3, 4, 4]


def test_dedup_exchange_mandatory_duplicate_is_returned(connection, qname: str) -> None:
    """The plugin routes a duplicate nowhere: mandatory makes that a basic.return."""
    ch = connection.channel()
    x = uniq("dx")
    ch.exchange_declare(x, "x-message-deduplication", auto_delete=True,
                        arguments={"x-cache-size": 100})
    ch.queue_declare(qname, auto_delete=True)
    ch.queue_bind(qname, x)
    ch.confirm_delivery()
    ch.basic_publish(x, "", b"1", props("a"), mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(x, "", b"1", props("a"), mandatory=True)


def test_dedup_exchange_cache_size_bounds_memory(channel, qname: str) -> None:
    x = uniq("dx")
    channel.exchange_declare(x, "x-message-deduplication", auto_delete=True,
                             arguments={"x-cache-size": 2})
    channel.queue_declare(qname, auto_delete=True)
    channel.queue_bind(qname, x)
    channel.confirm_delivery()
    for i in [1, 2, 3, 1]:  # 3 evicts 1: the second 1 is routed again
        channel.basic_publish(x, "", str(i).encode(), props(i))
    wait_ready(channel, qname, 4)
    assert drain_ints(channel, qname) == [1, 2, 3, 1]


def test_dedup_exchange_ttl_default_and_per_message_header(channel, qname: str) -> None:
    import time

    x = uniq("dx")
    channel.exchange_declare(x, "x-message-deduplication", auto_delete=True,
                             arguments={"x-cache-size": 100, "x-cache-ttl": 300})
    channel.queue_declare(qname, auto_delete=True)
    channel.queue_bind(qname, x)
    channel.confirm_delivery()
    channel.basic_publish(x, "", b"1", props("a"))
    channel.basic_publish(x, "", b"2", props("b", ttl=60_000))  # its own, longer TTL
    channel.basic_publish(x, "", b"3", props("a"))               # within 300 ms: dropped
    time.sleep(0.5)
    channel.basic_publish(x, "", b"4", props("a"))               # expired: routed again
    channel.basic_publish(x, "", b"5", props("b"))               # still remembered
    wait_ready(channel, qname, 3)
    assert drain_ints(channel, qname) == [1, 2, 4]


# -- queue level ------------------------------------------------------------------------
def test_dedup_queue_drops_a_copy_while_the_original_is_held(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=False, arguments={"x-message-deduplication": True})
    channel.confirm_delivery()
    for i in [1, 2, 1, 2, 3]:
        channel.basic_publish("", qname, str(i).encode(), props(str(i)))
    wait_ready(channel, qname, 3)
    m, _p, body = channel.basic_get(qname, auto_ack=False)
    channel.basic_publish("", qname, b"1", props("1"))  # unacked: still held, still a dup
    wait_ready(channel, qname, 2)
    channel.basic_ack(m.delivery_tag)
    channel.basic_publish("", qname, b"1", props("1"))  # acked: gone, so taken again
    wait_ready(channel, qname, 3)
    assert drain_ints(channel, qname) == [2, 3, 1]
    channel.queue_delete(qname)


def test_dedup_queue_requeued_message_still_counts(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True, arguments={"x-message-deduplication": True})
    channel.confirm_delivery()
    channel.basic_publish("", qname, b"7", props(7))
    m, _p, _b = channel.basic_get(qname, auto_ack=False)
    channel.basic_nack(m.delivery_tag, requeue=True)
    channel.basic_publish("", qname, b"7", props(7))
    wait_ready(channel, qname, 1)
    channel.queue_purge(qname)
    channel.basic_publish("", qname, b"7", props(7))  # purged: gone, so taken again
    wait_ready(channel, qname, 1)


def test_dedup_queue_off_stores_every_copy(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", qname, b"1", props("1"))
    wait_ready(channel, qname, 3)


# -- durable: kill -9 -------------------------------------------------------------------
@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    b.stop()


def test_dedup_ids_survive_kill_9(broker: BrokerProcess) -> None:
    """Ids are headers of stored messages: after kill -9 a re-send of a confirmed message
    is still a duplicate, at queue level and at exchange level (queues deeper than the
    4,096 read back at start included)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("dq", durable=True, arguments={"x-message-deduplication": True})
    ch.exchange_declare("dx", "x-message-deduplication", durable=True,
                        arguments={"x-cache-size": 100_000})
    ch.queue_declare("xq", durable=True)
    ch.queue_bind("xq", "dx")
    ch.confirm_delivery()
    n = 5000
    for i in range(n):
        ch.basic_publish("", "dq", str(i).encode(), props(i), mandatory=False)
        ch.basic_publish("dx", "", str(i).encode(), props(i))
    conn.close()
    broker.kill()
    broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in (0, 1, n - 1):  # re-sent: confirmed, not stored
        ch.basic_publish("", "dq", str(i).encode(), props(i))
        ch.basic_publish("dx", "", str(i).encode(), props(i))
    ch.basic_publish("", "dq", str(n).encode(), props(n))
    ch.basic_publish("dx", "", str(n).encode(), props(n))
    assert ch.queue_declare("dq", passive=True).method.message_count == n + 1
    assert ch.queue_declare("xq", passive=True).method.message_count == n + 1
    conn.close()


# -- RabbitMQ without the plugin ------------------------------------------------------------
@pytest.mark.rabbitmq
def test_dedup_rabbitmq_without_plugin_refuses_type_and_stores_copies() -> None:
    """The reference: RabbitMQ 3.10 as installed here has no dedup plugin, so the
    exchange type is unknown (503, connection closed) and a dedup queue argument is
    ignored: every copy is stored. ackmq answers both as the plugin does."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url()))
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
            ch.exchange_declare(uniq("dedup.x"), "x-message-deduplication",
                                arguments={"x-cache-size": 10})
        assert ei.value.reply_code == 503
        assert ei.value.reply_text == \
            "COMMAND_INVALID - unknown exchange type 'x-message-deduplication'"
    finally:
        if conn.is_open:
            conn.close()
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url()))
    try:
        ch = conn.channel()
        q = uniq("dedup.q")
        ch.queue_declare(q, auto_delete=True, arguments={"x-message-deduplication": True})
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("", q, b"1", props("1"))
        wait_ready(ch, q, 3)
        ch.queue_delete(q)
    finally:
        conn.close()


# -- STOMP onto the same queues (fixtures: stomphelp, loaded by conftest) ---------------
def test_dedup_queue_over_stomp(ackmq_target, queue: str) -> None:
    """A STOMP SEND's `x-deduplication-header` header is the same AMQP header (RabbitMQ's
    header mapping), so a dedup queue drops a STOMP re-send too; the re-send still gets
    its receipt."""
    conn = ackmq_target.pika()
    conn.channel().queue_declare(queue, durable=True,
                                 arguments={"x-message-deduplication": True})
    conn.close()
    with ackmq_target.raw() as r:
        for i, body in enumerate([b"a", b"a", b"b"]):
            r.receipt("SEND", {"destination": f"/amq/queue/{queue}", "persistent": "true",
                               "x-deduplication-header": body.decode()}, body,
                      receipt=f"r{i}")
    conn = ackmq_target.pika()
    ch = conn.channel()
    wait_ready(ch, queue, 2)
    assert [ch.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"a", b"b"]
    conn.close()
