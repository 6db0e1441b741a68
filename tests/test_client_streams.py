"""ackmq.client on a stream (R2): `consumer.streamOffset` picks where a consumer starts
(first / last / next / an offset / an ISO time / an interval), against ackmq and RabbitMQ."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pika
import pytest

from ackmq.client import connect
from ackmq.client.options import parse_destination

pytest_plugins = ["support.clienthelp"]


@pytest.fixture
def stream(url: str) -> Iterator[str]:
    name = f"t.client-stream.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(6):
        ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    yield name
    conn.channel().queue_delete(name)
    conn.close()


def read(url: str, dest: str, n: int, timeout: float = 3.0) -> list[tuple[int, bytes]]:
    out = []
    with connect(url) as conn:
        c = conn.session().consumer(dest)
        while len(out) < n:
            m = c.receive(timeout=timeout)
            if m is None:
                break
            out.append((m.headers["x-stream-offset"], m.body))
    return out


@pytest.mark.parametrize("option,want", [
    ("first", range(6)), ("2", range(2, 6)), ("last", [5]), ("1h", range(6)),
    ("2020-01-01T00:00:00", range(6))])
def test_R2_client_stream_offset_option(url: str, stream: str, option: str, want: range) -> None:
    got = read(url, f"{stream}?consumer.streamOffset={option}&consumer.prefetchSize=10",
               len(want))
    assert got == [(i, f"m{i}".encode()) for i in want]


def test_R2_client_stream_offset_next_sees_only_new(url: str, stream: str) -> None:
    with connect(url) as conn:
        s = conn.session()
        c = s.consumer(f"{stream}?consumer.streamOffset=next")
        assert c.receive(timeout=0.5) is None
        s.producer(stream).send(b"new")
        m = c.receive(timeout=3.0)
        assert m is not None and m.body == b"new" and m.headers["x-stream-offset"] == 6


def test_R2_client_stream_offset_parsing() -> None:
    assert parse_destination("s?consumer.streamOffset=first").stream_offset == "first"
    assert parse_destination("s?consumer.streamOffset=42").stream_offset == 42
    assert parse_destination("s?consumer.streamOffset=7D").stream_offset == "7D"
    assert parse_destination("s?consumer.streamOffset=2024-05-01T10:00:00Z").stream_offset \
        == datetime.datetime(2024, 5, 1, 10, tzinfo=datetime.UTC)
    with pytest.raises(ValueError, match="streamOffset"):
        parse_destination("s?consumer.streamOffset=soon")
