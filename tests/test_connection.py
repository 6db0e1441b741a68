"""Connection and channel lifecycle, frame by frame, as RabbitMQ 3.10 does it.

Why: every client library depends on the exact handshake (header, start, tune, open)
and on which errors are connection-level (504, 530, 540) versus channel-level.
"""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pamqp import commands
from support.rawamqp import (
    PROTOCOL_HEADER,
    ConnectionClosedByPeer,
    RawConnection,
    amqplain_response,
)

CAPABILITIES = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "per_consumer_qos",
    "authentication_failure_close",
]


def _to_str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.fixture
def raw(broker_url: str):
    conn = RawConnection.open(broker_url)
    yield conn
    conn.abort()


# ---- protocol header --------------------------------------------------------------

@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x08\x00",   # AMQP 0-8
    b"AMQP\x01\x01\x00\x0a",   # AMQP 1.0 style
    b"GET / HTTP/1.1\r\n\r\n",  # not AMQP at all
])
def test_wrong_protocol_header_gets_ours_and_close(broker_url: str, header: bytes) -> None:
    """A bad header is answered with the header we speak, then the socket closes."""
    conn = RawConnection.connect(broker_url)
    try:
        conn.send_raw(header)
        data = conn.read_raw(timeout=5)
        assert data == PROTOCOL_HEADER
        assert conn.closed, "broker must close the socket after sending its header"
    finally:
        conn.abort()


def test_protocol_header_gets_connection_start(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    try:
        start = conn.start()
        assert (start.version_major, start.version_minor) == (0, 9)
        mechanisms = _to_str(start.mechanisms).split()
        assert "PLAIN" in mechanisms and "AMQPLAIN" in mechanisms
        assert "en_US" in _to_str(start.locales).split()
    finally:
        conn.abort()


def test_server_properties_capabilities(broker_url: str) -> None:
    """Clients switch features on by these names: they must be exactly RabbitMQ's."""
    conn = RawConnection.open(broker_url)
    try:
        props = conn.server_properties
        caps = props.get("capabilities")
        assert isinstance(caps, dict)
        for name in CAPABILITIES:
            assert caps.get(name) is True, f"capability {name} missing or not true: {caps}"
        assert _to_str(props.get("product", ""))
        assert _to_str(props.get("version", ""))
    finally:
        conn.close()


# ---- authentication ----------------------------------------------------------------

def test_login_plain_with_pika(params: pika.URLParameters) -> None:
    conn = pika.BlockingConnection(params)
    try:
        assert conn.is_open
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
    finally:
        conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_mechanisms(broker_url: str, mechanism: str) -> None:
    conn = RawConnection.open(broker_url, mechanism=mechanism)
    try:
        conn.open_channel(1)
        ok = conn.rpc(1, commands.Queue.Declare(queue="", exclusive=True),
                      commands.Queue.DeclareOk)
        assert ok.queue
    finally:
        conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_bad_credentials_access_refused(broker_url: str, mechanism: str) -> None:
    """With authentication_failure_close, a failed login is connection.close 403."""
    conn = RawConnection.connect(broker_url)
    try:
        conn.start()
        response = (amqplain_response("guest", "wrong") if mechanism == "AMQPLAIN"
                    else "\0guest\0wrong")
        conn.send(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism=mechanism, response=response, locale="en_US"))
        close = conn.wait_close()
        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code == 403
        assert close.reply_text.startswith("ACCESS_REFUSED")
    finally:
        conn.abort()


def test_bad_credentials_without_capability_never_opens(broker_url: str) -> None:
    """Without the capability RabbitMQ just drops the socket; either way: no tune."""
    conn = RawConnection.connect(broker_url)
    try:
        conn.start()
        conn.send(0, commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0wrong",
            locale="en_US"))
        close = conn.wait_close()
        assert close is None or (isinstance(close, commands.Connection.Close)
                                 and close.reply_code == 403)
    finally:
        conn.abort()


def test_bad_credentials_with_pika(params: pika.URLParameters) -> None:
    bad = pika.ConnectionParameters(params.host, params.port, params.virtual_host,
                                    pika.PlainCredentials("guest", "nope"),
                                    connection_attempts=1)
    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError)):
        pika.BlockingConnection(bad)


