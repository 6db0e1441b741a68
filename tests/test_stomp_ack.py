"""W4 (ack modes), W5 (prefetch) and W6 (NACK, redelivery, dead-lettering) with raw
frames and stomp.py, against ackmq and RabbitMQ where RabbitMQ behaves the same."""

from __future__ import annotations

import time

import pika
import pytest
from support.stomphelp import Raw, Target, queue_depth, wait_depth


def fill(r: Raw, queue: str, *bodies: bytes) -> None:
    for b in bodies:
        r.send("SEND", {"destination": f"/queue/{queue}"}, b)
    r.receipt("BEGIN", {"transaction": "sync"})  # a round trip: the sends are in
    r.send("ABORT", {"transaction": "sync"})


# -- W4 ack modes -------------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_W4_client_ack_is_cumulative(target: Target, queue: str, version: str) -> None:
    with target.raw(version) as r:
        fill(r, queue, b"1", b"2", b"3")
        r.subscribe(f"/queue/{queue}", "s", ack="client")
        m = [r.expect("MESSAGE") for _ in range(3)]
        assert [x.body for x in m] == [b"1", b"2", b"3"]
        r.ack(m[1])  # acks 1 and 2
        r.receipt("DISCONNECT")
    assert wait_depth(target, queue, 1) == 1
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "s")
        again = r.expect("MESSAGE")
        assert again.body == b"3" and again.headers["redelivered"] == "true"


def test_W4_client_ack_is_cumulative_per_subscription(ackmq_target: Target, queue: str) -> None:
    """The STOMP spec's `client` mode: an ACK covers earlier messages of *that*
    subscription only. (RabbitMQ sends basic.ack multiple=true on the connection's one
    channel, so it also acks other subscriptions' earlier messages.)"""
    other = queue + ".other"
    with ackmq_target.raw() as r:
        fill(r, other, b"o1")
        r.subscribe(f"/queue/{other}", "o", ack="client")
        assert r.expect("MESSAGE").body == b"o1"     # delivery tag 1
        fill(r, queue, b"1", b"2")
        r.subscribe(f"/queue/{queue}", "s", ack="client")
        m = [r.expect("MESSAGE") for _ in range(2)]  # tags 2, 3
        r.ack(m[1])
        r.receipt("DISCONNECT")
    assert wait_depth(ackmq_target, queue, 0) == 0
    assert wait_depth(ackmq_target, other, 1) == 1  # o1 was not acked
    conn = ackmq_target.pika()
    conn.channel().queue_delete(other)
    conn.close()


def test_W4_client_individual_acks_that_message_only(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, b"1", b"2", b"3")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = [r.expect("MESSAGE") for _ in range(3)]
        r.ack(m[1])
        r.receipt("DISCONNECT")
    assert wait_depth(target, queue, 2) == 2
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "s")
        assert [r.expect("MESSAGE").body for _ in range(2)] == [b"1", b"3"]


def test_W4_ack_ids_are_the_ack_header_in_1_2_and_message_id_before(target: Target,
                                                                     queue: str) -> None:
    with target.raw("1.2") as r:
        fill(r, queue, b"x")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = r.expect("MESSAGE")
        assert "ack" in m.headers
        r.receipt("ACK", {"id": m.headers["ack"]})
    with target.raw("1.1") as r:
        fill(r, queue, b"y")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = r.expect("MESSAGE")
        assert "ack" not in m.headers
        r.receipt("ACK", {"message-id": m.headers["message-id"]})
        r.receipt("DISCONNECT")
    assert wait_depth(target, queue, 0) == 0


def test_W4_auto_mode_messages_are_gone_once_sent(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, b"1", b"2")
        r.subscribe(f"/queue/{queue}", "s")
        m = [r.expect("MESSAGE"), r.expect("MESSAGE")]
        assert "ack" not in m[0].headers
    time.sleep(0.3)
    assert queue_depth(target, queue) == 0


def test_W4_acking_twice_is_an_error(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, b"1")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = r.expect("MESSAGE")
        r.receipt("ACK", {"id": m.headers["ack"]}, receipt="a1")
        r.ack(m)
        f = r.expect("ERROR")
        assert f.headers["message"] == "precondition_failed"
        assert b"unknown delivery tag" in f.body
        assert r.closed()


def test_W4_unknown_ack_id_is_an_error(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "s", ack="client")
        r.send("ACK", {"id": "T_nope@@x@@1"})
        f = r.expect("ERROR")
        assert f.headers["message"] == "Subscription not found"


