"""The stream protocol over TLS (SPEC X1 with U4): `--stream-tls-port` with the same
certificate options as AMQPS (RabbitMQ's stream.listeners.ssl, usually 5551); rstream
with a verifying TLS context publishes and consumes; Metadata advertises the TLS port
to TLS clients."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from conftest import BrokerProcess
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    SlasMechanism,
    schema,
)
from support.mgmthelp import Target
from support.streamraw import StreamPeer
from support.tlshelp import cert_broker, port_in_log, server_files

STREAM_TLS_URL = re.compile(r"rabbitmq-stream\+tls://\S+:(\d+)")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_files(ca, tmp_path_factory.mktemp("stream-tls"))


@pytest.fixture
def broker(tmp_path: Path, files: dict[str, Path]) -> Iterator[BrokerProcess]:
    b = cert_broker(tmp_path, files, "--stream-tls-port", "0")
    yield b
    b.stop()


def test_X1_stream_protocol_over_tls(broker: BrokerProcess, files: dict[str, Path]) -> None:
    port = int(port_in_log(broker, STREAM_TLS_URL, "rabbitmq-stream+tls:// URL"))
    ctx = ssl.create_default_context(cafile=str(files["ca"]))
    got: list[bytes] = []

    async def go() -> None:
        async with Producer("127.0.0.1", port=port, username="guest", password="guest",
                            ssl_context=ctx) as p:
            await p.create_stream("tls-s")
            for i in range(3):
                await p.send_wait("tls-s", AMQPMessage(body=f"t{i}".encode()))
        done = asyncio.Event()

        async def on(msg: AMQPMessage, _ctx: object) -> None:
            got.append(bytes(msg.body))
            if len(got) == 3:
                done.set()

        from rstream import amqp_decoder
        c = Consumer("127.0.0.1", port=port, username="guest", password="guest",
                     ssl_context=ctx)
        await c.start()
        await c.subscribe("tls-s", on, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(done.wait(), 20)
        await c.close()

    asyncio.run(asyncio.wait_for(go(), 60))
    assert got == [b"t0", b"t1", b"t2"]


@pytest.fixture
def verifying(tmp_path: Path, files: dict[str, Path]) -> Iterator[BrokerProcess]:
    b = cert_broker(tmp_path, files, "--stream-tls-port", "0", "--tls-verify-peer")
    yield b
    b.stop()


def _stream_connections(b: BrokerProcess) -> list[dict[str, object]]:
    base = port_in_log(b, re.compile(r"(http://\S+?:\d+)"), "management URL")
    r = Target("ackmq", base.replace("0.0.0.0", "127.0.0.1"), "").call(
        "GET", "/api/stream/connections")
    assert r.status == 200
    return list(r.body)


def _client_tls(ca: trustme.CA, cert_for: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(ctx)
    if cert_for is not None:
        ca.issue_cert(cert_for, common_name=cert_for).configure_cert(ctx)
    return ctx


def _mechanisms_and_login(port: int, ctx: ssl.SSLContext) -> tuple[list[str], int]:
    p = StreamPeer(port, tls=ctx)
    try:
        p.call(schema.PeerProperties(p.next_corr(), properties=[]),
               schema.PeerPropertiesResponse)
        mechs = list(p.call(schema.SaslHandshake(p.next_corr()),
                            schema.SaslHandshakeResponse).mechanisms)
        r = p.call(schema.SaslAuthenticate(p.next_corr(), mechanism="EXTERNAL", data=b""),
                   schema.SaslAuthenticateResponse)
        return mechs, int(r.response_code)
    finally:
        p.close()


def test_X1_U4_stream_external_login_by_certificate_cn(verifying: BrokerProcess,
                                                      ca: trustme.CA) -> None:
    """EXTERNAL over stream TLS (RabbitMQ's rabbitmq_auth_mechanism_ssl, which the stream
    plugin offers where the client sent a certificate: RabbitMQ's documentation is the
    reference, the reference broker here has no TLS listener): the user is the verified
    certificate's CN, through the broker's one admission, as over AMQPS; rstream with
    EXTERNAL publishes. A certificate naming no user: 0x08; no certificate: no EXTERNAL
    offered, and asking for it 0x07."""
    port = int(port_in_log(verifying, STREAM_TLS_URL, "rabbitmq-stream+tls:// URL"))

    async def go() -> None:
        async with Producer("127.0.0.1", port=port, username="", password="",
                            ssl_context=_client_tls(ca, "guest"),
                            sasl_configuration_mechanism=SlasMechanism.MechanismExternal
                            ) as p:
            await p.create_stream("ext-s")
            await p.send_wait("ext-s", AMQPMessage(body=b"by certificate"))
            conns = await asyncio.to_thread(_stream_connections, verifying)
            assert {(c["user"], c["auth_mechanism"], c["ssl"]) for c in conns} == {
                ("guest", "EXTERNAL", True)}

    asyncio.run(asyncio.wait_for(go(), 60))
    assert _mechanisms_and_login(port, _client_tls(ca, "guest")) == (
        ["AMQPLAIN", "PLAIN", "EXTERNAL"], 0x01)
    assert _mechanisms_and_login(port, _client_tls(ca, "nobody"))[1] == 0x08
    assert _mechanisms_and_login(port, _client_tls(ca, None)) == (["AMQPLAIN", "PLAIN"], 0x07)
    assert "Traceback" not in "".join(verifying.log)
