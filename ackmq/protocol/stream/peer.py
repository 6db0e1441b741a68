"""The client's side of RabbitMQ's stream protocol, sans-IO: requests encoded from the same
table the server decodes them by (`frames.REQUESTS`), and what a server sends decoded:
responses (correlation id, code, the rest), Tune, Heartbeat, Close, Deliver (a chunk),
MetadataUpdate, a Credit's error. For readers of a stream (the Spark source's executors)
that want no client library in the hot loop: a Deliver's chunk is read by
`chunk.read_chunk`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream.frames import (
    BYTES,
    I64,
    OFFSET_SPEC,
    PROPS,
    REQUESTS,
    STR,
    STRS,
    U8,
    U16,
    U32,
    U64,
    BadFrame,
    Reader,
    frame,
)
from ackmq.protocol.wire import I32 as _I32
from ackmq.protocol.wire import I64 as _I64
from ackmq.protocol.wire import U16 as _U16
from ackmq.protocol.wire import U32 as _U32
from ackmq.protocol.wire import U64 as _U64


def _str(s: str | None) -> bytes:
    if s is None:
        return b"\xff\xff"
    b = s.encode("utf-8")
    return _U16.pack(len(b)) + b


def _write(t: str, v: Any) -> bytes:
    if t == U8:
        return bytes((v,))
    if t == U16:
        return _U16.pack(v)
    if t == U32:
        return _U32.pack(v)
    if t == U64:
        return _U64.pack(v)
    if t == I64:
        return _I64.pack(v)
    if t == STR:
        return _str(v)
    if t == BYTES:
        return b"\xff\xff\xff\xff" if v is None else _I32.pack(len(v)) + bytes(v)
    if t == STRS:
        return _I32.pack(len(v)) + b"".join(_str(s) for s in v)
    if t == PROPS:
        return _I32.pack(len(v)) + b"".join(_str(k) + _str(x) for k, x in v.items())
    if t == OFFSET_SPEC:
        kind, value = v
        if kind == K.OFFSET_OFFSET:
            return _U16.pack(kind) + _U64.pack(value)
        if kind == K.OFFSET_TIMESTAMP:
            return _U16.pack(kind) + _I64.pack(value)
        return _U16.pack(kind)
    raise AssertionError(t)


def request(key: int, **fields: Any) -> bytes:
    """A request frame (version 1), its fields by the names `frames.REQUESTS` gives."""
    spec = REQUESTS[(key, 1)]
    return frame(key, 1, b"".join(_write(t, fields[name]) for name, t in spec))


@dataclass(slots=True)
class ServerFrame:
    """A frame from the server. `correlation_id` and `code` for responses (and Close);
    `subscription_id` and `chunk` for Deliver (and a Credit's error); `rest` what follows
    a response's code."""

    key: int
    version: int
    correlation_id: int = 0
    code: int = K.OK
    subscription_id: int = 0
    chunk: bytes | memoryview = b""
    rest: bytes | memoryview = b""
    reason: str | None = None
    frame_max: int = 0
    heartbeat: int = 0


def read_frame(data: bytes | memoryview) -> ServerFrame:
    """One frame's bytes after its size (key, version, content)."""
    r = Reader(data)
    key, version = r.u16(), r.u16()
    if key == K.DELIVER:
        sub = r.u8()
        if version == 2:
            r.u64()  # the committed chunk id
        return ServerFrame(key, version, subscription_id=sub, chunk=data[r.pos:])
    if key == K.TUNE:
        return ServerFrame(key, version, frame_max=r.u32(), heartbeat=r.u32())
    if key in (K.HEARTBEAT, K.PUBLISH_CONFIRM, K.PUBLISH_ERROR):
        return ServerFrame(key, version, rest=data[r.pos:])
    if key == K.CLOSE:
        return ServerFrame(key, version, correlation_id=r.u32(), code=r.u16(),
                           reason=r.string())
    if key == K.METADATA_UPDATE:
        return ServerFrame(key, version, code=r.u16(), reason=r.string())
    if key == K.RESPONSE | K.CREDIT:
        return ServerFrame(key, version, code=r.u16(), subscription_id=r.u8())
    if key == K.CONSUMER_UPDATE:
        return ServerFrame(key, version, correlation_id=r.u32(), subscription_id=r.u8())
    if key & K.RESPONSE:
        corr = r.u32()
        if key == K.RESPONSE | K.METADATA:  # no code: brokers and streams follow
            return ServerFrame(key, version, correlation_id=corr, rest=data[r.pos:])
        return ServerFrame(key, version, correlation_id=corr, code=r.u16(),
                           rest=data[r.pos:])
    raise BadFrame(f"a server frame of key 0x{key:04x}")


def close_response(correlation_id: int) -> bytes:
    """The answer to the server's Close."""
    return frame(K.RESPONSE | K.CLOSE, 1, _U32.pack(correlation_id) + _U16.pack(K.OK))


def read_properties(rest: bytes | memoryview) -> dict[str, str]:
    """PeerProperties' and Open's response: the map after the code."""
    r = Reader(rest)
    out: dict[str, str] = {}
    for _ in range(r.count()):
        k = r.string()
        out[k or ""] = r.string() or ""
    return out


def metadata_codes(rest: bytes | memoryview) -> dict[str, int]:
    """Metadata's response (after the correlation id): each stream's code."""
    r = Reader(rest)
    for _ in range(r.count()):  # brokers: reference, host, port
        r.u16()
        r.string()
        r.u32()
    out: dict[str, int] = {}
    for _ in range(r.count()):
        name, code = r.string() or "", r.u16()
        r.u16()  # leader
        for _ in range(r.count()):
            r.u16()
        out[name] = code
    return out
