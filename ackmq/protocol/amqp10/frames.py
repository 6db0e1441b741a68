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
    Composite,
    composite_of,
    descriptor_name,
    from_fields,
)
from ackmq.protocol.amqp10.transfer import (
    DISPOSITION_HEAD,
    TRANSFER_HEAD,
    frame_head,
    read_disposition,
    read_transfer,
)
from ackmq.protocol.amqp10.types import DecodeError, Described, UByte, UInt, ULong, decode

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
_FH = struct.Struct(">IBBH")  # a frame's header, as read (transfer.frame_head writes it)


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
                if size == doff * 4:
                    if ftype == SASL_FRAME:
                        raise FramingError(DECODE_ERROR, "empty SASL frame")
                    events.append(Heartbeat(channel))
                else:
                    with memoryview(buf) as view:
                        body = bytes(view[pos + doff * 4:pos + size])
                    perf, end = _performative(body)
                    payload = body[end:]
                    if payload and perf.kind != "transfer":
                        raise FramingError(DECODE_ERROR,
                                           f"bytes after the {perf.kind} performative")
                    events.append(Frame(ftype, channel, perf, payload))
                pos += size
                self.in_sasl = ftype == SASL_FRAME
        finally:
            del buf[:pos]


_PERFORMATIVES = frozenset(("open", "begin", "attach", "flow", "transfer", "disposition",
                            "detach", "end", "close", "sasl_mechanisms", "sasl_init",
                            "sasl_challenge", "sasl_response", "sasl_outcome"))


# a value read from its wire width is in range: made without the type's checking __new__
_wire = int.__new__


def _transfer(body: bytes) -> tuple[Composite, int] | None:
    """A transfer performative read by transfer.py's reader (what clients send), as
    the Composite `decode` gives (a uint a UInt, so it re-encodes as one); None for
    anything else, which `decode` reads (and refuses) as before."""
    t = read_transfer(body, 0, len(body))
    if t is None:
        return None
    values = t.values()
    values[0] = _wire(UInt, t.handle)
    if t.delivery_id is not None:
        values[1] = _wire(UInt, t.delivery_id)
    if t.message_format is not None:
        values[3] = _wire(UInt, t.message_format)
    if t.rcv_settle_mode is not None:
        values[6] = _wire(UByte, t.rcv_settle_mode)
    return composite_of("transfer", values), len(body) - len(t.payload)


def _disposition(body: bytes) -> tuple[Composite, int] | None:
    """A plain disposition read by transfer.py's reader, as `decode` gives it (its
    state a Described outcome of no fields); None for anything else."""
    d = read_disposition(body, 0, len(body))
    if d is None:
        return None
    state = None if d.state < 0 else Described(_wire(ULong, d.state), [])
    return composite_of("disposition", [
        d.role, _wire(UInt, d.first), None if d.last is None else _wire(UInt, d.last),
        d.settled, state, d.batchable]), len(body)


def _performative(body: bytes) -> tuple[Composite, int]:
    head = body[:4]
    if head == TRANSFER_HEAD:
        fast = _transfer(body)
        if fast is not None:
            return fast
    elif head == DISPOSITION_HEAD:
        fast = _disposition(body)
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
    return frame_head(8 + len(body), channel, frame_type) + body


def encode_frames(channel: int, transfer: Composite, payload: bytes, max_frame_size: int
                  ) -> list[bytes]:
    """A transfer split into frames of at most `max_frame_size` (`more` on all but the
    last, part 2.6.14); fields after the first frame's stay the same (proton reads them)."""
    head = transfer.encode_amqp()
    room = max_frame_size - 8 - len(head)
    if len(payload) <= room:
        return [frame_head(8 + len(head) + len(payload), channel) + head + payload]
    transfer.more = True
    head = transfer.encode_amqp()
    room = max_frame_size - 8 - len(head)
    if room <= 0:
        raise ValueError("max-frame-size too small for a transfer")
    out = []
    pos = 0
    while len(payload) - pos > room:
        chunk = payload[pos:pos + room]
        out.append(frame_head(8 + len(head) + len(chunk), channel) + head + chunk)
        pos += room
    transfer.more = False
    last = transfer.encode_amqp()
    chunk = payload[pos:]
    out.append(frame_head(8 + len(last) + len(chunk), channel) + last + chunk)
    return out


HEARTBEAT = frame_head(8, 0)
