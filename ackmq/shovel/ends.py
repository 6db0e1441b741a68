"""A shovel's two ends, per protocol, behind one small interface so the mover
(worker.py's `_Move`) is written once:

    source  start(deliver)          deliver(tag, exchange, routing_key, properties, body)
            ack(tags) / nack(tags)  settled at the source (nack: back to the queue)
    dest    publish(exchange, routing_key, properties, body)
            confirms call `confirmed(seq, multiple, ack)`, seq 1, 2, ... in publish order
            (a 1.0 destination: `confirmed(last, False, ack, first)`, a disposition's range)

Messages travel between the ends in the model's format (raw AMQP 0-9-1 properties and
body); an AMQP 1.0 end converts with protocol/amqp10/amqp_map.py (RabbitMQ 4's mapping,
the one the broker's AMQP 1.0 front end uses).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ackmq.client.lowlevel import RawChannel, RawConnection
from ackmq.protocol.amqp import encode_nack, encode_publish
from ackmq.protocol.amqp10 import Composite, DecodeError, Symbol
from ackmq.protocol.amqp10.amqp_map import AMQP_CONTENT_TYPE, from_amqp091
from ackmq.protocol.amqp10.kept import From091, To091
from ackmq.protocol.amqp10.types import Timestamp, UInt
from ackmq.shovel.amqp10 import Peer10

Deliver = Callable[[int, str, str, bytes, bytes], None]
Confirmed = Callable[[int, bool, bool], None]
ConfirmedRange = Callable[[int, bool, bool, int], None]  # seq, multiple, ack, first seq
_AMQP_CONTENT = (b"\x80\x00" + bytes((len(AMQP_CONTENT_TYPE),))
                 + AMQP_CONTENT_TYPE.encode())  # properties: content_type only


class Source091:
    def __init__(self, conn: RawConnection, ch: RawChannel) -> None:
        self.conn, self.ch = conn, ch

    def ack(self, tags: list[int]) -> None:
        ch = self.ch
        self.conn.write(ch.ack_bytes(tags[0]) if len(tags) == 1 else
                        b"".join(ch.ack_bytes(t) for t in tags))

    def nack(self, tags: list[int]) -> None:
        n = self.ch.number
        self.conn.write(b"".join(encode_nack(n, t, False, True) for t in tags))


class Dest091:
    def __init__(self, conn: RawConnection, ch: RawChannel) -> None:
        self.conn, self.ch, self.number = conn, ch, ch.number

    def publish(self, exchange: str, key: str, props: bytes, body: bytes) -> None:
        self.conn.write(encode_publish(self.number, exchange, key, False, False, props, body,
                                       self.conn.frame_max))

    def on_confirm(self, fn: Confirmed) -> None:
        self.ch.on_confirm = fn


def _runs(tags: list[int]) -> list[tuple[int, int, int]]:
    """Consecutive delivery ids as (first, last, count) ranges."""
    out: list[tuple[int, int, int]] = []
    for t in sorted(tags):
        if out and out[-1][1] + 1 == t:
            first, _, n = out[-1]
            out[-1] = (first, t, n + 1)
        else:
            out.append((t, t, 1))
    return out


class Source10:
    """A receiving link: each transfer converted to the model's format, the
    conversion of what precedes a trailing data section kept (kept.py)."""

    def __init__(self, peer: Peer10) -> None:
        self.peer = peer
        self.deliver: Deliver = lambda t, x, k, p, b: None
        self._to091 = To091()
        peer.on_message = self._message

    def _message(self, delivery_id: int, payload: bytes, settled: bool) -> None:
        exchange = key = ""
        try:
            m, props, body = self._to091.convert(payload)
            ann = m.message_annotations or {}
            x, k = ann.get("x-exchange"), ann.get("x-routing-key")
            exchange = x if isinstance(x, str) else ""
            key = k if isinstance(k, str) else ""
        except DecodeError:  # moved as it came: a 1.0 consumer gets the sections back
            props, body = _AMQP_CONTENT, payload
        self.deliver(delivery_id, exchange, key, props, body)

    def ack(self, tags: list[int]) -> None:
        for first, last, n in _runs(tags):
            self.peer.settle(first, last, n, "accepted")

    def nack(self, tags: list[int]) -> None:
        for first, last, n in _runs(tags):
            self.peer.settle(first, last, n, "released")


_PROPERTY_TYPES: dict[str, Callable[[Any], Any]] = {
    "content_type": Symbol, "content_encoding": Symbol, "absolute_expiry_time": Timestamp,
    "creation_time": Timestamp, "group_sequence": UInt}


class Dest10:
    """A sending link: each message converted to AMQP 1.0, with the shovel's
    dest-properties, dest-application-properties and dest-message-annotations set, and
    as RabbitMQ 3.10's amqp10 shovel does (checked there): dest-add-forward-headers as
    application properties, dest-add-timestamp-header as properties.creation-time."""

    def __init__(self, peer: Peer10, properties: dict[str, Any],
                 application_properties: dict[str, Any], annotations: dict[str, Any]) -> None:
        self.peer = peer
        self.properties = {k.replace("-", "_"): _PROPERTY_TYPES.get(k.replace("-", "_"),
                                                                     lambda v: v)(v)
                           for k, v in properties.items()}
        self.application_properties = application_properties
        self.annotations = {Symbol(k): v for k, v in annotations.items()}
        self.extra: Callable[[], dict[str, Any]] | None = None  # forward properties
        self.timestamp = False
        self._from091 = From091()
        self._confirmed: ConfirmedRange = lambda s, m, a, f: None
        peer.on_outcome = self._outcome

    def publish(self, exchange: str, key: str, props: bytes, body: bytes) -> None:
        self.peer.send(self.message(exchange, key, props, body))

    def message(self, exchange: str, key: str, props: bytes, body: bytes) -> bytes:
        """As `convert`; what precedes the data section is kept (kept.py) per
        (properties, exchange, routing key) when nothing in it changes per message
        (no timestamp, no forward properties)."""
        if self.timestamp or self.extra is not None:
            return self.convert(exchange, key, props, body)
        return self._from091.payload(
            (props, exchange, key), props, body,
            lambda b: self.convert(exchange, key, props, b))

    def convert(self, exchange: str, key: str, props: bytes, body: bytes) -> bytes:
        m = from_amqp091(props, body, exchange, key)
        if self.properties or self.timestamp:
            p = m.properties if m.properties is not None else Composite("properties")
            for k, v in self.properties.items():
                setattr(p, k, v)
            if self.timestamp:
                p.creation_time = Timestamp(int(time.time() * 1000))
            m.properties = p
        if self.application_properties or self.extra is not None:
            ap = dict(m.application_properties or {})
            ap.update(self.application_properties)
            if self.extra is not None:
                ap.update(self.extra())
            m.application_properties = ap
        if self.annotations:
            ma = dict(m.message_annotations or {})
            ma.update(self.annotations)
            m.message_annotations = ma
        return m.encode()

    def on_confirm(self, fn: ConfirmedRange) -> None:
        self._confirmed = fn

    def _outcome(self, first: int, last: int, ok: bool) -> None:
        self._confirmed(last + 1, False, ok, first + 1)


__all__ = ["Dest091", "Dest10", "Source091", "Source10"]
