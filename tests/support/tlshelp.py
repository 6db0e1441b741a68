"""Certificates for the TLS tests (AMQPS and STOMP over TLS), made by trustme."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trustme
from conftest import BrokerProcess


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """One certificate authority per test module."""
    return trustme.CA()


def server_files(ca: trustme.CA, d: Path) -> dict[str, Path]:
    """The CA, a server certificate chain for localhost/127.0.0.1 and its key, as files."""
    server = ca.issue_cert("localhost", "127.0.0.1")
    out = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    ca.cert_pem.write_to_path(str(out["ca"]))
    server.cert_chain_pems[0].write_to_path(str(out["cert"]))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(out["cert"]), append=True)
    server.private_key_pem.write_to_path(str(out["key"]))
    return out


def with_client_certs(ca: trustme.CA, d: Path, out: dict[str, Path],
                      *names: str) -> dict[str, Path]:
    """Client certificates (CN = the name, key in the same file) added to `out`."""
    for cn in names:
        ca.issue_cert(cn, common_name=cn).private_key_and_cert_chain_pem.write_to_path(
            str(d / f"{cn}.pem"))
        out[cn] = d / f"{cn}.pem"
    return out


def port_in_log(b: BrokerProcess, pattern: re.Pattern[str], what: str) -> str:
    """The first match of `pattern`'s group 1 in the broker's log."""
    for line in b.log:
        m = pattern.search(line)
        if m:
            return m.group(1)
    raise AssertionError(f"no {what} in the log:\n" + "".join(b.log))


def cert_broker(tmp_path: Path, files: dict[str, Path], *args: str) -> BrokerProcess:
    """A started `ackmq serve` with the server certificate, key and CA of `files`;
    `args` name the TLS listener(s) and any other options."""
    data = tmp_path / "data"
    data.mkdir()
    b = BrokerProcess(data, *args, "--tls-cert", str(files["cert"]),
                      "--tls-key", str(files["key"]), "--tls-ca", str(files["ca"]))
    b.start()
    return b
