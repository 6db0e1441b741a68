"""AMQP 0-9-1 field tables: read, skip, find, encode (the codec half of the property
grammar, as pamqp splits `decode`/`encode` from `commands.Basic.Properties`).

Why our own and not pamqp's: reading is bounded (MAX_TABLE_DEPTH, every length inside
its container, as RabbitMQ parses) and raises ValueError on malformed input, never
RecursionError, OverflowError or OSError; skipping and finding step over entries without
decoding them (the broker keeps tables as raw bytes); encoding writes the types RabbitMQ
itself writes (integers as 'l', floats as 'd', text as 'S'). Decoded values have pamqp
4's types, so tests compare with pamqp directly (tests/test_amqp_table.py).
"""

from __future__ import annotations

import calendar
import datetime
import decimal
import struct
import time
from typing import Any

from ackmq.protocol.wire import U32 as _U32
from ackmq.protocol.wire import U64 as _U64

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


# Value sizes after the type tag, for the kinds of fixed width (RabbitMQ's table types);
# S x A F are a 32-bit length and that many bytes.
FIXED_SIZES: dict[int, int] = {
    0x74: 1, 0x62: 1, 0x42: 1,  # t b B
    0x73: 2, 0x75: 2,  # s u
    0x49: 4, 0x69: 4, 0x66: 4,  # I i f
    0x6C: 8, 0x4C: 8, 0x64: 8, 0x54: 8,  # l L d T
    0x44: 5,  # D: scale octet + int32
    0x56: 0,  # V
}
_SIZED = frozenset(b"SxAF")


# ---------------------------------------------------------------- structural walk

def skip_table(raw: bytes, pos: int, depth: int = 1) -> int:
    """Return the offset after the field table at `pos` (at nesting level `depth`);
    ValueError if malformed, TableTooDeep past MAX_TABLE_DEPTH."""
    if depth > MAX_TABLE_DEPTH:
        raise TableTooDeep()
    (length,) = _U32.unpack_from(raw, pos)
    pos += 4
    end = pos + length
    if end > len(raw):
        raise ValueError("field table longer than its container")
    fixed = FIXED_SIZES.get
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
            pos = skip_value(raw, pos, end, depth)
    if pos != end:
        raise ValueError("field table entries overrun its length")
    return end


def skip_value(raw: bytes, pos: int, end: int, depth: int = 1) -> int:
    """Offset after the field value at `pos`, held by a container at level `depth`."""
    tag = raw[pos]
    pos += 1
    size = FIXED_SIZES.get(tag)
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
                inner = skip_value(raw, inner, inner_end, depth + 1)
            if inner != inner_end:
                raise ValueError("field array entries overrun its length")
        pos += 4 + length
    elif tag == 0x46:  # F
        pos = skip_table(raw, pos, depth + 1)
    else:
        raise ValueError(f"unknown field-table type {chr(tag)!r}")
    if pos > end:
        raise ValueError("field value overruns its container")
    return pos


def find_value(raw: bytes, pos: int, key: bytes) -> int | None:
    """Offset of the value (its type tag) of the first entry named `key` in the field
    table at `pos`, or None when there is none. Steps over the other entries by their
    sizes without decoding them, so `raw` must be a checked table (one the decoder
    accepted); anything else may raise ValueError or IndexError."""
    (length,) = _U32.unpack_from(raw, pos)
    pos += 4
    end = pos + length
    fixed = FIXED_SIZES.get
    while pos < end:
        klen = raw[pos]
        vpos = pos + 1 + klen
        if raw[pos + 1:vpos] == key:
            return vpos
        tag = raw[vpos]
        size = fixed(tag)
        if size is None:
            if tag not in _SIZED:
                raise ValueError(f"unknown field-table type {chr(tag)!r}")
            size = 4 + _U32.unpack_from(raw, vpos + 1)[0]
        pos = vpos + 1 + size
    return None


def table_entries(raw: bytes, start: int, end: int) -> list[tuple[bytes, bytes]]:
    """Split the encoded table at `start` (length prefix) ending at `end` into
    (key bytes, raw entry bytes) pairs, in wire order with their exact encoding."""
    entries = []
    pos = start + 4
    while pos < end:
        entry_start = pos
        key_end = pos + 1 + raw[pos]
        key = bytes(raw[pos + 1 : key_end])
        pos = skip_value(raw, key_end, end)
        entries.append((key, bytes(raw[entry_start:pos])))
    return entries


