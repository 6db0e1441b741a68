"""R2 over STOMP: SUBSCRIBE to a stream with `x-stream-offset` (first / last / next /
offset=N / timestamp=S), `prefetch-count` and client acks, as RabbitMQ's STOMP plugin
(compared against it on 61623)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pika
import pytest
from support.stomphelp import Target


@pytest.fixture
def stream(target: Target) -> Iterator[str]:
    name = f"t.stomp-stream.{uuid.uuid4().hex[:8]}"
    conn = target.pika()
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    yield name
    conn = target.pika()
    conn.channel().queue_delete(name)
    conn.close()


@pytest.mark.parametrize("offset,want", [
    ("first", [0, 1, 2, 3, 4]), ("offset=2", [2, 3, 4]), ("last", [4]),
    ("timestamp=0", [0, 1, 2, 3, 4])])
def test_R2_stomp_subscribe_from_stream_offset(target: Target, stream: str, offset: str,
                                               want: list[int]) -> None:
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{stream}", "s", ack="client", **{
            "prefetch-count": "10", "x-stream-offset": offset})
        got = [r.expect("MESSAGE") for _ in want]
        assert [m.body for m in got] == [f"m{i}".encode() for i in want]
        assert [m.headers["x-stream-offset"] for m in got] == [str(i) for i in want]
        assert r.frames(0.5) == []  # nothing more
        r.ack(got[-1])
        r.receipt("DISCONNECT")


def test_R2_stomp_next_by_default_then_new_messages(target: Target, stream: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{stream}", "s", ack="client", **{"prefetch-count": "10"})
        assert r.frames(0.5) == []
        conn = target.pika()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", stream, b"new", pika.BasicProperties(delivery_mode=2))
        conn.close()
        m = r.expect("MESSAGE")
        assert m.body == b"new" and m.headers["x-stream-offset"] == "5"


def test_R2_stomp_prefetch_is_credit(target: Target, stream: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{stream}", "s", ack="client", **{
            "prefetch-count": "2", "x-stream-offset": "first"})
        first = [r.expect("MESSAGE") for _ in range(2)]
        assert r.frames(0.5) == []
        r.ack(first[-1])  # client mode: both acked, two more may come
        more = [r.expect("MESSAGE") for _ in range(2)]
        assert [m.body for m in first + more] == [b"m0", b"m1", b"m2", b"m3"]
        time.sleep(0.1)
        r.receipt("DISCONNECT")


def test_R2_stomp_stream_without_prefetch_is_an_error(target: Target, stream: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{stream}", "s", ack="client", receipt=False,
                    **{"x-stream-offset": "first"})
        e = r.expect("ERROR")
        assert "consumer prefetch count is not set" in (e.headers.get("message", "")
                                                        + e.body.decode())


def test_R2_stomp_nack_on_stream_is_an_error(target: Target, stream: str) -> None:
    """RabbitMQ's plugin turns NACK into basic.nack, which a stream refuses (540)."""
    with target.raw() as r:
        r.subscribe(f"/amq/queue/{stream}", "s", ack="client-individual", **{
            "prefetch-count": "10", "x-stream-offset": "first"})
        m = r.expect("MESSAGE")
        r.ack(m, command="NACK")
        e = r.recv()
        while e.command == "MESSAGE":  # the other four, already on their way
            e = r.recv()
        assert e.command == "ERROR", e
        assert "basic.nack and basic.reject not supported by stream queues" in (
            e.headers.get("message", "") + e.body.decode())


def test_R1_stomp_queue_destination_declares_or_matches_a_stream(target: Target) -> None:
    """/queue/<name> declares durably, with x-* headers as arguments: x-queue-type:stream
    makes (or matches) a stream; without it, an existing stream is inequivalent."""
    name = f"t.stomp-stream-q.{uuid.uuid4().hex[:8]}"
    try:
        with target.raw() as r:
            r.subscribe(f"/queue/{name}", "s", ack="client", **{
                "x-queue-type": "stream", "prefetch-count": "5", "x-stream-offset": "first"})
            r.receipt("SEND", {"destination": f"/queue/{name}"}, b"hello")
            m = r.expect("MESSAGE")
            assert m.body == b"hello" and m.headers["x-stream-offset"] == "0"
        with target.raw() as r:
            r.subscribe(f"/queue/{name}", "s", ack="client", receipt=False,
                        **{"prefetch-count": "5"})
            e = r.expect("ERROR")
            assert "inequivalent arg 'x-queue-type'" in (e.headers.get("message", "")
                                                         + e.body.decode())
    finally:
        conn = target.pika()
        conn.channel().queue_delete(name)
        conn.close()
