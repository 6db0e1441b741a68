"""basic content-header properties kept as raw bytes, with lazy peeks and splices.

Why raw: the broker stores and forwards a publisher's property bytes untouched (no
re-encoding cost, no type drift in header tables). It only needs to peek at a few fields
(delivery-mode, priority, expiration, headers) and, for dead-lettering, add header
entries; both are done here without decoding or re-encoding the other fields.

Raw layout: 16-bit property flags, then each present property in flag order
(content-type, content-encoding, headers, delivery-mode, priority, correlation-id,
reply-to, expiration, message-id, timestamp, type, user-id, app-id, cluster-id).
"""

from __future__ import annotations

import calendar
import datetime
import decimal
import struct
import time
from typing import Any

from pamqp import commands

from ackmq.protocol.amqp.constants import SEQ_HEADER

EMPTY_PROPERTIES = b"\x00\x00"

_SHORTSTR, _TABLE, _OCTET, _TIMESTAMP = 0, 1, 2, 3
# (flag bit, attribute name, wire kind) in wire order.
_FIELDS: tuple[tuple[int, str, int], ...] = (
    (0x8000, "content_type", _SHORTSTR),
    (0x4000, "content_encoding", _SHORTSTR),
    (0x2000, "headers", _TABLE),
    (0x1000, "delivery_mode", _OCTET),
    (0x0800, "priority", _OCTET),
    (0x0400, "correlation_id", _SHORTSTR),
    (0x0200, "reply_to", _SHORTSTR),
    (0x0100, "expiration", _SHORTSTR),
    (0x0080, "message_id", _SHORTSTR),
    (0x0040, "timestamp", _TIMESTAMP),
    (0x0020, "message_type", _SHORTSTR),
    (0x0010, "user_id", _SHORTSTR),
    (0x0008, "app_id", _SHORTSTR),
    (0x0004, "cluster_id", _SHORTSTR),
)
_FLAG_HEADERS = 0x2000
_UNKNOWN_FLAGS = 0x0003  # bit 1 unused; bit 0 = continuation word (RabbitMQ rejects it)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# Field-table value sizes for the structural walk: fixed width, or None for the
# variable-size kinds handled in _skip_value.
_FIXED = {
    0x74: 1, 0x62: 1, 0x42: 1,  # t b B
    0x73: 2, 0x75: 2,  # s u
    0x49: 4, 0x69: 4, 0x66: 4,  # I i f
    0x6C: 8, 0x4C: 8, 0x64: 8, 0x54: 8,  # l L d T
    0x44: 5,  # D: scale octet + int32
    0x56: 0,  # V
}


MAX_TABLE_DEPTH = 100
"""Deepest nesting of field tables and arrays accepted in what a client sends (method
arguments, message headers); the outermost table is level 1, each table or array value
inside adds one. RabbitMQ 3.10 has no bound but frame-max (it takes an 18,000-level table
in queue.declare and delivers one in headers as it came), but every Python decoder
recurses per level (pamqp, pika: two frames each), so past ~450 levels the message
cannot be read by its consumers and, unbounded, not by the broker either (headers
exchange, CC/BCC, dead-lettering). 100 is far above real use (x-death is 4 deep) and
keeps any recursion over a table (ours, pamqp's re-encoding) at a few hundred frames."""


class TableTooDeep(ValueError):
    """A field table nested deeper than MAX_TABLE_DEPTH: 502 SYNTAX_ERROR, not a crash."""

    def __init__(self) -> None:
        super().__init__(f"field table nested deeper than {MAX_TABLE_DEPTH} levels")


