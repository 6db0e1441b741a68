"""AMQP 1.0 framing (part 2.3, SASL part 5.3), sans-IO. The rules, as a table:

    protocol header  b"AMQP" id major minor revision: id 0 = AMQP, 3 = SASL (1.0.0 only);
                     the SASL layer's header comes first, then the AMQP one
    frame            size:uint32 (whole frame, >= 8) doff:ubyte (>= 2, header words)
                     type:ubyte (0 AMQP, 1 SASL) channel:ushort, extended header
                     (skipped), body
    empty frame      no body: a heartbeat (AMQP frames only)
    body             one performative (a described list) then, for transfer, the payload
    size limit       a frame above the negotiated max-frame-size: amqp:frame-size-too-small
                     (before open: 512, the minimum every peer takes, part 2.7.1)

`Decoder.feed(bytes) -> [events]`: `ProtocolHeader(protocol_id)`, `Frame(type, channel,
performative, payload)` or `Heartbeat(channel)`. A broken stream raises `FramingError`
(`condition`, `description`); `.events` holds the good events read before the bad bytes,
which the server handles first. The decoder expects a protocol header first, and takes
one again where a frame would follow SASL frames (a client pipelines its AMQP header
behind its sasl-init; the connection checks the outcome was sent).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ackmq.protocol.amqp10.composite import (
    FIELDS,
    Composite,
    composite_of,
    descriptor_name,
    from_fields,
)
from ackmq.protocol.amqp10.types import DecodeError, Described, UByte, UInt, decode

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
AMQP_FRAME, SASL_FRAME = 0, 1
MIN_MAX_FRAME_SIZE = 512
DEFAULT_MAX_FRAME_SIZE = 131072  # what ackmq offers in open (RabbitMQ 4's frame_max)

DECODE_ERROR = "amqp:decode-error"
FRAME_SIZE_TOO_SMALL = "amqp:frame-size-too-small"
NOT_ALLOWED = "amqp:not-allowed"
NOT_IMPLEMENTED = "amqp:not-implemented"
NOT_FOUND = "amqp:not-found"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
INTERNAL_ERROR = "amqp:internal-error"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
ILLEGAL_STATE = "amqp:illegal-state"
INVALID_FIELD = "amqp:invalid-field"
RESOURCE_DELETED = "amqp:resource-deleted"
PRECONDITION_FAILED = "amqp:precondition-failed"
CONNECTION_FORCED = "amqp:connection:forced"
FRAMING_ERROR = "amqp:connection:framing-error"
UNATTACHED_HANDLE = "amqp:session:unattached-handle"
HANDLE_IN_USE = "amqp:session:handle-in-use"
WINDOW_VIOLATION = "amqp:session:window-violation"
LINK_DETACH_FORCED = "amqp:link:detach-forced"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
_FH = struct.Struct(">IBBH")


@dataclass(slots=True)
class ProtocolHeader:
    protocol_id: int  # 0 AMQP, 3 SASL
    raw: bytes


@dataclass(slots=True)
class Frame:
    type: int
    channel: int
    performative: Composite
    payload: bytes = b""


@dataclass(slots=True)
class Heartbeat:
    channel: int


class FramingError(Exception):
    """The stream cannot be read on: close the connection with `condition`."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description
        self.events: list[Any] = []


