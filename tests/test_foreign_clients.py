"""A1: a client of another protocol on the AMQP port (or on the STOMP port) gets an answer
at once and the broker logs one line naming what arrived, no traceback.

The first bytes are the ones those clients send: paho-mqtt's CONNECT (MQTT 3.1.1), the
stream protocol's peer-properties request (what rstream sends first), a TLS ClientHello
(Python's ssl), an HTTP request. RabbitMQ 3.10.8, sent the same bytes on 5672: the AMQP
0-9-1 header, then close, logging `{bad_header,<<...>>}` at error — checked here against
the reference; sent fewer than 8 bytes (b"GET /\\r\\n") it waits for the eighth and drops
the client after its 10 s handshake timeout, where ackmq refuses bytes that cannot begin
"AMQP" at once (the spec, 4.2.2: a valid protocol header, then close). RabbitMQ's STOMP
plugin (61623) stays silent for 10 s for MQTT, the stream protocol and HTTP, and closes
on a ClientHello without a frame; ackmq's STOMP port answers an ERROR frame "Not STOMP"
naming what came and closes (STOMP 1.2: an ERROR, then close)."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Iterator

import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.rawamqp import PROTOCOL_HEADER


def _mqtt_connect() -> bytes:
    client_id = b"probe"
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack(">H", len(client_id)) + client_id
    return bytes([0x10, len(body)]) + body


def _stream_peer_properties() -> bytes:
    body = struct.pack(">HHII", 0x0011, 1, 1, 0)  # key, version, correlation id, empty map
    return struct.pack(">I", len(body)) + body


def _tls_client_hello() -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out = ssl.MemoryBIO()
    tls = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return out.read()


FOREIGN = {
    "mqtt": (_mqtt_connect, "an MQTT CONNECT"),
    "stream": (_stream_peer_properties, "a RabbitMQ stream protocol peer-properties frame"),
    "tls": (_tls_client_hello, "a TLS ClientHello"),
    "http": (lambda: b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "an HTTP request"),
    "http-short": (lambda: b"GET /\r\n", "an HTTP request"),
}


def _exchange(addr: tuple[str, int], data: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send `data`, read until the broker closes: what it sent and how long it took."""
    with socket.create_connection(addr, timeout=timeout) as s:
        start = time.monotonic()
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
        return got, time.monotonic() - start


@pytest.fixture(scope="module")
def ackmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("foreign") / "data", "--no-http")
    b.start()
    yield b
    b.stop()


def _logged(b: BrokerProcess, needle: str, since: int = 0) -> list[str]:
    """The broker's log lines from line `since` on that hold `needle` (waited for)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [line for line in list(b.log)[since:] if needle in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_A1_other_protocol_on_amqp_port_gets_header_close_and_one_log_line(
        ackmq: BrokerProcess, kind: str) -> None:
    make, what = FOREIGN[kind]
    data = make()
    got, took = _exchange(("127.0.0.1", ackmq.port), data)
    assert got == PROTOCOL_HEADER, got
    assert took < 3, took  # not the 10 s handshake timeout
    shown = repr(data[:16])
    lines = _logged(ackmq, shown)
    assert len(lines) == 1, ackmq.log[-5:]
    assert f"got {what} ({shown})" in lines[0], lines
    assert "WARNING" in lines[0], lines
    assert not any("Traceback" in line for line in ackmq.log)


@pytest.mark.parametrize("kind", [k for k in FOREIGN if k != "http-short"])
def test_A1_other_protocol_on_amqp_port_rabbitmq_answers_the_same(kind: str) -> None:
    """The reference: RabbitMQ 3.10 answers 8 or more foreign bytes with its header and
    closes (a client sending fewer waits 10 s there: not run)."""
    url = rabbitmq_url()
    host, port = url.split("@")[-1].split("/")[0].split(":")
    got, took = _exchange((host, int(port)), FOREIGN[kind][0]())
    assert got == PROTOCOL_HEADER, got
    assert took < 3, took


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_W9_other_protocol_on_stomp_port_gets_error_frame_and_close(
        ackmq: BrokerProcess, kind: str) -> None:
    make, what = FOREIGN[kind]
    data = make()
    since = len(ackmq.log)
    got, took = _exchange(("127.0.0.1", ackmq.stomp_port), data)
    assert took < 3, took
    assert got.startswith(b"ERROR\nmessage:Not STOMP\n"), got
    assert got.rstrip(b"\n").endswith(b"\x00"), got
    assert f"got {what} ".encode() in got, got
    # the detail is logged as a repr, whose quotes depend on the bytes shown (a TLS
    # ClientHello's random part may hold both ' and "): match inside them
    lines = _logged(ackmq, "expected a STOMP CONNECT frame, got " + what, since)
    assert len(lines) == 1, ackmq.log[-5:]
    assert "STOMP error to" in lines[0] and "Not STOMP: " in lines[0], lines
    assert not any("Traceback" in line for line in ackmq.log)


def test_W9_stomp_port_still_serves_stomp_after_foreign_clients(ackmq: BrokerProcess) -> None:
    """A CONNECT (after leading EOLs, which STOMP allows) is not mistaken for another
    protocol."""
    got, _ = _exchange(("127.0.0.1", ackmq.stomp_port),
                       b"\n\nCONNECT\naccept-version:1.2\nhost:/\nlogin:guest\n"
                       b"passcode:guest\n\n\x00DISCONNECT\n\n\x00")
    assert got.startswith(b"CONNECTED\n"), got
