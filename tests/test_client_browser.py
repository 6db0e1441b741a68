"""V3 in ackmq.client: `session.browser(queue, selector=None)` as JMS's QueueBrowser —
a stream queue's messages from its first offset, nothing consumed, on ackmq and on
RabbitMQ; a classic queue is not browsable over AMQP 0-9-1 (NotBrowsable before anything
is delivered, the queue untouched: no message taken, none marked redelivered)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest

from ackmq.client import connect
from ackmq.client.browser import NotBrowsable

pytest_plugins = ["support.clienthelp"]


@pytest.fixture
def stream(url: str) -> Iterator[str]:
    name = f"t.browse-stream.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(12):
        ch.basic_publish("", name, f"m{i}".encode(),
                         pika.BasicProperties(delivery_mode=2, headers={"n": i}))
    yield name
    conn.channel().queue_delete(name)
    conn.close()


def test_V3_client_browser_reads_a_stream_twice_and_consumes_nothing(url: str,
                                                                     stream: str) -> None:
    with connect(url) as conn:
        s = conn.session()
        b = s.browser(stream)
        first = [m.body for m in b]
        assert first == [f"m{i}".encode() for i in range(12)]
        assert [m.body for m in b] == first  # again: nothing was consumed
        odd = [m.headers["n"] for m in s.browser(stream, selector=lambda m:
                                                 m.headers["n"] % 2 == 1)]
        assert odd == [1, 3, 5, 7, 9, 11]
        # a consumer reading from the first offset still sees all of them
        c = s.consumer(f"{stream}?consumer.streamOffset=first&consumer.prefetchSize=20")
        got = [c.receive(timeout=3.0) for _ in range(12)]
        assert [m.body for m in got if m is not None] == first


def test_V3_client_browser_refuses_a_classic_queue_untouched(url: str) -> None:
    name = f"t.browse-classic.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, f"c{i}".encode())
    try:
        with connect(url) as client:
            with pytest.raises(NotBrowsable, match="is not a stream"):
                list(client.session().browser(name))
        got = []
        while True:
            m, _p, body = ch.basic_get(name, auto_ack=True)
            if m is None:
                break
            got.append((body, m.redelivered))
        assert got == [(b"c0", False), (b"c1", False), (b"c2", False)]
    finally:
        ch.queue_delete(name)
        conn.close()
