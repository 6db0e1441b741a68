"""N1: MQTT over TLS on its own port (`--mqtt-tls-port`, RabbitMQ's mqtt.listeners.ssl,
usually 8883) with the broker's certificate options; paho with `tls_set` against it."""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import trustme
from conftest import BrokerProcess
from paho.mqtt.enums import CallbackAPIVersion
from support.mqtthelp import client_id, wait_for
from support.tlshelp import cert_broker, port_in_log, server_files, with_client_certs

from ackmq.ctl.socket_client import request

MQTTS = re.compile(r"mqtts://\S+:(\d+)")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mqtt-tls")
    return with_client_certs(ca, d, server_files(ca, d), "certuser", "nobody")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]
           ) -> Iterator[BrokerProcess]:
    b = cert_broker(tmp_path_factory.mktemp("b"), files, "--mqtt-tls-port", "0")
    yield b
    b.stop()


def test_N1_mqtt_over_tls_end_to_end(broker: BrokerProcess, files: dict[str, Path]) -> None:
    port = int(port_in_log(broker, MQTTS, "mqtts:// URL"))
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id())
    c.tls_set(ca_certs=str(files["ca"]))
    c.username_pw_set("guest", "guest")
    got: list[bytes] = []
    c.on_message = lambda cl, u, m: got.append(m.payload)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        time.sleep(0.3)
        c.subscribe("tls/t", 1)
        time.sleep(0.3)
        c.publish("tls/t", b"secret", qos=1).wait_for_publish(10)
        assert wait_for(lambda: got == [b"secret"])
    finally:
        c.disconnect()
        c.loop_stop()
    assert broker.mqtt_port and broker.mqtt_port != port  # the plain listener as well


def test_N1_a_client_that_does_not_trust_the_certificate_fails(broker: BrokerProcess) -> None:
    port = int(port_in_log(broker, MQTTS, "mqtts:// URL"))
    ctx = ssl.create_default_context()  # the system's CAs, not the test CA
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
            pytest.raises(ssl.SSLError):
        ctx.wrap_socket(s, server_hostname="localhost")


def _tls_connect(port: int, files: dict[str, Path], cert: str | None,
                 user: str | None = None) -> tuple[int, mqtt.Client]:
    """CONNECT over TLS (with the client certificate `cert`); the CONNACK's reason code."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id())
    c.tls_set(ca_certs=str(files["ca"]),
              certfile=None if cert is None else str(files[cert]))
    if user is not None:
        c.username_pw_set(user, user)
    codes: list[int] = []
    c.on_connect = lambda cl, u, f, reason, p: codes.append(reason.value)
    c.connect("127.0.0.1", port)
    c.loop_start()
    assert wait_for(lambda: bool(codes))
    return codes[0], c


def test_U4_N1_mqtt_ssl_cert_login(tmp_path: Path, files: dict[str, Path]) -> None:
    """RabbitMQ's mqtt.ssl_cert_login (`--mqtt-ssl-cert-login`): a CONNECT over TLS
    without user name and password logs in as the verified certificate's CN, through the
    shared admission (U4); a CN that names no user is refused (CONNACK 4, as a failed
    login is in RabbitMQ's plugin);
    a user name and password still win over the certificate (as RabbitMQ)."""
    b = cert_broker(tmp_path, files, "--mqtt-tls-port", "0", "--tls-verify-peer",
                    "--mqtt-ssl-cert-login")
    try:
        port = int(port_in_log(b, MQTTS, "mqtts:// URL"))
        assert request(b.data_dir / "ctl.sock", "add_user", ["certuser", "pw"])["ok"]
        assert request(b.data_dir / "ctl.sock", "set_permissions",
                       ["certuser", ".*", ".*", ".*"])["ok"]
        code, c = _tls_connect(port, files, "certuser")
        assert code == 0  # without the certificate's user: 5, no user name (SPEC N1)
        got: list[bytes] = []
        c.on_message = lambda cl, u, m: got.append(m.payload)
        c.subscribe("cert/t", 1)
        time.sleep(0.3)
        c.publish("cert/t", b"by cert", qos=1).wait_for_publish(10)
        assert wait_for(lambda: got == [b"by cert"])
        c.disconnect()
        c.loop_stop()
        code, c = _tls_connect(port, files, "nobody")
        assert code == 134  # CONNACK 4, bad user name or password (paho shows 0x86)
        c.loop_stop()
        code, c = _tls_connect(port, files, "nobody", user="guest")
        assert code == 0
        c.disconnect()
        c.loop_stop()
        assert "Traceback" not in "".join(b.log)
    finally:
        b.stop()
