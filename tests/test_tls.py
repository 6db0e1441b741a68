"""AMQPS (SPEC U4) with certificates made by trustme: a verified server, a client refused
without a certificate when one is required, the EXTERNAL mechanism (user = certificate
CN), and the plain port still serving. Real TLS over loopback with pika and the stdlib
`ssl`; the broker is a real `ackmq serve` subprocess."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import trustme
from conftest import BrokerProcess
from support.tlshelp import cert_broker, port_in_log, server_files

TLS_URL = re.compile(r"(amqps://\S+?)/?[ )]")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_files(ca, tmp_path_factory.mktemp("tls"))


def tls_broker(tmp_path: Path, files: dict[str, Path], *extra: str) -> BrokerProcess:
    return cert_broker(tmp_path, files, "--tls-port", "0", *extra)


def tls_port(b: BrokerProcess) -> int:
    return int(port_in_log(b, TLS_URL, "amqps:// URL").rsplit(":", 1)[1])


def client_params(port: int, ca: trustme.CA, cert_for: str | None = None,
                  external: bool = False) -> pika.ConnectionParameters:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(ctx)
    if cert_for is not None:
        ca.issue_cert(cert_for, common_name=cert_for).configure_cert(ctx)
    creds = pika.credentials.ExternalCredentials() if external else \
        pika.PlainCredentials("guest", "guest")
    return pika.ConnectionParameters("127.0.0.1", port, credentials=creds,
                                     ssl_options=pika.SSLOptions(ctx, "localhost"),
                                     connection_attempts=1, socket_timeout=5)


def round_trip(params: pika.ConnectionParameters) -> bytes:
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"over tls", pika.BasicProperties(delivery_mode=2))
        _m, _p, body = ch.basic_get(q, auto_ack=True)
        return body
    finally:
        conn.close()


@pytest.fixture
def verifying(tmp_path: Path, files: dict[str, Path]) -> Iterator[BrokerProcess]:
    b = tls_broker(tmp_path, files, "--tls-verify-peer")
    yield b
    b.stop()


def test_U4_verified_server_and_plain_port_still_served(verifying: BrokerProcess,
                                                       ca: trustme.CA) -> None:
    assert round_trip(client_params(tls_port(verifying), ca)) == b"over tls"
    assert round_trip(pika.URLParameters(verifying.url)) == b"over tls"  # plain AMQP


def test_U4_client_that_does_not_trust_the_server_fails(verifying: BrokerProcess) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)  # system CAs only
    params = pika.ConnectionParameters("127.0.0.1", tls_port(verifying),
                                       ssl_options=pika.SSLOptions(ctx, "localhost"),
                                       connection_attempts=1, socket_timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):  # pika re-raises the ssl error
        pika.BlockingConnection(params)


def test_U4_external_logs_in_by_certificate_cn(verifying: BrokerProcess,
                                              ca: trustme.CA) -> None:
    port = tls_port(verifying)
    assert round_trip(client_params(port, ca, cert_for="guest", external=True)) == b"over tls"
    # a certificate naming a user that does not exist is refused (403, then closed)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(client_params(port, ca, cert_for="nobody", external=True))
    # without a client certificate there is no EXTERNAL to use
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(client_params(port, ca, external=True))
    assert "Traceback" not in "".join(verifying.log)


def test_U4_fail_if_no_peer_cert(tmp_path: Path, files: dict[str, Path],
                                 ca: trustme.CA) -> None:
    b = tls_broker(tmp_path, files, "--tls-verify-peer", "--tls-fail-if-no-peer-cert")
    try:
        port = tls_port(b)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            round_trip(client_params(port, ca))  # no client certificate: refused
        assert round_trip(client_params(port, ca, cert_for="guest")) == b"over tls"
    finally:
        b.stop()


@pytest.mark.parametrize("args,message", [
    (["--tls-port", "0"], "--tls-port needs --tls-cert FILE and --tls-key FILE"),
    (["--tls-cert", "x.pem"], "the --tls-* options need --tls-port"),
    (["--tls-port", "0", "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"],
     "cannot load --tls-cert /nonexistent.pem"),
])
def test_U4_bad_tls_options_say_what_to_fix(tmp_path: Path, args: list[str],
                                            message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                           "--no-stomp", "--data-dir", str(tmp_path / "d"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert message in out and "Traceback" not in out
