"""Malformed and hostile input: the offending connection dies the RabbitMQ way, the
broker keeps serving everyone else, and no message is lost or duplicated.

Why: a broker whose promise is data safety must not let one bad client (or a port
scanner) disturb the confirmed messages of the others. A long-lived pika connection
(`survivor`) publishes with confirms and consumes with acks after every bad input;
at the end of the module it must have seen each of its messages exactly once.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pika
import pytest
from pamqp import commands
from support.rawamqp import (
    PROTOCOL_HEADER,
    ConnectionClosedByPeer,
    RawConnection,
    body_frame,
    header_frame,
    method_frame,
    raw_frame,
)


class Survivor:
    """A well-behaved client that stays connected through all the bad input."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.pub = self.conn.channel()
        self.pub.confirm_delivery()
        self.sub = self.conn.channel()
        self.sub.basic_qos(prefetch_count=50)
        self.queue = f"t.robustness.survivor.{uuid.uuid4().hex[:8]}"
        self.pub.queue_declare(self.queue)
        self.sent = 0
        self.received: Counter[int] = Counter()
        self.sub.basic_consume(self.queue, self._on_message)

    def _on_message(self, ch, method, properties, body: bytes) -> None:
        self.received[int(body)] += 1
        ch.basic_ack(method.delivery_tag)

    def roundtrip(self, n: int = 20, timeout: float = 15.0) -> None:
        """Publish n confirmed messages and wait until all sent so far were consumed."""
        for _ in range(n):
            self.sent += 1
            # confirm_delivery: raises on nack / unroutable, returns once acked
            self.pub.basic_publish("", self.queue, str(self.sent).encode(), mandatory=True)
        deadline = time.monotonic() + timeout
        while sum(self.received.values()) < self.sent and time.monotonic() < deadline:
            self.conn.process_data_events(time_limit=0.1)
        self.check()

    def check(self) -> None:
        missing = set(range(1, self.sent + 1)) - set(self.received)
        dups = {k: v for k, v in self.received.items() if v > 1}
        extra = set(self.received) - set(range(1, self.sent + 1))
        assert not missing, f"survivor lost messages: {sorted(missing)[:20]}"
        assert not dups, f"survivor got duplicates: {dups}"
        assert not extra, f"survivor got messages never sent: {extra}"

    def finish(self) -> None:
        self.conn.process_data_events(time_limit=0.5)  # late duplicates would show here
        self.check()
        self.pub.queue_delete(self.queue)
        self.conn.close()


@pytest.fixture(scope="module")
def survivor(broker_url: str) -> Iterator[Survivor]:
    s = Survivor(broker_url)
    s.roundtrip()
    yield s
    s.finish()


@pytest.fixture(autouse=True)
def still_serving(survivor: Survivor, broker_url: str) -> Iterator[None]:
    """After each bad input: the survivor and a brand-new connection both still work."""
    yield
    survivor.roundtrip()
    fresh = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        ch = fresh.channel()
        ch.confirm_delivery()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"fresh")
        _, _, body = ch.basic_get(q, auto_ack=True)
        assert body == b"fresh"
    finally:
        fresh.close()


@pytest.fixture
def raw(broker_url: str) -> Iterator[RawConnection]:
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    yield conn
    conn.abort()


def _connection_close(conn: RawConnection, timeout: float = 5.0) -> commands.Connection.Close:
    close = conn.wait_close(timeout)
    assert isinstance(close, commands.Connection.Close), f"expected connection.close, got {close}"
    assert conn.close_channel == 0
    return close


def _publish_frame(channel: int = 1, routing_key: str = "nowhere") -> bytes:
    return method_frame(channel, commands.Basic.Publish(exchange="", routing_key=routing_key))


# ---- before / during the handshake --------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_bytes_instead_of_handshake(broker_url: str, seed: int) -> None:
    data = random.Random(seed).randbytes(512)
    conn = RawConnection.connect(broker_url)
    try:
        try:
            conn.send_raw(data)
        except OSError:
            return  # already dropped us: fine
        got = conn.read_raw(timeout=5)
        assert got in (b"", PROTOCOL_HEADER)
        assert conn.closed
    finally:
        conn.abort()