def test_W4_ack_without_its_id_header(target: Target) -> None:
    with target.raw() as r:
        r.send("ACK", {"message-id": "T_s@@x@@1"})  # 1.2 wants `id`
        f = r.expect("ERROR")
        assert f.headers["message"] == "Missing header"
        assert b'"ACK" must include the "id" header' in f.body


def test_W4_stomp_py_client_individual(target: Target, queue: str) -> None:
    conn, listener = target.client("1.2")
    conn.subscribe(f"/queue/{queue}", id=1, ack="client-individual")
    conn.send(f"/queue/{queue}", "a", receipt="r1")
    conn.send(f"/queue/{queue}", "b", receipt="r2")
    msgs = listener.wait("messages", 2)
    conn.ack(msgs[0].headers["ack"], receipt="r3")
    listener.wait("receipts", 3)
    conn.disconnect(receipt="bye")
    assert wait_depth(target, queue, 1) == 1


# -- W5 prefetch --------------------------------------------------------------------

@pytest.mark.parametrize("header", ["prefetch-count", "activemq.prefetchSize"])
def test_W5_prefetch_header_caps_unacked_deliveries(target: Target, queue: str,
                                                    header: str) -> None:
    if header == "activemq.prefetchSize" and not target.ackmq:
        pytest.skip("RabbitMQ does not read ActiveMQ's prefetch header")
    with target.raw() as r:
        fill(r, queue, *[b"%d" % i for i in range(6)])
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual", **{header: "2"})
        first = r.frames(0.5)
        assert [m.body for m in first] == [b"0", b"1"]
        r.ack(first[0])
        assert [m.body for m in r.frames(0.5)] == [b"2"]


def test_W5_prefetch_is_per_subscription(target: Target, queue: str) -> None:
    other = queue + ".b"
    with target.raw() as r:
        fill(r, queue, *[b"a%d" % i for i in range(5)])
        fill(r, other, *[b"b%d" % i for i in range(5)])
        r.subscribe(f"/queue/{queue}", "a", ack="client", **{"prefetch-count": "1"})
        r.subscribe(f"/queue/{other}", "b", ack="client", **{"prefetch-count": "3"})
        got = r.frames(0.7)
        r.receipt("DISCONNECT")
    assert sorted(m.headers["subscription"] for m in got) == ["a", "b", "b", "b"]
    conn = target.pika()
    conn.channel().queue_delete(other)
    conn.close()


def test_W5_auto_subscriptions_ignore_prefetch(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, *[b"%d" % i for i in range(5)])
        r.subscribe(f"/queue/{queue}", "s", ack="auto", **{"prefetch-count": "1"})
        assert len(r.frames(0.7)) == 5


def test_W5_default_is_unlimited(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, *[b"%d" % i for i in range(50)])
        r.subscribe(f"/queue/{queue}", "s", ack="client")
        assert len(r.frames(1.0)) == 50


# -- W6 NACK ------------------------------------------------------------------------

def test_W6_nack_redelivers_with_redelivered_true(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, b"x")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = r.expect("MESSAGE")
        assert m.headers["redelivered"] == "false"
        r.ack(m, "NACK")
        again = r.expect("MESSAGE")
        assert again.body == b"x" and again.headers["redelivered"] == "true"
        r.ack(again)
        r.receipt("DISCONNECT")


def test_W6_nack_in_client_mode_is_cumulative(target: Target, queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, b"1", b"2")
        r.subscribe(f"/queue/{queue}", "s", ack="client", **{"prefetch-count": "10"})
        m = [r.expect("MESSAGE"), r.expect("MESSAGE")]
        r.ack(m[1], "NACK")
        again = [r.expect("MESSAGE"), r.expect("MESSAGE")]
        assert [x.body for x in again] == [b"1", b"2"]
        assert all(x.headers["redelivered"] == "true" for x in again)


def test_W6_nack_requeue_false_drops_without_dead_letter_exchange(target: Target,
                                                                  queue: str) -> None:
    with target.raw() as r:
        fill(r, queue, b"x")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        r.ack(r.expect("MESSAGE"), "NACK", requeue="false")
        assert r.frames(0.5) == []
        r.receipt("DISCONNECT")
    assert queue_depth(target, queue) == 0