def test_unknown_mechanism_refused(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    try:
        conn.start()
        conn.send(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="NO-SUCH-MECH", response="x", locale="en_US"))
        close = conn.wait_close()
        # RabbitMQ drops the socket; a connection.close (any code) is fine too.
        assert close is None or isinstance(close, commands.Connection.Close)
        assert conn.wait_eof(5)
    finally:
        conn.abort()


# ---- tune ---------------------------------------------------------------------------

def test_tune_server_proposal(broker_url: str) -> None:
    conn = RawConnection.open(broker_url)
    try:
        tune = conn.tune
        assert tune is not None
        assert tune.channel_max > 0
        assert tune.frame_max >= 4096
        assert tune.heartbeat >= 0
    finally:
        conn.close()


def test_tune_client_asks_less_gets_less(broker_url: str, qname: str) -> None:
    """A smaller frame_max from the client binds the server: its body frames shrink."""
    conn = RawConnection.open(broker_url, frame_max=4096, channel_max=10, heartbeat=0)
    try:
        assert conn.frame_max == 4096 and conn.channel_max == 10
        conn.open_channel(1)
        conn.rpc(1, commands.Queue.Declare(queue=qname, auto_delete=True),
                 commands.Queue.DeclareOk)
        body = bytes(range(256)) * 80  # 20480 bytes: needs several 4096-byte frames
        conn.publish(1, "", qname, body)
        conn.send(1, commands.Basic.Get(queue=qname, no_ack=True))
        msg = conn.expect(commands.Basic.GetOk, timeout=5)
        assert msg.body == body
        bodies = [f for _, f in msg.frames if f.name == "ContentBody"]
        assert len(bodies) >= 6
        assert all(len(f.value) <= 4096 - 8 for f in bodies)
    finally:
        conn.close()


# ---- vhost, close ----------------------------------------------------------------------

def test_open_default_vhost(broker_url: str) -> None:
    conn = RawConnection.open(broker_url, vhost="/")
    conn.close()


def test_unknown_vhost_not_allowed(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    try:
        with pytest.raises(AssertionError, match="530"):
            conn.handshake(vhost="no-such-vhost-ackmq")
    finally:
        conn.abort()


def test_unknown_vhost_not_allowed_close_method(broker_url: str) -> None:
    conn = RawConnection.connect(broker_url)
    try:
        conn.start()
        conn.send(0, commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0guest",
            locale="en_US"))
        tune = conn.expect(commands.Connection.Tune)
        conn.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        conn.send(0, commands.Connection.Open(virtual_host="no-such-vhost-ackmq"))
        close = conn.wait_close()
        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code == 530
        assert close.reply_text.startswith("NOT_ALLOWED")
        assert (close.class_id, close.method_id) == (10, 40)
    finally:
        conn.abort()


def test_connection_close_handshake(raw: RawConnection) -> None:
    raw.open_channel(1)
    raw.send(0, commands.Connection.Close(200, "bye", 0, 0))
    raw.expect(commands.Connection.CloseOk, timeout=5, channel=0)


def test_pika_close_is_clean(params: pika.URLParameters) -> None:
    conn = pika.BlockingConnection(params)
    conn.channel()
    conn.close()
    assert conn.is_closed


# ---- channels -----------------------------------------------------------------------

def test_channel_open_twice_is_504(raw: RawConnection) -> None:
    raw.open_channel(1)
    raw.send(1, commands.Channel.Open())
    close = raw.wait_close()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 504
    assert close.reply_text.startswith("CHANNEL_ERROR")
    assert (close.class_id, close.method_id) == (20, 10)


def test_method_on_unopened_channel_is_504(raw: RawConnection) -> None:
    raw.send(3, commands.Basic.Qos(0, 1))
    close = raw.wait_close()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 504
    assert close.reply_text.startswith("CHANNEL_ERROR")
    assert (close.class_id, close.method_id) == (60, 10)


