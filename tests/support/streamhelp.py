"""Stream-queue fixtures for the Spark stream tests: the same test against ackmq and
RabbitMQ, the ackmq case skipped (with the reason) while its broker has no streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest
from conftest import STREAM_URLS, rabbitmq_url


def stream_support(url: str) -> str | None:
    """None if `url`'s broker has stream queues as RabbitMQ's (declare, publish, consume
    from `first` with x-stream-offset on the delivery); else why not."""
    name = f"spark.probe.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        try:
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        except pika.exceptions.ChannelClosedByBroker as exc:
            return f"declaring x-queue-type=stream refused: {exc}"
        try:
            ch.confirm_delivery()
            ch.basic_publish("", name, b"probe", pika.BasicProperties(delivery_mode=2))
            ch.basic_qos(prefetch_count=10)
            got: list[dict] = []
            ch.basic_consume(name, lambda c, m, p, b: got.append(p.headers or {}),
                             arguments={"x-stream-offset": "first"})
            conn.process_data_events(time_limit=2.0)
            if not got:
                return "a consumer from x-stream-offset=first got nothing"
            if "x-stream-offset" not in got[0]:
                return "deliveries carry no x-stream-offset (stream declared as a classic queue)"
            return None
        except pika.exceptions.AMQPError as exc:
            return f"consuming a stream failed: {exc!r}"
    finally:
        try:
            c2 = pika.BlockingConnection(pika.URLParameters(url))
            c2.channel().queue_delete(name)
            c2.close()
        finally:
            if conn.is_open:
                conn.close()


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def stream_url(request: pytest.FixtureRequest) -> str:
    """A broker with stream queues: embedded-process ackmq or the reference RabbitMQ."""
    if request.param == "rabbitmq":
        url = rabbitmq_url()
    else:
        url = request.getfixturevalue("broker_url")
    why = stream_support(url)
    if why is not None:
        pytest.skip(f"{request.param} has no stream queues: {why}")
    return url


@pytest.fixture
def stream(stream_url: str) -> Iterator[str]:
    """A fresh stream queue on `stream_url`, deleted afterwards."""
    name = f"spark.stream.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    conn.channel().queue_delete(name)
    conn.close()


def publish(url: str, stream: str, bodies: list[bytes], **props: object) -> None:
    """Publish persistent messages, every one confirmed (asynchronous confirms)."""
    from ackmq.spark.amqp import ConfirmingPublisher

    pub = ConfirmingPublisher(url, idempotent=False)  # headers exactly as given
    try:
        for b in bodies:
            pub.publish("", stream, b, **props)
        pub.flush()
    finally:
        pub.close()


def stream_protocol_url(url: str) -> str:
    """The stream protocol's URL of the broker at AMQP `url`: the session ackmq's free
    port, RabbitMQ's 5552 (its plugin, enabled on the reference broker)."""
    from ackmq.spark.streamproto import stream_url_for

    return STREAM_URLS.get(url) or stream_url_for(url)


@pytest.fixture(params=["amqp", "stream"])
def read_protocol(request: pytest.FixtureRequest, stream_url: str) -> dict[str, str]:
    """The Spark stream source's options for each way its read tasks read: AMQP 0-9-1
    and RabbitMQ's stream protocol."""
    if request.param == "amqp":
        return {"protocol": "amqp"}
    return {"protocol": "stream", "streamUrl": stream_protocol_url(stream_url)}
