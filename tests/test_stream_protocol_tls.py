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
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
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
