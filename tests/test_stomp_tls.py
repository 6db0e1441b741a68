"""STOMP over TLS (SPEC U4) with certificates made by trustme and stomp.py's own TLS
(`set_ssl`): the same certificate options as AMQPS (--tls-cert/--tls-key/--tls-ca/
--tls-verify-peer/--tls-fail-if-no-peer-cert) on RabbitMQ's stomp.listeners.ssl, here
`--stomp-tls-port`; a verified peer sends, subscribes and gets receipts; a peer without a
certificate is refused when one is required; the plain STOMP port still serves;
`--stomp-ssl-cert-login` (RabbitMQ's stomp.ssl_cert_login) logs a CONNECT without a login
in as the certificate's CN. The broker is a real `ackmq serve` subprocess (and once an
EmbeddedBroker)."""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
import stomp.exception
import trustme
from conftest import BrokerProcess
from support.tlshelp import cert_broker, port_in_log, server_files

from ackmq.ctl.socket_client import request

STOMP_TLS_URL = re.compile(r"stomp\+ssl://\S+:(\d+)")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("stomp-tls")
    out = server_files(ca, d)
    for cn in ("guest", "certuser", "nobody"):  # client certificates, key in the same file
        c = ca.issue_cert(cn, common_name=cn)
        path = d / f"{cn}.pem"
        c.private_key_and_cert_chain_pem.write_to_path(str(path))
        out[cn] = path
    return out


def stomp_tls_port(b: BrokerProcess) -> int:
    return int(port_in_log(b, STOMP_TLS_URL, "stomp+ssl:// URL"))


def tls_broker(tmp_path: Path, files: dict[str, Path], *extra: str) -> BrokerProcess:
    return cert_broker(tmp_path, files, "--stomp-tls-port", "0", *extra)


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.errors: list[Any] = []
        self.event = threading.Event()

    def on_message(self, frame: Any) -> None:
        self.messages.append(frame)
        self.event.set()

    def on_receipt(self, frame: Any) -> None:
        self.receipts.append(frame.headers["receipt-id"])
        self.event.set()

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)
        self.event.set()

    def wait(self, pred: Any, timeout: float = 10.0) -> bool:
        import time
        deadline = time.monotonic() + timeout
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.event.wait(min(left, 0.1))
            self.event.clear()
        return True


def tls_client(port: int, files: dict[str, Path], cert: str | None = None
               ) -> tuple[stomp.Connection12, Listener]:
    conn = stomp.Connection12([("127.0.0.1", port)], timeout=5, reconnect_attempts_max=1)
    kw: dict[str, Any] = {"ca_certs": str(files["ca"])}
    if cert is not None:
        kw["cert_file"] = str(files[cert])
    conn.set_ssl(for_hosts=[("127.0.0.1", port)], **kw)
    listener = Listener()
    conn.set_listener("t", listener)
    return conn, listener


def round_trip(conn: stomp.Connection12, listener: Listener) -> bytes:
    """SUBSCRIBE with a receipt, SEND with a receipt, the MESSAGE back."""
    dest = f"/queue/ackU4-{uuid.uuid4().hex[:8]}"
    conn.subscribe(dest, id="s1", ack="client-individual", headers={"receipt": "sub"})
    assert listener.wait(lambda: "sub" in listener.receipts), listener.errors
    conn.send(dest, b"over tls", headers={"receipt": "sent", "persistent": "true"})
    assert listener.wait(lambda: "sent" in listener.receipts and listener.messages), \
        listener.errors
    m = listener.messages[0]
    conn.ack(m.headers["ack"])
    body = m.body if isinstance(m.body, bytes) else m.body.encode()
    return body


@pytest.fixture
def verifying(tmp_path: Path, files: dict[str, Path]) -> Iterator[BrokerProcess]:
    b = tls_broker(tmp_path, files, "--tls-verify-peer")
    yield b
    b.stop()


def test_U4_stomp_tls_verified_peer_end_to_end(verifying: BrokerProcess,
                                              files: dict[str, Path]) -> None:
    port = stomp_tls_port(verifying)
    conn, listener = tls_client(port, files, cert="certuser")
    conn.connect("guest", "guest", wait=True)
    try:
        assert round_trip(conn, listener) == b"over tls"
        sock = conn.transport.socket
        assert isinstance(sock, ssl.SSLSocket) and sock.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        conn.disconnect()
    # a client without a certificate is served too: verify_peer alone does not require one
    conn, listener = tls_client(port, files)
    conn.connect("guest", "guest", wait=True)
    try:
        assert round_trip(conn, listener) == b"over tls"
    finally:
        conn.disconnect()


def test_U4_stomp_plain_port_still_served(verifying: BrokerProcess) -> None:
    conn = stomp.Connection12([("127.0.0.1", verifying.stomp_port)])
    listener = Listener()
    conn.set_listener("t", listener)
    conn.connect("guest", "guest", wait=True)
    try:
        assert round_trip(conn, listener) == b"over tls"  # (the same helper: no TLS here)
        assert not isinstance(conn.transport.socket, ssl.SSLSocket)
    finally:
        conn.disconnect()


def test_U4_stomp_tls_client_that_does_not_trust_the_server_fails(
        verifying: BrokerProcess) -> None:
    ctx = ssl.create_default_context()  # system CAs only: the trustme CA is unknown
    with socket.create_connection(("127.0.0.1", stomp_tls_port(verifying)), timeout=5) as s, \
            pytest.raises(ssl.SSLCertVerificationError):
        ctx.wrap_socket(s, server_hostname="127.0.0.1")


