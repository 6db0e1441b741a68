"""Connection edges, as RabbitMQ 3.10 handles them: frames read together with a bad one,
confirms owed when a connection error comes, a client that stops reading, methods only a
server may send, tune-ok outside the proposed limits, guest from a remote address.

Why: each is a way for a client to lose confirms, to be told the wrong thing, or to make
the broker grow without bound. Every check here also runs against RabbitMQ
(ACKMQ_TEST_URL=amqp://guest:guest@127.0.0.1:5672/), except where it says ackmq only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pamqp import commands
from rawamqp import (
    RawConnection,
    body_frame,
    header_frame,
    method_frame,
    raw_frame,
    safe_name,
)

from ackmq.protocol.amqp import Decoder, FrameError, Publish


def _publish(channel: int, routing_key: str, body: bytes, mandatory: bool = False) -> bytes:
    return (method_frame(channel, commands.Basic.Publish(exchange="", routing_key=routing_key,
                                                         mandatory=mandatory))
            + header_frame(channel, len(body)) + body_frame(channel, body))


def _until_close(conn: RawConnection, timeout: float = 5.0
                 ) -> tuple[list[tuple[int, object]], commands.Connection.Close]:
    """Every frame up to the connection.close (answered with close-ok), and the close."""
    frames: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    while True:
        ch, value = conn.recv(max(deadline - time.monotonic(), 0.001))
        if isinstance(value, commands.Connection.Close):
            conn.send(0, commands.Connection.CloseOk())
            return frames, value
        frames.append((ch, value))


def _confirmed(frames: list[tuple[int, object]], channel: int = 1) -> set[int]:
    """Publish sequence numbers acked on `channel` (multiple=true expanded)."""
    done: set[int] = set()
    for ch, value in frames:
        if ch == channel and isinstance(value, commands.Basic.Ack):
            if value.multiple:
                done.update(range(1, value.delivery_tag + 1))
            else:
                done.add(value.delivery_tag)
    return done


@pytest.fixture
def queue(broker_url: str, qname: str) -> Iterator[str]:
    """A durable-less, non-auto-delete queue that outlives the connections that die here."""
    name = safe_name(qname)
    admin = RawConnection.open(broker_url)
    admin.open_channel(1)
    admin.rpc(1, commands.Queue.Declare(queue=name), commands.Queue.DeclareOk)
    yield name
    admin.rpc(1, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)
    admin.close()


def _depth(broker_url: str, name: str) -> int:
    conn = RawConnection.open(broker_url)
    try:
        conn.open_channel(1)
        return conn.rpc(1, commands.Queue.Declare(queue=name, passive=True),
                        commands.Queue.DeclareOk).message_count
    finally:
        conn.close()


def _confirming(broker_url: str) -> RawConnection:
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    conn.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    return conn


# ---- frames read together with a bad one --------------------------------------------

def test_decoder_hands_over_the_events_before_a_bad_frame() -> None:
    """Sans-IO: the FrameError carries what was decoded ahead of the bad frame, once."""
    dec = Decoder(expect_header=False)
    bad = raw_frame(1, 1, b"\x00\x3c\x00\x0a", end=0)
    with pytest.raises(FrameError) as info:
        dec.feed(_publish(1, "q", b"a") + _publish(1, "q", b"b") + bad)
    assert info.value.reply_code == 501
    assert [(e.routing_key, e.body) for e in info.value.events
            if isinstance(e, Publish)] == [("q", b"a"), ("q", b"b")]
    with pytest.raises(FrameError) as again:  # dead: same error, nothing handed over twice
        dec.feed(_publish(1, "q", b"c"))
    assert again.value.events == []


def test_P4_publishes_before_a_bad_frame_are_queued_and_confirmed(
        broker_url: str, queue: str, is_rabbitmq: bool) -> None:
    """Two confirmed publishes and a bad frame-end octet in one write: both are queued (and
    confirmed, before the 501 close), as RabbitMQ handles every frame ahead of the bad one."""
    conn = _confirming(broker_url)
    try:
        conn.send_raw(_publish(1, queue, b"1") + _publish(1, queue, b"2")
                      + raw_frame(1, 1, b"\x00\x3c\x00\x0a", end=0))
        frames, close = _until_close(conn)
    finally:
        conn.abort()
    assert close.reply_code == 501
    assert "invalid_frame_end_marker" in close.reply_text
    assert _depth(broker_url, queue) == 2
    # RabbitMQ's channel races its reader here: its acks may come after the close (or
    # never reach the socket). ackmq answers what it handled before saying goodbye.
    if not is_rabbitmq:
        assert _confirmed(frames) == {1, 2}


def test_P4_confirms_are_sent_before_a_connection_error(broker_url: str, queue: str) -> None:
    """Two confirmed publishes, then a method on a channel never opened: RabbitMQ acks both
    (basic.ack) and only then closes the connection with 504."""
    conn = _confirming(broker_url)
    try:
        conn.send_raw(_publish(1, queue, b"1") + _publish(1, queue, b"2")
                      + method_frame(3, commands.Basic.Qos(0, 1)))
        frames, close = _until_close(conn)
    finally:
        conn.abort()
    assert close.reply_code == 504
    assert (close.class_id, close.method_id) == (60, 10)
    assert _confirmed(frames) == {1, 2}
    assert _depth(broker_url, queue) == 2


# ---- methods only a server sends --------------------------------------------------------

SERVER_ONLY = [
    commands.Queue.DeclareOk(queue="x", message_count=0, consumer_count=0),
    commands.Exchange.DeclareOk(),
    commands.Basic.ConsumeOk(consumer_tag="x"),
    commands.Basic.CancelOk(consumer_tag="x"),
    commands.Basic.GetEmpty(),
    commands.Basic.QosOk(),
    commands.Confirm.SelectOk(),
    commands.Tx.CommitOk(),
    commands.Channel.FlowOk(active=True),
    commands.Channel.OpenOk(),
    commands.Channel.CloseOk(),      # on an open channel: nothing asked for it
    commands.Connection.Tune(),      # a connection method off channel 0
]
CONTENT_FROM_SERVER = [
    commands.Basic.Deliver(consumer_tag="x", delivery_tag=1, exchange="", routing_key="q"),
    commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="q"),
    commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key="q", message_count=0),
]


def _unimplemented(close: commands.Connection.Close, method: object) -> None:
    assert (close.reply_code, close.reply_text) == (503, "COMMAND_INVALID - unimplemented method")
    assert (close.class_id, close.method_id) == divmod(method.index, 0x10000)


@pytest.mark.parametrize("method", SERVER_ONLY, ids=[m.name for m in SERVER_ONLY])
def test_server_only_method_from_client_is_503(broker_url: str, method: object) -> None:
    with RawConnection.open(broker_url) as conn:
        conn.open_channel(1)
        conn.send(1, method)
        _, close = _until_close(conn)
        _unimplemented(close, method)


@pytest.mark.parametrize("method", CONTENT_FROM_SERVER, ids=[m.name for m in CONTENT_FROM_SERVER])
def test_server_content_method_from_client_is_503(broker_url: str, method: object) -> None:
    """basic.deliver / return / get-ok with their content: not swallowed, a 503 close; the
    basic.qos behind it is never answered."""
    with RawConnection.open(broker_url) as conn:
        conn.open_channel(1)
        conn.send_raw(method_frame(1, method) + header_frame(1, 3) + body_frame(1, b"abc")
                      + method_frame(1, commands.Basic.Qos(0, 1)))
        frames, close = _until_close(conn)
        _unimplemented(close, method)
        assert frames == []


def test_server_content_method_on_unopened_channel_is_504(broker_url: str) -> None:
    method = CONTENT_FROM_SERVER[0]
    with RawConnection.open(broker_url) as conn:
        conn.send_raw(method_frame(7, method) + header_frame(7, 1) + body_frame(7, b"a"))
        _, close = _until_close(conn)
        assert close.reply_code == 504
        assert (close.class_id, close.method_id) == (60, 60)
