"""Deliveries and consumer acknowledgements (SPEC D1-D10), checked against the wire.

Every test here passes against RabbitMQ 3.10 (ACKMQ_TEST_URL=amqp://...:5672/), so it
encodes the reference behaviour; D10 is ackmq's extension and is skipped there.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker
from support.pikahelp import WAIT, ready_count, wait_ready

Got = tuple[int, bytes, bool, dict]  # (delivery_tag, body, redelivered, headers)


def publish_n(ch: BlockingChannel, queue: str, n: int, start: int = 1) -> None:
    """Publish bodies b"start".."start+n-1" to `queue` through the default exchange."""
    for i in range(start, start + n):
        ch.basic_publish("", queue, str(i).encode())


def get(ch: BlockingChannel, queue: str, auto_ack: bool = False) -> Got:
    """basic.get that must succeed (the message is expected to be there)."""
    deadline = time.monotonic() + WAIT
    while True:
        m, p, b = ch.basic_get(queue, auto_ack=auto_ack)
        if m is not None:
            return m.delivery_tag, b, m.redelivered, dict(p.headers or {})
        assert time.monotonic() < deadline, f"no message on {queue}"
        time.sleep(0.02)


def drain(ch: BlockingChannel, queue: str) -> list[tuple[bytes, bool]]:
    """Take every ready message with auto-ack; (body, redelivered) in queue order."""
    out: list[tuple[bytes, bool]] = []
    while True:
        m, _p, b = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append((b, m.redelivered))


def consume(conn: pika.BlockingConnection, ch: BlockingChannel, queue: str, n: int,
            auto_ack: bool = False, timeout: float = WAIT) -> list[Got]:
    """Push-consume until n deliveries arrived; the consumer is left running."""
    got: list[Got] = []

    def on_msg(_ch: BlockingChannel, m, p, b: bytes) -> None:
        got.append((m.delivery_tag, b, m.redelivered, dict(p.headers or {})))

    ch.basic_consume(queue, on_msg, auto_ack=auto_ack)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert len(got) >= n, f"only {len(got)} of {n} deliveries"
    return got


def expect_channel_closed(ch: BlockingChannel, code: int, text: str | None = None) -> str:
    """A synchronous round trip on `ch` must fail with the broker closing the channel."""
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_qos(prefetch_count=0)
    assert ei.value.reply_code == code, ei.value
    if text is not None:
        assert ei.value.reply_text == text
    return ei.value.reply_text


@pytest.fixture
def queue(params: pika.URLParameters, channel: BlockingChannel, qname: str):
    """A non-exclusive queue (so other connections may use it), deleted afterwards."""
    channel.queue_declare(qname)
    yield qname
    conn = pika.BlockingConnection(params)
    try:
        conn.channel().queue_delete(qname)
    finally:
        conn.close()


# ---------------------------------------------------------------------- D1


def test_D1_pull_get_ok_and_get_empty(channel: BlockingChannel, queue: str) -> None:
    m, _p, _b = channel.basic_get(queue)
    assert m is None  # get-empty
    publish_n(channel, queue, 3)
    wait_ready(channel, queue, 3)
    m, _p, b = channel.basic_get(queue, auto_ack=True)
    assert b == b"1"
    assert m.message_count == 2  # messages left after this one
    assert m.exchange == "" and m.routing_key == queue and m.redelivered is False
    m, _p, b = channel.basic_get(queue, auto_ack=True)
    assert (b, m.message_count) == (b"2", 1)
    m, _p, b = channel.basic_get(queue, auto_ack=True)
    assert (b, m.message_count) == (b"3", 0)
    assert channel.basic_get(queue)[0] is None


def test_D1_push_consume_delivers_in_order(connection, channel: BlockingChannel,
                                           queue: str) -> None:
    props = pika.BasicProperties(content_type="text/plain", headers={"k": "v"},
                                 message_id="mid-1", correlation_id="c1", priority=3)
    channel.basic_publish("", queue, b"hello", props)
    publish_n(channel, queue, 4)
    got = consume(connection, channel, queue, 5, auto_ack=True)
    assert [g[1] for g in got] == [b"hello", b"1", b"2", b"3", b"4"]
    assert got[0][3].get("k") == "v"


def test_D1_deliver_carries_properties_and_routing(connection, channel: BlockingChannel,
                                                   queue: str) -> None:
    channel.queue_bind(queue, "amq.direct", "rk.d1")
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                 message_id="m-1", correlation_id="corr", reply_to="r",
                                 app_id="app", type="t", user_id="guest", timestamp=1234,
                                 headers={"a": 1, "b": "two"})
    channel.basic_publish("amq.direct", "rk.d1", b"{}", props)
    seen: list = []
    channel.basic_consume(queue, lambda c, m, p, b: seen.append((m, p, b)), auto_ack=True)
    deadline = time.monotonic() + WAIT
    while not seen and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert seen, "no delivery"
    m, p, b = seen[0]
    assert (m.exchange, m.routing_key, m.redelivered, b) == ("amq.direct", "rk.d1", False, b"{}")
    assert (p.content_type, p.delivery_mode, p.message_id, p.correlation_id) == (
        "application/json", 2, "m-1", "corr")
    assert (p.reply_to, p.app_id, p.type, p.user_id, p.timestamp) == ("r", "app", "t",
                                                                      "guest", 1234)
    assert p.headers["a"] == 1 and p.headers["b"] == "two"


# ---------------------------------------------------------------------- D2


def test_D2_delivery_tags_per_channel_across_push_pull_and_consumers(
        params, connection, channel: BlockingChannel, queue: str, qname: str) -> None:
    other_q = qname + ".2"
    channel.queue_declare(other_q, exclusive=True)
    publish_n(channel, queue, 2)
    publish_n(channel, other_q, 2)
    wait_ready(channel, queue, 2)
    tag1 = get(channel, queue)[0]                          # pull
    tag2 = get(channel, other_q, auto_ack=True)[0]         # pull, no-ack: still a tag
    got_a = consume(connection, channel, queue, 1)         # push, consumer A
    got_b = consume(connection, channel, other_q, 1)       # push, consumer B
    assert [tag1, tag2, got_a[0][0], got_b[0][0]] == [1, 2, 3, 4]
    publish_n(channel, queue, 1, start=10)
    deadline = time.monotonic() + WAIT
    while len(got_a) < 2 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert [(g[0], g[1]) for g in got_a] == [(3, b"2"), (5, b"10")]

    # an independent channel on the same connection starts again at 1
    ch2 = connection.channel()
    third_q = qname + ".3"
    ch2.queue_declare(third_q, exclusive=True)
    publish_n(ch2, third_q, 1, start=20)
    assert get(ch2, third_q)[0] == 1
    # ... and tags on the first channel are never reused after acks
    channel.basic_ack(0, multiple=True)
    ch3 = connection.channel()
    publish_n(ch3, other_q, 1, start=30)
    deadline = time.monotonic() + WAIT
    n_before = len(got_b)
    while len(got_b) == n_before and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert (got_b[-1][0], got_b[-1][1]) == (6, b"30")


# ---------------------------------------------------------------------- D3


def test_D3_no_ack_message_gone_once_delivered(params, queue: str) -> None:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    publish_n(ch, queue, 3)
    got = consume(conn, ch, queue, 3, auto_ack=True)
    assert [g[1] for g in got] == [b"1", b"2", b"3"]
    conn.close()  # never acked anything: in automatic mode there is nothing to ack
    conn2 = pika.BlockingConnection(params)
    try:
        ch2 = conn2.channel()
        time.sleep(0.2)
        assert ready_count(ch2, queue) == 0
        assert drain(ch2, queue) == []
    finally:
        conn2.close()


def test_D3_manual_mode_keeps_message_until_settled(params, queue: str) -> None:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    publish_n(ch, queue, 3)
    got = consume(conn, ch, queue, 3)
    assert [g[1] for g in got] == [b"1", b"2", b"3"]
    observer = pika.BlockingConnection(params)
    try:
        och = observer.channel()
        assert ready_count(och, queue) == 0  # delivered, unacked: not ready
        conn.close()
        wait_ready(och, queue, 3)
        assert drain(och, queue) == [(b"1", True), (b"2", True), (b"3", True)]
    finally:
        observer.close()


# ---------------------------------------------------------------------- D4


def test_D4_ack_multiple_settles_up_to_tag(params, channel: BlockingChannel,
                                           queue: str) -> None:
    publish_n(channel, queue, 5)
    wait_ready(channel, queue, 5)
    tags = [get(channel, queue)[0] for _ in range(5)]
    assert tags == [1, 2, 3, 4, 5]
    channel.basic_ack(3, multiple=True)
    channel.close()  # 4 and 5 still unacked: they come back, 1..3 do not
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        wait_ready(ch, queue, 2)
        assert drain(ch, queue) == [(b"4", True), (b"5", True)]
    finally:
        conn.close()


def test_D4_ack_zero_multiple_acks_everything(params, channel: BlockingChannel,
                                              queue: str) -> None:
    publish_n(channel, queue, 4)
    wait_ready(channel, queue, 4)
    for _ in range(4):
        get(channel, queue)
    channel.basic_ack(0, multiple=True)
    channel.basic_qos(prefetch_count=0)  # round trip: the channel is still fine
    channel.close()
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        time.sleep(0.2)
        assert ready_count(ch, queue) == 0
    finally:
        conn.close()


def test_D4_ack_multiple_skips_already_acked(params, channel: BlockingChannel,
                                             queue: str) -> None:
    publish_n(channel, queue, 5)
    wait_ready(channel, queue, 5)
    for _ in range(5):
        get(channel, queue)
    channel.basic_ack(2)
    channel.basic_ack(4)
    channel.basic_ack(4 + 1, multiple=True)  # settles 1, 3, 5 (2 and 4 are gone)
    channel.basic_qos(prefetch_count=0)
    channel.close()
    conn = pika.BlockingConnection(params)
    try:
        time.sleep(0.2)
        assert ready_count(conn.channel(), queue) == 0
    finally:
        conn.close()


# ---------------------------------------------------------------------- D5


def test_D5_reject_settles_one(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 3)
    wait_ready(channel, queue, 3)
    tags = [get(channel, queue)[0] for _ in range(3)]
    channel.basic_reject(tags[1], requeue=False)  # dropped (no DLX)
    channel.basic_reject(tags[2], requeue=True)   # back to the queue
    wait_ready(channel, queue, 1)
    assert drain(channel, queue) == [(b"3", True)]
    channel.basic_ack(tags[0])  # the first is untouched and still ackable
    channel.basic_qos(prefetch_count=0)


def test_D5_nack_multiple_settles_up_to_tag(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 5)
    wait_ready(channel, queue, 5)
    for _ in range(5):
        get(channel, queue)
    channel.basic_nack(3, multiple=True, requeue=True)
    wait_ready(channel, queue, 3)
    assert drain(channel, queue) == [(b"1", True), (b"2", True), (b"3", True)]
    channel.basic_nack(0, multiple=True, requeue=False)  # 4 and 5 dropped
    channel.basic_qos(prefetch_count=0)
    assert ready_count(channel, queue) == 0


def test_D5_nack_single(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 3)
    wait_ready(channel, queue, 3)
    for _ in range(3):
        get(channel, queue)
    channel.basic_nack(2, multiple=False, requeue=True)
    wait_ready(channel, queue, 1)
    assert drain(channel, queue) == [(b"2", True)]
    channel.basic_ack(3, multiple=True)
    channel.basic_qos(prefetch_count=0)


# ---------------------------------------------------------------------- D6


def test_D6_requeue_all_taken_keeps_original_order(channel: BlockingChannel,
                                                   queue: str) -> None:
    """Publish 1..5, take all, nack 4 then 2: the queue holds 2, 4 (publish order)."""
    publish_n(channel, queue, 5)
    wait_ready(channel, queue, 5)
    for _ in range(5):
        get(channel, queue)
    channel.basic_nack(4, requeue=True)
    channel.basic_nack(2, requeue=True)
    wait_ready(channel, queue, 2)
    assert drain(channel, queue) == [(b"2", True), (b"4", True)]


def test_D6_requeue_goes_back_to_original_position(channel: BlockingChannel,
                                                   queue: str) -> None:
    """Publish 1..6, take 1..4, nack 4 then 2: the queue is 2, 4, 5, 6."""
    publish_n(channel, queue, 6)
    wait_ready(channel, queue, 6)
    for _ in range(4):
        get(channel, queue)
    channel.basic_nack(4, requeue=True)
    channel.basic_nack(2, requeue=True)
    wait_ready(channel, queue, 4)
    assert drain(channel, queue) == [(b"2", True), (b"4", True), (b"5", False),
                                     (b"6", False)]


def test_D6_requeue_to_consumer_is_redelivered(connection, channel: BlockingChannel,
                                               queue: str) -> None:
    publish_n(channel, queue, 1)
    got: list[Got] = []

    def on_msg(ch: BlockingChannel, m, p, b: bytes) -> None:
        got.append((m.delivery_tag, b, m.redelivered, {}))
        if len(got) == 1:
            ch.basic_reject(m.delivery_tag, requeue=True)
        else:
            ch.basic_ack(m.delivery_tag)

    channel.basic_consume(queue, on_msg)
    deadline = time.monotonic() + WAIT
    while len(got) < 2 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert [(g[0], g[1], g[2]) for g in got] == [(1, b"1", False), (2, b"1", True)]


def test_D6_requeue_false_without_dlx_drops(params, channel: BlockingChannel,
                                            queue: str) -> None:
    publish_n(channel, queue, 2)
    wait_ready(channel, queue, 2)
    get(channel, queue)
    get(channel, queue)
    channel.basic_reject(1, requeue=False)
    channel.basic_nack(2, requeue=False)
    channel.close()  # nothing unacked left to requeue
    conn = pika.BlockingConnection(params)
    try:
        time.sleep(0.2)
        assert ready_count(conn.channel(), queue) == 0
    finally:
        conn.close()


def _check_x_death(headers: dict, queue: str, reason: str, exchange: str,
                   routing_keys: list[str], count: int = 1) -> None:
    deaths = headers["x-death"]
    assert isinstance(deaths, list) and len(deaths) == 1
    d = deaths[0]
    assert d["queue"] == queue
    assert d["reason"] == reason
    assert d["count"] == count
    assert d["exchange"] == exchange
    assert d["routing-keys"] == routing_keys
    assert "time" in d and hasattr(d["time"], "year")  # AMQP timestamp
    assert headers["x-first-death-queue"] == queue
    assert headers["x-first-death-reason"] == reason
    assert headers["x-first-death-exchange"] == exchange


def test_D6_requeue_false_with_dlx_dead_letters(channel: BlockingChannel, qname: str) -> None:
    dlx = qname + ".dlx"
    dead = qname + ".dead"
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(dead, exclusive=True)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(qname, exclusive=True, arguments={"x-dead-letter-exchange": dlx})
    channel.queue_bind(qname, "amq.direct", "orig.rk")
    channel.basic_publish("amq.direct", "orig.rk", b"m1",
                          pika.BasicProperties(headers={"keep": "me"}, message_id="id1"))
    channel.basic_publish("", qname, b"m2")
    wait_ready(channel, qname, 2)
    t1 = get(channel, qname)[0]
    t2 = get(channel, qname)[0]
    channel.basic_reject(t1, requeue=False)
    channel.basic_nack(t2, requeue=False)
    wait_ready(channel, dead, 2)
    m, p, b = channel.basic_get(dead, auto_ack=True)
    assert b == b"m1"
    assert (m.exchange, m.routing_key, m.redelivered) == (dlx, "orig.rk", False)
    assert p.message_id == "id1" and p.headers["keep"] == "me"
    _check_x_death(p.headers, qname, "rejected", "amq.direct", ["orig.rk"])
    m, p, b = channel.basic_get(dead, auto_ack=True)
    assert b == b"m2" and m.routing_key == qname
    _check_x_death(p.headers, qname, "rejected", "", [qname])
    assert ready_count(channel, qname) == 0


def test_D6_dead_letter_routing_key(channel: BlockingChannel, qname: str) -> None:
    dead = qname + ".dead"
    other = qname + ".other"
    channel.queue_declare(dead, exclusive=True)
    channel.queue_declare(other, exclusive=True)
    channel.queue_bind(dead, "amq.direct", "to.dead")
    channel.queue_bind(other, "amq.direct", qname)  # would match the original key
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "to.dead"})
    channel.basic_publish("", qname, b"x")
    wait_ready(channel, qname, 1)
    channel.basic_nack(get(channel, qname)[0], requeue=False)
    wait_ready(channel, dead, 1)
    m, p, b = channel.basic_get(dead, auto_ack=True)
    assert (m.exchange, m.routing_key, b) == ("amq.direct", "to.dead", b"x")
    # x-death keeps the routing keys the message had before it died
    _check_x_death(p.headers, qname, "rejected", "", [qname])
    assert ready_count(channel, other) == 0


def test_D6_dead_letter_to_default_exchange(channel: BlockingChannel, qname: str) -> None:
    dead = qname + ".dead"
    channel.queue_declare(dead, exclusive=True)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    publish_n(channel, qname, 1)
    wait_ready(channel, qname, 1)
    channel.basic_reject(get(channel, qname)[0], requeue=False)
    wait_ready(channel, dead, 1)
    m, p, b = channel.basic_get(dead, auto_ack=True)
    assert (m.exchange, m.routing_key, b) == ("", dead, b"1")
    _check_x_death(p.headers, qname, "rejected", "", [qname])


def test_D6_dead_letter_to_missing_exchange_drops(channel: BlockingChannel,
                                                  qname: str) -> None:
    channel.queue_declare(qname, exclusive=True,
                          arguments={"x-dead-letter-exchange": qname + ".nope"})
    publish_n(channel, qname, 1)
    wait_ready(channel, qname, 1)
    channel.basic_reject(get(channel, qname)[0], requeue=False)
    channel.basic_qos(prefetch_count=0)  # no error for the channel
    assert ready_count(channel, qname) == 0


# ---------------------------------------------------------------------- D7

UNKNOWN = "PRECONDITION_FAILED - unknown delivery tag {}"


def test_D7_ack_twice_closes_channel_406(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    tag = get(channel, queue)[0]
    channel.basic_ack(tag)
    channel.basic_ack(tag)
    expect_channel_closed(channel, 406, UNKNOWN.format(tag))


@pytest.mark.parametrize("settle", [
    lambda ch, t: ch.basic_ack(t),
    lambda ch, t: ch.basic_nack(t, requeue=True),
    lambda ch, t: ch.basic_reject(t, requeue=False),
    lambda ch, t: ch.basic_ack(t, multiple=True),
], ids=["ack", "nack", "reject", "ack-multiple"])
def test_D7_unknown_tag_closes_channel_406(channel: BlockingChannel, queue: str,
                                           settle: Callable[[BlockingChannel, int], None]
                                           ) -> None:
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    get(channel, queue)  # tag 1 exists; 99 does not
    settle(channel, 99)
    expect_channel_closed(channel, 406, UNKNOWN.format(99))


def test_D7_tag_from_other_channel_closes_only_that_channel(
        connection, channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 2)
    wait_ready(channel, queue, 2)
    tag = get(channel, queue)[0]  # tag 1 on `channel`
    ch2 = connection.channel()
    ch2.basic_ack(tag)            # ch2 never delivered anything
    expect_channel_closed(ch2, 406, UNKNOWN.format(tag))
    # the connection and the first channel go on
    assert connection.is_open and channel.is_open
    channel.basic_ack(tag)
    assert get(channel, queue)[1] == b"2"
    ch3 = connection.channel()
    assert ready_count(ch3, queue) == 0


def test_D7_channel_error_requeues_its_unacked(connection, channel: BlockingChannel,
                                               queue: str) -> None:
    """The 406 is a channel error: D8 applies to that channel's deliveries."""
    publish_n(channel, queue, 3)
    wait_ready(channel, queue, 3)
    for _ in range(3):
        get(channel, queue)
    channel.basic_ack(7)
    expect_channel_closed(channel, 406, UNKNOWN.format(7))
    ch2 = connection.channel()
    wait_ready(ch2, queue, 3)
    assert drain(ch2, queue) == [(b"1", True), (b"2", True), (b"3", True)]