def _skip_table(raw: bytes, pos: int, depth: int = 1) -> int:
    """Return the offset after the field table at `pos` (at nesting level `depth`);
    ValueError if malformed, TableTooDeep past MAX_TABLE_DEPTH."""
    if depth > MAX_TABLE_DEPTH:
        raise TableTooDeep()
    (length,) = _U32.unpack_from(raw, pos)
    pos += 4
    end = pos + length
    if end > len(raw):
        raise ValueError("field table longer than its container")
    fixed = _FIXED.get
    unpack = _U32.unpack_from
    while pos < end:
        pos += 1 + raw[pos]  # key shortstr
        if pos >= end:
            raise ValueError("field table entry without a value")
        # scalars and strings (most header values) without a call; an overrun of the
        # table shows as pos != end below
        tag = raw[pos]
        size = fixed(tag)
        if size is not None:
            pos += 1 + size
        elif tag == 0x53 or tag == 0x78:  # S x
            pos += 5 + unpack(raw, pos + 1)[0]
        else:
            pos = _skip_value(raw, pos, end, depth)
    if pos != end:
        raise ValueError("field table entries overrun its length")
    return end


def _skip_value(raw: bytes, pos: int, end: int, depth: int = 1) -> int:
    """Offset after the field value at `pos`, held by a container at level `depth`."""
    tag = raw[pos]
    pos += 1
    size = _FIXED.get(tag)
    if size is not None:
        pos += size
    elif tag in (0x53, 0x78, 0x41):  # S x A: 32-bit length prefix
        (length,) = _U32.unpack_from(raw, pos)
        if tag == 0x41:
            if depth >= MAX_TABLE_DEPTH:
                raise TableTooDeep()
            inner_end = pos + 4 + length
            inner = pos + 4
            if inner_end > end:
                raise ValueError("field array longer than its container")
            while inner < inner_end:
                inner = _skip_value(raw, inner, inner_end, depth + 1)
            if inner != inner_end:
                raise ValueError("field array entries overrun its length")
        pos += 4 + length
    elif tag == 0x46:  # F
        pos = _skip_table(raw, pos, depth + 1)
    else:
        raise ValueError(f"unknown field-table type {chr(tag)!r}")
    if pos > end:
        raise ValueError("field value overruns its container")
    return pos


def _offsets(raw: bytes) -> dict[str, tuple[int, int]]:
    """Map present property name -> (start, end) of its encoded value in `raw`."""
    flags = _U16.unpack_from(raw, 0)[0]
    if flags & _UNKNOWN_FLAGS:
        raise ValueError(f"unsupported property flags 0x{flags:04x}")
    out: dict[str, tuple[int, int]] = {}
    pos = 2
    for flag, name, kind in _FIELDS:
        if flags & flag:
            start = pos
            if kind == _SHORTSTR:
                pos += 1 + raw[pos]
            elif kind == _OCTET:
                pos += 1
            elif kind == _TIMESTAMP:
                pos += 8
            else:
                pos = _skip_table(raw, pos)
            if pos > len(raw):
                raise ValueError(f"property {name} truncated")
            out[name] = (start, pos)
    if pos != len(raw):
        raise ValueError("trailing bytes after the property list")
    return out


def check_properties(raw: bytes) -> None:
    """Validate the structure of raw property bytes (the decoder calls this per message).

    Raises ValueError/IndexError/struct.error on anything RabbitMQ could not decode.
    Unrolled in wire order because it runs once per published message.
    """
    flags = (raw[0] << 8) | raw[1]
    pos = 2
    if flags:
        if flags & 0x0003:
            raise ValueError(f"unsupported property flags 0x{flags:04x}")
        if flags & 0x8000:
            pos += 1 + raw[pos]
        if flags & 0x4000:
            pos += 1 + raw[pos]
        if flags & 0x2000:
            pos = _skip_table(raw, pos)
        if flags & 0x1000:
            pos += 1
        if flags & 0x0800:
            pos += 1
        if flags & 0x0400:
            pos += 1 + raw[pos]
        if flags & 0x0200:
            pos += 1 + raw[pos]
        if flags & 0x0100:
            pos += 1 + raw[pos]
        if flags & 0x0080:
            pos += 1 + raw[pos]
        if flags & 0x0040:
            pos += 8
        if flags & 0x0020:
            pos += 1 + raw[pos]
        if flags & 0x0010:
            pos += 1 + raw[pos]
        if flags & 0x0008:
            pos += 1 + raw[pos]
        if flags & 0x0004:
            pos += 1 + raw[pos]
    if pos != len(raw):
        raise ValueError("property list length does not match the content header")