def array_items(entry: bytes) -> list[bytes] | None:
    """The encoded values of an array entry (key, then b"A" + length + values), each
    with its type tag; None if the value is no array."""
    pos = 1 + entry[0]
    if entry[pos:pos + 1] != b"A":
        return None
    pos += 5
    items = []
    while pos < len(entry):
        start = pos
        pos = skip_value(entry, pos, len(entry))
        items.append(bytes(entry[start:pos]))
    return items


def table_items(value: bytes) -> list[tuple[bytes, bytes]] | None:
    """A table value's (key, encoded entry) pairs (value: b"F" + length + entries), in
    wire order with their exact encoding; None if the value is no table."""
    if value[:1] != b"F":
        return None
    return table_entries(value, 1, len(value))


# ---------------------------------------------------------------- decoding

# Values come out as pamqp 4 decodes them (the types the broker and its tests already
# handle); on malformed input this raises ValueError (IndexError / struct.error when
# truncated; decode_table turns those into ValueError).
_S8, _S16, _U16V, _S32, _U32V = (struct.Struct(f) for f in (">b", ">h", ">H", ">i", ">I"))
_S64, _F32, _F64, _DEC = (struct.Struct(f) for f in (">q", ">f", ">d", ">Bi"))
_SCALAR: dict[int, struct.Struct] = {
    0x62: _S8, 0x73: _S16, 0x75: _U16V, 0x49: _S32, 0x69: _U32V,  # b s u I i
    0x6C: _S64, 0x4C: _S64, 0x66: _F32, 0x64: _F64,  # l L f d
}


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
        table[key], pos = read_value(raw, key_end, end, depth, lenient)
    return table, end


def read_value(raw: bytes, pos: int, end: int, depth: int = 1,
               lenient: bool = False) -> tuple[Any, int]:
    """(value, offset after it) for the field value at `pos` (its type tag) inside a
    level-`depth` container ending at `end`."""
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
            item, pos = read_value(raw, pos, inner_end, depth + 1, lenient)
            value.append(item)
    elif tag == 0x54:  # T
        (stamp,) = _U64.unpack_from(raw, pos)
        pos += 8
        value = read_timestamp(stamp, lenient, millis=True)
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


def read_timestamp(stamp: int, lenient: bool, millis: bool = False) -> datetime.datetime | int:
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


# ---------------------------------------------------------------- encoding

_LONG = struct.Struct(">cq")
_DOUBLE = struct.Struct(">cd")


def encode_value(value: Any) -> bytes:
    """One typed field value (tag included), with the types RabbitMQ itself emits (e.g.
    in x-death): integers as signed 64-bit 'l', floats as 'd', text as 'S'."""
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return _LONG.pack(b"l", value)
    if isinstance(value, float):
        return _DOUBLE.pack(b"d", value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return b"S" + _U32.pack(len(data)) + data
    if isinstance(value, bytes | bytearray):
        return b"x" + _U32.pack(len(value)) + bytes(value)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list | tuple):
        data = b"".join(encode_value(item) for item in value)
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


def encode_key(key: str) -> bytes:
    """A table key as its shortstr (length octet + UTF-8)."""
    name = key.encode("utf-8")
    if len(name) > 255:
        raise ValueError(f"field-table key longer than 255 bytes: {key[:40]!r}")
    return bytes((len(name),)) + name


def encode_entry(key: str, value: Any) -> bytes:
    """One encoded table entry (key, then typed value; see encode_value)."""
    return encode_key(key) + encode_value(value)


def encode_entries(table: dict[str, Any]) -> list[bytes]:
    """The encoded entries of `table`, in insertion order."""
    return [encode_key(key) + encode_value(value) for key, value in table.items()]


def encode_table(table: dict[str, Any]) -> bytes:
    """AMQP field table (32-bit length prefix included), keys in insertion order."""
    data = b"".join(encode_entries(table))
    return _U32.pack(len(data)) + data


def encode_array(items: list[bytes]) -> bytes:
    """b"A" + length + the encoded values, as they are."""
    data = b"".join(items)
    return b"A" + _U32.pack(len(data)) + data
