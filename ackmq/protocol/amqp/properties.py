"""basic content-header properties kept as raw bytes: the flag table, peeks and splices.

Why raw: the broker stores and forwards a publisher's property bytes untouched (no
re-encoding cost, no type drift in header tables). It only needs to peek at a few fields
(delivery-mode, priority, expiration, headers) and, for dead-lettering, add header
entries; both are done here without decoding or re-encoding the other fields. The
field-table codec (headers) is table.py; this module holds the property list around it,
and it is the one place that knows the flag bits (FIELDS).

Every walk of the list is derived from FIELDS: the general ones loop over it (`spans`,
`read_into`, `encode_fields`, `properties_edit`); the ones every message pays for
(`check_properties`, `peek_routing_fields`, `properties_with_header`, the client's
`encode_basic_properties`) are generated from it at import as the straight-line code one
would write by hand (`walk_source`), so they cost no more than that code did.

Raw layout: 16-bit property flags, then each present property in flag order
(content-type, content-encoding, headers, delivery-mode, priority, correlation-id,
reply-to, expiration, message-id, timestamp, type, user-id, app-id, cluster-id).
"""

from __future__ import annotations

import datetime
import linecache
import struct
from collections.abc import Callable, Iterator
from typing import Any, Final

from pamqp import commands

from ackmq.protocol.amqp.table import MAX_TABLE_DEPTH as MAX_TABLE_DEPTH  # tests import it here
from ackmq.protocol.amqp.table import (
    encode_entries,
    find_value,
    read_table,
    read_timestamp,
    read_value,
    skip_table,
    table_entries,
)

EMPTY_PROPERTIES = b"\x00\x00"

# The one flag table of the basic properties: (flag bit, pamqp attribute name, wire kind),
# in wire order. RabbitMQ's names differ only in `type` (property_names.py).
SHORTSTR, TABLE, OCTET, TIMESTAMP = 0, 1, 2, 3
FIELDS: tuple[tuple[int, str, int], ...] = (
    (0x8000, "content_type", SHORTSTR),
    (0x4000, "content_encoding", SHORTSTR),
    (0x2000, "headers", TABLE),
    (0x1000, "delivery_mode", OCTET),
    (0x0800, "priority", OCTET),
    (0x0400, "correlation_id", SHORTSTR),
    (0x0200, "reply_to", SHORTSTR),
    (0x0100, "expiration", SHORTSTR),
    (0x0080, "message_id", SHORTSTR),
    (0x0040, "timestamp", TIMESTAMP),
    (0x0020, "message_type", SHORTSTR),
    (0x0010, "user_id", SHORTSTR),
    (0x0008, "app_id", SHORTSTR),
    (0x0004, "cluster_id", SHORTSTR),
)
_FIELDS = FIELDS  # the name tests/test_decoder_hostile.py knows
FLAGS: dict[str, int] = {name: flag for flag, name, _kind in FIELDS}
"""Flag bit by pamqp property name."""
_FLAG_HEADERS = FLAGS["headers"]


def has_headers(raw: bytes) -> bool:
    """Whether raw (checked) properties carry a headers table: a header's name can
    appear in them only then."""
    return bool(raw[0] & (_FLAG_HEADERS >> 8))


_UNKNOWN_FLAGS = 0x0003  # bit 1 unused; bit 0 = continuation word (RabbitMQ rejects it)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def spans(raw: bytes) -> Iterator[tuple[int, str, int, int, int]]:
    """(flag, name, kind, start, end) of each present property, in wire order, checked
    for truncation and unknown flags: the general walk (the hot ones are generated)."""
    flags = _U16.unpack_from(raw, 0)[0]
    if flags & _UNKNOWN_FLAGS:
        raise ValueError(f"unsupported property flags 0x{flags:04x}")
    pos = 2
    for flag, name, kind in FIELDS:
        if flags & flag:
            start = pos
            if kind == SHORTSTR:
                pos += 1 + raw[pos]
            elif kind == OCTET:
                pos += 1
            elif kind == TIMESTAMP:
                pos += 8
            else:
                pos = skip_table(raw, pos)
            if pos > len(raw):
                raise ValueError(f"property {name} truncated")
            yield flag, name, kind, start, pos
    if pos != len(raw):
        raise ValueError("trailing bytes after the property list")