def peek_routing_fields(raw: bytes) -> tuple[int | None, int | None, str | None]:
    """(delivery-mode, priority, expiration) in one pass: what the broker needs of every
    message. Assumes `raw` passed `check_properties` (the decoder checks each message)."""
    flags = (raw[0] << 8) | raw[1]
    if not flags & 0x1F00:
        return None, None, None
    pos = 2
    if flags & 0x8000:
        pos += 1 + raw[pos]
    if flags & 0x4000:
        pos += 1 + raw[pos]
    if flags & 0x2000:
        pos += 4 + ((raw[pos] << 24) | (raw[pos + 1] << 16) | (raw[pos + 2] << 8) | raw[pos + 3])
    mode = prio = None
    if flags & 0x1000:
        mode = raw[pos]
        pos += 1
    if flags & 0x0800:
        prio = raw[pos]
        pos += 1
    if not flags & 0x0100:
        return mode, prio, None
    if flags & 0x0400:
        pos += 1 + raw[pos]
    if flags & 0x0200:
        pos += 1 + raw[pos]
    n = raw[pos]
    return mode, prio, bytes(raw[pos + 1:pos + 1 + n]).decode("utf-8", "replace")


class PropertiesView:
    """Lazy read-only view of raw property bytes; fields decode on first access."""

    __slots__ = ("raw", "_offsets", "_cache")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._offsets: dict[str, tuple[int, int]] | None = None
        self._cache: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        cache = self._cache
        if name in cache:
            return cache[name]
        if self._offsets is None:
            self._offsets = _offsets(self.raw)
        span = self._offsets.get(name)
        value: Any = None
        if span is not None:
            start, end = span
            raw = self.raw
            if name in ("delivery_mode", "priority"):
                value = raw[start]
            elif name == "timestamp":
                value = _timestamp(_U64.unpack_from(raw, start)[0], lenient=True)
            elif name == "headers":
                value = read_table(raw, start, lenient=True)[0]
            else:  # RabbitMQ takes any octets in a shortstr: lossless, never raises
                value = bytes(raw[start + 1 : end]).decode("utf-8", "surrogateescape")
        elif name == "headers":
            value = {}
        cache[name] = value
        return value

    def __contains__(self, name: str) -> bool:
        """True when the property is present on the wire."""
        if self._offsets is None:
            self._offsets = _offsets(self.raw)
        return name in self._offsets

    def __repr__(self) -> str:
        return f"PropertiesView({self.raw!r})"


def _field(name: str) -> property:
    return property(lambda self: self._get(name), doc=f"basic.properties {name}")


for _flag, _name, _kind in _FIELDS:
    setattr(PropertiesView, _name, _field(_name))


def encode_properties(props: commands.Basic.Properties) -> bytes:
    """Raw property bytes for a pamqp Properties object (the slow, general path)."""
    return props.marshal()


def decode_properties(raw: bytes) -> commands.Basic.Properties:
    """A pamqp Properties object from raw property bytes."""
    check_properties(raw)
    props = commands.Basic.Properties()
    flags = _U16.unpack_from(raw, 0)[0]
    props.unmarshal(flags, bytes(raw[2:]))
    return props


# ---------------------------------------------------------------- field tables

def _encode_value(value: Any) -> bytes:
    """One typed field value, with the types RabbitMQ itself emits (e.g. in x-death):
    integers as signed 64-bit 'l', floats as 'd', text as 'S'."""
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return b"l" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return b"S" + _U32.pack(len(data)) + data
    if isinstance(value, bytes | bytearray):
        return b"x" + _U32.pack(len(value)) + bytes(value)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list | tuple):
        data = b"".join(_encode_value(item) for item in value)
        return b"A" + _U32.pack(len(data)) + data
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return b"T" + _U64.pack(int(value.timestamp()))
    if isinstance(value, time.struct_time):
        return b"T" + _U64.pack(calendar.timegm(value))
    if isinstance(value, decimal.Decimal):
        return _encode_decimal(value)
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in a field table")


