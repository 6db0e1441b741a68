"""Liveness (SPEC H1, H2): dead peers and stuck consumers give their messages back.

Why: a consumer that vanishes without closing (cable pulled, process frozen) or that
never acks must not hold messages forever; heartbeats and the consumer timeout are
how the broker notices, and D8 then requeues its unacked deliveries.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from conftest import BrokerProcess
from pamqp import commands
from pamqp.heartbeat import Heartbeat
from support.rawamqp import Message, RawConnection, safe_name


@pytest.fixture
def qname(qname: str) -> str:
    return safe_name(qname)


def fill(conn: RawConnection, queue: str, n: int, **declare) -> None:
    conn.rpc(1, commands.Queue.Declare(queue=queue, **declare), commands.Queue.DeclareOk)
    for i in range(n):
        conn.publish(1, "", queue, str(i).encode())
    conn.rpc(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)


def take(conn: RawConnection, n: int, timeout: float = 5.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        _, frame = conn.recv(max(0.01, deadline - time.monotonic()))
        assert isinstance(frame, Message), frame
        out.append(frame)
    return out


def get_all(conn: RawConnection, queue: str, channel: int = 1,
            timeout: float = 10.0) -> list[Message]:
    """basic.get until empty (no-ack); retries briefly while the queue is still empty."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while True:
        conn.send(channel, commands.Basic.Get(queue=queue, no_ack=True))
        _, frame = conn.recv(5)
        if isinstance(frame, Message):
            out.append(frame)
        elif out or time.monotonic() > deadline:
            return out
        else:
            time.sleep(0.05)


# ---- H1 ------------------------------------------------------------------------------

def test_H1_heartbeat_negotiated_in_tune(broker_url: str) -> None:
    conn = RawConnection.open(broker_url, heartbeat=1)
    try:
        assert conn.tune is not None and conn.tune.heartbeat >= 0
        assert conn.heartbeat == 1
        # the broker honours the negotiated interval: heartbeats come within ~1 s
        conn.send_heartbeat()
        deadline = time.monotonic() + 4
        while True:
            _, frame = conn.recv(max(0.01, deadline - time.monotonic()), heartbeats=True)
            if isinstance(frame, Heartbeat):
                break
    finally:
        conn.abort()


def test_H1_heartbeat_zero_means_none(broker_url: str) -> None:
    """A client that declines heartbeats is not timed out for silence."""
    conn = RawConnection.open(broker_url, heartbeat=0)
    try:
        conn.open_channel(1)
        assert conn.drain(3.0) == []
        conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    finally:
        conn.close()


def test_H1_client_sending_heartbeats_stays_alive(broker_url: str) -> None:
    conn = RawConnection.open(broker_url, heartbeat=1)
    try:
        conn.open_channel(1)
        end = time.monotonic() + 4
        while time.monotonic() < end:
            conn.send_heartbeat()
            conn.drain(0.4)
            assert not conn.closed
        conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    finally:
        conn.close()


def test_H1_silent_client_closed_and_deliveries_redelivered(broker_url: str,
                                                            qname: str) -> None:
    """heartbeat=1, then silence: the broker drops us within a few intervals and our
    unacked deliveries go to another consumer with redelivered=true (D8)."""
    silent = RawConnection.open(broker_url, heartbeat=1)
    other = RawConnection.open(broker_url)
    try:
        silent.open_channel(1)
        fill(silent, qname, 5, durable=False, auto_delete=False)
        silent.rpc(1, commands.Basic.Qos(0, 3), commands.Basic.QosOk)
        silent.rpc(1, commands.Basic.Consume(queue=qname, consumer_tag="silent"),
                   commands.Basic.ConsumeOk)
        held = take(silent, 3)
        assert [m.body for m in held] == [b"0", b"1", b"2"]
        assert not any(m.redelivered for m in held)

        other.open_channel(1)
        other.rpc(1, commands.Basic.Consume(queue=qname, consumer_tag="other"),
                  commands.Basic.ConsumeOk)
        first = take(other, 2)
        assert [m.body for m in first] == [b"3", b"4"]

        started = time.monotonic()
        assert silent.wait_eof(15), "broker kept a silent heartbeat=1 client"
        waited = time.monotonic() - started
        assert 0.5 <= waited <= 10, f"closed after {waited:.1f}s"

        again = take(other, 3, timeout=10)
        assert sorted(m.body for m in again) == [b"0", b"1", b"2"]
        assert all(m.redelivered for m in again)
        other.rpc(1, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)
    finally:
        silent.abort()
        other.close()


# ---- H2 ------------------------------------------------------------------------------

