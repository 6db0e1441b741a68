"""Frame encoders: plain arguments in, socket-ready bytes out.

The hot ones (deliver, get-ok, return, publish, ack, nack, reject) are written by hand
with precompiled structs; tests prove their bytes equal pamqp's. Everything else goes
through pamqp (`encode_method`). Strings may be given as str or as already-encoded bytes
(so the broker can cache a consumer tag's encoding). Delivery tags are unsigned 64-bit
(P10), which pamqp cannot encode above 2**63-1.
"""

from __future__ import annotations

import struct

from pamqp import encode as pamqp_encode
from pamqp.base import Frame

from ackmq.protocol.amqp.constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    BASIC_RETURN,
)

_FRAME_END = b"\xce"
_BODY_HEAD = struct.Struct(">BHI").pack
_ACK = struct.Struct(">BHIIQBB").pack  # frame head, method index, tag, bits, frame-end
_HEADER = struct.Struct(">BHIHHQ").pack  # frame head, class 60, weight 0, body size
_DELIVER_HEAD = struct.Struct(">BHIIB").pack  # frame head, method index, tag length
_TAG_BIT_LEN = struct.Struct(">QBB").pack  # delivery-tag, bits, next shortstr length
_GET_OK_HEAD = struct.Struct(">BHIIQBB").pack
_RETURN_HEAD = struct.Struct(">BHIIHB").pack
_PUBLISH_HEAD = struct.Struct(">BHIIHB").pack
_U32 = struct.Struct(">I").pack

HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def _short(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    if len(data) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {data[:40]!r}...")
    return data


def _arguments(method: Frame) -> bytes:
    """pamqp's Frame.marshal without its validate(): RabbitMQ accepts any UTF-8 name
    (pamqp's regex refuses e.g. "orders[eu]"), and names the client sent must come back."""
    out: list[bytes] = []
    byte = offset = 0
    in_bits = False
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value = getattr(method, name, 0)
        if kind == "bit":
            if not in_bits:
                byte, offset, in_bits = 0, 0, True
            byte = pamqp_encode.bit(value, byte, offset)
            offset += 1
            if offset == 8:
                out.append(pamqp_encode.octet(byte))
                in_bits = False
            continue
        if in_bits:
            out.append(pamqp_encode.octet(byte))
            in_bits = False
        if kind == "shortstr" and isinstance(value, str):
            # octets a client sent that are not UTF-8 (kept as surrogates) go back as they
            # came, as RabbitMQ echoes them (a reply text quoting a bad user_id)
            data = value.encode("utf-8", "surrogateescape")
            if len(data) > 255:
                raise ValueError(f"shortstr longer than 255 bytes: {data[:40]!r}...")
            out.append(bytes((len(data),)) + data)
            continue
        out.append(pamqp_encode.by_type(value, kind))
    if in_bits:
        out.append(pamqp_encode.octet(byte))
    return b"".join(out)


def encode_method(channel: int, method: Frame) -> bytes:
    """Any method frame (the slow path: pamqp's argument encoders, no name validation)."""
    payload = _U32(method.index) + _arguments(method)
    return _BODY_HEAD(1, channel, len(payload)) + payload + _FRAME_END


def _content(
    channel: int, parts: list[bytes], properties: bytes, body: bytes, frame_max: int
) -> bytes:
    """Append header + body frames to `parts` (which holds the method frame) and join."""
    size = len(body)
    parts.append(_HEADER(2, channel, 12 + len(properties), 60, 0, size))
    parts.append(properties)
    parts.append(_FRAME_END)
    if size:
        chunk = frame_max - 8 if frame_max else size
        if size <= chunk:
            parts.append(_BODY_HEAD(3, channel, size))
            parts.append(body)
            parts.append(_FRAME_END)
        else:
            view = memoryview(body)
            for offset in range(0, size, chunk):
                piece = view[offset : offset + chunk]
                parts.append(_BODY_HEAD(3, channel, len(piece)))
                parts.append(piece)  # type: ignore[arg-type]  # joined as bytes are
                parts.append(_FRAME_END)
    return b"".join(parts)


def encode_deliver(
    channel: int,
    consumer_tag: str | bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver + content header + body frames (body split at frame_max - 8)."""
    ctag = _short(consumer_tag)
    ex = _short(exchange)
    rk = _short(routing_key)
    size = 4 + 1 + len(ctag) + 8 + 1 + 1 + len(ex) + 1 + len(rk)
    parts = [
        _DELIVER_HEAD(1, channel, size, BASIC_DELIVER, len(ctag)),
        ctag,
        _TAG_BIT_LEN(delivery_tag, 1 if redelivered else 0, len(ex)),
        ex,
        bytes((len(rk),)),
        rk,
        _FRAME_END,
    ]
    return _content(channel, parts, properties, body, frame_max)


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    message_count: int,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.get-ok + content header + body frames."""
    ex = _short(exchange)
    rk = _short(routing_key)
    size = 4 + 8 + 1 + 1 + len(ex) + 1 + len(rk) + 4
    parts = [
        _GET_OK_HEAD(1, channel, size, BASIC_GET_OK, delivery_tag, 1 if redelivered else 0,
                     len(ex)),
        ex,
        bytes((len(rk),)),
        rk,
        _U32(message_count),
        _FRAME_END,
    ]
    return _content(channel, parts, properties, body, frame_max)


def encode_return(
    channel: int,
    reply_code: int,
    reply_text: str | bytes,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.return + content header + body frames."""
    text = _short(reply_text)
    ex = _short(exchange)
    rk = _short(routing_key)
    size = 4 + 2 + 1 + len(text) + 1 + len(ex) + 1 + len(rk)
    parts = [
        _RETURN_HEAD(1, channel, size, BASIC_RETURN, reply_code, len(text)),
        text,
        bytes((len(ex),)),
        ex,
        bytes((len(rk),)),
        rk,
        _FRAME_END,
    ]
    return _content(channel, parts, properties, body, frame_max)


def encode_publish(
    channel: int,
    exchange: str | bytes,
    routing_key: str | bytes,
    mandatory: bool,
    immediate: bool,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.publish + content header + body frames (client side)."""
    ex = _short(exchange)
    rk = _short(routing_key)
    size = 4 + 2 + 1 + len(ex) + 1 + len(rk) + 1
    parts = [
        _PUBLISH_HEAD(1, channel, size, BASIC_PUBLISH, 0, len(ex)),
        ex,
        bytes((len(rk),)),
        rk,
        bytes(((1 if mandatory else 0) | (2 if immediate else 0),)),
        _FRAME_END,
    ]
    return _content(channel, parts, properties, body, frame_max)


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """basic.ack (from a consumer, or a publisher confirm from the server)."""
    return _ACK(1, channel, 13, BASIC_ACK, delivery_tag, 1 if multiple else 0, 0xCE)


def encode_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool) -> bytes:
    """basic.nack."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _ACK(1, channel, 13, BASIC_NACK, delivery_tag, bits, 0xCE)


def encode_reject(channel: int, delivery_tag: int, requeue: bool) -> bytes:
    """basic.reject."""
    return _ACK(1, channel, 13, BASIC_REJECT, delivery_tag, 1 if requeue else 0, 0xCE)


def build_method(cls: type[Frame], **arguments: object) -> Frame:
    """A pamqp method object without pamqp's validation (see `_arguments`)."""
    method = object.__new__(cls)
    for name, default in _defaults(cls):
        setattr(method, name, arguments.get(name, default))
    return method


_DEFAULTS: dict[type, list[tuple[str, object]]] = {}


def _defaults(cls: type[Frame]) -> list[tuple[str, object]]:
    found = _DEFAULTS.get(cls)
    if found is None:
        import inspect
        found = [(n, p.default) for n, p in inspect.signature(cls.__init__).parameters.items()
                 if n != "self"]
        _DEFAULTS[cls] = found
    return found