def _encode_decimal(value: decimal.Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise TypeError(f"cannot encode {value} as a decimal")
    scale = max(0, -exponent)
    mantissa = int(value.scaleb(scale))
    return b"D" + struct.pack(">Bi", scale, mantissa)


def _encode_entries(table: dict[str, Any]) -> list[bytes]:
    parts = []
    for key, value in table.items():
        name = key.encode("utf-8")
        if len(name) > 255:
            raise ValueError(f"field-table key longer than 255 bytes: {key[:40]!r}")
        parts.append(bytes((len(name),)) + name + _encode_value(value))
    return parts


def encode_table(table: dict[str, Any]) -> bytes:
    """AMQP field table (32-bit length prefix included), keys in insertion order."""
    data = b"".join(_encode_entries(table))
    return _U32.pack(len(data)) + data


def decode_table(raw: bytes, lenient: bool = False) -> dict[str, Any]:
    """Decode a field table (with its length prefix) into pamqp's value types.

    Raises ValueError (TableTooDeep past MAX_TABLE_DEPTH) on anything malformed or trailing.
    `lenient` is for tables already accepted off the wire (message headers): every one of
    them decodes, see read_table."""
    try:
        table, end = read_table(raw, 0, lenient=lenient)
    except (IndexError, struct.error) as err:
        raise ValueError(f"field table truncated: {err}") from None
    if end != len(raw):
        raise ValueError("trailing bytes after the field table")
    return table


# Field-value decoding. Values come out as pamqp 4 decodes them (the types the broker and
# its tests already handle); the difference is that this walk is bounded (depth, lengths
# inside their container, as RabbitMQ parses) and on malformed input raises ValueError
# (IndexError / struct.error when truncated), never RecursionError, OverflowError or
# OSError.
_S8, _S16, _U16V, _S32, _U32V = (struct.Struct(f) for f in (">b", ">h", ">H", ">i", ">I"))
_S64, _F32, _F64, _DEC = (struct.Struct(f) for f in (">q", ">f", ">d", ">Bi"))
_SCALAR: dict[int, struct.Struct] = {
    0x62: _S8, 0x73: _S16, 0x75: _U16V, 0x49: _S32, 0x69: _U32V,  # b s u I i
    0x6C: _S64, 0x4C: _S64, 0x66: _F32, 0x64: _F64,  # l L f d
}


def read_table(raw: bytes, pos: int, depth: int = 1,
               lenient: bool = False) -> tuple[dict[str, Any], int]:
    """(table, offset after it) for the field table at `pos`, itself at level `depth`.

    Strict (method arguments): a key that is not UTF-8 or a timestamp no datetime can
    hold is a ValueError, as pamqp had it. `lenient` (headers of an accepted message,
    which RabbitMQ takes as binaries): such a key decodes with surrogateescape (lossless)
    and such a timestamp as its integer, so reading an accepted message never raises.
    """
    if depth > MAX_TABLE_DEPTH:
        raise TableTooDeep()
    (length,) = _U32.unpack_from(raw, pos)
    pos += 4
    end = pos + length
    if end > len(raw):
        raise ValueError("field table longer than its container")
    errors = "surrogateescape" if lenient else "strict"
    table: dict[str, Any] = {}
    while pos < end:
        key_end = pos + 1 + raw[pos]
        if key_end >= end:
            raise ValueError("field table entry without a value")
        key = bytes(raw[pos + 1 : key_end]).decode("utf-8", errors)
        table[key], pos = _read_value(raw, key_end, end, depth, lenient)
    return table, end


def _read_value(raw: bytes, pos: int, end: int, depth: int, lenient: bool) -> tuple[Any, int]:
    """(value, offset after it) for the field value at `pos` inside a level-`depth`
    container ending at `end`."""
    tag = raw[pos]
    pos += 1
    value: Any
    scalar = _SCALAR.get(tag)
    if scalar is not None:
        (value,) = scalar.unpack_from(raw, pos)
        pos += scalar.size
    elif tag == 0x53 or tag == 0x78:  # S x
        (length,) = _U32.unpack_from(raw, pos)
        data = bytes(raw[pos + 4 : pos + 4 + length])
        pos += 4 + length
        if tag == 0x78:
            value = bytearray(data)
        else:
            try:
                value = data.decode("utf-8")
            except UnicodeDecodeError:
                value = data  # pamqp's answer to a longstr that is not UTF-8
    elif tag == 0x74 or tag == 0x42:  # t B
        value = raw[pos] if tag == 0x42 else bool(raw[pos])
        pos += 1
    elif tag == 0x46:  # F
        value, pos = read_table(raw, pos, depth + 1, lenient)
    elif tag == 0x41:  # A
        if depth >= MAX_TABLE_DEPTH:
            raise TableTooDeep()
        (length,) = _U32.unpack_from(raw, pos)
        pos += 4
        inner_end = pos + length
        if inner_end > end:
            raise ValueError("field array longer than its container")
        value = []
        while pos < inner_end:
            item, pos = _read_value(raw, pos, inner_end, depth + 1, lenient)
            value.append(item)
    elif tag == 0x54:  # T
        (stamp,) = _U64.unpack_from(raw, pos)
        pos += 8
        value = _timestamp(stamp, lenient, millis=True)
    elif tag == 0x44:  # D
        scale, mantissa = _DEC.unpack_from(raw, pos)
        pos += 5
        value = decimal.Decimal(mantissa) * (decimal.Decimal(10) ** -scale)
    elif tag == 0x56:  # V
        value = None
    else:
        raise ValueError(f"unknown field-table type {chr(tag)!r}")
    if pos > end:
        raise ValueError("field value overruns its container")
    return value, pos


def _timestamp(stamp: int, lenient: bool, millis: bool = False) -> datetime.datetime | int:
    """A timestamp as a UTC datetime; one past datetime's range (year 9999) is a ValueError,
    or with `lenient` the integer itself. `millis`: pamqp's guess for table values, that
    one above 2**32 counts milliseconds."""
    try:
        if millis and stamp > 0xFFFFFFFF:
            return datetime.datetime.fromtimestamp(stamp / 1000.0, tz=datetime.UTC)
        return datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC)
    except (ValueError, OverflowError, OSError):
        if lenient:
            return stamp
        raise ValueError(f"timestamp {stamp} out of range") from None


