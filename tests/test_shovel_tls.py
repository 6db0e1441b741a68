"""V1 shovels over TLS: `amqps://` URIs with RabbitMQ's TLS query keys (`cacertfile`,
`certfile`, `keyfile`, `verify`, `server_name_indication`) into and out of an ackmq
AMQPS listener (certificates made by trustme, as tests/test_tls.py), over AMQP 0-9-1
and AMQP 1.0; a shovel that does not trust the server stays `starting`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from conftest import BrokerProcess
from support.shovelhelp import Side, drop_side, http_target, make_side
from support.tlshelp import cert_broker, port_in_log, server_files

TLS_URL = re.compile(r"(amqps://\S+?)/?[ )]")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_files(ca, tmp_path_factory.mktemp("shovel-tls"))


@pytest.fixture
def tls_side(files: dict[str, Path], tmp_path: Path
             ) -> Iterator[tuple[Side, int, BrokerProcess]]:
    b = cert_broker(tmp_path, files, "--tls-port", "0", "--http-port", "0", "--no-stomp")
    s = make_side("ackmq", http_target(b), b.url)
    yield s, int(port_in_log(b, TLS_URL, "amqps:// URL").rsplit(":", 1)[1]), b
    drop_side(s)
    b.stop()


def test_V1_shovel_over_amqps_both_protocols(tls_side: tuple[Side, int, BrokerProcess],
                                            files: dict[str, Path]) -> None:
    s, port, _b = tls_side
    ca = str(files["ca"])
    amqps = f"amqps://guest:guest@localhost:{port}/{s.vhost}?cacertfile={ca}"
    s.publish("src", 100)
    # 0-9-1: out of the plain port, into the TLS one
    assert s.put("to-tls", {"src-uri": s.local, "src-queue": "src", "dest-uri": amqps,
                            "dest-queue": "mid"}).status == 201
    s.wait(lambda: s.depth("mid") == 100, "100 moved over amqps:// (0-9-1)")
    st = s.wait_state("to-tls", "running")
    assert st["dest_uri"] == amqps.replace("guest:guest@", "")
    # AMQP 1.0: out of the TLS port (server_name_indication given), into the TLS port
    ten = (f"amqps://guest:guest@127.0.0.1:{port}?hostname=vhost:{s.vhost}"
           f"&cacertfile={ca}&server_name_indication=localhost&verify=verify_peer")
    assert s.put("ten-tls", {"src-protocol": "amqp10", "src-uri": ten,
                             "src-address": "/amq/queue/mid", "dest-protocol": "amqp10",
                             "dest-uri": ten, "dest-address": "/queue/dst"}).status == 201
    s.wait(lambda: s.depth("dst") == 100, "100 moved over amqps:// (1.0)")
    assert [b for b, _p in s.drain("dst")] == [b"m%d" % i for i in range(100)]


def test_V1_shovel_to_an_untrusted_tls_server_stays_starting(
        tls_side: tuple[Side, int, BrokerProcess]) -> None:
    """Without cacertfile the system's CAs do not know the test CA: no connection, the
    shovel waits to reconnect (as RabbitMQ's with verify_peer); verify=verify_none
    connects."""
    s, port, b = tls_side
    s.publish("src", 5)
    plain = f"amqps://guest:guest@localhost:{port}/{s.vhost}"
    assert s.put("untrusted", {"src-uri": s.local, "src-queue": "src", "dest-uri": plain,
                               "dest-queue": "dst", "reconnect-delay": 1}).status == 201
    s.wait(lambda: any("untrusted" in line and "CERTIFICATE_VERIFY_FAILED" in line
                       for line in b.log), "the verification failure logged")
    assert s.wait_state("untrusted", "starting") and s.depth("dst") <= 0
    assert s.put("untrusted", {"src-uri": s.local, "src-queue": "src",
                               "dest-uri": plain + "?verify=verify_none",
                               "dest-queue": "dst"}).status == 204
    s.wait(lambda: s.depth("dst") == 5, "moved with verify_none")
