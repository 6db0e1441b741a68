"""N1, U4: MQTT over secure WebSocket (`--mqtt-wss-port`, RabbitMQ's web_mqtt.ssl.port,
usually 15676): `wss://` at /ws with the broker's certificate options; paho-mqtt's
websockets transport with `tls_set` against it, and certificate login over it as over
MQTT's own TLS port (`--mqtt-ssl-cert-login`)."""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import trustme
from conftest import BrokerProcess
from paho.mqtt.enums import CallbackAPIVersion
from support.mqtthelp import client_id, paho, wait_for
from support.tlshelp import cert_broker, port_in_log, server_files, with_client_certs

from ackmq.ctl.socket_client import request

WSS_URL = re.compile(r"wss://\S+:(\d+)/ws")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mqtt-wss")
    return with_client_certs(ca, d, server_files(ca, d), "certuser", "nobody")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]
           ) -> Iterator[BrokerProcess]:
    b = cert_broker(tmp_path_factory.mktemp("b"), files, "--mqtt-wss-port", "0",
                    "--tls-verify-peer", "--mqtt-ssl-cert-login")
    assert request(b.data_dir / "ctl.sock", "add_user", ["certuser", "pw"])["ok"]
    assert request(b.data_dir / "ctl.sock", "set_permissions",
                   ["certuser", ".*", ".*", ".*"])["ok"]
    yield b
    b.stop()
    assert not [line for line in b.log if "Traceback" in line], "".join(b.log[-40:])


def _wss(broker: BrokerProcess, files: dict[str, Path], cert: str | None = None,
         user: str | None = "guest", v5: bool = False) -> tuple[int, mqtt.Client]:
    """A paho client over wss:// (with the client certificate `cert`): the CONNACK's
    reason code, and the client, its loop running."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id("wss"),
                    transport="websockets", protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311)
    c.ws_set_options(path="/ws")
    c.tls_set(ca_certs=str(files["ca"]),
              certfile=None if cert is None else str(files[cert]))
    if user is not None:
        c.username_pw_set(user, "guest" if user == "guest" else user)
    codes: list[int] = []
    c.on_connect = lambda cl, u, f, reason, p: codes.append(reason.value)
    c.connect("127.0.0.1", int(port_in_log(broker, WSS_URL, "wss:// URL")))
    c.loop_start()
    assert wait_for(lambda: bool(codes)), "no CONNACK"
    return codes[0], c


@pytest.mark.parametrize("v5", [False, True])
def test_N1_mqtt_over_secure_websocket_talks_with_tcp_clients(
        broker: BrokerProcess, files: dict[str, Path], v5: bool) -> None:
    code, wss = _wss(broker, files, v5=v5)
    assert code == 0
    got: list[bytes] = []
    wss.on_message = lambda c, u, m: got.append(m.payload)
    tcp = paho(broker.mqtt_port)
    try:
        wss.subscribe("wss/#", 1)
        tcp.subscribe("dev/#", 1)
        time.sleep(0.3)
        tcp.publish("wss/page", b"from-tcp", qos=1).wait_for_publish(10)
        wss.publish("dev/led", b"from-wss", qos=2).wait_for_publish(10)
        assert wait_for(lambda: got == [b"from-tcp"])
        assert wait_for(lambda: [m.payload for m in tcp.got] == [b"from-wss"])
    finally:
        for c in (wss, tcp):
            c.disconnect()
            c.loop_stop()


def test_U4_N1_mqtt_ssl_cert_login_over_secure_websocket(
        broker: BrokerProcess, files: dict[str, Path]) -> None:
    """As over 8883: a CONNECT without user name and password logs in as the verified
    client certificate's CN; a CN naming no user is CONNACK 4 (paho shows 0x86); a user
    name and password win over the certificate; no certificate and no user name: 5."""
    code, c = _wss(broker, files, "certuser", user=None)
    assert code == 0
    got: list[bytes] = []
    c.on_message = lambda cl, u, m: got.append(m.payload)
    c.subscribe("cert/t", 1)
    time.sleep(0.3)
    c.publish("cert/t", b"by cert", qos=1).wait_for_publish(10)
    assert wait_for(lambda: got == [b"by cert"])
    c.disconnect()
    c.loop_stop()
    for cert, user, want in (("nobody", None, 134), ("nobody", "guest", 0),
                             (None, None, 135)):
        code, c = _wss(broker, files, cert, user=user)
        assert code == want, (cert, user)
        c.disconnect()
        c.loop_stop()


def test_N1_secure_websocket_refuses_what_does_not_trust_it_or_is_not_tls(
        broker: BrokerProcess) -> None:
    port = int(port_in_log(broker, WSS_URL, "wss:// URL"))
    ctx = ssl.create_default_context()  # the system's CAs, not the test CA
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
            pytest.raises(ssl.SSLError):
        ctx.wrap_socket(s, server_hostname="localhost")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n")
        s.settimeout(5)
        try:
            data = s.recv(100)
        except (ConnectionResetError, TimeoutError):
            data = b""
        assert b"HTTP" not in data  # no plain HTTP on the TLS port
    assert broker.mqtt_port  # the plain TCP listener is still there


@pytest.mark.parametrize("args,message", [
    (["--mqtt-wss-port", "0"], "--mqtt-wss-port needs --tls-cert FILE and --tls-key FILE"),
    (["--mqtt-wss-port", "70000"], "--mqtt-wss-port must be between 0 and 65535"),
    (["--mqtt-ssl-cert-login"], "--mqtt-ssl-cert-login needs --mqtt-tls-port or "
                                "--mqtt-wss-port"),
])
def test_U4_bad_mqtt_wss_options_say_what_to_fix(tmp_path: Path, args: list[str],
                                                 message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                           "--stomp-port", "0", "--mqtt-port", "0", "--no-stream",
                           "--no-http", "--data-dir", str(tmp_path / "d"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert message in out and "Traceback" not in out


def test_N1_web_mqtt_ssl_keys_from_the_config_file() -> None:
    """RabbitMQ's web_mqtt.ssl.port is `--mqtt-wss-port`; its certfile / keyfile /
    cacertfile set the broker's one set of certificate options (as management.ssl.*)."""
    from ackmq.server.conffile import parse
    assert parse("web_mqtt.ssl.port = 15676\n", []) == {"mqtt_wss_port": 15676}
    assert parse("web_mqtt.ssl.certfile = /c.pem\nweb_mqtt.ssl.keyfile = /k.pem\n"
                 "web_mqtt.ssl.cacertfile = /ca.pem\n", []) == {
        "tls_cert": Path("/c.pem"), "tls_key": Path("/k.pem"), "tls_ca": Path("/ca.pem")}


def test_N9_web_mqtt_listeners_are_listed_with_rabbitmqs_protocol_names(
        broker: BrokerProcess, tmp_path: Path) -> None:
    """/api/overview's and `ctl status`'s listeners: RabbitMQ's web_mqtt names them
    `http/web-mqtt` and `https/web-mqtt` (rabbit_web_mqtt_app)."""
    import contextlib
    import io
    import json

    from ackmq.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ctl", "--data-dir", str(broker.data_dir), "status",
                     "--formatter", "json"]) == 0
    got = {x["protocol"]: x["port"] for x in json.loads(out.getvalue())["listeners"]}
    assert got["https/web-mqtt"] == int(port_in_log(broker, WSS_URL, "wss:// URL"))
    assert "http/web-mqtt" not in got  # not asked for
