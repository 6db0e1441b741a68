"""Kept conversions between AMQP 1.0 payloads and the model's format (amqp_map.py).
Messages of one publisher mostly differ in their body alone, so what precedes a
trailing data section converts the same way every time: it is converted once and
kept, keyed by the bytes (or the 0-9-1 fields) it comes from. Every output is
byte-for-byte what the full conversion gives. Used by the AMQP 1.0 front end and
the shovel's AMQP 1.0 ends."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Final

from ackmq.protocol.amqp.properties import PropertiesView
from ackmq.protocol.amqp10.amqp_map import AMQP_CONTENT_TYPE, to_amqp091
from ackmq.protocol.amqp10.message import Message10, decode_message

KEPT = 1024  # conversions kept per converter (cleared when full)
KEPT_BYTES = 4096  # larger sections before the body are converted each time: what is
# kept stays under KEPT x KEPT_BYTES x 2 per link, and their conversion is not the cost
_DATA_HEAD: Final = b"\x00\x53\x75"
_EMPTY_DATA_LEN = 5  # 00 53 75 a0 00: an empty body's data section, last


def trailing_data(payload: bytes, tries: int = 4) -> tuple[int, int]:
    """(offset, header length) of what looks like a data section (`00 53 75`, vbin8 or
    vbin32) running exactly to the payload's end, without decoding: (-1, 0) if none of
    the first `tries` candidates fits. A guess: only a decode of the sections before it
    (decode_sections' `starts`) shows it is one."""
    n = len(payload)
    p = payload.find(_DATA_HEAD)
    while p >= 0 and tries > 0:
        c = payload[p + 3] if p + 3 < n else -1
        if c == 0xA0 and p + 5 <= n and payload[p + 4] == n - p - 5:
            return p, 5
        if c == 0xB0 and p + 8 <= n and int.from_bytes(payload[p + 4:p + 8]) == n - p - 8:
            return p, 8
        p = payload.find(_DATA_HEAD, p + 1)
        tries -= 1
    return -1, 0


def data_section(body: bytes) -> bytes:
    """`body` as a data section: encode_body([(DATA, body)])."""
    n = len(body)
    if n < 256:
        return b"\x00\x53\x75\xa0" + bytes((n,)) + body
    return b"\x00\x53\x75\xb0" + n.to_bytes(4, "big") + body


class To091:
    """Incoming payloads as (message, 0-9-1 properties, body), as
    `decode_message` + `to_amqp091` give them. A kept message has no body and is
    shared: read it, never change it."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[bytes, tuple[Message10, bytes]] = {}

    def convert(self, payload: bytes) -> tuple[Message10, bytes, bytes]:
        """DecodeError as decode_message's."""
        at, head = trailing_data(payload)
        if at >= 0:
            known = self._kept.get(payload[:at])
            if known is not None:
                return known[0], known[1], payload[at + head:]
        starts: list[int] = []
        m = decode_message(payload, starts)
        props, body = to_amqp091(m)
        if 0 <= at <= KEPT_BYTES and starts[-1] == at and m.data is not None:
            # the sections before `at` decode on their own: trailing_data's guess was right
            kept = self._kept
            if len(kept) >= KEPT:
                kept.clear()
            kept[payload[:at]] = (replace(m, body=[]), props)
        return m, props, body


class From091:
    """Outgoing payloads: what precedes the data section is kept per key (the inputs
    of the conversion other than the body); `full(body)` is the full conversion."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[Hashable, bytes] = {}

    def payload(self, key: Hashable, properties: bytes, body: bytes,
                full: Callable[[bytes], bytes]) -> bytes:
        if len(properties) > KEPT_BYTES:
            return full(body)
        kept = self._kept
        prefix = kept.get(key)
        if prefix is None:
            if PropertiesView(properties).content_type == AMQP_CONTENT_TYPE:
                prefix = b""  # the body is the sections themselves: no data section
            else:
                prefix = full(b"")[:-_EMPTY_DATA_LEN]
            if len(kept) >= KEPT:
                kept.clear()
            kept[key] = prefix
        if not prefix:
            return full(body)
        return prefix + data_section(body)


__all__ = ["KEPT", "From091", "To091", "data_section"]