def _offsets(raw: bytes) -> dict[str, tuple[int, int]]:
    """Map present property name -> (start, end) of its encoded value in `raw`."""
    return {name: (start, end) for _flag, name, _kind, start, end in spans(raw)}


# ---------------------------------------------------------------- generated walks

# how a walk steps over one property: checked (a table is parsed, as the decoder must)
# or trusting properties already checked (a table's length is read)
_STEP = {SHORTSTR: "pos += 1 + raw[pos]", OCTET: "pos += 1", TIMESTAMP: "pos += 8",
         TABLE: "pos = skip_table(raw, pos)"}
_STEP_TRUSTED = {**_STEP, TABLE: "pos += 4 + ((raw[pos] << 24) | (raw[pos + 1] << 16)"
                                 " | (raw[pos + 2] << 8) | raw[pos + 3])"}


def walk_source(until: str | None = None, trusted: bool = True, indent: int = 4) -> str:
    """Straight-line code advancing `pos` over each present property (`flags` holds the
    property flags) in FIELDS' order, up to `until` (excluded) or over all."""
    step = _STEP_TRUSTED if trusted else _STEP
    pad = " " * indent
    out = []
    for flag, name, kind in FIELDS:
        if name == until:
            break
        out.append(f"{pad}if flags & 0x{flag:04x}:\n{pad}    {step[kind]}\n")
    return "".join(out)


def generate(name: str, source: str, env: dict[str, Any]) -> Any:
    """Define function `name` from generated `source` (kept in linecache, so tracebacks
    and inspect show it)."""
    filename = f"<generated {__name__}.{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), env, namespace)
    return namespace[name]


check_properties: Callable[[bytes], None] = generate("check_properties", f"""\
def check_properties(raw):
    flags = (raw[0] << 8) | raw[1]
    pos = 2
    if flags:
        if flags & 0x{_UNKNOWN_FLAGS:04x}:
            raise ValueError(f"unsupported property flags 0x{{flags:04x}}")
{walk_source(trusted=False, indent=8)}\
    if pos != len(raw):
        raise ValueError("property list length does not match the content header")
""", {"skip_table": skip_table})
check_properties.__doc__ = """Validate the structure of raw property bytes (the decoder
calls this per message). Raises ValueError/IndexError/struct.error on anything RabbitMQ
could not decode."""


_DELIVERY_MODE: Final = FLAGS["delivery_mode"]
_PRIORITY: Final = FLAGS["priority"]
_EXPIRATION: Final = FLAGS["expiration"]
_BEFORE_MODE: Final = (FLAGS["content_type"], FLAGS["content_encoding"])  # shortstrs
_BETWEEN: Final = (FLAGS["correlation_id"], FLAGS["reply_to"])  # shortstrs, before expiration


def peek_routing_fields(raw: bytes) -> tuple[int | None, int | None, str | None]:
    """(delivery-mode, priority, expiration) in one pass: what the broker needs of every
    message. Assumes `raw` passed `check_properties` (the decoder checks each message).
    Written out, not generated as the walks above are (every message runs it, and a
    generated function stays interpreted in the compiled build); it follows FIELDS'
    order, and tests/test_property_layout.py checks it against pamqp."""
    flags: int = (raw[0] << 8) | raw[1]
    if not flags & (_DELIVERY_MODE | _PRIORITY | _EXPIRATION):
        return None, None, None
    pos: int = 2
    for flag in _BEFORE_MODE:
        if flags & flag:
            pos += 1 + raw[pos]
    if flags & _FLAG_HEADERS:
        pos += 4 + _U32.unpack_from(raw, pos)[0]
    mode: int | None = None
    priority: int | None = None
    if flags & _DELIVERY_MODE:
        mode = raw[pos]
        pos += 1
    if flags & _PRIORITY:
        priority = raw[pos]
        pos += 1
    if not flags & _EXPIRATION:
        return mode, priority, None
    for flag in _BETWEEN:
        if flags & flag:
            pos += 1 + raw[pos]
    n = raw[pos]
    return mode, priority, bytes(raw[pos + 1:pos + 1 + n]).decode("utf-8", "replace")


