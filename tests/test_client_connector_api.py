"""The small ackmq.client API connectors use (the Spark source and sink): ack exactly
the messages of a batch, a round trip on the session's channel, batched receive, and a
producer to any exchange. Against ackmq and RabbitMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from ackmq.client import AckMode, ChannelClosed, Destination, OutboundMessage, connect

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]


def _received(url: str, q: str, witness: Witness, n: int) -> tuple[Any, Any, list[Any]]:
    """n messages published, then all delivered to one INDIVIDUAL session: (conn, session,
    messages in order)."""
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(n)])
    conn = connect(url)
    s = conn.session(AckMode.INDIVIDUAL)
    c = s.consumer(q)
    got: list[Any] = []
    while len(got) < n:
        got.extend(c.receive_batch(n, timeout=5))
    assert [m.body for m in got] == [str(i).encode() for i in range(n)]
    return conn, s, got


def test_acknowledge_messages_acks_exactly_those(url: str, q: str, witness: Witness) -> None:
    """Messages 0, 1, 3 acked (a `multiple` run then a single ack); 2 and 4 stay unacked
    and come back after the connection closes."""
    conn, s, got = _received(url, q, witness, 5)
    try:
        assert s.acknowledge_messages([got[0], got[1], got[3]]) == 3
        assert s.unacked == 2
        assert s.queue_info(q).message_count == 0  # after the acks: a round trip
    finally:
        conn.abort()
    witness.wait_ready(q, 2)
    assert sorted(b for _, _, b in witness.drain(q)) == [b"2", b"4"]


def test_acknowledge_messages_of_the_oldest_deliveries_in_order(url: str, q: str,
                                                                witness: Witness) -> None:
    """The connector's common case (its oldest deliveries, in order: the fast path):
    those are acked, the later ones stay unacked; acking them again, or out of order
    afterwards, still acks exactly what is asked."""
    conn, s, got = _received(url, q, witness, 8)
    try:
        assert s.acknowledge_messages(got[:3]) == 3
        assert s.unacked == 5
        assert s.acknowledge_messages(got[:3]) == 0  # already settled
        assert s.acknowledge_messages([got[4], got[3]]) == 2  # not in order: slow path
        assert s.unacked == 3
        assert s.queue_info(q).message_count == 0  # after the acks: a round trip
    finally:
        conn.abort()
    witness.wait_ready(q, 3)
    assert sorted(b for _, _, b in witness.drain(q)) == [b"5", b"6", b"7"]


def test_receive_batch_takes_what_is_buffered_up_to_the_maximum(url: str, q: str,
                                                                witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, *[b"x"] * 10)
    with connect(url) as conn:
        s = conn.session(AckMode.CLIENT)
        c = s.consumer(Destination("queue", q, prefetch=10))
        got = []
        while len(got) < 10:
            batch = c.receive_batch(4, timeout=5)
            assert 0 < len(batch) <= 4
            got.extend(batch)
        assert c.receive_batch(4, timeout=0.05) == []
        s.acknowledge()


def test_queue_info_and_check_exchange_answer_404_with_the_brokers_text(url: str) -> None:
    with connect(url) as conn:
        with pytest.raises(ChannelClosed, match="404 NOT_FOUND - no queue 'no.such.q'"):
            conn.session().queue_info("no.such.q")
        with pytest.raises(ChannelClosed,
                           match="404 NOT_FOUND - no exchange 'no.such.x'"):
            conn.session().check_exchange("no.such.x")
        conn.session().check_exchange("amq.topic")  # exists: no error


def test_producer_to_publishes_to_any_exchange_and_key(url: str, q: str,
                                                       witness: Witness) -> None:
    witness.declare(q)
    witness.ch.queue_bind(q, "amq.direct", routing_key=q)
    with connect(url) as conn:
        p = conn.session().producer_to("amq.direct", q)
        p.publish(b"a").result(10)
        p.publish(OutboundMessage.build(b"b", "", q, True, "id-b")).result(10)
    got = witness.drain(q)
    assert [b for _, _, b in got] == [b"a", b"b"]
    assert got[1][1].message_id == "id-b"