def test_W6_nack_requeue_false_dead_letters_to_the_queues_dlx(target: Target,
                                                               queue: str) -> None:
    dlq = queue + ".dlq"
    with target.raw() as r:
        r.receipt("SUBSCRIBE", {"destination": f"/queue/{dlq}", "id": "d", "ack": "auto"})
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual",
                    **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
        r.send("SEND", {"destination": f"/queue/{queue}"}, b"poison")
        m = r.expect("MESSAGE")
        r.ack(m, "NACK", requeue="false")
        dead = r.expect("MESSAGE")
    assert dead.headers["subscription"] == "d" and dead.body == b"poison"


def nack_until_gone(r: Raw, limit: int = 10) -> int:
    """NACK (requeue) every delivery; the number of deliveries until none comes."""
    n = 0
    while n < limit:
        got = r.frames(0.5)
        if not got:
            return n
        for m in got:
            n += 1
            r.ack(m, "NACK")
    return n


def test_W6_rabbitmq_form_without_dlx_requeues_past_the_limit(target: Target,
                                                               queue: str) -> None:
    """Never dropped silently: with nowhere to dead-letter to, a NACKed message keeps
    coming back (RabbitMQ's classic-queue behaviour), past ActiveMQ's 6 redeliveries."""
    with target.raw() as r:
        fill(r, queue, b"x")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        assert nack_until_gone(r, limit=9) == 9


def test_W6_past_the_delivery_limit_goes_to_the_queues_dlx(ackmq_target: Target,
                                                            queue: str) -> None:
    """Default 6 redeliveries for STOMP subscriptions: the 7th NACK dead-letters, with
    reason delivery_limit. (RabbitMQ's classic queues requeue for ever.)"""
    dlq = queue + ".dlq"
    conn = ackmq_target.pika()
    try:
        ch = conn.channel()
        ch.queue_declare(dlq, durable=True)
        ch.queue_declare(queue, durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
        with ackmq_target.raw() as r:
            r.receipt("SEND", {"destination": f"/amq/queue/{queue}"}, b"poison")
            r.subscribe(f"/amq/queue/{queue}", "s", ack="client-individual")
            assert nack_until_gone(r) == 7
        assert wait_depth(ackmq_target, dlq, 1) == 1
        _m, props, body = ch.basic_get(dlq, auto_ack=True)
        assert body == b"poison"
        assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    finally:
        conn.close()


def test_W6_activemq_form_dead_letters_to_activemq_dlq(ackmq_target: Target,
                                                        queue: str) -> None:
    conn = ackmq_target.pika()
    try:
        ch = conn.channel()
        with ackmq_target.raw() as r:
            r.receipt("SEND", {"destination": f"queue://{queue}"}, b"poison")
            r.subscribe(f"queue://{queue}", "s", ack="client-individual")
            assert nack_until_gone(r) == 7
            before = queue_depth(ackmq_target, "ActiveMQ.DLQ")
            r.receipt("SEND", {"destination": f"queue://{queue}"}, b"rejected")
            r.ack(r.expect("MESSAGE"), "NACK", requeue="false")
            assert wait_depth(ackmq_target, "ActiveMQ.DLQ", before + 1) == before + 1
        ch.queue_purge("ActiveMQ.DLQ")
    finally:
        conn.close()
    assert queue_depth(ackmq_target, queue) == 0


def test_W6_nack_with_pika_consumer_sees_the_delivery_count(target: Target,
                                                            queue: str) -> None:
    """After a STOMP NACK the message reaches an AMQP consumer as redelivered."""
    with target.raw() as r:
        fill(r, queue, b"x")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        r.ack(r.expect("MESSAGE"), "NACK", requeue="true")
        r.receipt("DISCONNECT")
        conn = target.pika()
        try:
            deadline = time.monotonic() + 5
            while True:
                m, _p, body = conn.channel().basic_get(queue, auto_ack=True)
                if m is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert body == b"x" and m.redelivered
        finally:
            conn.close()


def test_W6_pika_publish_then_stomp_nack_keeps_properties(target: Target, queue: str) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, b"p", pika.BasicProperties(content_type="text/plain",
                                                                 headers={"h": "1"}))
    finally:
        conn.close()
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{queue}", "s", ack="client-individual")
        r.ack(r.expect("MESSAGE"), "NACK")
        m = r.expect("MESSAGE")
    assert m.headers["content-type"] == "text/plain" and m.headers["h"] == "1"
