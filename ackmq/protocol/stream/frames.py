"""Frames of RabbitMQ's stream protocol, sans-IO: bytes in, `Command`s out; bytes out
from plain arguments. Every request is described by a row of `REQUESTS` (its fields'
types, in wire order) and read by one table-driven reader; only Publish, the hot one,
has its own reader (`read_publish`, yielding raw entries without copying them twice).

A frame is `u32 size | u16 key | u16 version | content`. A frame whose size is above the
decoder's `max_frame` is refused with `FrameTooLarge` before its bytes are buffered; a
frame whose content does not parse as its key says is a `BadFrame` (the connection says
so and closes, as RabbitMQ's reader does); an unknown key is an `UnknownFrame` (answered
with `UNKNOWN_FRAME` when it carries a correlation id, then the connection is closed).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ackmq.protocol.stream import constants as K
from ackmq.protocol.wire import I32 as _I32
from ackmq.protocol.wire import I64 as _I64
from ackmq.protocol.wire import U16 as _U16
from ackmq.protocol.wire import U32 as _U32
from ackmq.protocol.wire import U64 as _U64

_HDR = struct.Struct(">IHH")  # size, key, version
MAX_ARRAY = 1 << 16  # array lengths above this in a request are hostile


class StreamFrameError(Exception):
    """Input that is not a frame of the protocol."""


class BadFrame(StreamFrameError):
    pass


class FrameTooLarge(StreamFrameError):
    pass


class UnknownFrame(StreamFrameError):
    def __init__(self, key: int, version: int, correlation_id: int | None) -> None:
        super().__init__(f"unknown command key 0x{key:04x} version {version}")
        self.key, self.version, self.correlation_id = key, version, correlation_id


@dataclass(slots=True)
class Command:
    """A decoded frame: its key (response bit included), version and fields by name."""

    key: int
    version: int
    fields: dict[str, Any]

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, key: int, version: int, fields: dict[str, Any]) -> None:
        self.key, self.version, self.fields = key, version, fields

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None


class Reader:
    """Bounds-checked reads from one frame's content."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def need(self, n: int) -> int:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise BadFrame("frame content too short")
        self.pos = p + n
        return p

    def u8(self) -> int:
        return self.data[self.need(1)]

    def u16(self) -> int:
        return int(_U16.unpack_from(self.data, self.need(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self.data, self.need(4))[0])

    def i32(self) -> int:
        return int(_I32.unpack_from(self.data, self.need(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self.data, self.need(8))[0])

    def i64(self) -> int:
        return int(_I64.unpack_from(self.data, self.need(8))[0])

    def string(self) -> str | None:
        n = _U16.unpack_from(self.data, self.need(2))[0]
        if n == 0xFFFF:  # int16 -1: null
            return None
        p = self.need(n)
        try:
            return bytes(self.data[p:p + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise BadFrame("a string that is not UTF-8") from None

    def bytes_(self) -> bytes | None:
        n = self.i32()
        if n == -1:
            return None
        p = self.need(n)
        return bytes(self.data[p:p + n])

    def count(self) -> int:
        n = self.i32()
        if n < 0 or n > MAX_ARRAY:
            raise BadFrame(f"array length {n}")
        return n

    def offset_spec(self) -> tuple[int, int]:
        kind = self.u16()
        if kind == K.OFFSET_OFFSET:
            return kind, self.u64()
        if kind == K.OFFSET_TIMESTAMP:
            return kind, self.i64()
        if kind in (K.OFFSET_FIRST, K.OFFSET_LAST, K.OFFSET_NEXT, K.OFFSET_NONE):
            return kind, 0
        raise BadFrame(f"offset type {kind}")

    def done(self) -> None:
        if self.pos != self.end:
            raise BadFrame(f"{self.end - self.pos} bytes past the command's fields")


# field types of the request table
U8, U16, U32, U64, I64, STR, BYTES = "u8", "u16", "u32", "u64", "i64", "str", "bytes"
STRS = "strs"        # [string]
PROPS = "props"      # [string string]: a map
VERSIONS = "versions"  # [u16 key, u16 min, u16 max]
OFFSET_SPEC = "offset_spec"  # u16 type (+ u64 offset | i64 timestamp)
OFFSET_SPEC8 = "offset_spec8"  # u16 type, then 8 bytes whatever the type (ConsumerUpdate)


def _read(r: Reader, t: str) -> Any:
    if t == U8:
        return r.u8()
    if t == U16:
        return r.u16()
    if t == U32:
        return r.u32()
    if t == U64:
        return r.u64()
    if t == I64:
        return r.i64()
    if t == STR:
        return r.string()
    if t == BYTES:
        return r.bytes_()
    if t == STRS:
        return [r.string() for _ in range(r.count())]
    if t == PROPS:
        out: dict[str, str | None] = {}
        for _ in range(r.count()):
            k = r.string()
            out[k or ""] = r.string()
        return out
    if t == VERSIONS:
        return [(r.u16(), r.u16(), r.u16()) for _ in range(r.count())]
    if t == OFFSET_SPEC:
        return r.offset_spec()
    if t == OFFSET_SPEC8:
        kind = r.u16()
        value = r.i64() if kind == K.OFFSET_TIMESTAMP else r.u64()
        return kind, value
    raise AssertionError(t)


_C = ("correlation_id", U32)
# (key, version) -> the fields, in wire order. Requests from a client, and the responses a
# client sends to the server's requests (tune, close, consumer update).
REQUESTS: dict[tuple[int, int], tuple[tuple[str, str], ...]] = {
    (K.DECLARE_PUBLISHER, 1): (_C, ("publisher_id", U8), ("reference", STR), ("stream", STR)),
    (K.QUERY_PUBLISHER_SEQUENCE, 1): (_C, ("reference", STR), ("stream", STR)),
    (K.DELETE_PUBLISHER, 1): (_C, ("publisher_id", U8)),
    (K.SUBSCRIBE, 1): (_C, ("subscription_id", U8), ("stream", STR), ("offset", OFFSET_SPEC),
                       ("credit", U16), ("properties", PROPS)),
    (K.CREDIT, 1): (("subscription_id", U8), ("credit", U16)),
    (K.STORE_OFFSET, 1): (("reference", STR), ("stream", STR), ("offset", U64)),
    (K.QUERY_OFFSET, 1): (_C, ("reference", STR), ("stream", STR)),
    (K.UNSUBSCRIBE, 1): (_C, ("subscription_id", U8)),
    (K.CREATE, 1): (_C, ("stream", STR), ("arguments", PROPS)),
    (K.DELETE, 1): (_C, ("stream", STR)),
    (K.METADATA, 1): (_C, ("streams", STRS)),
    (K.PEER_PROPERTIES, 1): (_C, ("properties", PROPS)),
    (K.SASL_HANDSHAKE, 1): (_C,),
    (K.SASL_AUTHENTICATE, 1): (_C, ("mechanism", STR), ("data", BYTES)),
    (K.TUNE, 1): (("frame_max", U32), ("heartbeat", U32)),
    (K.RESPONSE | K.TUNE, 1): (("frame_max", U32), ("heartbeat", U32)),
    (K.OPEN, 1): (_C, ("vhost", STR)),
    (K.CLOSE, 1): (_C, ("code", U16), ("reason", STR)),
    (K.RESPONSE | K.CLOSE, 1): (_C, ("code", U16)),
    (K.HEARTBEAT, 1): (),
    (K.ROUTE, 1): (_C, ("routing_key", STR), ("super_stream", STR)),
    (K.PARTITIONS, 1): (_C, ("super_stream", STR)),
    (K.RESPONSE | K.CONSUMER_UPDATE, 1): (_C, ("code", U16), ("offset", OFFSET_SPEC8)),
    (K.EXCHANGE_COMMAND_VERSIONS, 1): (_C, ("commands", VERSIONS)),
    (K.STREAM_STATS, 1): (_C, ("stream", STR)),
    (K.CREATE_SUPER_STREAM, 1): (_C, ("name", STR), ("partitions", STRS),
                                 ("binding_keys", STRS), ("arguments", PROPS)),
    (K.DELETE_SUPER_STREAM, 1): (_C, ("name", STR)),
    (K.RESOLVE_OFFSET_SPEC, 1): (_C, ("stream", STR), ("offset", OFFSET_SPEC),
                                 ("properties", PROPS)),
}
# keys whose requests carry a correlation id first (for UNKNOWN_FRAME's answer)
_CORRELATED = {k for (k, _v), f in REQUESTS.items() if f[:1] == (_C,)}


def decode_command(key: int, version: int, content: bytes | memoryview) -> Command:
    """One frame's content (after size, key and version) as a Command."""
    if key == K.PUBLISH and version in (1, 2):
        r = Reader(content)
        return Command(key, version, {"publisher_id": r.u8(), "content": content})
    spec = REQUESTS.get((key, version))
    if spec is None:
        corr = None
        if key in _CORRELATED and len(content) >= 4:
            corr = int(_U32.unpack_from(content, 0)[0])
        raise UnknownFrame(key, version, corr)
    r = Reader(content)
    fields = {name: _read(r, t) for name, t in spec}
    r.done()
    return Command(key, version, fields)


_ENTRY = struct.Struct(">QI")  # a simple entry's publishing id and size


def read_publish(content: bytes | memoryview, version: int
                 ) -> Iterator[tuple[int, str | None, int, bytes | memoryview]]:
    """A Publish's entries as (publishing id, filter value, entry type, data): entry type
    0 for one message (`data` its bytes), else a sub-entry batch's type byte (compression
    in bits 4-6) with `data` the batch's bytes; read `subentries` on it."""
    r = Reader(content, 1)  # past the publisher id
    n = r.count()
    end = r.end
    view = memoryview(content)  # the usual entry's data: a view, copied once by its reader
    for _ in range(n):
        pos = r.pos
        if version == 1 and pos + 12 <= end:  # the usual entry, read in one go
            pid, size = _ENTRY.unpack_from(content, pos)
            if not size & 0x80000000 and pos + 12 + size <= end:
                r.pos = pos = pos + 12 + size
                yield pid, None, 0, view[pos - size:pos]
                continue
        pid = r.u64()
        fv = r.string() if version == 2 else None
        p = r.need(1)
        first = content[p]
        r.pos = p
        if first & K.SUBENTRY_FLAG:
            r.pos += 1
            count = r.u16()
            _uncompressed = r.u32()
            size = r.u32()
            p = r.need(size)
            yield pid, fv, (first << 16) | count, content[p:p + size]
        else:
            size = r.u32()
            p = r.need(size)
            yield pid, fv, 0, content[p:p + size]
    r.done()


def subentries(kind: int, data: bytes | memoryview, max_size: int) -> list[bytes]:
    """The messages of a sub-entry batch (`kind` as `read_publish` gives it): uncompressed
    or gzip (the two every client can send); others raise BadFrame. `max_size` bounds
    what a gzip batch may inflate to."""
    compression = (kind >> 20) & 0x7
    count = kind & 0xFFFF
    if compression == K.COMPRESSION_GZIP:
        import zlib
        d = zlib.decompressobj(wbits=31)
        try:
            raw: bytes | memoryview = d.decompress(bytes(data), max_size + 1)
        except zlib.error as e:
            raise BadFrame(f"sub-entry batch: {e}") from None
        if len(raw) > max_size:
            raise BadFrame("sub-entry batch inflates past the frame limit")
    elif compression == K.COMPRESSION_NONE:
        raw = data
    else:
        raise BadFrame(f"sub-entry compression {compression} is not supported")
    r = Reader(raw)
    out = []
    for _ in range(count):
        size = r.u32()
        p = r.need(size)
        out.append(bytes(raw[p:p + size]))
    return out


class Decoder:
    """Bytes from the socket -> Commands. `max_frame` bounds one frame's size (the
    low ceiling before open, the tuned one after).

    A frame's bytes are copied at most once here: a frame within one read is parsed
    from the read itself (a Publish's content a view of it: its reader copies each
    message once), and a frame the reads cut is kept as views of those reads until it
    is whole, then joined once (growing a buffer read by read copied it again at every
    reallocation). The reads must not change after `feed` (bytes do not)."""

    def __init__(self, max_frame: int = 8192) -> None:
        self.max_frame = max_frame
        self._parts: list[bytes | memoryview] = []  # the cut frame's bytes so far
        self._have = 0  # their length

    def _size(self, size: int) -> int:
        if self.max_frame and size > self.max_frame:
            raise FrameTooLarge(f"frame of {size} bytes above the limit {self.max_frame}")
        if size < 4:
            raise BadFrame(f"frame size {size}")
        return size

    def feed(self, data: bytes) -> list[Command]:
        """The whole frames read so far; a bad one raises (`.commands` carries those
        decoded before it)."""
        out: list[Command] = []
        view = memoryview(data)
        try:
            parts = self._parts
            if parts:  # first the frame an earlier read began
                if self._have < 4:  # its size is not all there yet
                    take = min(4 - self._have, len(view))
                    parts.append(view[:take])
                    view = view[take:]
                    self._have += take
                    if self._have < 4:
                        return out
                    parts[:] = [b"".join(parts)]
                need = 4 + self._size(int(_U32.unpack_from(parts[0], 0)[0])) - self._have
                if len(view) < need:
                    parts.append(view)
                    self._have += len(view)
                    return out
                parts.append(view[:need])
                view = view[need:]
                whole = memoryview(b"".join(parts))
                self._parts, self._have = [], 0
                _s, key, version = _HDR.unpack_from(whole, 0)
                out.append(decode_command(key, version, whole[8:] if key == K.PUBLISH
                                          else whole[8:].tobytes()))
            pos, n = 0, len(view)
            while n - pos >= 4:
                size = self._size(int(_U32.unpack_from(view, pos)[0]))
                if n - pos - 4 < size:
                    break
                _s, key, version = _HDR.unpack_from(view, pos)
                content = view[pos + 8:pos + 4 + size]
                pos += 4 + size
                out.append(decode_command(key, version, content if key == K.PUBLISH
                                          else content.tobytes()))
            if pos < n:
                self._parts, self._have = [view[pos:]], n - pos
        except StreamFrameError as e:
            self._parts, self._have = [], 0
            e.commands = out  # type: ignore[attr-defined]
            raise
        return out


# -- encoding (server -> client) ------------------------------------------------------------
def _str(s: str | None) -> bytes:
    if s is None:
        return b"\xff\xff"
    b = s.encode("utf-8")
    return _U16.pack(len(b)) + b


def _props(d: dict[str, str]) -> bytes:
    return _I32.pack(len(d)) + b"".join(_str(k) + _str(v) for k, v in d.items())


def frame(key: int, version: int, body: bytes) -> bytes:
    return _HDR.pack(len(body) + 4, key, version) + body


def response(key: int, correlation_id: int, code: int, extra: bytes = b"") -> bytes:
    """The response to a request: its key with the response bit, version 1."""
    return frame(K.RESPONSE | key, 1, _U32.pack(correlation_id) + _U16.pack(code) + extra)


def peer_properties_response(correlation_id: int, props: dict[str, str]) -> bytes:
    return response(K.PEER_PROPERTIES, correlation_id, K.OK, _props(props))


def sasl_handshake_response(correlation_id: int, mechanisms: list[str]) -> bytes:
    return response(K.SASL_HANDSHAKE, correlation_id, K.OK,
                    _I32.pack(len(mechanisms)) + b"".join(_str(m) for m in mechanisms))


def sasl_authenticate_response(correlation_id: int, code: int) -> bytes:
    return response(K.SASL_AUTHENTICATE, correlation_id, code)


def tune(frame_max: int, heartbeat: int) -> bytes:
    return frame(K.TUNE, 1, _U32.pack(frame_max) + _U32.pack(heartbeat))


def open_response(correlation_id: int, code: int, props: dict[str, str] | None) -> bytes:
    return response(K.OPEN, correlation_id, code, _props(props) if props is not None else b"")


def close_request(correlation_id: int, code: int, reason: str) -> bytes:
    return frame(K.CLOSE, 1, _U32.pack(correlation_id) + _U16.pack(code) + _str(reason))


def heartbeat() -> bytes:
    return frame(K.HEARTBEAT, 1, b"")


def metadata_response(correlation_id: int, brokers: list[tuple[int, str, int]],
                      streams: list[tuple[str, int, int, list[int]]]) -> bytes:
    """brokers: (reference, host, port); streams: (name, code, leader, replicas);
    a stream that does not exist has leader 0xFFFF (RabbitMQ: -1 as uint16)."""
    body = [_U32.pack(correlation_id), _I32.pack(len(brokers))]
    for ref, host, port in brokers:
        body += [_U16.pack(ref), _str(host), _U32.pack(port)]
    body.append(_I32.pack(len(streams)))
    for name, code, leader, replicas in streams:
        body += [_str(name), _U16.pack(code), _U16.pack(leader), _I32.pack(len(replicas))]
        body += [_U16.pack(r) for r in replicas]
    return frame(K.RESPONSE | K.METADATA, 1, b"".join(body))


def metadata_update(code: int, stream: str) -> bytes:
    return frame(K.METADATA_UPDATE, 1, _U16.pack(code) + _str(stream))


def publish_confirm(publisher_id: int, ids: list[int]) -> bytes:
    return frame(K.PUBLISH_CONFIRM, 1, bytes((publisher_id,)) + _I32.pack(len(ids))
                 + struct.pack(f">{len(ids)}Q", *ids))


def publish_error(publisher_id: int, errors: list[tuple[int, int]]) -> bytes:
    return frame(K.PUBLISH_ERROR, 1, bytes((publisher_id,)) + _I32.pack(len(errors))
                 + b"".join(_U64.pack(i) + _U16.pack(c) for i, c in errors))


def u64_response(key: int, correlation_id: int, code: int, value: int) -> bytes:
    """QueryPublisherSequence's and QueryOffset's response."""
    return response(key, correlation_id, code, _U64.pack(value))


def answer_code(data: bytes) -> int | None:
    """The response code of one of the server's answers (`data` as written: size first),
    or None for a frame that carries none (not an answer, Metadata's answer)."""
    if len(data) < 10:
        return None
    key = _U16.unpack_from(data, 4)[0]
    if key == K.RESPONSE | K.CREDIT:
        return int(_U16.unpack_from(data, 8)[0])
    if not key & K.RESPONSE or key == K.RESPONSE | K.METADATA or len(data) < 14:
        return None
    return int(_U16.unpack_from(data, 12)[0])


def credit_response(code: int, subscription_id: int) -> bytes:
    return frame(K.RESPONSE | K.CREDIT, 1, _U16.pack(code) + bytes((subscription_id,)))


def strings_response(key: int, correlation_id: int, code: int, items: list[str]) -> bytes:
    """Route's and Partitions' response."""
    return response(key, correlation_id, code,
                    _I32.pack(len(items)) + b"".join(_str(s) for s in items))


def stats_response(correlation_id: int, code: int, stats: dict[str, int]) -> bytes:
    return response(K.STREAM_STATS, correlation_id, code, _I32.pack(len(stats)) + b"".join(
        _str(k) + _I64.pack(v) for k, v in stats.items()))


def command_versions_response(correlation_id: int,
                              versions: list[tuple[int, int, int]]) -> bytes:
    return response(K.EXCHANGE_COMMAND_VERSIONS, correlation_id, K.OK, _I32.pack(
        len(versions)) + b"".join(_U16.pack(k) + _U16.pack(a) + _U16.pack(b)
                                  for k, a, b in versions))


def consumer_update(correlation_id: int, subscription_id: int, active: bool) -> bytes:
    return frame(K.CONSUMER_UPDATE, 1, _U32.pack(correlation_id)
                 + bytes((subscription_id, 1 if active else 0)))


def offset_spec_response(correlation_id: int, code: int, offset: int) -> bytes:
    return response(K.RESOLVE_OFFSET_SPEC, correlation_id, code,
                    _U16.pack(K.OFFSET_OFFSET) + _U64.pack(offset))
