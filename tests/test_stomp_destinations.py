"""W3: destinations as RabbitMQ's plugin names them (and ActiveMQ's spellings on ackmq),
checked from both sides: STOMP frames and pika."""

from __future__ import annotations

import uuid

import pika
import pika.exceptions
import pytest
from support.stomphelp import Target, queue_depth, wait_depth


def test_W3_queue_destination_creates_a_durable_queue_on_first_send(
        target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"one")
    assert queue_depth(target, queue) == 1
    conn = target.pika()
    try:  # declared durable: a non-durable declare of it is inequivalent (406)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            conn.channel().queue_declare(queue, durable=False)
        assert e.value.reply_code == 406
    finally:
        conn.close()


def test_W3_queue_send_and_subscribe_round_trip(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "1")
        r.send("SEND", {"destination": f"/queue/{queue}", "k": "v"}, b"hello")
        m = r.expect("MESSAGE")
    assert m.body == b"hello"
    assert m.headers["destination"] == f"/queue/{queue}"
    assert m.headers["subscription"] == "1" and m.headers["k"] == "v"
    assert m.headers["redelivered"] == "false"


def test_W3_amq_queue_uses_an_existing_queue_and_never_creates_one(
        target: Target, queue: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{queue}", "1", receipt=False)
        f = r.expect("ERROR")
        assert f.headers["message"] == "not_found"
        assert f"NOT_FOUND - no queue '{queue}' in vhost '/'".encode() in f.body
    conn = target.pika()
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            conn.channel().queue_declare(queue, passive=True)
        ch = conn.channel()
        ch.queue_declare(queue, durable=False)
        with target.raw() as r:
            r.subscribe(f"/amq/queue/{queue}", "1")
            ch.basic_publish("", queue, b"from amqp")
            m = r.expect("MESSAGE")
            assert m.body == b"from amqp"
            assert m.headers["destination"] == f"/queue/{queue}"
    finally:
        conn.close()


def test_W3_topic_each_subscription_gets_its_own_copy(target: Target) -> None:
    key = f"t.{uuid.uuid4().hex[:8]}"
    with target.raw() as a, target.raw() as b:
        a.subscribe(f"/topic/{key}.*", "a")
        b.subscribe(f"/topic/{key}.#", "b")
        with target.raw() as sender:
            sender.receipt("SEND", {"destination": f"/topic/{key}.x"}, b"news")
        conn = target.pika()
        conn.channel().basic_publish("amq.topic", f"{key}.y.z", b"from amqp")
        conn.close()
        got_a = a.expect("MESSAGE")
        got_b = [b.expect("MESSAGE"), b.expect("MESSAGE")]
    assert got_a.body == b"news" and got_a.headers["destination"] == f"/topic/{key}.x"
    assert sorted(m.body for m in got_b) == [b"from amqp", b"news"]


def test_W3_topic_subscription_queue_goes_with_the_subscription(target: Target) -> None:
    key = f"t.{uuid.uuid4().hex[:8]}"
    with target.raw() as r:
        r.subscribe(f"/topic/{key}", "a", **{"x-queue-name": f"sub-{key}"})
        assert queue_depth(target, f"sub-{key}") == 0
        r.receipt("UNSUBSCRIBE", {"id": "a"})
        conn = target.pika()
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                conn.channel().queue_declare(f"sub-{key}", passive=True)
        finally:
            conn.close()


def test_W3_exchange_destination_binds_and_publishes(target: Target) -> None:
    key = f"k.{uuid.uuid4().hex[:8]}"
    with target.raw() as r:
        r.subscribe(f"/exchange/amq.direct/{key}", "1")
        r.send("SEND", {"destination": f"/exchange/amq.direct/{key}"}, b"direct")
        m = r.expect("MESSAGE")
    assert m.body == b"direct"
    assert m.headers["destination"] == f"/exchange/amq.direct/{key}"


def test_W3_exchange_that_does_not_exist(target: Target) -> None:
    with target.raw() as r:
        r.subscribe("/exchange/no-such-exchange/k", "1", receipt=False)
        f = r.expect("ERROR")
        assert f.headers["message"] == "not_found"
        assert b"NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'" in f.body


def test_W3_temp_queue_reply_to_works_with_an_amqp_replier(target: Target, queue: str) -> None:
    """reply-to:/temp-queue/x makes a queue of the connection; AMQP sees its name as the
    reply_to, replies to it, and the STOMP client gets the reply on subscription
    /temp-queue/x."""
    conn = target.pika()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        with target.raw() as r:
            r.receipt("SEND", {"destination": f"/amq/queue/{queue}",
                               "reply-to": "/temp-queue/answers"}, b"question")
            method, props, body = ch.basic_get(queue, auto_ack=True)
            assert body == b"question"
            assert props.reply_to and not props.reply_to.startswith("/")
            ch.basic_publish("", props.reply_to, b"answer")
            m = r.expect("MESSAGE")
        assert m.body == b"answer"
        assert m.headers["subscription"] == "/temp-queue/answers"
    finally:
        conn.close()


def test_W3_reply_to_of_an_amqp_message_reads_as_a_reply_queue(target: Target,
                                                               queue: str) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.queue_declare(queue + ".r", exclusive=True)
        with target.raw() as r:
            r.subscribe(f"/amq/queue/{queue}", "1")
            ch.basic_publish("", queue, b"q", pika.BasicProperties(reply_to=queue + ".r"))
            m = r.expect("MESSAGE")
            assert m.headers["reply-to"] == f"/reply-queue/{queue}.r"
            r.receipt("SEND", {"destination": m.headers["reply-to"]}, b"a")
        assert ch.basic_get(queue + ".r", auto_ack=True)[2] == b"a"
    finally:
        conn.close()


@pytest.mark.parametrize("dest,detail", [
    ("/queue/bah/baz", "'/bah/baz' is not a valid queue destination"),
    ("/queue", "'' is not a valid queue destination"),
    ("/topic/bah/baz", "'/bah/baz' is not a valid topic destination"),
    ("/exchange//foo", "'//foo' is not a valid exchange destination"),
])
def test_W3_invalid_destination(target: Target, dest: str, detail: str) -> None:
    with target.raw() as r:
        r.send("SEND", {"destination": dest}, b"x")
        f = r.expect("ERROR")
        assert f.headers["message"] == "Invalid destination"
        assert f.body.decode().startswith(detail)


def test_W3_unknown_destination(target: Target) -> None:
    with target.raw() as r:
        r.send("SEND", {"destination": "/something/interesting"}, b"x")
        assert r.expect("ERROR").headers["message"] == "Unknown destination"


def test_W3_temp_queue_is_not_a_send_destination(target: Target) -> None:
    with target.raw() as r:
        r.send("SEND", {"destination": "/temp-queue/x"}, b"x")
        f = r.expect("ERROR")
        assert f.headers["message"] == "Invalid destination"
        assert b"is not a valid destination for 'SEND'" in f.body


# -- ActiveMQ's spellings (ackmq; RabbitMQ answers "Unknown destination") ---------------

def test_W3_activemq_queue_form_is_the_same_queue(ackmq_target: Target, queue: str) -> None:
    with ackmq_target.raw() as r:
        r.receipt("SEND", {"destination": f"queue://{queue}"}, b"amq-style")
        r.subscribe(f"/queue/{queue}", "1")
        m = r.expect("MESSAGE")
    assert m.body == b"amq-style" and m.headers["destination"] == f"/queue/{queue}"


def test_W3_activemq_topic_form_and_its_wildcard(ackmq_target: Target) -> None:
    key = f"p{uuid.uuid4().hex[:8]}"
    with ackmq_target.raw() as r:
        r.subscribe(f"topic://{key}.>", "1")
        r.send("SEND", {"destination": f"/topic/{key}.eu.fr"}, b"deep")
        r.send("SEND", {"destination": f"topic://{key}.us"}, b"shallow")
        got = [r.expect("MESSAGE").body, r.expect("MESSAGE").body]
    assert got == [b"deep", b"shallow"]


def test_W3_bare_name_is_a_queue(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SEND", {"destination": queue}, b"bare")
    assert wait_depth(target, queue, 1) == 1
