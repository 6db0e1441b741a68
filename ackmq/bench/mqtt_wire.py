"""A minimal asyncio MQTT 3.1.1 client for the bench's MQTT workloads (mqtt_load.py), on
the project's sans-IO codec (protocol/mqtt): CONNECT, PUBLISH at QoS 0/1/2 with the
acknowledgements counted by callback, SUBSCRIBE, a subscriber that acknowledges what it
gets (PUBACK; PUBREC, then PUBCOMP for the PUBREL), PINGREQ as a barrier, DISCONNECT.
Why not paho-mqtt: its per-message cost (tens of µs) would be what the rows measure.
The acknowledgements it sends are built by hand: four bytes each."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import cast
from urllib.parse import unquote, urlsplit

from ackmq.protocol.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    MQTTError,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    SubOptions,
    Subscribe,
    encode,
    encode_publish,
)
from ackmq.protocol.mqtt.constants import MQTT311

URL_FORM = "mqtt://[user:password@]host:port"
_PID = struct.Struct(">H")
_PUBACK, _PUBREC, _PUBREL, _PUBCOMP = b"\x40\x02", b"\x50\x02", b"\x62\x02", b"\x70\x02"
#: PINGREQ and DISCONNECT, whole
_PINGREQ, _DISCONNECT = b"\xc0\x00", b"\xe0\x00"


class MqttWireError(Exception):
    pass


def parse_mqtt_url(url: str) -> tuple[str, int, str | None, str | None]:
    """(host, port, user or None, password or None) of `mqtt://[user:pass@]host:port`."""
    u = urlsplit(url)
    if u.scheme != "mqtt":
        raise ValueError(f"unsupported scheme {u.scheme}:// in {url!r}; expected {URL_FORM}")
    try:
        port = u.port or 1883
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r} ({exc}); expected {URL_FORM}") from None
    user = unquote(u.username) if u.username else None
    password = unquote(u.password) if u.password is not None else None
    return u.hostname or "127.0.0.1", port, user, password


class MqttConnection(asyncio.Protocol):
    """One MQTT 3.1.1 connection. `on_acked(k)`: k of our QoS 1/2 publishes completed
    (PUBACK, PUBCOMP, or a PUBACK answering a QoS 2 publish: `downgraded` counts those);
    `on_message(payload)`: a delivery, already acknowledged."""

    def __init__(self) -> None:
        self.decoder = Decoder(level=MQTT311, server=False)
        self.transport: asyncio.Transport | None = None
        self.on_acked: Callable[[int], None] = lambda k: None
        self.on_message: Callable[[bytes], None] = lambda payload: None
        self.downgraded = 0
        self.session_present = False
        self._next_id = 0
        self._qos2: set[int] = set()  # our QoS 2 publishes not PUBRECed yet
        self._waiters: list[tuple[type, asyncio.Future[object]]] = []
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, url: str, client_id: str, clean: bool = True,
                   timeout: float = 10.0) -> MqttConnection:
        host, port, user, password = parse_mqtt_url(url)
        loop = asyncio.get_running_loop()
        _, c = await asyncio.wait_for(loop.create_connection(cls, host, port), timeout)
        assert c.transport is not None
        sock = c.transport.get_extra_info("socket")
        if sock is not None:  # small acknowledgements must not wait for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ack = await asyncio.wait_for(c._call(
            encode(Connect(client_id, MQTT311, clean, 60, None, user,
                           None if password is None else password.encode())), ConnAck),
            timeout)
        assert isinstance(ack, ConnAck)
        if ack.reason_code:
            c.transport.close()
            raise MqttWireError(f"CONNACK {ack.reason_code} from {host}:{port}")
        c.session_present = ack.session_present
        return c

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        err = MqttWireError(f"connection closed ({exc or 'by the broker'})")
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(err)
        self._waiters.clear()
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MQTTError as exc:
            assert self.transport is not None
            self.transport.close()
            self.connection_lost(exc)
            return
        out: list[bytes] = []
        acked = 0
        for p in packets:
            if type(p) is Publish:
                if p.qos == 1:
                    out += (_PUBACK, _PID.pack(p.packet_id))
                elif p.qos == 2:
                    out += (_PUBREC, _PID.pack(p.packet_id))
                self.on_message(p.payload)
            elif type(p) is PubAck:
                acked += 1
                if p.packet_id in self._qos2:
                    self._qos2.discard(p.packet_id)
                    self.downgraded += 1
            elif type(p) is PubRec:
                self._qos2.discard(p.packet_id)
                out += (_PUBREL, _PID.pack(p.packet_id))
            elif type(p) is PubComp:
                acked += 1
            elif type(p) is PubRel:
                out += (_PUBCOMP, _PID.pack(p.packet_id))
            else:
                for i, (kind, fut) in enumerate(self._waiters):
                    if type(p) is kind:
                        del self._waiters[i]
                        if not fut.done():
                            fut.set_result(p)
                        break
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
        if acked:
            self.on_acked(acked)

    # -- requests --------------------------------------------------------------------------
    def _call(self, data: bytes, kind: type) -> asyncio.Future[object]:
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiters.append((kind, fut))
        assert self.transport is not None
        self.transport.write(data)
        return fut

    def packet_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    def publish_bytes(self, topic: str, payload: bytes, qos: int) -> bytes:
        """One PUBLISH, its packet id taken (QoS 1/2): to be written by `write`."""
        pid = self.packet_id() if qos else 0
        if qos == 2:
            self._qos2.add(pid)
        return encode_publish(topic, payload, qos, False, False, pid, MQTT311)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            raise MqttWireError("connection closed")
        self.transport.write(data)

    async def drain(self) -> None:
        await self._can_write.wait()

    async def subscribe(self, topic_filter: str, qos: int) -> int:
        """The granted QoS (0x80: refused)."""
        ack = await self._call(encode(Subscribe(self.packet_id(), [(topic_filter,
                                                                     SubOptions(qos))])), SubAck)
        assert isinstance(ack, SubAck)
        return ack.reason_codes[0]

    async def ping(self) -> None:
        """PINGRESP: the broker has read everything written before (one connection is
        processed in order)."""
        await self._call(_PINGREQ, PingResp)

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_DISCONNECT)
            self.transport.close()
        await asyncio.wait_for(asyncio.shield(self.closed), 10)
