"""The wire form of a firehose copy (RabbitMQ's rabbit_trace): raw properties holding
only a headers table, with the traced message's exchange, routing keys and properties
as RabbitMQ 3.10 writes them, then what the caller adds (node, vhost, connection, ...).

RabbitMQ's types, as read from 3.10 on the wire: text as longstr 'S', integers as
signedint 'I', the routing keys and queue names as arrays of 'S', the properties as a
table of the set fields in reverse AMQP order (its fold prepends), the message's own
headers table inside it as it came.
"""

from __future__ import annotations

from typing import Any

from ackmq.protocol.amqp.properties import FLAGS, OCTET, SHORTSTR, TIMESTAMP, spans
from ackmq.protocol.amqp.property_names import PAMQP_TO_RABBIT
from ackmq.protocol.amqp.table import encode_key, encode_value
from ackmq.protocol.wire import I32 as _I32
from ackmq.protocol.wire import U16 as _U16
from ackmq.protocol.wire import U32 as _U32
from ackmq.protocol.wire import U64 as _U64

_HEADERS_ONLY = _U16.pack(FLAGS["headers"])


def value(v: Any) -> bytes:
    """One field value as rabbit_trace types it: str 'S', int 'I' (64-bit 'l' when it
    does not fit), list of str an array of 'S'; anything else as table.encode_value."""
    if isinstance(v, str):
        data = v.encode("utf-8")
        return b"S" + _U32.pack(len(data)) + data
    if isinstance(v, int) and not isinstance(v, bool) and -(1 << 31) <= v < (1 << 31):
        return b"I" + _I32.pack(v)
    if isinstance(v, list | tuple):
        data = b"".join(value(item) for item in v)
        return b"A" + _U32.pack(len(data)) + data
    if isinstance(v, bytes):  # an encoded table, as it came
        return b"F" + v
    return encode_value(v)


def properties_table(raw: bytes) -> bytes:
    """The message's properties as rabbit_trace's `properties` table (length included)."""
    entries: list[bytes] = []
    for _flag, name, kind, start, end in spans(raw):
        v: Any
        if kind == SHORTSTR:
            v = bytes(raw[start + 1:end]).decode("utf-8", "surrogateescape")
        elif kind == OCTET:
            v = raw[start]
        elif kind == TIMESTAMP:
            v = _U64.unpack_from(raw, start)[0]
        else:
            v = bytes(raw[start:end])
        entries.append(encode_key(PAMQP_TO_RABBIT[name]) + value(v))
    entries.reverse()
    data = b"".join(entries)
    return _U32.pack(len(data)) + data


def copy_properties(exchange: str, routing_keys: list[str], raw: bytes,
                    tail: list[tuple[str, Any]]) -> bytes:
    """Raw properties of a firehose copy: exchange_name, routing_keys, properties, then
    `tail`'s entries in order (node, redelivered, vhost, connection, ...)."""
    parts = [encode_key("exchange_name") + value(exchange),
             encode_key("routing_keys") + value(routing_keys),
             encode_key("properties") + b"F" + properties_table(raw)]
    parts.extend(encode_key(k) + value(v) for k, v in tail)
    data = b"".join(parts)
    return _HEADERS_ONLY + _U32.pack(len(data)) + data


def event_properties(entries: list[tuple[str, Any]]) -> bytes:
    """Raw properties of one of ackmq's lifecycle events: a headers table only."""
    data = b"".join(encode_key(k) + value(v) for k, v in entries)
    return _HEADERS_ONLY + _U32.pack(len(data)) + data