class BadHeader(Exception):
    """A protocol header ackmq does not speak: answer with ours and close (part 2.2)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__(raw)
        self.raw = raw


class Decoder:
    def __init__(self, max_frame_size: int = MIN_MAX_FRAME_SIZE) -> None:
        self.buf = bytearray()
        self.max_frame_size = max_frame_size
        self.want_header = True
        self.in_sasl = False  # the last thing read was the SASL header or a SASL frame
        self.dead = False

    def feed(self, data: bytes) -> list[Any]:
        if self.dead:
            return []
        self.buf += data
        events: list[Any] = []
        try:
            self._read(events)
        except (FramingError, BadHeader) as e:
            self.dead = True
            if isinstance(e, FramingError):
                e.events = events
            raise
        return events

    def _read(self, events: list[Any]) -> None:
        buf = self.buf
        pos = 0
        try:
            while True:
                if self.want_header:
                    if len(buf) - pos < 8:
                        if buf[pos:pos + 4] != b"AMQP"[:len(buf) - pos]:
                            raise BadHeader(bytes(buf[pos:pos + 8]))
                        return
                    raw = bytes(buf[pos:pos + 8])
                    if raw[:4] != b"AMQP" or raw[5:] != b"\x01\x00\x00" or raw[4] not in (0, 3):
                        raise BadHeader(raw)
                    pos += 8
                    self.want_header = False
                    events.append(ProtocolHeader(raw[4], raw))
                    self.in_sasl = raw[4] == 3
                    continue
                if len(buf) - pos < 8:
                    return
                if self.in_sasl and buf[pos:pos + 4] == b"AMQP":
                    # a client pipelines its AMQP header behind its SASL frames: "AMQP"
                    # is never a frame's size (1 GiB); the connection checks it came after
                    # the outcome
                    self.want_header = True
                    continue
                size, doff, ftype, channel = _FH.unpack_from(buf, pos)
                if size < 8 or doff < 2 or doff * 4 > size:
                    raise FramingError(FRAMING_ERROR, f"malformed frame header (size {size}, "
                                                      f"doff {doff})")
                if size > self.max_frame_size:
                    raise FramingError(FRAME_SIZE_TOO_SMALL,
                                       f"frame of {size} bytes, max-frame-size is "
                                       f"{self.max_frame_size}")
                if ftype not in (AMQP_FRAME, SASL_FRAME):
                    raise FramingError(FRAMING_ERROR, f"unknown frame type {ftype}")
                if len(buf) - pos < size:
                    return
                body = memoryview(buf)[pos + doff * 4:pos + size]
                try:
                    if not len(body):
                        if ftype == SASL_FRAME:
                            raise FramingError(DECODE_ERROR, "empty SASL frame")
                        events.append(Heartbeat(channel))
                    else:
                        perf, end = _performative(body)
                        payload = bytes(body[end:])
                        if payload and perf.kind != "transfer":
                            raise FramingError(DECODE_ERROR,
                                               f"bytes after the {perf.kind} performative")
                        events.append(Frame(ftype, channel, perf, payload))
                finally:
                    body.release()
                pos += size
                self.in_sasl = ftype == SASL_FRAME
        finally:
            del buf[:pos]


_PERFORMATIVES = frozenset(("open", "begin", "attach", "flow", "transfer", "disposition",
                            "detach", "end", "close", "sasl_mechanisms", "sasl_init",
                            "sasl_challenge", "sasl_response", "sasl_outcome"))


# a transfer's fields by position: the codes its common encodings use (else: decode())
_UINT_CODES = (0x40, 0x43, 0x52, 0x70)
_BOOL_CODES = (0x40, 0x41, 0x42, 0x56)
_TRANSFER_CODES = (_UINT_CODES, _UINT_CODES, (0x40, 0xA0), _UINT_CODES, _BOOL_CODES,
                   _BOOL_CODES, (0x40, 0x50), (0x40,), _BOOL_CODES, _BOOL_CODES, _BOOL_CODES)
_TRANSFER_DEFAULTS = [d for _, _, _, d in FIELDS["transfer"]]


def _transfer(body: Any) -> tuple[Composite, int] | None:
    """A transfer performative read without the general decoder, when it is a small
    list of plain fields (what clients send); None for anything else, which
    `decode` reads (and refuses) as before. The same Composite either way."""
    n = len(body)
    if n < 6 or body[4] > n - 5 or body[5] > 11:
        return None
    end = 5 + body[4]
    count = body[5]
    values = _TRANSFER_DEFAULTS.copy()
    try:
        pos = _transfer_fields(body, count, end, values)
    except IndexError:  # truncated
        return None
    if pos != end or values[0] is None:
        return None
    return composite_of("transfer", values), end


# a value read from its wire width is in range: made without the type's checking __new__
_wire = int.__new__
_UINT_0 = UInt(0)


def _transfer_fields(body: Any, count: int, end: int, values: list[Any]) -> int:
    """The fields into `values`; the position after them, -1 if not plain."""
    pos = 6
    for i in range(count):
        if pos >= end:
            return -1
        code = body[pos]
        if code not in _TRANSFER_CODES[i]:
            return -1
        if code == 0x40:
            pos += 1
            continue
        if code == 0x43:
            values[i], pos = _UINT_0, pos + 1
        elif code == 0x52:
            values[i], pos = _wire(UInt, body[pos + 1]), pos + 2
        elif code == 0x70:
            values[i], pos = _wire(UInt, int.from_bytes(body[pos + 1:pos + 5])), pos + 5
        elif code == 0xA0:
            size = body[pos + 1]
            values[i], pos = bytes(body[pos + 2:pos + 2 + size]), pos + 2 + size
        elif code == 0x41 or code == 0x42:
            values[i], pos = code == 0x41, pos + 1
        elif code == 0x56:
            if body[pos + 1] > 1:
                return -1
            values[i], pos = body[pos + 1] == 1, pos + 2
        else:  # 0x50, rcv-settle-mode
            values[i], pos = _wire(UByte, body[pos + 1]), pos + 2
    return pos


def _performative(body: Any) -> tuple[Composite, int]:
    if body[:4] == b"\x00\x53\x14\xc0":
        fast = _transfer(body)
        if fast is not None:
            return fast
    try:
        v, end = decode(body, 0)
        if not isinstance(v, Described):
            raise DecodeError("a frame body is not a described value")
        name = descriptor_name(v.descriptor)
        if name is None or name not in _PERFORMATIVES:
            raise DecodeError(f"unknown performative {v.descriptor!r}")
        return from_fields(name, v.value), end
    except DecodeError as e:
        raise FramingError(DECODE_ERROR, str(e)) from None


def encode_frame(channel: int, performative: Composite, payload: bytes = b"",
                 frame_type: int = AMQP_FRAME) -> bytes:
    body = performative.encode_amqp() + payload
    return _FH.pack(8 + len(body), 2, frame_type, channel) + body


def encode_frames(channel: int, transfer: Composite, payload: bytes, max_frame_size: int
                  ) -> list[bytes]:
    """A transfer split into frames of at most `max_frame_size` (`more` on all but the
    last, part 2.6.14); fields after the first frame's stay the same (proton reads them)."""
    head = transfer.encode_amqp()
    room = max_frame_size - 8 - len(head)
    if len(payload) <= room:
        return [_FH.pack(8 + len(head) + len(payload), 2, AMQP_FRAME, channel) + head + payload]
    transfer.more = True
    head = transfer.encode_amqp()
    room = max_frame_size - 8 - len(head)
    if room <= 0:
        raise ValueError("max-frame-size too small for a transfer")
    out = []
    pos = 0
    while len(payload) - pos > room:
        chunk = payload[pos:pos + room]
        out.append(_FH.pack(8 + len(head) + len(chunk), 2, AMQP_FRAME, channel) + head + chunk)
        pos += room
    transfer.more = False
    last = transfer.encode_amqp()
    chunk = payload[pos:]
    out.append(_FH.pack(8 + len(last) + len(chunk), 2, AMQP_FRAME, channel) + last + chunk)
    return out


