"""MQTT test helpers: the reference brokers' addresses, a raw MQTT client on ackmq's codec
(`Raw`, for what paho hides: packet ids, DUP, reason codes, session present), and paho
clients made one way.

RabbitMQ 3.10's MQTT plugin listens on 127.0.0.1:1883 (MQTT 3.1.1 only, guest/guest);
Mosquitto 2.0 on 127.0.0.1:1884 (`/work/shared/tools/mosquitto-local start`; MQTT 5,
anonymous). A test needing one of them is skipped, with the reason, when it is not
listening."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any

from ackmq.protocol.mqtt import Connect, Decoder, Packet, encode

RABBITMQ_MQTT = ("127.0.0.1", int(os.environ.get("RABBITMQ_MQTT_PORT", "1883")))
MOSQUITTO = ("127.0.0.1", int(os.environ.get("MOSQUITTO_PORT", "1884")))


def client_id(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Closed(Exception):
    """The broker closed the connection."""


class Raw:
    """MQTT over a plain socket: `send(packet)`, `recv()` -> packet (our codec decodes what
    the broker wrote; test_mqtt_codec.py proves the codec against paho)."""

    def __init__(self, host: str, port: int, level: int = 4) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.level = level
        self.decoder = Decoder(level=level, server=False)
        self.pending: list[Packet] = []

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, p: Packet) -> None:
        self.sendraw(encode(p, self.level))

    def sendraw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 10.0) -> Packet:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no MQTT packet")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no MQTT packet") from None
            except ConnectionResetError:
                data = b""
            if not data:
                raise Closed()
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def connect(self, cid: str, user: str | None = "guest", password: str | None = "guest",
                clean: bool = True, **kw: Any) -> Packet:
        self.send(Connect(cid, self.level, clean, kw.pop("keep_alive", 60), kw.pop("will", None),
                          user, None if password is None else password.encode(),
                          kw.pop("properties", {})))
        return self.recv()

    def closed(self, timeout: float = 10.0) -> bool:
        """True once the broker closes the socket (packets before it are dropped)."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.recv(deadline - time.monotonic())
        except Closed:
            return True
        except TimeoutError:
            return False
        return False


def paho(port: int, cid: str | None = None, v5: bool = False, user: str | None = "guest",
         password: str | None = "guest", clean: bool = True, host: str = "127.0.0.1",
         **kw: Any) -> Any:
    """A connected paho-mqtt 2 client with its network loop running, and its received
    messages in `.got` (a list) / `.arrived` (an Event set on each)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    proto = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
    args: dict[str, Any] = {"client_id": cid or client_id(), "protocol": proto}
    if not v5:
        args["clean_session"] = clean
    c = mqtt.Client(CallbackAPIVersion.VERSION2, **args)
    if user is not None:
        c.username_pw_set(user, password)
    c.got = []
    c.arrived = threading.Event()
    c.connack = None
    connected = threading.Event()

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        c.got.append(msg)
        c.arrived.set()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        c.connack = (reason, flags)
        connected.set()

    c.on_message = on_message
    c.on_connect = on_connect
    props = None
    if v5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = kw.pop("session_expiry", 0)
    c.connect(host, port, keepalive=kw.pop("keepalive", 60), clean_start=clean if v5 else 3,
              properties=props)
    c.loop_start()
    if not connected.wait(10):
        raise TimeoutError("no CONNACK")
    return c


def wait_for(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return bool(cond())