def test_publish_on_unopened_channel_is_504(raw: RawConnection) -> None:
    raw.publish(5, "", "nowhere", b"abc")
    close = raw.wait_close()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 504
    assert (close.class_id, close.method_id) == (60, 40)


def test_channel_close_on_unopened_channel_is_504(raw: RawConnection) -> None:
    raw.send(3, commands.Channel.Close(200, "", 0, 0))
    close = raw.wait_close()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 504


def test_channel_close_handshake_and_reuse(raw: RawConnection) -> None:
    raw.open_channel(1)
    raw.rpc(1, commands.Channel.Close(200, "done", 0, 0), commands.Channel.CloseOk)
    raw.open_channel(1)  # the number is free again
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)


def test_channel_close_only_closes_that_channel(raw: RawConnection, qname: str) -> None:
    raw.open_channel(1)
    raw.open_channel(2)
    raw.rpc(2, commands.Queue.Declare(queue=qname, auto_delete=True), commands.Queue.DeclareOk)
    raw.rpc(1, commands.Channel.Close(200, "done", 0, 0), commands.Channel.CloseOk)
    raw.publish(2, "", qname, b"still here")
    raw.send(2, commands.Basic.Get(queue=qname, no_ack=True))
    msg = raw.expect(commands.Basic.GetOk, channel=2)
    assert msg.body == b"still here"


def test_channel_error_only_closes_that_channel(connection: pika.BlockingConnection,
                                                qname: str) -> None:
    """A 404 on one channel leaves the connection and its other channels working."""
    ch1 = connection.channel()
    ch2 = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch1.queue_declare("no-such-queue-" + qname, passive=True)
    assert err.value.reply_code == 404
    assert ch1.is_closed and ch2.is_open and connection.is_open
    ch2.queue_declare(qname, auto_delete=True)
    ch2.basic_publish("", qname, b"x")
    method, _, body = ch2.basic_get(qname, auto_ack=True)
    assert body == b"x"


def test_methods_after_channel_close_are_ignored(raw: RawConnection) -> None:
    """Between the broker's channel.close and our close-ok, other methods are dropped."""
    raw.open_channel(1)
    raw.send(1, commands.Tx.Commit())  # not transactional: 406 channel error
    close = raw.wait_close(reply=False)
    assert isinstance(close, commands.Channel.Close) and close.reply_code == 406
    raw.send(1, commands.Basic.Qos(0, 1))
    assert raw.drain(0.5) == []
    raw.send(1, commands.Channel.CloseOk())
    raw.open_channel(1)
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)


def test_channel_flow_active_true(raw: RawConnection) -> None:
    raw.open_channel(1)
    ok = raw.rpc(1, commands.Channel.Flow(active=True), commands.Channel.FlowOk)
    assert ok.active is True


def test_channel_flow_active_false(raw: RawConnection) -> None:
    """RabbitMQ refuses client-initiated flow stop: connection.close 540.

    A broker that implements it would answer flow-ok(active=false); that is accepted.
    """
    raw.open_channel(1)
    raw.send(1, commands.Channel.Flow(active=False))
    _, reply = raw.recv(5)
    if isinstance(reply, commands.Channel.FlowOk):
        assert reply.active is False
        return
    assert isinstance(reply, commands.Connection.Close)
    assert reply.reply_code == 540
    assert reply.reply_text.startswith("NOT_IMPLEMENTED")
    assert (reply.class_id, reply.method_id) == (20, 20)


def test_many_channels_independent(raw: RawConnection) -> None:
    for n in range(1, 21):
        raw.open_channel(n)
    for n in range(20, 0, -1):
        raw.rpc(n, commands.Basic.Qos(0, n), commands.Basic.QosOk)


def test_eof_after_connection_close_ok(broker_url: str) -> None:
    """After close/close-ok the broker no longer answers anything."""
    conn = RawConnection.open(broker_url)
    try:
        conn.send(0, commands.Connection.Close(200, "bye", 0, 0))
        conn.expect(commands.Connection.CloseOk)
        try:
            conn.send(1, commands.Channel.Open())
        except OSError:
            return
        try:
            assert conn.drain(0.5) == []
        except ConnectionClosedByPeer:
            pass
    finally:
        conn.abort()
