"""A stream-protocol message <-> the model's record (raw 0-9-1 properties + body), so what
one protocol appends every other reads (X2). Stream clients send AMQP 1.0 encoded
messages (RabbitMQ's stream format): they go through RabbitMQ's 1.0 <-> 0-9-1 mapping
(protocol/amqp10/amqp_map.py), marked durable (a stream keeps everything, and a confirm
means fsynced: P5c). A payload that is not an AMQP 1.0 message (a client may send any
bytes) is kept as the body with the header `x-ackmq-stream-raw` and given back to stream
consumers byte for byte.
"""

from __future__ import annotations

from typing import Any

from ackmq.protocol.amqp.properties import encode_fields, header_value, properties_with_header
from ackmq.protocol.amqp10 import Composite, DecodeError, decode_message
from ackmq.protocol.amqp10.amqp_map import AMQP_CONTENT_TYPE, from_amqp091, to_amqp091
from ackmq.protocol.wire import U32 as _U32

RAW_HEADER = "x-ackmq-stream-raw"
# a message's filter value (Publish v2), kept as RabbitMQ 4 keeps it for AMQP clients
FILTER_HEADER = "x-stream-filter-value"
_FILTER_MARK = FILTER_HEADER.encode()
_RAW_PROPERTIES = encode_fields({"delivery_mode": 2, "headers": {RAW_HEADER: True}})


_PREFIXES_MAX = 4096


# the properties of a published message's sections before its body, by those bytes: a
# publisher's messages mostly share them, so a publish costs one lookup, not a decode
_PUBLISHED: dict[bytes, bytes] = {}


def split_data(data: bytes | memoryview) -> tuple[bytes, bytes] | None:
    """(the bytes before the body, the body) when the message ends with one data section
    (the usual shape); None otherwise. Found by the section's length, not trusted yet:
    only a prefix a full decode has accepted is looked up."""
    raw = bytes(data)
    end = len(raw)
    pos = end
    for _ in range(8):
        pos = raw.rfind(b"\x00\x53\x75", 0, pos)
        if pos < 0:
            return None
        kind = raw[pos + 3:pos + 4]
        if kind == b"\xa0" and pos + 5 <= end and raw[pos + 4] == end - pos - 5:
            return raw[:pos], raw[pos + 5:]
        if kind == b"\xb0" and pos + 8 <= end and \
                _U32.unpack_from(raw, pos + 4)[0] == end - pos - 8:
            return raw[:pos], raw[pos + 8:]
    return None


# the last prefix a full decode accepted, and its properties (none yet: empty)
_last: list[bytes] = []


def to_record(data: bytes | memoryview) -> tuple[bytes, bytes]:
    """(properties, body) to append for a published message."""
    data = bytes(data)  # (a memoryview of the frame until here: bytes compare faster)
    if _last:  # a publisher's messages mostly share the last one's prefix: compared,
        prefix, known = _last  # not searched for
        n, end = len(prefix), len(data)
        if data.startswith(prefix):
            if data.startswith(_DATA8, n) and n + 5 <= end and data[n + 4] == end - n - 5:
                return known, data[n + 5:]
            if data.startswith(_DATA32, n) and n + 8 <= end and \
                    _U32.unpack_from(data, n + 4)[0] == end - n - 8:
                return known, data[n + 8:]
    split = split_data(data)
    if split is not None:
        props = _PUBLISHED.get(split[0])
        if props is not None:
            _last[:] = split[0], props
            return props, split[1]
    try:
        m = decode_message(data)
    except (DecodeError, ValueError, TypeError, IndexError):
        return _RAW_PROPERTIES, bytes(data)
    if m.header is None:
        m.header = Composite("header", durable=True)
    else:
        m.header.durable = True
    props, body = to_amqp091(m)
    if split is not None and m.data is not None and m.data == split[1] \
            and m.footer is None and m.delivery_annotations is None:
        if len(_PUBLISHED) >= _PREFIXES_MAX:
            _PUBLISHED.clear()
        _PUBLISHED[split[0]] = props
        _last[:] = split[0], props
    return props, body


# the sections before the body of a record's 1.0 encoding, by (properties, exchange,
# routing key): a stream's records mostly share them, so a delivery costs one lookup and
# the body's data section, not a full conversion
_PREFIXES: dict[tuple[bytes, str, str], bytes] = {}
_AMQP_BODY = AMQP_CONTENT_TYPE.encode()
_DATA8, _DATA32 = b"\x00\x53\x75\xa0", b"\x00\x53\x75\xb0"


def _data_section(body: bytes) -> bytes:
    if len(body) < 256:
        return _DATA8 + bytes((len(body),)) + body
    return _DATA32 + _U32.pack(len(body)) + body


# the last record converted by its prefix: (properties, exchange, routing key, prefix)
_last_record: list[Any] = [None, None, None, b""]


def from_record(properties: bytes, body: bytes, exchange: str, routing_key: str) -> bytes:
    """A stored record as the message a stream consumer gets."""
    head, tail = record_parts(properties, body, exchange, routing_key)
    return head + tail


def record_parts(properties: bytes, body: bytes, exchange: str, routing_key: str
                 ) -> tuple[bytes, bytes]:
    """A stored record as the message a stream consumer gets, in two parts (head +
    body), so a chunk joins the body once, straight from what the log read."""
    last = _last_record  # a stream's records mostly repeat the one before
    if properties == last[0] and exchange == last[1] and routing_key == last[2]:
        return last[3] + data_header(len(body)), body
    if properties == _RAW_PROPERTIES:
        return b"", body
    prefix = record_head(properties, exchange, routing_key)
    if prefix is None:  # 1.0 body sections kept encoded: the full conversion
        return from_amqp091(properties, body, exchange, routing_key).encode(), b""
    last[:] = properties, exchange, routing_key, prefix
    return prefix + data_header(len(body)), body


def record_head(properties: bytes, exchange: str, routing_key: str) -> bytes | None:
    """The sections that come before the body's data section in the message a stream
    consumer gets for a stored record (cached by properties, exchange and routing key);
    None when the record is not given as head + data section + body: a raw payload
    (given back as it is) or an AMQP 1.0 body kept encoded (converted in full)."""
    if properties == _RAW_PROPERTIES or _AMQP_BODY in properties:
        return None
    key = (properties, exchange, routing_key)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        empty = from_amqp091(properties, b"", exchange, routing_key).encode()
        prefix = empty[:len(empty) - len(_data_section(b""))]
        if len(_PREFIXES) >= _PREFIXES_MAX:
            _PREFIXES.clear()
        _PREFIXES[key] = prefix
    return prefix


def data_header(n: int) -> bytes:
    """The header of a data section of `n` bytes (its descriptor, type and length)."""
    if n < 256:
        return _DATA8 + bytes((n,))
    return _DATA32 + _U32.pack(n)


def with_filter_value(properties: bytes, value: str | None) -> bytes:
    """The record's properties carrying a Publish v2 filter value (none: unchanged)."""
    return properties if value is None else properties_with_header(properties, FILTER_HEADER,
                                                                   value)


def filter_value(properties: bytes) -> str | None:
    """A record's filter value, if it has one (a byte search first: most have none)."""
    if _FILTER_MARK not in properties:
        return None
    v = header_value(properties, FILTER_HEADER)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None
