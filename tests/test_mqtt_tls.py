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
from support.tlshelp import cert_broker, port_in_log, server_files

MQTTS = re.compile(r"mqtts://\S+:(\d+)")


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return server_files(ca, tmp_path_factory.mktemp("mqtt-tls"))


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
