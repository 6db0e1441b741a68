"""W3 interop: a message sent by STOMP read by pika, and one published by pika read by
STOMP, compared field by field with what RabbitMQ's STOMP plugin gives (same test,
run against both)."""

from __future__ import annotations

import datetime

import pika
from support.stomphelp import Target, wait_depth

SEND_HEADERS = {
    "content-type": "application/json", "content-encoding": "utf-8", "persistent": "true",
    "priority": "5", "correlation-id": "corr-1", "reply-to": "/queue/replies",
    "expiration": "600000", "amqp-message-id": "msg-1", "timestamp": "1700000000",
    "type": "order.created", "user-id": "guest", "app-id": "shop", "x-custom": "1",
    "custom-text": "hello: world",
}
BODY = b'{"id": 1}'


def _own(headers: dict) -> dict:
    """Without ackmq's own delivery headers (x-ackmq-seq, x-delivery-count)."""
    return {k: v for k, v in headers.items() if not (k.startswith("x-ackmq-")
                                                      or k == "x-delivery-count")}


def test_W3_stomp_to_amqp_properties_field_by_field(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}", **SEND_HEADERS}, BODY,
                  receipt="r1")
    wait_depth(target, queue, 1)
    conn = target.pika()
    try:
        method, props, body = conn.channel().basic_get(queue, auto_ack=True)
    finally:
        conn.close()
    assert body == BODY
    assert method.exchange == "" and method.routing_key == queue
    assert props.content_type == "application/json"
    assert props.content_encoding == "utf-8"
    assert props.delivery_mode == 2
    assert props.priority == 5
    assert props.correlation_id == "corr-1"
    assert props.reply_to == "/queue/replies"
    assert props.expiration == "600000"
    assert props.message_id == "msg-1"
    assert props.timestamp == 1700000000
    assert props.type == "order.created"
    assert props.user_id == "guest"
    assert props.app_id == "shop"
    want = {"x-custom": "1", "custom-text": "hello: world"}
    if not target.ackmq:  # RabbitMQ copies the frame's own headers into the message
        want |= {"receipt": "r1", "content-length": str(len(BODY))}
    assert _own(props.headers) == want


AMQP_PROPS = pika.BasicProperties(
    content_type="text/plain", content_encoding="gzip", delivery_mode=2, priority=7,
    correlation_id="c-9", reply_to="amq.gen-abc", expiration="900000", message_id="m-9",
    timestamp=1234567890, type="t", user_id="guest", app_id="billing",
    headers={"h-text": "v", "h-int": 42, "h-bool": True, "h-list": [1, "a"],
             "h-table": {"a": 1}, "destination": "/queue/not-this-one"})

# what RabbitMQ 3.10's plugin writes, in its order (booleans, arrays and tables dropped)
WANT_MESSAGE = [
    ("redelivered", "false"), ("h-text", "v"), ("h-int", "42"), ("app-id", "billing"),
    ("user-id", "guest"), ("type", "t"), ("timestamp", "1234567890"),
    ("amqp-message-id", "m-9"), ("expiration", "900000"),
    ("reply-to", "/reply-queue/amq.gen-abc"), ("correlation-id", "c-9"), ("priority", "7"),
    ("persistent", "true"), ("content-encoding", "gzip"), ("content-type", "text/plain"),
    ("content-length", "5"),
]


def test_W3_amqp_to_stomp_headers_field_by_field(target: Target, queue: str) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        with target.raw() as r:
            r.subscribe(f"/amq/queue/{queue}", "sub-1", ack="client")
            ch.basic_publish("", queue, b"hello", AMQP_PROPS)
            m = r.expect("MESSAGE")
    finally:
        conn.close()
    assert m.body == b"hello"
    assert m.headers["subscription"] == "sub-1"
    assert m.headers["destination"] == f"/queue/{queue}"  # the real one comes first
    assert m.headers["ack"] == m.headers["message-id"]
    got = [(k, v) for k, v in m.items
           if k not in ("subscription", "destination", "message-id", "ack")
           and not k.startswith("x-ackmq-")]
    assert got == WANT_MESSAGE


def test_W3_transient_amqp_message_reads_persistent_1_as_rabbitmq_writes_it(
        target: Target, queue: str) -> None:
    conn = target.pika()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, b"t", pika.BasicProperties(delivery_mode=1))
        ch.basic_publish("", queue, b"n", pika.BasicProperties())
        with target.raw() as r:
            r.subscribe(f"/amq/queue/{queue}", "s")
            a, b = r.expect("MESSAGE"), r.expect("MESSAGE")
    finally:
        conn.close()
    assert a.headers["persistent"] == "1"
    assert "persistent" not in b.headers and "content-length" in b.headers


def test_W3_stomp_to_stomp_keeps_custom_headers(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "s")
        r.send("SEND", {"destination": f"/queue/{queue}", "a-b": "c\\cd", "x-y": "line\\nbreak",
                        "persistent": "true", "content-type": "text/plain"}, b"m")
        m = r.expect("MESSAGE")
    assert m.headers["a-b"] == "c:d" and m.headers["x-y"] == "line\nbreak"
    assert m.headers["persistent"] == "true" and m.headers["content-type"] == "text/plain"


def test_W3_amqp_timestamp_and_stomp_timestamp_are_seconds(target: Target, queue: str) -> None:
    now = int(datetime.datetime.now(tz=datetime.UTC).timestamp())
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "s")
        r.send("SEND", {"destination": f"/queue/{queue}", "timestamp": str(now)}, b"m")
        assert r.expect("MESSAGE").headers["timestamp"] == str(now)


def test_W3_ackmq_delivery_headers_only_when_the_subscription_asks(ackmq_target: Target,
                                                                   queue: str) -> None:
    with ackmq_target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"a")
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"b")
        r.subscribe(f"/queue/{queue}", "plain", ack="client-individual",
                    **{"prefetch-count": "1"})
        plain = r.expect("MESSAGE")
        assert not any(k.startswith("x-ackmq") for k in plain.headers)
        r.subscribe(f"/queue/{queue}", "asks", ack="client-individual",
                    **{"x-ackmq-seq": "true", "prefetch-count": "1"})
        asked = r.expect("MESSAGE")
    assert asked.headers["subscription"] == "asks" and int(asked.headers["x-ackmq-seq"]) > 0