def _table_entries(raw: bytes, start: int, end: int) -> list[tuple[bytes, bytes]]:
    """Split an encoded table's entries into (key bytes, raw entry bytes) pairs."""
    entries = []
    pos = start + 4
    while pos < end:
        entry_start = pos
        key_end = pos + 1 + raw[pos]
        key = bytes(raw[pos + 1 : key_end])
        pos = _skip_value(raw, key_end, end)
        entries.append((key, bytes(raw[entry_start:pos])))
    return entries


def properties_with_headers(raw: bytes, extra: dict[str, Any]) -> bytes:
    """Raw properties whose headers table has `extra` merged in (extra wins on a clash).

    The bytes before the headers (flags, content-type, content-encoding) and after it
    are copied as they are; existing header entries keep their original encoding.
    """
    if not extra:
        return raw
    offsets = _offsets(raw)
    flags = _U16.unpack_from(raw, 0)[0]
    new_entries = _encode_entries(extra)
    span = offsets.get("headers")
    if span is None:
        insert_at = 2
        for name in ("content_type", "content_encoding"):
            if name in offsets:
                insert_at = offsets[name][1]
        data = b"".join(new_entries)
        return b"".join(
            (
                _U16.pack(flags | _FLAG_HEADERS),
                raw[2:insert_at],
                _U32.pack(len(data)),
                data,
                raw[insert_at:],
            )
        )
    start, end = span
    replaced = {key.encode("utf-8") for key in extra}
    kept = [entry for key, entry in _table_entries(raw, start, end) if key not in replaced]
    data = b"".join(kept + new_entries)
    return b"".join((raw[:start], _U32.pack(len(data)), data, raw[end:]))


