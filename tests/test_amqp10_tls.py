"""AMQP 1.0 over the AMQPS port (SPEC A1, U4): the protocol header picks 1.0 inside TLS
too, and SASL EXTERNAL logs in as the verified client certificate's CN."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from conftest import BrokerProcess
from support.amqp10help import WAIT
from support.tlshelp import cert_broker, port_in_log, server_files

proton = pytest.importorskip("proton")
from proton import Message, SSLDomain  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

TLS_URL = re.compile(r"(amqps://\S+:\d+)")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_files(ca, tmp_path_factory.mktemp("tls10"))


@pytest.fixture
def broker(tmp_path: Path, files: dict[str, Path]) -> Iterator[BrokerProcess]:
    b = cert_broker(tmp_path, files, "--tls-port", "0", "--tls-verify-peer", "--no-stomp")
    yield b
    b.stop()


def _client(ca: trustme.CA, d: Path, cn: str | None) -> SSLDomain:
    dom = SSLDomain(SSLDomain.MODE_CLIENT)
    dom.set_trusted_ca_db(str(d / "ca.pem"))
    dom.set_peer_authentication(SSLDomain.VERIFY_PEER)
    if cn is not None:
        leaf = ca.issue_cert(cn, common_name=cn)
        cert, key = d / f"{cn}.pem", d / f"{cn}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        dom.set_credentials(str(cert), str(key), None)
    return dom


def test_A1_amqp10_over_tls_with_external(broker: BrokerProcess, files: dict[str, Path],
                                          ca: trustme.CA, tmp_path: Path) -> None:
    port = int(port_in_log(broker, TLS_URL, "amqps:// URL").rsplit(":", 1)[1])
    d = files["ca"].parent
    conn = BlockingConnection(f"amqps://127.0.0.1:{port}", timeout=WAIT,
                              ssl_domain=_client(ca, d, "guest"), allowed_mechs="EXTERNAL")
    try:
        s = conn.create_sender("/queue/a1-tls")
        assert s.send(Message(body="over tls")).remote_state == proton.Delivery.ACCEPTED
        r = conn.create_receiver("/queue/a1-tls", credit=1)
        assert r.receive(timeout=WAIT).body == "over tls"
        r.accept()
    finally:
        conn.close()
    # a certificate naming no user is refused
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(f"amqps://127.0.0.1:{port}", timeout=WAIT,
                           ssl_domain=_client(ca, d, "nobody"), allowed_mechs="EXTERNAL")
    assert "Traceback" not in "".join(broker.log)