def test_D7_ack_tag_zero_without_multiple_406(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    get(channel, queue)
    channel.basic_ack(0)
    expect_channel_closed(channel, 406, UNKNOWN.format(0))


def test_D7_ack_zero_multiple_with_nothing_outstanding_is_fine(
        channel: BlockingChannel) -> None:
    channel.basic_ack(0, multiple=True)
    channel.basic_qos(prefetch_count=0)
    assert channel.is_open


def test_D7_multiple_beyond_highest_tag_406(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    get(channel, queue)
    channel.basic_nack(5, multiple=True, requeue=True)
    expect_channel_closed(channel, 406, UNKNOWN.format(5))


def test_D7_ack_of_no_ack_delivery_406(channel: BlockingChannel, queue: str) -> None:
    """An automatic-mode delivery has a tag but nothing to settle."""
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    tag = get(channel, queue, auto_ack=True)[0]
    channel.basic_ack(tag)
    expect_channel_closed(channel, 406, UNKNOWN.format(tag))


def test_D7_ack_after_requeue_406(channel: BlockingChannel, queue: str) -> None:
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    tag = get(channel, queue)[0]
    channel.basic_nack(tag, requeue=True)
    channel.basic_ack(tag)
    expect_channel_closed(channel, 406, UNKNOWN.format(tag))


def test_D7_settling_after_queue_deleted_is_fine(channel: BlockingChannel,
                                                 qname: str) -> None:
    """The channel still knows the tags of a deleted queue's deliveries."""
    channel.queue_declare(qname, exclusive=True)
    publish_n(channel, qname, 2)
    wait_ready(channel, qname, 2)
    t1 = get(channel, qname)[0]
    t2 = get(channel, qname)[0]
    assert channel.queue_delete(qname).method.message_count == 0  # unacked not counted
    channel.basic_ack(t1)
    channel.basic_nack(t2, requeue=True)
    channel.basic_qos(prefetch_count=0)
    assert channel.is_open


# ---------------------------------------------------------------------- D8


def _take_some(ch: BlockingChannel, queue: str) -> None:
    """Publish 1..6 and take 1..3 unacked, ack 2; 1 and 3 stay unacked."""
    publish_n(ch, queue, 6)
    wait_ready(ch, queue, 6)
    for _ in range(3):
        get(ch, queue)
    ch.basic_ack(2)


AFTER_TAKE = [(b"1", True), (b"3", True), (b"4", False), (b"5", False), (b"6", False)]


def test_D8_channel_close_requeues_unacked_in_order(connection, channel: BlockingChannel,
                                                    queue: str) -> None:
    _take_some(channel, queue)
    channel.close()
    ch2 = connection.channel()
    wait_ready(ch2, queue, 5)
    assert drain(ch2, queue) == AFTER_TAKE


def test_D8_connection_close_requeues_unacked(params, queue: str) -> None:
    conn = pika.BlockingConnection(params)
    _take_some(conn.channel(), queue)
    conn.close()
    conn2 = pika.BlockingConnection(params)
    try:
        ch2 = conn2.channel()
        wait_ready(ch2, queue, 5)
        assert drain(ch2, queue) == AFTER_TAKE
    finally:
        conn2.close()


def test_D8_tcp_loss_requeues_unacked(params, queue: str) -> None:
    """The socket dies without connection.close: the broker must notice EOF."""
    conn = pika.BlockingConnection(params)
    _take_some(conn.channel(), queue)
    sock: socket.socket = conn._impl._transport._sock
    sock.shutdown(socket.SHUT_RDWR)
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - the connection is gone either way
        pass
    conn2 = pika.BlockingConnection(params)
    try:
        ch2 = conn2.channel()
        wait_ready(ch2, queue, 5)
        assert drain(ch2, queue) == AFTER_TAKE
    finally:
        conn2.close()


def test_D8_consumer_deliveries_requeued_to_other_consumer(params, queue: str) -> None:
    conn1 = pika.BlockingConnection(params)
    conn2 = pika.BlockingConnection(params)
    try:
        ch1 = conn1.channel()
        publish_n(ch1, queue, 3)
        got1 = consume(conn1, ch1, queue, 3)
        assert [g[2] for g in got1] == [False] * 3
        ch2 = conn2.channel()
        got2: list[Got] = []
        ch2.basic_consume(queue, lambda c, m, p, b: got2.append(
            (m.delivery_tag, b, m.redelivered, {})))
        conn2.process_data_events(time_limit=0.1)
        assert got2 == []  # all three are held by consumer 1
        ch1.close()
        deadline = time.monotonic() + WAIT
        while len(got2) < 3 and time.monotonic() < deadline:
            conn2.process_data_events(time_limit=0.05)
        assert [(g[0], g[1], g[2]) for g in got2] == [(1, b"1", True), (2, b"2", True),
                                                      (3, b"3", True)]
    finally:
        conn1.close()
        conn2.close()


def test_D8_cancel_keeps_unacked_with_channel(connection, channel: BlockingChannel,
                                              queue: str) -> None:
    """basic.cancel does not requeue: deliveries stay unacked on the channel (RabbitMQ)."""
    publish_n(channel, queue, 2)
    got = consume(connection, channel, queue, 2)
    channel.basic_cancel(channel.consumer_tags[0])
    ch2 = connection.channel()
    time.sleep(0.2)
    assert ready_count(ch2, queue) == 0
    channel.basic_ack(got[1][0])
    channel.close()
    wait_ready(ch2, queue, 1)
    assert drain(ch2, queue) == [(b"1", True)]


# ---------------------------------------------------------------------- D9


def test_D9_redelivered_false_first_then_true(connection, channel: BlockingChannel,
                                              queue: str) -> None:
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    tag, _b, redelivered, _h = get(channel, queue)
    assert redelivered is False
    channel.basic_nack(tag, requeue=True)
    tag, _b, redelivered, _h = get(channel, queue)
    assert redelivered is True
    channel.close()
    ch2 = connection.channel()
    wait_ready(ch2, queue, 1)
    tag, _b, redelivered, _h = get(ch2, queue)
    assert redelivered is True
    ch2.basic_ack(tag)


def test_D9_recover_marks_redelivered(connection, channel: BlockingChannel,
                                      queue: str) -> None:
    publish_n(channel, queue, 2)
    got = consume(connection, channel, queue, 2)
    assert [g[2] for g in got] == [False, False]
    channel.basic_recover(requeue=True)
    deadline = time.monotonic() + WAIT
    while len(got) < 4 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert [(g[1], g[2]) for g in got[2:]] == [(b"1", True), (b"2", True)]
    assert [g[0] for g in got] == [1, 2, 3, 4]


def test_D9_recover_without_requeue_not_implemented_540(params) -> None:
    """RabbitMQ refuses basic.recover(requeue=false) with a connection error."""
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.basic_recover(requeue=False)
    assert (ei.value.reply_code, ei.value.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")


def test_channel_flow_false_not_implemented_540(params, qname: str) -> None:
    """A client cannot pause deliveries with channel.flow: RabbitMQ 3.10 closes the
    connection with 540; active=true is answered and changes nothing."""
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    assert ch.flow(True) is True
    ch.queue_declare(qname, exclusive=True)
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.flow(False)
    assert (ei.value.reply_code, ei.value.reply_text) == (540, "NOT_IMPLEMENTED - active=false")


# ---------------------------------------------------------------------- D10 (ackmq only)


@pytest.fixture
def ackmq_only(is_rabbitmq: bool) -> None:
    if is_rabbitmq:
        pytest.skip("ackmq extension: RabbitMQ classic queues have no delivery counter/limit")


def test_D10_delivery_count_header(ackmq_only, connection, channel: BlockingChannel,
                                   qname: str) -> None:
    """As RabbitMQ quorum queues: 0 or absent first, then 1, 2, ... per redelivery, on a
    queue that asks for it (`x-ackmq-delivery-count`; one with `x-delivery-limit` does)."""
    queue = qname
    channel.queue_declare(queue, exclusive=True, arguments={"x-ackmq-delivery-count": True})
    publish_n(channel, queue, 1)
    wait_ready(channel, queue, 1)
    tag, _b, red, h = get(channel, queue)
    assert red is False and h.get("x-delivery-count", 0) == 0
    channel.basic_nack(tag, requeue=True)
    tag, _b, red, h = get(channel, queue)
    assert red is True and h["x-delivery-count"] == 1
    channel.close()  # a channel close counts as a failed delivery too
    ch2 = connection.channel()
    wait_ready(ch2, queue, 1)
    got = consume(connection, ch2, queue, 1)
    assert got[0][2] is True and got[0][3]["x-delivery-count"] == 2


def test_D10_delivery_limit_dead_letters(ackmq_only, channel: BlockingChannel,
                                         qname: str) -> None:
    dead = qname + ".dead"
    channel.queue_declare(dead, exclusive=True)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-delivery-limit": 2, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead})
    channel.basic_publish("", qname, b"poison", pika.BasicProperties(headers={"h": 1}))
    wait_ready(channel, qname, 1)
    counts = []
    for _ in range(3):  # limit 2: delivered 3 times (counts 0, 1, 2), then dead
        tag, _b, _r, h = get(channel, qname)
        counts.append(h.get("x-delivery-count", 0))
        channel.basic_nack(tag, requeue=True)
    assert counts == [0, 1, 2]
    wait_ready(channel, dead, 1)
    assert ready_count(channel, qname) == 0
    m, p, b = channel.basic_get(dead, auto_ack=True)
    assert b == b"poison" and p.headers["h"] == 1
    _check_x_death(p.headers, qname, "delivery_limit", "", [qname])


def test_D10_delivery_limit_without_dlx_drops(ackmq_only, channel: BlockingChannel,
                                              qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments={"x-delivery-limit": 0})
    publish_n(channel, qname, 1)
    wait_ready(channel, qname, 1)
    channel.basic_nack(get(channel, qname)[0], requeue=True)
    time.sleep(0.2)
    assert ready_count(channel, qname) == 0


# ------------------------------------------------ Q2/Q6: what an ack costs, shared tags


def test_Q6_same_consumer_tag_on_two_channels_both_served(connection, qname: str) -> None:
    """Consumer tags are per channel: two channels may use the same tag on one queue, and
    both stay consumers of it (round-robin), until each cancels its own."""
    c1, c2 = connection.channel(), connection.channel()
    c1.queue_declare(qname, exclusive=True)
    got: dict[int, list[bytes]] = {1: [], 2: []}
    for n, ch in ((1, c1), (2, c2)):
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(qname, lambda c, m, p, b, n=n: (got[n].append(b),
                                                         c.basic_ack(m.delivery_tag)),
                         consumer_tag="same")
    assert c1.queue_declare(qname, passive=True).method.consumer_count == 2
    publish_n(c1, qname, 10)
    deadline = time.monotonic() + WAIT
    while len(got[1]) + len(got[2]) < 10 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    # both served (exactly 5/5 depends on when each ack arrives: 6/4 seen under load)
    n1, n2 = len(got[1]), len(got[2])
    assert n1 + n2 == 10 and n1 >= 2 and n2 >= 2, (n1, n2)
    c2.basic_cancel("same")
    assert c1.queue_declare(qname, passive=True).method.consumer_count == 1
    publish_n(c1, qname, 4)
    while len(got[1]) < n1 + 4 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert (len(got[1]), len(got[2])) == (n1 + 4, n2)



class _Output:
    writable = True
    number = 1

    def __init__(self) -> None:
        self.tags: list[int] = []

    def deliver(self, consumer_tag: str, delivery_tag: int, *rest: object) -> None:
        self.tags.append(delivery_tag)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **kw: None


@pytest.mark.parametrize("global_", [False, True], ids=["consumer", "channel"])
def test_Q2_ack_wakes_only_the_consumers_it_frees(monkeypatch: pytest.MonkeyPatch,
                                                  global_: bool) -> None:
    """ackmq-only (model): with many consumers blocked at their prefetch, an ack costs
    O(tags settled), not O(consumers of the channel)."""
    from ackmq.broker import BrokerModel, NullScheduler
    from ackmq.broker.queue import ClassicQueue as Queue

    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    vh.declare_queue("q", False, False, False, False, {}, None)
    out = _Output()
    ch = broker.open_channel(vh, object(), out)
    n = 2000
    ch.basic_qos(0, n if global_ else 1, global_)
    for i in range(n):
        ch.start_consumer(ch.basic_consume("q", f"c{i}", False, False, {}))
    for i in range(n + 10):
        ch.basic_publish("", "q", False, False, b"\x00\x00", str(i).encode())
    assert len(out.tags) == n  # every consumer (or the channel) is at its prefetch
    calls = 0
    real = Queue.activate

    def counting(self: Queue, c: object) -> None:
        nonlocal calls
        calls += 1
        real(self, c)

    monkeypatch.setattr(Queue, "activate", counting)
    for tag in out.tags[:10]:
        ch.basic_ack(tag, False)
    assert len(out.tags) == n + 10  # each ack let one more message out (Q2)
    assert calls <= 20, f"{calls} activations for 10 acks"
    ch.basic_ack(out.tags[-1], True)  # one multiple ack frees everything
    assert calls <= 20 + n + 1


def test_D1_fanout_to_consumers_on_other_channel_numbers_and_frame_sizes(
        params: pika.URLParameters, qname: str) -> None:
    """A message routed to several queues is delivered to each consumer in frames of
    its own channel number and frame_max (a body over 4,096 bytes split for one, whole
    for the other): every consumer gets every body and its properties whole. (It guards
    any sharing of a message's encoded content between deliveries: one such cache keyed
    on the message alone failed it.)"""
    conns = [pika.BlockingConnection(params),
             pika.BlockingConnection(pika.ConnectionParameters(
                 params.host, params.port, credentials=params.credentials, frame_max=4096))]
    try:
        chans = [conns[0].channel(), conns[0].channel(), conns[1].channel()]  # 1, 2, 1
        ex = f"{qname}.fan"
        chans[0].exchange_declare(ex, "fanout", auto_delete=True)
        got: list[list[tuple[bytes, str | None]]] = [[], [], []]
        for i, ch in enumerate(chans):
            q = ch.queue_declare(f"{qname}.{i}", exclusive=True).method.queue
            ch.queue_bind(q, ex)
            ch.basic_consume(q, lambda _c, _m, p, b, i=i: got[i].append((b, p.content_type)),
                             auto_ack=True)
        sent = [(b"a" * 10, "t/1"), (bytes(range(256)) * 40, "t/2"), (b"", "t/3"),
                (b"z" * 9000, "t/4")]
        for body, ctype in sent:
            chans[1].basic_publish(ex, "", body, pika.BasicProperties(content_type=ctype))
        deadline = time.monotonic() + WAIT
        while any(len(g) < len(sent) for g in got) and time.monotonic() < deadline:
            for c in conns:
                c.process_data_events(time_limit=0.02)
        assert got == [sent, sent, sent]
    finally:
        for c in conns:
            c.close()