def test_amqp_prefix_then_garbage(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    try:
        conn.send_raw(b"AMQP" + os.urandom(64))
        assert conn.read_raw(timeout=5) in (b"", PROTOCOL_HEADER)
        assert conn.closed
    finally:
        conn.abort()


def test_half_protocol_header_then_disconnect(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    conn.send_raw(b"AMQ")
    conn.abort()


def test_connect_and_drop_many(broker_url: str) -> None:
    """Port scanners: connect and drop at once, 50 times."""
    host, port = broker_url.split("@")[-1].split("/")[0].split(":")
    for _ in range(50):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.close()


def test_disconnect_mid_handshake(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    conn.start()
    conn.send(0, commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
    conn.expect(commands.Connection.Tune)
    conn.abort()  # never send tune-ok


def test_garbage_after_start(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    try:
        conn.start()
        conn.send_raw(os.urandom(300))
        close = conn.wait_close(5)
        assert close is None or isinstance(close, commands.Connection.Close)
        assert conn.wait_eof(5)
    finally:
        conn.abort()


# ---- frame-level errors after the handshake (connection errors) -------------------

def test_frame_larger_than_frame_max_is_501(raw: RawConnection) -> None:
    raw.send_raw(raw_frame(3, 1, b"x" * (raw.frame_max + 1000)))
    close = _connection_close(raw)
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR")


def test_bad_frame_end_octet_is_501(raw: RawConnection) -> None:
    raw.send_raw(raw_frame(1, 1, struct.pack(">HHIHB", 60, 10, 0, 1, 0), end=0))
    close = _connection_close(raw)
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR")


def test_unknown_frame_type_is_501(raw: RawConnection) -> None:
    raw.send_raw(raw_frame(9, 1, b"abc"))
    close = _connection_close(raw)
    assert close.reply_code == 501


def test_truncated_method_is_501(raw: RawConnection) -> None:
    """queue.declare cut short: RabbitMQ says 501 'cannot decode'."""
    raw.send_raw(raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x05ab"))
    close = _connection_close(raw)
    assert close.reply_code in (501, 502)


@pytest.mark.parametrize("class_method", [(99, 10), (60, 99)], ids=["class99", "basic.99"])
def test_unknown_class_or_method_closes_connection(raw: RawConnection,
                                                   class_method: tuple[int, int]) -> None:
    """RabbitMQ 3.10 drops the socket without a close method; a connection.close
    (503 COMMAND_INVALID / 540 NOT_IMPLEMENTED) before EOF is accepted too."""
    raw.send_raw(raw_frame(1, 1, struct.pack(">HH", *class_method)))
    close = raw.wait_close(5)
    if close is not None:
        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code in (501, 502, 503, 540)
    assert raw.wait_eof(5)


def test_heartbeat_on_nonzero_channel_is_505(raw: RawConnection) -> None:
    raw.send_raw(raw_frame(8, 1, b""))
    close = _connection_close(raw)
    assert close.reply_code == 505


def test_method_on_channel_zero_is_504(raw: RawConnection) -> None:
    raw.send(0, commands.Basic.Qos(0, 1))
    close = _connection_close(raw)
    assert close.reply_code == 504


# ---- content framing --------------------------------------------------------------

def test_content_header_without_publish_is_505(raw: RawConnection) -> None:
    raw.send_raw(header_frame(1, 5))
    close = _connection_close(raw)
    assert close.reply_code == 505
    assert close.reply_text.startswith("UNEXPECTED_FRAME")


def test_body_without_publish_is_505(raw: RawConnection) -> None:
    raw.send_raw(body_frame(1, b"hello"))
    close = _connection_close(raw)
    assert close.reply_code == 505


def test_body_on_wrong_channel_is_505(raw: RawConnection) -> None:
    raw.open_channel(2)
    raw.send_raw(_publish_frame(1) + header_frame(1, 5) + body_frame(2, b"hello"))
    close = _connection_close(raw)
    assert close.reply_code == 505


def test_method_while_awaiting_header_is_505(raw: RawConnection) -> None:
    raw.send_raw(_publish_frame(1) + method_frame(1, commands.Basic.Qos(0, 1)))
    close = _connection_close(raw)
    assert close.reply_code == 505


def test_method_in_middle_of_content_is_505(raw: RawConnection) -> None:
    raw.send_raw(_publish_frame(1) + header_frame(1, 5) + body_frame(1, b"he")
                 + method_frame(1, commands.Basic.Qos(0, 1)))
    close = _connection_close(raw)
    assert close.reply_code == 505
    assert close.reply_text.startswith("UNEXPECTED_FRAME")


def test_header_of_wrong_class_is_505(raw: RawConnection) -> None:
    raw.send_raw(_publish_frame(1) + raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 5, 0)))
    close = _connection_close(raw)
    assert close.reply_code == 505


def test_other_channel_may_interleave_with_content(raw: RawConnection, qname: str) -> None:
    """Content frames are ordered per channel only: channel 2 may talk in between."""
    raw.open_channel(2)
    raw.rpc(2, commands.Queue.Declare(queue=qname, auto_delete=True), commands.Queue.DeclareOk)
    raw.send_raw(_publish_frame(1, qname) + header_frame(1, 10) + body_frame(1, b"hello"))
    raw.rpc(2, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    raw.send_raw(body_frame(1, b"world"))
    # channels are independent: the publish on 1 may be routed after a get on 2
    deadline = time.monotonic() + 5
    while True:
        raw.send(2, commands.Basic.Get(queue=qname, no_ack=True))
        _, msg = raw.recv(5)
        if not isinstance(msg, commands.Basic.GetEmpty) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert msg.body == b"helloworld"


def test_huge_declared_body_size(raw: RawConnection) -> None:
    """A header declaring 2**40 bytes must not make the broker allocate it.

    RabbitMQ 3.10 checks the size only once the body is complete, so it just waits;
    ackmq may refuse at once (channel.close 406, as for a too-large message) or close
    the connection. Whatever it does, the broker keeps serving (autouse fixture).
    """
    raw.open_channel(2)
    raw.send_raw(_publish_frame(1) + raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 2**40, 0))
                 + body_frame(1, b"a" * 60000))
    frames = raw.drain(1.5)
    closes = [(ch, f) for ch, f in frames
              if isinstance(f, commands.Channel.Close | commands.Connection.Close)]
    if not closes:
        assert not raw.closed
        raw.rpc(2, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # connection alive
        return
    ch, close = closes[0]
    if isinstance(close, commands.Channel.Close):
        assert ch == 1 and close.reply_code == 406
        raw.send(1, commands.Channel.CloseOk())
        raw.rpc(2, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    else:
        assert close.reply_code in (406, 501, 505, 530, 541)


def test_message_above_max_size_is_406(raw: RawConnection, is_rabbitmq: bool) -> None:
    """128 MiB is RabbitMQ's default max_message_size: one byte more is a channel 406."""
    raw.open_channel(2)
    size = 128 * 1024 * 1024 + 1
    raw.send_raw(_publish_frame(1) + header_frame(1, size))
    chunk = body_frame(1, b"z" * (raw.frame_max - 8))
    per = raw.frame_max - 8
    full, rest = divmod(size, per)
    batch = chunk * max(1, (1 << 20) // len(chunk))
    n_batch = len(batch) // len(chunk)
    sent = 0
    # A broker that refuses at the header drops the rest of the channel's frames, so
    # sending everything is fine either way.
    while sent + n_batch <= full:
        raw.send_raw(batch)
        sent += n_batch
    raw.send_raw(chunk * (full - sent) + body_frame(1, b"z" * rest))
    close = raw.wait_close(60, reply=False)
    assert isinstance(close, commands.Channel.Close), close
    assert close.reply_code == 406
    assert "larger than configured max size" in close.reply_text or not is_rabbitmq
    raw.send(1, commands.Channel.CloseOk())
    raw.rpc(2, commands.Basic.Qos(0, 1), commands.Basic.QosOk)


def test_disconnect_mid_content_publishes_nothing(broker_url: str, qname: str) -> None:
    """Half a message is no message: the queue stays empty after the socket drops."""
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    conn.rpc(1, commands.Queue.Declare(queue=qname), commands.Queue.DeclareOk)
    conn.send_raw(_publish_frame(1, qname) + header_frame(1, 10) + body_frame(1, b"hello"))
    time.sleep(0.2)
    conn.abort()
    check = RawConnection.open(broker_url)
    try:
        check.open_channel(1)
        ok = check.rpc(1, commands.Queue.Declare(queue=qname, passive=True),
                       commands.Queue.DeclareOk)
        assert ok.message_count == 0
        check.rpc(1, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)
    finally:
        check.close()


def test_publish_then_abort_without_confirm_no_duplicates(broker_url: str, qname: str) -> None:
    """Complete publishes followed by a TCP drop: each arrives at most once."""
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    conn.rpc(1, commands.Queue.Declare(queue=qname), commands.Queue.DeclareOk)
    for i in range(50):
        conn.publish(1, "", qname, str(i).encode())
    conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # all 50 were read
    conn.abort()
    check = RawConnection.open(broker_url)
    try:
        check.open_channel(1)
        bodies = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            check.send(1, commands.Basic.Get(queue=qname, no_ack=True))
            _, reply = check.recv(5)
            if isinstance(reply, commands.Basic.GetEmpty):
                break
            bodies.append(reply.body)
        assert sorted(bodies, key=int) == [str(i).encode() for i in range(50)]
        check.rpc(1, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)
    finally:
        check.close()


def test_write_after_broker_closed_us(raw: RawConnection) -> None:
    """Keep writing after a connection error: the broker ignores it and drops us."""
    raw.send_raw(body_frame(1, b"x"))
    _connection_close(raw)
    try:
        for _ in range(20):
            raw.send(1, commands.Basic.Qos(0, 1))
    except OSError:
        pass
    try:
        raw.drain(0.5)
    except ConnectionClosedByPeer:
        pass