def _uint(v: int) -> bytes:
    """A uint in its smallest encoding (types.py's)."""
    if v == 0:
        return b"\x43"
    if v < 256:
        return b"\x52" + bytes((v,))
    return b"\x70" + v.to_bytes(4, "big")


# after delivery-tag: message-format 0, settled (null / true), then more false,
# rcv-settle-mode null, state null, resume, aborted, batchable false
_UNSETTLED_TAIL = b"\x43\x40\x42\x40\x40\x42\x42\x42"
_SETTLED_TAIL = b"\x43\x41\x42\x40\x40\x42\x42\x42"


def delivery_frames(channel: int, handle: int, delivery_id: int, tag: bytes, settled: bool,
                    payload: bytes, max_frame_size: int) -> list[bytes]:
    """A delivery's transfer (message-format 0, `settled` true or absent) as
    `encode_frames` gives it, without building the performative each time: a
    delivery is one frame unless the payload needs more."""
    fields = (_uint(handle) + _uint(delivery_id) + b"\xa0" + bytes((len(tag),)) + tag
              + (_SETTLED_TAIL if settled else _UNSETTLED_TAIL))
    size = 8 + 6 + len(fields) + len(payload)
    if size > max_frame_size or len(tag) > 32:
        return encode_frames(channel, Composite(
            "transfer", handle=UInt(handle), delivery_id=UInt(delivery_id), delivery_tag=tag,
            message_format=UInt(0), settled=settled or None), payload, max_frame_size)
    return [_FH.pack(size, 2, AMQP_FRAME, channel) + b"\x00\x53\x14\xc0"
            + bytes((len(fields) + 1, 11)) + fields + payload]


def settled_disposition(channel: int, role: bool, first: int, last: int | None,
                        state: bytes) -> bytes:
    """A settled disposition with an encoded `state` (batchable false), as
    `encode_frame` writes the performative, without building it: a publisher's
    outcomes go out in one per confirm."""
    fields = ((b"\x41" if role else b"\x42") + _uint(first)
              + (_uint(last) if last is not None else b"\x40") + b"\x41" + state + b"\x42")
    if len(fields) + 1 < 256:
        body = b"\x00\x53\x15\xc0" + bytes((len(fields) + 1, 6)) + fields
    else:
        body = (b"\x00\x53\x15\xd0" + (len(fields) + 4).to_bytes(4, "big")
                + (6).to_bytes(4, "big") + fields)
    return _FH.pack(8 + len(body), 2, AMQP_FRAME, channel) + body


HEARTBEAT = _FH.pack(8, 2, AMQP_FRAME, 0)