H2_TEXT = "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out"


@pytest.fixture(scope="module")
def timeout_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dedicated ackmq with --consumer-timeout-ms 500 (RabbitMQ here has 30 min), one
    for the module: each test has its own queue and connection."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("needs its own ackmq started with --consumer-timeout-ms")
    broker = BrokerProcess(tmp_path_factory.mktemp("timeout-broker"), "--consumer-timeout-ms",
                           "500", "--no-fsync")
    url = broker.start()
    yield url
    broker.stop()


def _expect_timeout_close(conn: RawConnection, limit_ms: int, within: float) -> float:
    started = time.monotonic()
    close = conn.wait_close(within)
    waited = time.monotonic() - started
    assert isinstance(close, commands.Channel.Close), f"no channel.close, got {close}"
    assert conn.close_channel == 1
    assert close.reply_code == 406
    assert close.reply_text.startswith(H2_TEXT), close.reply_text
    assert f"Timeout value used: {limit_ms} ms" in close.reply_text
    assert (close.class_id, close.method_id) == (0, 0)  # not caused by a client method
    return waited


# L7: a client that advertises consumer_cancel_notify gets basic.cancel instead (RabbitMQ
# 4.3, tests/test_retry_timeout.py); these clients do not, and keep RabbitMQ 3.10's close
NO_CANCEL_NOTIFY = {"consumer_cancel_notify": False}


def test_H2_unacked_delivery_times_out_channel(timeout_broker: str, qname: str) -> None:
    conn = RawConnection.open(timeout_broker, capabilities=NO_CANCEL_NOTIFY)
    try:
        conn.open_channel(1)
        conn.open_channel(2)
        fill(conn, qname, 2, auto_delete=False)
        conn.rpc(1, commands.Basic.Consume(queue=qname, consumer_tag="slow"),
                 commands.Basic.ConsumeOk)
        take(conn, 2)
        waited = _expect_timeout_close(conn, 500, within=10)
        assert waited >= 0.2
        # the connection and its other channel go on; the messages are back (D8)
        again = get_all(conn, qname, channel=2)
        assert sorted(m.body for m in again) == [b"0", b"1"]
        assert all(m.redelivered for m in again)
    finally:
        conn.close()


def test_H2_prompt_acks_do_not_time_out(timeout_broker: str, qname: str) -> None:
    conn = RawConnection.open(timeout_broker)
    try:
        conn.open_channel(1)
        conn.rpc(1, commands.Queue.Declare(queue=qname), commands.Queue.DeclareOk)
        conn.rpc(1, commands.Basic.Consume(queue=qname, consumer_tag="fast"),
                 commands.Basic.ConsumeOk)
        end = time.monotonic() + 2.0
        i = 0
        while time.monotonic() < end:
            conn.publish(1, "", qname, str(i).encode())
            msg = take(conn, 1)[0]
            time.sleep(0.1)
            conn.send(1, commands.Basic.Ack(msg.delivery_tag))
            i += 1
        conn.rpc(1, commands.Basic.Qos(0, 0), commands.Basic.QosOk)  # channel still open
    finally:
        conn.close()


def test_H2_basic_get_delivery_times_out_too(timeout_broker: str, qname: str) -> None:
    conn = RawConnection.open(timeout_broker)
    try:
        conn.open_channel(1)
        fill(conn, qname, 1)
        conn.send(1, commands.Basic.Get(queue=qname, no_ack=False))
        conn.expect(commands.Basic.GetOk, channel=1)
        _expect_timeout_close(conn, 500, within=10)
    finally:
        conn.close()


def test_H2_queue_argument_x_consumer_timeout(broker_url: str, is_rabbitmq: bool,
                                              qname: str) -> None:
    """ackmq honours `x-consumer-timeout` (ms) per queue, as RabbitMQ 3.12+ does."""
    if is_rabbitmq:
        pytest.skip("x-consumer-timeout queue argument needs RabbitMQ 3.12+ (here 3.10)")
    conn = RawConnection.open(broker_url, capabilities=NO_CANCEL_NOTIFY)
    try:
        conn.open_channel(1)
        conn.open_channel(2)
        fill(conn, qname, 1, arguments={"x-consumer-timeout": 400})
        conn.rpc(1, commands.Basic.Consume(queue=qname, consumer_tag="slow"),
                 commands.Basic.ConsumeOk)
        take(conn, 1)
        _expect_timeout_close(conn, 400, within=10)
        again = get_all(conn, qname, channel=2)
        assert [m.body for m in again] == [b"0"] and again[0].redelivered
        conn.rpc(2, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)
    finally:
        conn.close()