def _read_field(raw: bytes, start: int, end: int, kind: int) -> Any:
    """One property's value, read leniently: every accepted message reads."""
    if kind == SHORTSTR:  # RabbitMQ takes any octets in a shortstr: lossless, never raises
        return bytes(raw[start + 1 : end]).decode("utf-8", "surrogateescape")
    if kind == OCTET:
        return raw[start]
    if kind == TIMESTAMP:
        return read_timestamp(_U64.unpack_from(raw, start)[0], lenient=True)
    return read_table(raw, start, lenient=True)[0]


def read_plan(names: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    """For read_into: (flag, kind, index in `names` or -1) per property, in wire order;
    `names` are pamqp's (property_names.py maps RabbitMQ's)."""
    return tuple((flag, kind, names.index(name) if name in names else -1)
                 for flag, name, kind in FIELDS)


def read_into(raw: bytes, plan: tuple[tuple[int, int, int], ...], out: list[Any]) -> list[Any]:
    """Decode the present properties that `plan` (read_plan) wants into their slots of
    `out`, in one pass, leniently as PropertiesView reads them; returns `out`. For
    readers that want many fields of every message (Spark's rows): no dict, no view.
    `raw` is not re-checked."""
    flags = (raw[0] << 8) | raw[1]
    if not flags:
        return out
    pos = 2
    for flag, kind, slot in plan:
        if not flags & flag:
            continue
        if kind == SHORTSTR:
            end = pos + 1 + raw[pos]
            if slot >= 0:
                out[slot] = bytes(raw[pos + 1 : end]).decode("utf-8", "surrogateescape")
            pos = end
        elif kind == OCTET:
            if slot >= 0:
                out[slot] = raw[pos]
            pos += 1
        elif kind == TIMESTAMP:
            if slot >= 0:
                out[slot] = read_timestamp(_U64.unpack_from(raw, pos)[0], lenient=True)
            pos += 8
        elif slot >= 0:
            out[slot], pos = read_table(raw, pos, lenient=True)
        else:
            pos = skip_table(raw, pos)
    return out



_KINDS = {name: kind for _flag, name, kind in FIELDS}


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
            value = _read_field(self.raw, span[0], span[1], _KINDS[name])
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

    # One read-only property per entry of FIELDS, in wire order (tests check they match);
    # declared rather than generated so that readers are type-checked.

    @property
    def content_type(self) -> str | None:
        """basic.properties content_type"""
        return self._get("content_type")

    @property
    def content_encoding(self) -> str | None:
        """basic.properties content_encoding"""
        return self._get("content_encoding")

    @property
    def headers(self) -> dict[str, Any]:
        """basic.properties headers ({} when absent)"""
        return self._get("headers")

    @property
    def delivery_mode(self) -> int | None:
        """basic.properties delivery_mode"""
        return self._get("delivery_mode")

    @property
    def priority(self) -> int | None:
        """basic.properties priority"""
        return self._get("priority")

    @property
    def correlation_id(self) -> str | None:
        """basic.properties correlation_id"""
        return self._get("correlation_id")

    @property
    def reply_to(self) -> str | None:
        """basic.properties reply_to"""
        return self._get("reply_to")

    @property
    def expiration(self) -> str | None:
        """basic.properties expiration"""
        return self._get("expiration")

    @property
    def message_id(self) -> str | None:
        """basic.properties message_id"""
        return self._get("message_id")

    @property
    def timestamp(self) -> datetime.datetime | int | None:
        """basic.properties timestamp"""
        return self._get("timestamp")

    @property
    def message_type(self) -> str | None:
        """basic.properties message_type"""
        return self._get("message_type")

    @property
    def user_id(self) -> str | None:
        """basic.properties user_id"""
        return self._get("user_id")

    @property
    def app_id(self) -> str | None:
        """basic.properties app_id"""
        return self._get("app_id")

    @property
    def cluster_id(self) -> str | None:
        """basic.properties cluster_id"""
        return self._get("cluster_id")


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


def encode_fields(values: dict[str, Any]) -> bytes:
    """Raw property bytes for `values` by pamqp name (None: absent), without a pamqp
    object: shortstrs from str (ValueError past 255 bytes), octets from int, the
    timestamp from an int (seconds), headers from a dict (table.encode_table)."""
    flags = 0
    parts: list[bytes] = []
    for flag, name, kind in FIELDS:
        v = values.get(name)
        if v is None:
            continue
        flags |= flag
        if kind == SHORTSTR:
            data = v.encode("utf-8")
            if len(data) > 255:
                raise ValueError(f"property {name} longer than 255 bytes")
            parts.append(bytes((len(data),)) + data)
        elif kind == OCTET:
            parts.append(bytes((v,)))
        elif kind == TIMESTAMP:
            parts.append(_U64.pack(v))
        else:
            data = b"".join(encode_entries(v))
            parts.append(_U32.pack(len(data)) + data)
    return _U16.pack(flags) + b"".join(parts)


# ---------------------------------------------------------------- peeks into headers

_headers_at: Callable[[bytes], int | None] = generate("_headers_at", f"""\
def _headers_at(raw):
    flags = (raw[0] << 8) | raw[1]
    if not flags & 0x{_FLAG_HEADERS:04x}:
        return None
    pos = 2
{walk_source(until="headers")}\
    return pos
""", {})
_headers_at.__doc__ = "Offset of the headers table in checked properties, or None."


def header_value(raw: bytes, key: str) -> Any:
    """The value of header `key` (the first such entry), decoded leniently as
    PropertiesView.headers has it, or None when there is none; decodes nothing else.
    `raw` must be checked properties (as every message's are)."""
    pos = _headers_at(raw)
    if pos is None:
        return None
    at = find_value(raw, pos, key.encode("utf-8", "surrogateescape"))
    if at is None:
        return None
    end = pos + 4 + _U32.unpack_from(raw, pos)[0]
    return read_value(raw, at, end, 1, lenient=True)[0]


# ---------------------------------------------------------------- header splices

def properties_with_headers(raw: bytes, extra: dict[str, Any]) -> bytes:
    """Raw properties whose headers table has `extra` merged in (extra wins on a clash).

    The bytes before the headers (flags, content-type, content-encoding) and after it
    are copied as they are; existing header entries keep their original encoding.
    """
    if not extra:
        return raw
    offsets = _offsets(raw)
    flags = _U16.unpack_from(raw, 0)[0]
    new_entries = encode_entries(extra)
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
    kept = [entry for key, entry in table_entries(raw, start, end) if key not in replaced]
    data = b"".join(kept + new_entries)
    return b"".join((raw[:start], _U32.pack(len(data)), data, raw[end:]))


_ONE_LONG: dict[str, tuple[Any, int, int, bytes]] = {}


def _one_long_table(key: str) -> tuple[Any, int, int, bytes]:
    """(pack, entry size, key length, key bytes): packing a headers table of the one entry
    `key` = 'l' value; made once per key (there are a handful: seq, stream offset)."""
    name = key.encode("utf-8")
    if len(name) > 255:
        raise ValueError(f"field-table key longer than 255 bytes: {key[:40]!r}")
    s = struct.Struct(f">IB{len(name)}scq")
    _ONE_LONG[key] = found = (s.pack, s.size - 4, len(name), name)
    return found


properties_with_header: Callable[[bytes, str, Any], bytes] = generate(
    "properties_with_header", f"""\
def properties_with_header(raw, key, value):
    flags = (raw[0] << 8) | raw[1]
    if flags & 0x{_FLAG_HEADERS:04x} or value.__class__ is not int:
        return properties_with_headers(raw, {{key: value}})
    pos = 2
{walk_source(until="headers")}\
    try:
        pack, size, klen, name = _ONE_LONG[key]
    except KeyError:
        pack, size, klen, name = _one_long_table(key)
    return b"".join((_U16.pack(flags | 0x{_FLAG_HEADERS:04x}), raw[2:pos],
                     pack(size, klen, name, b"l", value), raw[pos:]))
""", {"properties_with_headers": properties_with_headers, "_ONE_LONG": _ONE_LONG,
      "_one_long_table": _one_long_table, "_U16": _U16})
properties_with_header.__doc__ = """`properties_with_headers(raw, {key: value})`, fast for
the common case of an integer added to a message without headers (one splice, no parse of
the property list): every delivery pays for this (x-ackmq-seq, x-stream-offset), so it is
straight-line code (generated) and tested against the general function."""


# ---------------------------------------------------------------- edits as splices

def header_entries(raw: bytes) -> list[tuple[bytes, bytes]]:
    """The headers table's entries as (key, encoded entry) pairs, in wire order; [] when
    there is no headers table. Entries keep their exact encoding (types included)."""
    span = _offsets(raw).get("headers")
    return [] if span is None else table_entries(raw, *span)


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
    for flag, name, _kind in FIELDS:
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
