"""Prefetch (SPEC Q1-Q6): how many unacked deliveries the broker lets out, and to whom.

Why: prefetch is the consumer's flow control; too many deliveries swamp a slow
consumer, too few (or a wrong scope) starve it, and round-robin decides fairness.
Counting is done on the wire: deliveries received within a quiet period, no acks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from pamqp import commands
from support.rawamqp import Message, RawConnection, safe_name

QUIET = 0.5  # seconds without frames after which "nothing more comes"


@pytest.fixture
def qname(qname: str) -> str:
    return safe_name(qname)


@pytest.fixture
def raw(broker_url: str) -> Iterator[RawConnection]:
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    yield conn
    conn.abort()


def declare_filled(conn: RawConnection, queue: str, n: int, channel: int = 1) -> None:
    conn.rpc(channel, commands.Queue.Declare(queue=queue, auto_delete=True),
             commands.Queue.DeclareOk)
    for i in range(n):
        conn.publish(channel, "", queue, str(i).encode())
    # a round trip on the same channel: all n publishes were handled before this returns
    conn.rpc(channel, commands.Queue.Declare(queue=queue, passive=True),
             commands.Queue.DeclareOk)


def consume(conn: RawConnection, queue: str, tag: str, channel: int = 1,
            no_ack: bool = False) -> None:
    conn.rpc(channel, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack),
             commands.Basic.ConsumeOk)


def deliveries(conn: RawConnection, quiet: float = QUIET) -> list[Message]:
    """Deliveries that arrive until the wire has been quiet for `quiet` seconds."""
    out: list[Message] = []
    while True:
        got = conn.drain(quiet)
        new = [f for _, f in got if isinstance(f, Message)]
        others = [f for _, f in got if not isinstance(f, Message)]
        assert not others, f"unexpected frames: {others}"
        if not new:
            return out
        out.extend(new)


def by_consumer(msgs: list[Message]) -> Counter[str]:
    return Counter(m.consumer_tag for m in msgs)


# ---- Q1 / Q2 -------------------------------------------------------------------------

def test_Q1_prefetch_caps_unacked_deliveries(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 10)
    raw.rpc(1, commands.Basic.Qos(0, 3), commands.Basic.QosOk)
    consume(raw, qname, "c")
    got = deliveries(raw)
    assert [m.body for m in got] == [b"0", b"1", b"2"]
    assert [m.delivery_tag for m in got] == [1, 2, 3]


def test_Q1_prefetch_zero_means_no_cap(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 50)
    raw.rpc(1, commands.Basic.Qos(0, 0), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 50


def test_Q1_cap_applies_to_later_publishes(raw: RawConnection, qname: str) -> None:
    raw.rpc(1, commands.Queue.Declare(queue=qname, auto_delete=True), commands.Queue.DeclareOk)
    raw.rpc(1, commands.Basic.Qos(0, 2), commands.Basic.QosOk)
    consume(raw, qname, "c")
    for i in range(5):
        raw.publish(1, "", qname, str(i).encode())
    assert len(deliveries(raw)) == 2


def test_Q2_at_cap_nothing_until_ack(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 10)
    raw.rpc(1, commands.Basic.Qos(0, 2), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 2
    raw.send(1, commands.Basic.Ack(delivery_tag=1))
    got = deliveries(raw)
    assert [m.body for m in got] == [b"2"]
    assert got[0].delivery_tag == 3


def test_Q2_multiple_ack_frees_many(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 20)
    raw.rpc(1, commands.Basic.Qos(0, 5), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 5
    raw.send(1, commands.Basic.Ack(delivery_tag=4, multiple=True))
    got = deliveries(raw)
    assert [m.body for m in got] == [b"5", b"6", b"7", b"8"]


@pytest.mark.parametrize("settle", ["reject", "nack"])
def test_Q2_reject_and_nack_free_room(raw: RawConnection, qname: str, settle: str) -> None:
    declare_filled(raw, qname, 5)
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    consume(raw, qname, "c")
    first = deliveries(raw)
    assert len(first) == 1
    if settle == "reject":
        raw.send(1, commands.Basic.Reject(delivery_tag=1, requeue=False))
    else:
        raw.send(1, commands.Basic.Nack(delivery_tag=1, requeue=False))
    got = deliveries(raw)
    assert [m.body for m in got] == [b"1"]


def test_Q2_requeue_frees_room_and_redelivers(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 3)
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 1
    raw.send(1, commands.Basic.Reject(delivery_tag=1, requeue=True))
    got = deliveries(raw)
    assert len(got) == 1 and got[0].body == b"0" and got[0].redelivered is True


# ---- Q3 -------------------------------------------------------------------------------

def _two_consumers(raw: RawConnection, qname: str, n: int = 10) -> None:
    for q in (qname + ".a", qname + ".b"):
        declare_filled(raw, q, n)


def test_Q3_global_false_limits_each_consumer(raw: RawConnection, qname: str) -> None:
    _two_consumers(raw, qname)
    raw.rpc(1, commands.Basic.Qos(0, 2, global_=False), commands.Basic.QosOk)
    consume(raw, qname + ".a", "a")
    consume(raw, qname + ".b", "b")
    assert by_consumer(deliveries(raw)) == {"a": 2, "b": 2}


def test_Q3_global_true_limits_the_channel(raw: RawConnection, qname: str) -> None:
    _two_consumers(raw, qname)
    raw.rpc(1, commands.Basic.Qos(0, 3, global_=True), commands.Basic.QosOk)
    consume(raw, qname + ".a", "a")
    consume(raw, qname + ".b", "b")
    counts = by_consumer(deliveries(raw))
    assert sum(counts.values()) == 3


def test_Q3_both_scopes_apply(raw: RawConnection, qname: str) -> None:
    """Per consumer 2, per channel 3: neither consumer above 2, both together 3."""
    _two_consumers(raw, qname)
    raw.rpc(1, commands.Basic.Qos(0, 2, global_=False), commands.Basic.QosOk)
    raw.rpc(1, commands.Basic.Qos(0, 3, global_=True), commands.Basic.QosOk)
    consume(raw, qname + ".a", "a")
    consume(raw, qname + ".b", "b")
    counts = by_consumer(deliveries(raw))
    assert sum(counts.values()) == 3
    assert max(counts.values()) <= 2
    # acking frees channel room: the consumer with room gets the next one
    raw.send(1, commands.Basic.Ack(delivery_tag=3, multiple=True))
    counts = by_consumer(deliveries(raw))
    assert sum(counts.values()) == 3 and max(counts.values()) <= 2


def test_Q3_global_false_only_for_consumers_created_afterwards(raw: RawConnection,
                                                               qname: str) -> None:
    _two_consumers(raw, qname)
    consume(raw, qname + ".a", "a")  # before the qos: unlimited
    raw.rpc(1, commands.Basic.Qos(0, 1, global_=False), commands.Basic.QosOk)
    consume(raw, qname + ".b", "b")
    assert by_consumer(deliveries(raw)) == {"a": 10, "b": 1}


def test_Q3_prefetch_is_per_channel_setting(raw: RawConnection, qname: str) -> None:
    """Another channel's qos does not limit this channel's consumers."""
    _two_consumers(raw, qname)
    raw.open_channel(2)
    raw.rpc(2, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    consume(raw, qname + ".a", "a", channel=1)
    consume(raw, qname + ".b", "b", channel=2)
    assert by_consumer(deliveries(raw)) == {"a": 10, "b": 1}


# ---- Q4 -------------------------------------------------------------------------------

@pytest.mark.parametrize("global_", [False, True], ids=["consumer", "channel"])
def test_Q4_lowering_prefetch_in_flight_is_no_error(raw: RawConnection, qname: str,
                                                    global_: bool) -> None:
    declare_filled(raw, qname, 20)
    raw.rpc(1, commands.Basic.Qos(0, 5, global_=global_), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 5
    raw.rpc(1, commands.Basic.Qos(0, 1, global_=global_), commands.Basic.QosOk)
    # 5 unacked above a cap of 1: allowed; nothing is taken back, all 5 ackable
    raw.send(1, commands.Basic.Ack(delivery_tag=5, multiple=True))
    got = deliveries(raw)
    assert 1 <= len(got) <= 5
    assert [m.delivery_tag for m in got] == list(range(6, 6 + len(got)))


def test_Q4_lowering_channel_prefetch_takes_effect_after_drain(raw: RawConnection,
                                                               qname: str) -> None:
    """With the channel-wide cap lowered to 1, 4 still in flight: one ack sends nothing."""
    declare_filled(raw, qname, 20)
    raw.rpc(1, commands.Basic.Qos(0, 5, global_=True), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 5
    raw.rpc(1, commands.Basic.Qos(0, 1, global_=True), commands.Basic.QosOk)
    raw.send(1, commands.Basic.Ack(delivery_tag=1))
    assert deliveries(raw) == []
    raw.send(1, commands.Basic.Ack(delivery_tag=5, multiple=True))
    assert len(deliveries(raw)) == 1


def test_Q4_raising_prefetch_releases_more(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 20)
    raw.rpc(1, commands.Basic.Qos(0, 2, global_=True), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 2
    raw.rpc(1, commands.Basic.Qos(0, 6, global_=True), commands.Basic.QosOk)
    assert len(deliveries(raw)) == 4


# ---- Q5 -------------------------------------------------------------------------------

def test_Q5_basic_get_ignores_prefetch(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 5)
    raw.rpc(1, commands.Basic.Qos(0, 1, global_=True), commands.Basic.QosOk)
    tags = []
    for _ in range(5):
        raw.send(1, commands.Basic.Get(queue=qname, no_ack=False))
        tags.append(raw.expect(commands.Basic.GetOk, channel=1).delivery_tag)
    assert tags == [1, 2, 3, 4, 5]


def test_Q5_basic_get_works_while_consumer_at_cap(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 5)
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    consume(raw, qname, "c")
    assert len(deliveries(raw)) == 1
    raw.send(1, commands.Basic.Get(queue=qname, no_ack=False))
    msg = raw.expect(commands.Basic.GetOk, channel=1)
    assert msg.body == b"1" and msg.delivery_tag == 2


def test_Q5_no_ack_consumer_ignores_prefetch(raw: RawConnection, qname: str) -> None:
    declare_filled(raw, qname, 30)
    raw.rpc(1, commands.Basic.Qos(0, 1, global_=False), commands.Basic.QosOk)
    raw.rpc(1, commands.Basic.Qos(0, 1, global_=True), commands.Basic.QosOk)
    consume(raw, qname, "c", no_ack=True)
    assert len(deliveries(raw)) == 30


# ---- Q6 -------------------------------------------------------------------------------

def test_Q6_round_robin_among_consumers_with_room(raw: RawConnection, qname: str) -> None:
    """Two consumers, prefetch 1 each: they alternate as they ack."""
    declare_filled(raw, qname, 10)
    raw.open_channel(2)
    for ch in (1, 2):
        raw.rpc(ch, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    consume(raw, qname, "a", channel=1)
    consume(raw, qname, "b", channel=2)
    first = deliveries(raw)
    assert sorted((m.consumer_tag, m.body) for m in first) == [("a", b"0"), ("b", b"1")]
    seen: list[tuple[str, bytes]] = []
    tags = {"a": 1, "b": 1}
    for _ in range(4):
        for ch, tag in ((1, "a"), (2, "b")):
            raw.send(ch, commands.Basic.Ack(delivery_tag=tags[tag]))
            got = deliveries(raw, 0.3)
            assert len(got) == 1 and got[0].consumer_tag == tag
            tags[tag] = got[0].delivery_tag
            seen.append((tag, got[0].body))
    assert [b for _, b in seen] == [str(i).encode() for i in range(2, 10)]


def test_Q6_round_robin_without_prefetch(raw: RawConnection, qname: str) -> None:
    raw.rpc(1, commands.Queue.Declare(queue=qname, auto_delete=True), commands.Queue.DeclareOk)
    raw.open_channel(2)
    consume(raw, qname, "a", channel=1, no_ack=True)
    consume(raw, qname, "b", channel=2, no_ack=True)
    for i in range(10):
        raw.publish(1, "", qname, str(i).encode())
    got = deliveries(raw)
    a = [int(m.body) for m in got if m.consumer_tag == "a"]
    b = [int(m.body) for m in got if m.consumer_tag == "b"]
    assert sorted(a + b) == list(range(10))
    assert len(a) == len(b) == 5
    assert a in ([0, 2, 4, 6, 8], [1, 3, 5, 7, 9])


def test_Q6_full_consumer_is_skipped(raw: RawConnection, qname: str) -> None:
    """Consumer a (prefetch 1, holding one) is skipped; b (no cap) takes the rest."""
    raw.rpc(1, commands.Queue.Declare(queue=qname, auto_delete=True), commands.Queue.DeclareOk)
    raw.open_channel(2)
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    consume(raw, qname, "a", channel=1)
    consume(raw, qname, "b", channel=2)
    for i in range(9):
        raw.publish(1, "", qname, str(i).encode())
    counts = by_consumer(deliveries(raw))
    assert counts == {"a": 1, "b": 8}


# ---- prefetch-size ---------------------------------------------------------------------

def test_prefetch_size_nonzero_not_implemented(raw: RawConnection) -> None:
    """RabbitMQ refuses byte-based prefetch: connection.close 540 NOT_IMPLEMENTED."""
    raw.send(1, commands.Basic.Qos(prefetch_size=100, prefetch_count=0))
    close = raw.wait_close()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 540
    assert close.reply_text.startswith("NOT_IMPLEMENTED")
    assert (close.class_id, close.method_id) == (60, 10)


def test_pika_prefetch(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True)
    for i in range(5):
        channel.basic_publish("", qname, str(i).encode())
    channel.basic_qos(prefetch_count=2)
    got = []
    channel.basic_consume(qname, lambda ch, m, p, b: got.append(m.delivery_tag))
    channel.connection.process_data_events(time_limit=QUIET)
    assert got == [1, 2]