def _raw_connect(port: int, files: dict[str, Path], cert: str | None,
                 headers: str = "login:guest\npasscode:guest\n", then: bytes = b"") -> bytes:
    """CONNECT over TLS on a raw socket (and the frame `then`); what came back up to the
    last frame's end or EOF (b"" if the server closed the connection, an ssl error's text
    if the handshake failed)."""
    ctx = ssl.create_default_context(cafile=str(files["ca"]))
    if cert is not None:
        ctx.load_cert_chain(str(files[cert]))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(f"CONNECT\naccept-version:1.2\nhost:/\n{headers}\n\0".encode() + then)
            out = b""
            while out.count(b"\0") < (2 if then else 1):
                chunk = s.recv(4096)
                if not chunk:
                    break
                out += chunk
            return out
    except (ssl.SSLError, ConnectionError) as e:
        return f"ssl: {e}".encode()


def test_U4_stomp_tls_fail_if_no_peer_cert(tmp_path: Path, files: dict[str, Path]) -> None:
    b = tls_broker(tmp_path, files, "--tls-verify-peer", "--tls-fail-if-no-peer-cert")
    try:
        port = stomp_tls_port(b)
        refused = _raw_connect(port, files, None)
        assert not refused.startswith(b"CONNECTED"), refused  # refused in the handshake
        assert refused == b"" or refused.startswith(b"ssl: "), refused
        conn, listener = tls_client(port, files)
        try:  # stomp.py raises, or (when it sees the drop first) returns unconnected
            conn.connect("guest", "guest", wait=True)
        except stomp.exception.StompException:
            pass
        assert not conn.is_connected()
        conn, listener = tls_client(port, files, cert="certuser")
        conn.connect("guest", "guest", wait=True)
        try:
            assert round_trip(conn, listener) == b"over tls"
        finally:
            conn.disconnect()
        assert "Traceback" not in "".join(b.log)
    finally:
        b.stop()


def test_U4_stomp_ssl_cert_login(tmp_path: Path, files: dict[str, Path]) -> None:
    b = tls_broker(tmp_path, files, "--tls-verify-peer", "--stomp-ssl-cert-login")
    try:
        port = stomp_tls_port(b)
        assert request(b.data_dir / "ctl.sock", "add_user", ["certuser", "pw"])["ok"]
        # certuser may not declare ackU4-forbidden: the refusal names who is logged in
        assert request(b.data_dir / "ctl.sock", "set_permissions",
                       ["certuser", "^(?!ackU4-forbidden)", ".*", ".*"])["ok"]
        # no login header + a certificate: the CN is the user, no password asked
        conn, listener = tls_client(port, files, cert="certuser")
        conn.connect(wait=True)
        try:
            assert round_trip(conn, listener) == b"over tls"
        finally:
            conn.disconnect()
        out = _raw_connect(port, files, "certuser", headers="",
                           then=b"SEND\ndestination:/queue/ackU4-forbidden\n\nx\0")
        assert out.startswith(b"CONNECTED\n") and b"refused for user 'certuser'" in out, out
        # a CN that names no user is refused
        out = _raw_connect(port, files, "nobody", headers="")
        assert out.startswith(b"ERROR\n") and b"Access refused for user 'nobody'" in out, out
        # a login header still wins over the certificate
        out = _raw_connect(port, files, "nobody", headers="login:guest\npasscode:guest\n")
        assert out.startswith(b"CONNECTED\n"), out
        # no certificate, no login: RabbitMQ's default user, as on the plain port
        out = _raw_connect(port, files, None, headers="")
        assert out.startswith(b"CONNECTED\n"), out
        assert "Traceback" not in "".join(b.log)
    finally:
        b.stop()


def test_U4_stomp_no_login_without_cert_login_option_is_guest(verifying: BrokerProcess,
                                                             files: dict[str, Path]) -> None:
    """Without --stomp-ssl-cert-login (RabbitMQ's default), a certificate does not log
    anyone in: no login means the default user, guest."""
    out = _raw_connect(stomp_tls_port(verifying), files, "nobody", headers="")
    assert out.startswith(b"CONNECTED\n"), out


def test_U4_embedded_broker_stomp_tls_url(files: dict[str, Path]) -> None:
    from ackmq import EmbeddedBroker
    with EmbeddedBroker(persistent=False, stomp_tls_port=0, tls_cert=files["cert"],
                        tls_key=files["key"]) as broker:
        assert broker.stomp_tls_url == f"stomp+ssl://127.0.0.1:{broker.stomp_tls_port}"
        conn, listener = tls_client(broker.stomp_tls_port, files)
        conn.connect("guest", "guest", wait=True)
        try:
            assert round_trip(conn, listener) == b"over tls"
        finally:
            conn.disconnect()


@pytest.mark.parametrize("args,message", [
    (["--stomp-tls-port", "0"], "--stomp-tls-port needs --tls-cert FILE and --tls-key FILE"),
    (["--stomp-tls-port", "0", "--tls-cert", "/nonexistent.pem", "--tls-key",
      "/nonexistent.key"], "cannot load --tls-cert /nonexistent.pem"),
    (["--stomp-tls-port", "70000"], "--stomp-tls-port must be between 0 and 65535"),
    (["--stomp-ssl-cert-login"], "--stomp-ssl-cert-login needs --stomp-tls-port"),
    (["--tls-ca", "ca.pem"], "need --tls-port (e.g. --tls-port 5671) and/or --stomp-tls-port"),
])
def test_U4_bad_stomp_tls_options_say_what_to_fix(tmp_path: Path, args: list[str],
                                                  message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                           "--stomp-port", "0", "--data-dir", str(tmp_path / "d"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert message in out and "Traceback" not in out
