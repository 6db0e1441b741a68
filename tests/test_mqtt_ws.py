"""N1: MQTT over WebSocket at /ws (`--mqtt-ws-port`, RabbitMQ's web_mqtt, usually 15675):
paho-mqtt's websockets transport against it, talking with a plain TCP MQTT client."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from conftest import BrokerProcess
from paho.mqtt.enums import CallbackAPIVersion
from support.mqtthelp import client_id, paho, wait_for

WS_URL = re.compile(r"ws://\S+:(\d+)/ws")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("mqtt-ws") / "d", "--mqtt-ws-port", "0")
    b.start()
    yield b
    b.stop()
    assert not [line for line in b.log if "Traceback" in line], "".join(b.log[-40:])


def _ws_port(b: BrokerProcess) -> int:
    return next(int(m.group(1)) for line in b.log if (m := WS_URL.search(line)))


def test_N1_mqtt_over_websocket_talks_with_tcp_clients(broker: BrokerProcess) -> None:
    ws = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id("ws"),
                     transport="websockets", protocol=mqtt.MQTTv5)
    ws.ws_set_options(path="/ws")
    ws.username_pw_set("guest", "guest")
    got: list[bytes] = []
    ws.on_message = lambda c, u, m: got.append(m.payload)
    ws.connect("127.0.0.1", _ws_port(broker))
    ws.loop_start()
    tcp = paho(broker.mqtt_port)
    try:
        time.sleep(0.3)
        ws.subscribe("web/#", 1)
        tcp.subscribe("dev/#", 1)
        time.sleep(0.3)
        tcp.publish("web/page", b"from-tcp", qos=1).wait_for_publish(10)
        ws.publish("dev/led", b"from-ws", qos=1).wait_for_publish(10)
        assert wait_for(lambda: got == [b"from-tcp"])
        assert wait_for(lambda: [m.payload for m in tcp.got] == [b"from-ws"])
    finally:
        for c in (ws, tcp):
            c.disconnect()
            c.loop_stop()


def test_N1_websocket_off_unless_asked(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        assert not any(WS_URL.search(line) for line in b.log)
    finally:
        b.stop()


def test_N9_websocket_listener_is_listed_as_http_web_mqtt(broker: BrokerProcess) -> None:
    """`ctl status` (and /api/overview) list it as RabbitMQ's web_mqtt does."""
    import contextlib
    import io
    import json

    from ackmq.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ctl", "--data-dir", str(broker.data_dir), "status",
                     "--formatter", "json"]) == 0
    got = {x["protocol"]: x["port"] for x in json.loads(out.getvalue())["listeners"]}
    assert got["http/web-mqtt"] == _ws_port(broker)
    assert "https/web-mqtt" not in got