_SEQ_KEY = SEQ_HEADER.encode()
_SEQ_ENTRY = struct.Struct(">B11scq")  # shortstr key "x-ackmq-seq", type 'l', value
_SEQ_ONLY_TABLE = struct.Struct(">IB11scq")


def properties_with_seq(raw: bytes, seq: int) -> bytes:
    """`properties_with_headers(raw, {"x-ackmq-seq": seq})`, fast for the common case of
    a message without headers (one splice, no parse of the property list); every
    delivery pays for this, so it is written out by hand and tested against the general
    function."""
    flags = (raw[0] << 8) | raw[1]
    if flags & _FLAG_HEADERS:
        return properties_with_headers(raw, {SEQ_HEADER: seq})
    pos = 2
    if flags & 0x8000:
        pos += 1 + raw[pos]
    if flags & 0x4000:
        pos += 1 + raw[pos]
    return b"".join((_U16.pack(flags | _FLAG_HEADERS), raw[2:pos],
                     _SEQ_ONLY_TABLE.pack(_SEQ_ENTRY.size, 11, _SEQ_KEY, b"l", seq),
                     raw[pos:]))


# ---------------------------------------------------------------- edits as splices

def header_entries(raw: bytes) -> list[tuple[bytes, bytes]]:
    """The headers table's entries as (key, encoded entry) pairs, in wire order; [] when
    there is no headers table. Entries keep their exact encoding (types included)."""
    span = _offsets(raw).get("headers")
    return [] if span is None else _table_entries(raw, *span)


def array_items(entry: bytes) -> list[bytes] | None:
    """The encoded values of an array entry (as `header_entries` gives it: key, then
    b"A" + length + values), each with its type tag; None if the value is no array."""
    pos = 1 + entry[0]
    if entry[pos:pos + 1] != b"A":
        return None
    pos += 5
    items = []
    while pos < len(entry):
        start = pos
        pos = _skip_value(entry, pos, len(entry))
        items.append(bytes(entry[start:pos]))
    return items


def table_items(value: bytes) -> list[tuple[bytes, bytes]] | None:
    """A table value's (key, encoded entry) pairs (value: b"F" + length + entries), in
    wire order with their exact encoding; None if the value is no table."""
    if value[:1] != b"F":
        return None
    return _table_entries(value, 1, len(value))


def encode_value(value: Any) -> bytes:
    """One typed value (tag included), in the types RabbitMQ writes (see _encode_value)."""
    return _encode_value(value)


def encode_array(items: list[bytes]) -> bytes:
    """b"A" + length + the encoded values, as they are."""
    data = b"".join(items)
    return b"A" + _U32.pack(len(data)) + data


def encode_entry(key: str, value: Any) -> bytes:
    """One encoded table entry, in the types RabbitMQ itself writes (see _encode_value)."""
    return _encode_entries({key: value})[0]


def properties_edit(raw: bytes, entries: list[bytes] | None = None,
                    drop: tuple[str, ...] = (),
                    set_short: dict[str, str] | None = None) -> bytes:
    """Raw properties with the headers table made of `entries` (encoded entries, as
    `header_entries` returns them; None keeps the table as it is) and without the
    properties named in `drop`. Every other byte is copied: the edits RabbitMQ makes
    (BCC removal, dead-lettering) change nothing else a consumer can see."""
    offsets = _offsets(raw)
    flags = _U16.unpack_from(raw, 0)[0]
    parts: list[bytes] = []
    for flag, name, _kind in _FIELDS:
        if name == "headers" and entries is not None:
            data = b"".join(entries)
            parts.append(_U32.pack(len(data)) + data)
            flags |= flag
        elif set_short and name in set_short:  # a shortstr property given a new value
            data = set_short[name].encode("utf-8")
            parts.append(bytes((len(data),)) + data)
            flags |= flag
        elif name in drop:
            flags &= ~flag
        elif name in offsets:
            start, end = offsets[name]
            parts.append(raw[start:end])
    return _U16.pack(flags) + b"".join(parts)
