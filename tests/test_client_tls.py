"""ackmq.client over TLS (`amqps://`, SPEC U4 from the client's side) with RabbitMQ's URI
TLS keys (`cacertfile`, `certfile`, `keyfile`, `verify`, `server_name_indication`):
the sync and the asyncio connection against an ackmq AMQPS listener (certificates made
by trustme, as tests/test_tls.py), a server that is not trusted refused, a client
certificate presented where the broker requires one."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import trustme
from conftest import BrokerProcess
from support.tlshelp import cert_broker, port_in_log, server_files

from ackmq.client import connect, connect_async
from ackmq.client.errors import ConnectionLost
from ackmq.client.options import parse_url

TLS_URL = re.compile(r"(amqps://\S+?)/?[ )]")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_files(ca, tmp_path_factory.mktemp("client-tls"))


@pytest.fixture(scope="module")
def broker(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[BrokerProcess]:
    """An AMQPS listener that wants a client certificate (and takes none too)."""
    b = cert_broker(tmp_path_factory.mktemp("b"), files, "--tls-port", "0",
                    "--tls-verify-peer", "--no-stomp")
    yield b
    b.stop()


def amqps(b: BrokerProcess, **query: str) -> str:
    port = int(port_in_log(b, TLS_URL, "amqps:// URL").rsplit(":", 1)[1])
    qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    return f"amqps://guest:guest@localhost:{port}/?{qs}"


def _round_trip(url: str) -> bytes | None:
    with connect(url) as conn:
        s = conn.session()
        q = "client-tls"
        s.producer(q).send(b"over tls")
        m = s.consumer(q).receive(timeout=10)
        return None if m is None else m.body


def test_U4_client_amqps_sync_and_async_with_cacertfile(broker: BrokerProcess,
                                                       files: dict[str, Path]) -> None:
    url = amqps(broker, cacertfile=str(files["ca"]))
    assert _round_trip(url) == b"over tls"

    async def run() -> bytes | None:
        conn = await connect_async(url)
        async with conn:
            s = await conn.session()
            await (await s.producer("client-tls-async")).send(b"async over tls")
            m = await (await s.consumer("client-tls-async")).receive(timeout=10)
            return None if m is None else m.body
    assert asyncio.run(run()) == b"async over tls"


def test_U4_client_refuses_an_untrusted_server_unless_verify_none(
        broker: BrokerProcess) -> None:
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
        connect(amqps(broker))  # the system's CAs do not know trustme's
    assert _round_trip(amqps(broker, verify="verify_none")) == b"over tls"


def test_U4_client_server_name_indication_is_checked(broker: BrokerProcess,
                                                    files: dict[str, Path]) -> None:
    """The certificate names localhost and 127.0.0.1: another name fails verification."""
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED|match"):
        connect(amqps(broker, cacertfile=str(files["ca"]),
                      server_name_indication="other.example"))


def test_U4_client_certificate_from_certfile_and_keyfile(
        ca: trustme.CA, files: dict[str, Path], tmp_path: Path) -> None:
    b = cert_broker(tmp_path, files, "--tls-port", "0", "--tls-verify-peer",
                    "--tls-fail-if-no-peer-cert", "--no-stomp")
    try:
        with pytest.raises(ConnectionLost):  # no certificate: the handshake fails
            _round_trip(amqps(b, cacertfile=str(files["ca"])))
        leaf = ca.issue_cert("guest", common_name="guest")
        cert, key = tmp_path / "guest.pem", tmp_path / "guest.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        assert _round_trip(amqps(b, cacertfile=str(files["ca"]), certfile=str(cert),
                                 keyfile=str(key))) == b"over tls"
    finally:
        b.stop()


def test_U4_client_tls_options_parsed_and_checked() -> None:
    o = parse_url("amqps://h/?cacertfile=/ca.pem&verify=verify_none")
    assert o.port == 5671 and o.tls is not None and o.tls.verify == "verify_none"
    assert parse_url("amqp://h/").tls is None
    with pytest.raises(ValueError, match="need an amqps:// URL"):
        parse_url("amqp://h/?cacertfile=/ca.pem")
    with pytest.raises(ValueError, match="verify must be verify_peer or verify_none"):
        parse_url("amqps://h/?verify=sometimes")
