"""Sans-IO AMQP 0-9-1 decoder: bytes in, events out.

The rules of the wire, as this decoder enforces them (RabbitMQ 3.10's answer to each
violation, observed with `python -m tools.robustness.frame_probe`, is quoted):

1. A server-side connection starts with the 8-byte protocol header
   b"AMQP\\x00\\x00\\x09\\x01". Anything else: BadProtocolHeader; the server writes its
   own header and closes (RabbitMQ replies b"AMQP\\x00\\x00\\x09\\x01" and closes). Bytes
   that cannot begin "AMQP" are refused without waiting for the eighth (RabbitMQ 3.10
   waits, and drops a client that sent fewer after its 10 s handshake timeout).
2. Then frames: type(1) channel(2) size(4) payload(size) frame-end(1 = 0xCE).
   - size > frame_max - 8: 501 "FRAME_ERROR - type 3, all octets = <<>>:
     {frame_too_large,200000,131064}" (checked from the 7-byte header, before the payload
     arrives). frame_max 0 means no limit.
   - frame-end != 0xCE: 501 "... {invalid_frame_end_marker,0}".
   - type not in {1 method, 2 header, 3 body, 8 heartbeat}: 501 "... unknown_frame".
3. Heartbeats travel on channel 0 with an empty payload. On another channel:
   505 "UNEXPECTED_FRAME - type 8, all octets = <<>>".
4. A method frame is class-id(2) method-id(2) arguments. Unknown ids: RabbitMQ crashes
   the connection without a close ({unknown_method_id,{99,10}}); we send
   540 NOT_IMPLEMENTED. Arguments that do not decode exactly (truncated, or trailing
   bytes): 501 "FRAME_ERROR - cannot decode <<0,0,5,97,98>>" with the method's ids.
5. basic.publish, basic.deliver, basic.get-ok and basic.return carry content: the next
   frame on that channel must be a content header, then body frames until body-size
   octets have arrived (body-size 0: no body frames). Channels interleave freely; only
   frames on the same channel are ordered. Violations (all 505 UNEXPECTED_FRAME):
   - header or body with no content pending: "expected method frame, got non method
     frame instead" (ids 0/0);
   - method or body while a header is due: "expected content header for class 60, got
     non content header frame instead" (ids of the pending method); the same text for a
     header whose weight is not 0;
   - header for another class: "expected content header for class 60, got one for class
     50 instead";
   - method or header while body is due: "expected content body, got non content body
     frame instead";
   - body frames adding up to more than body-size: RabbitMQ waits forever; we say 505
     "content body exceeds declared size N".
6. The property list must decode: RabbitMQ answers 541 INTERNAL_ERROR (a channel crash)
   to truncated headers, bad lengths, trailing bytes or a continuation flag word; we
   send 501 "cannot decode content header ..." instead, at header time.
7. A body-size above max_message_size is a channel error, not a connection error:
   406 "PRECONDITION_FAILED - message size 134217729 is larger than configured max size
   134217728" on basic.publish (RabbitMQ checks after the body; we check the header and
   skip the body). Emitted as ChannelFault; the content's body frames are then skipped.
8. Not checked here (broker state, not framing): channel 0 vs open channels
   (RabbitMQ: 504 "CHANNEL_ERROR - unexpected method in connection state running"),
   delivery-mode not in {1, 2} (406 "invalid message: {delivery_mode_unknown,7}"),
   names and permissions.
9. Good frames that arrived in the same read as a bad one still count: RabbitMQ handles
   every frame before the bad one (two publishes then a bad frame-end: both are queued,
   then 501). FrameError.events carries them to the caller.
10. Field tables and arrays (method arguments, message headers) may nest at most
   MAX_TABLE_DEPTH (100) levels, the outermost table being level 1. Deeper: 502
   "SYNTAX_ERROR - field table nested deeper than 100 levels" with the ids of the method
   (or 60/40 for a content header). RabbitMQ 3.10 has no bound but frame-max (it takes
   18,000 levels in queue.declare and delivers them in headers); Python decoders recurse
   per level, so unbounded, such a table raised RecursionError here and cannot be read by
   pika/pamqp consumers past ~450 levels. Every table walk stops at the bound, so feed
   raises FrameError and nothing else, whatever the bytes (a property test over mutated
   sessions checks it: tests/test_decoder_hostile.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, cast

from pamqp import commands, decode

from .constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    BASIC_RETURN,
    CLASS_BASIC,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_MAX_DEFAULT,
    FRAME_METHOD,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)
from .erlang import erlang_binary
from .events import (
    BadProtocolHeader,
    ChannelFault,
    Content,
    ContentMethod,
    DecodedDeliver,
    Event,
    FrameError,
    Heartbeat,
    Method,
    ProtocolHeader,
    Publish,
    reply_text,
)
from .properties import check_properties
from .table import TableTooDeep, read_table

_FRAME_HEAD = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_CONTENT_HEAD = struct.Struct(">HHQ")
_HEADER_FRAME = struct.Struct(">BHIHHQ")
_TAG_BIT = struct.Struct(">QB")

_PUBLISH: Final = BASIC_PUBLISH
_RETURN: Final = BASIC_RETURN
_DELIVER: Final = BASIC_DELIVER
_GET_OK: Final = BASIC_GET_OK
_ACK: Final = BASIC_ACK
_REJECT: Final = BASIC_REJECT
_NACK: Final = BASIC_NACK
_CONTENT_METHODS = frozenset((_PUBLISH, _RETURN, _DELIVER, _GET_OK))

_Ack = commands.Basic.Ack
_Nack = commands.Basic.Nack
_Reject = commands.Basic.Reject
_Deliver = commands.Basic.Deliver
_new = object.__new__
_NO_LIMIT: Final = 1 << 62
_SMALL_CARRY: Final = 65536  # a carried-over partial frame smaller than this is copied per read
_ARGS_CACHE: Final = 1024    # distinct (exchange, routing key, bits) remembered per connection

_EXPECT_HEADER: Final = "expected content header for class 60, got non content header frame instead"
_EXPECT_BODY: Final = "expected content body, got non content body frame instead"
_EXPECT_METHOD: Final = "expected method frame, got non method frame instead"


class _Pending:
    """Content being assembled on one channel."""

    __slots__ = ("method_id", "method", "header_seen", "remaining", "parts", "properties",
                 "skip")

    def __init__(self, method_id: int, method: Any) -> None:
        self.method_id = method_id
        self.method = method  # Publish fields tuple, or a pamqp method object
        self.header_seen = False
        self.remaining = 0
        self.parts: list[bytes | bytearray] = []
        self.properties = b""
        self.skip = False  # body of a faulted content: consume and drop


class Decoder:
    """Incremental AMQP 0-9-1 frame decoder; one per connection, no I/O."""

    def __init__(
        self,
        frame_max: int = FRAME_MAX_DEFAULT,
        max_message_size: int = 128 * 1024 * 1024,
        expect_header: bool = True,
    ) -> None:
        self.frame_max = frame_max
        self.max_message_size = max_message_size
        self._need_header = expect_header
        self._buf = bytearray()
        self._pending: dict[int, _Pending] = {}
        self._dead: FrameError | None = None
        # A publisher repeats itself: the same exchange and routing key, often the same
        # property bytes. Both decodings are pure functions of their bytes, so a hit
        # skips them (the routing fields: bounded; the properties: the last valid ones).
        self._publish_args: dict[bytes, tuple[str, str, bool, bool]] = {}
        self._props_ok = b""

    @property
    def frame_max(self) -> int:
        """Largest frame accepted, overhead included (0 = no limit); set after tune-ok."""
        return self._frame_max

    @frame_max.setter
    def frame_max(self, value: int) -> None:
        self._frame_max = value
        self._payload_max = value - 8 if value else _NO_LIMIT

    @property
    def busy(self) -> dict[int, Any]:
        """Channels with content being assembled (`number in decoder.busy`): a fast path
        outside the decoder must leave their frames to it."""
        return self._pending

    def feed(self, data: bytes) -> list[Event]:
        """Consume bytes; return the complete events they finish, in wire order.

        Raises FrameError (connection-level); the decoder is unusable afterwards. The
        error's `events` attribute holds the events this call decoded before the bad
        frame: the caller handles them (publishes, acks, ...) and then closes with the
        error, as RabbitMQ processes every good frame read ahead of a bad one. A dead
        decoder raises the same error again, with `events` empty.
        """
        if self._dead is not None:
            self._dead.events = []
            raise self._dead
        if type(data) is not bytes:
            data = bytes(data)
        buf: bytes | bytearray
        if self._buf:
            if len(self._buf) < _SMALL_CARRY:
                # a partial frame carried over: one copy makes the whole read `bytes`,
                # whose slices are single copies (a bytearray's need bytes() again)
                buf = bytes(self._buf) + data
                self._buf = bytearray()
            else:  # a large frame in the making: append, do not copy it per read
                self._buf += data
                buf = self._buf
        else:
            buf = data
        events: list[Event] = []
        try:
            pos = self._parse(buf, events)
        except FrameError as err:
            err.events = events
            self._dead = err
            self._buf = bytearray()
            raise
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < len(buf):
            self._buf = bytearray(memoryview(buf)[pos:])
        return events

    def _parse(self, buf: bytes | bytearray, events: list[Event]) -> int:
        n = len(buf)
        pos = 0
        if self._need_header:
            # bytes that cannot begin "AMQP" are refused at once: a client of another
            # protocol whose first message is shorter than 8 bytes gets its answer now,
            # not after the handshake timeout
            if n < 8 and buf[:min(n, 4)] == PROTOCOL_HEADER[:min(n, 4)]:
                return 0
            if buf[:8] != PROTOCOL_HEADER:
                raise BadProtocolHeader(bytes(buf[:8]), bytes(buf[:16]))
            self._need_header = False
            events.append(ProtocolHeader())
            pos = 8
        unpack_head = _FRAME_HEAD.unpack_from
        payload_max = self._payload_max
        pending = self._pending
        append = events.append
        ftype: int  # typed, so the compiled loop compares machine ints
        channel: int
        size: int
        method_id: int
        while n - pos >= 7:
            ftype, channel, size = unpack_head(buf, pos)
            if size > payload_max:
                raise FrameError(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = <<>>: "
                    f"{{frame_too_large,{size},{payload_max}}}",
                )
            start = pos + 7
            end = start + size
            if end >= n:
                break
            if buf[end] != FRAME_END:
                raise FrameError(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = {erlang_binary(buf[start:end])}: "
                    f"{{invalid_frame_end_marker,{buf[end]}}}",
                )
            pos = end + 1
            if ftype == FRAME_METHOD:
                if pending and channel in pending:
                    if pending[channel].skip:
                        # the server closed the channel over this content: the client's
                        # channel.close-ok / close abandons the rest of the body
                        del pending[channel]
                    else:
                        self._interrupted(pending[channel])
                method_id = _U32.unpack_from(buf, start)[0] if size >= 4 else -1
                if method_id == _PUBLISH:
                    key = bytes(buf[start + 6 : end])
                    args = self._publish_args.get(key)
                    if args is None:
                        args = _publish_args(buf, start, end)
                        if len(self._publish_args) >= _ARGS_CACHE:
                            self._publish_args.clear()
                        self._publish_args[key] = args
                    fused = _fused_content(buf, pos, n, channel, payload_max,
                                           self.max_message_size, self._props_ok)
                    if fused is None:
                        pending[channel] = _Pending(_PUBLISH, args)
                    else:
                        pos, properties, body = fused
                        self._props_ok = properties
                        append(Publish(channel, args[0], args[1], args[2], args[3],
                                       properties, body))
                elif method_id == _ACK:
                    append(Method(channel, _ack(buf, start, end)))
                elif method_id in _CONTENT_METHODS:
                    pending[channel] = _Pending(method_id, _method(buf, start, end))
                else:
                    append(Method(channel, _method(buf, start, end)))
            elif ftype == FRAME_HEADER:
                self._header(buf, start, end, channel, events)
            elif ftype == FRAME_BODY:
                part = pending.get(channel) if pending else None
                if part is None:
                    raise FrameError(UNEXPECTED_FRAME, _EXPECT_METHOD)
                if not part.header_seen:
                    raise FrameError(UNEXPECTED_FRAME, _EXPECT_HEADER, 60, part.method_id & 0xFFFF)
                part.remaining -= size
                if part.remaining < 0:
                    raise FrameError(
                        UNEXPECTED_FRAME,
                        "content body exceeds declared size",
                        CLASS_BASIC,
                        part.method_id & 0xFFFF,
                    )
                if not part.skip:
                    part.parts.append(buf[start:end])  # bytes or bytearray: join copies
                if part.remaining == 0:
                    del pending[channel]
                    if not part.skip:
                        append(_complete(channel, part, b"".join(part.parts)))
            elif ftype == FRAME_HEARTBEAT:
                if size:
                    raise FrameError(
                        FRAME_ERROR,
                        f"type 8, all octets = {erlang_binary(buf[start:end])}: unknown_frame",
                    )
                if channel:
                    raise FrameError(UNEXPECTED_FRAME, "type 8, all octets = <<>>")
                append(Heartbeat())
            else:
                raise FrameError(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = {erlang_binary(buf[start:end])}: unknown_frame",
                )
        return pos

    @staticmethod
    def _interrupted(part: _Pending) -> None:
        """A method frame arrived on a channel whose content is incomplete."""
        text = _EXPECT_BODY if part.header_seen else _EXPECT_HEADER
        raise FrameError(UNEXPECTED_FRAME, text, CLASS_BASIC, part.method_id & 0xFFFF)

    def _header(
        self, buf: bytes | bytearray, start: int, end: int, channel: int, events: list[Event]
    ) -> None:
        part = self._pending.get(channel)
        if part is None:
            raise FrameError(UNEXPECTED_FRAME, _EXPECT_METHOD)
        method_id = part.method_id & 0xFFFF
        if part.header_seen:
            raise FrameError(UNEXPECTED_FRAME, _EXPECT_BODY, CLASS_BASIC, method_id)
        if end - start < 14:
            raise FrameError(
                FRAME_ERROR,
                f"cannot decode content header {erlang_binary(buf[start:end])}",
                CLASS_BASIC,
                method_id,
            )
        class_id, weight, body_size = _CONTENT_HEAD.unpack_from(buf, start)
        if class_id != CLASS_BASIC:
            raise FrameError(
                UNEXPECTED_FRAME,
                f"expected content header for class 60, got one for class {class_id} instead",
                CLASS_BASIC,
                method_id,
            )
        if weight:
            raise FrameError(UNEXPECTED_FRAME, _EXPECT_HEADER, CLASS_BASIC, method_id)
        properties = bytes(buf[start + 12 : end])
        try:
            if properties != self._props_ok:  # as the fused path: equal ones were checked
                check_properties(properties)
                self._props_ok = properties
        except TableTooDeep as deep:  # (one name per except: compiled, a name has one type)
            raise FrameError(SYNTAX_ERROR, str(deep), CLASS_BASIC, method_id) from None
        except (ValueError, IndexError, struct.error) as err:
            raise FrameError(
                FRAME_ERROR,
                f"cannot decode content header properties "
                f"{erlang_binary(properties)}: {err}",
                CLASS_BASIC,
                method_id,
            ) from None
        part.header_seen = True
        part.properties = properties
        part.remaining = body_size
        if body_size > self.max_message_size:
            part.skip = True
            events.append(
                ChannelFault(
                    channel,
                    PRECONDITION_FAILED,
                    reply_text(
                        PRECONDITION_FAILED,
                        f"message size {body_size} is larger than configured max size "
                        f"{self.max_message_size}",
                    ),
                    CLASS_BASIC,
                    method_id,
                )
            )
        elif body_size == 0:
            del self._pending[channel]
            events.append(_complete(channel, part, b""))


def _fused_content(
    buf: bytes | bytearray, pos: int, n: int, channel: int, payload_max: int, max_size: int,
    props_ok: bytes = b"",
) -> tuple[int, bytes, bytes] | None:
    """The hot path: a well-formed header and a single body frame already follow the
    basic.publish in the buffer. Returns (next offset, properties, body), or None to let
    the general per-frame path handle whatever is there (including every error).
    `props_ok`: property bytes known valid (equal ones are not checked again)."""
    if n - pos < 22:
        return None
    ftype: int  # typed, so the compiled code compares machine ints
    chan: int
    size: int
    class_id: int
    weight: int
    body_size: int
    ftype, chan, size, class_id, weight, body_size = _HEADER_FRAME.unpack_from(buf, pos)
    if (ftype != FRAME_HEADER or chan != channel or size > payload_max or size < 14
            or class_id != CLASS_BASIC or weight or body_size > max_size):
        return None
    hend = pos + 7 + size
    if hend >= n or buf[hend] != FRAME_END:
        return None
    properties = bytes(buf[pos + 19 : hend])
    if properties != props_ok:
        try:
            check_properties(properties)
        except (ValueError, IndexError, struct.error):
            return None
    if body_size == 0:
        return hend + 1, properties, b""
    bpos = hend + 1
    if n - bpos < 7:
        return None
    ftype, chan, size = _FRAME_HEAD.unpack_from(buf, bpos)
    if ftype != FRAME_BODY or chan != channel or size != body_size or size > payload_max:
        return None
    bend = bpos + 7 + size
    if bend >= n or buf[bend] != FRAME_END:
        return None
    return bend + 1, properties, bytes(buf[bpos + 7 : bend])


def _complete(channel: int, part: _Pending, body: bytes) -> Publish | Content[ContentMethod]:
    if part.method_id == _PUBLISH:
        exchange, routing_key, mandatory, immediate = part.method
        return Publish(channel, exchange, routing_key, mandatory, immediate,
                       part.properties, body)
    return Content(channel, part.method, part.properties, body)


def _cannot_decode(buf: bytes | bytearray, start: int, end: int) -> FrameError:
    if end - start >= 4:
        class_id, method_id = struct.unpack_from(">HH", buf, start)
    else:
        class_id = method_id = 0
    return FrameError(
        FRAME_ERROR,
        f"cannot decode {erlang_binary(buf[start + 4 : end])}",
        class_id,
        method_id,
    )


def _publish_args(buf: bytes | bytearray, start: int, end: int) -> tuple[str, str, bool, bool]:
    """basic.publish arguments: ticket(short) exchange(shortstr) routing-key(shortstr) bits."""
    try:
        p = start + 6
        p2 = p + 1 + buf[p]
        exchange = buf[p + 1 : p2].decode()
        p3 = p2 + 1 + buf[p2]
        routing_key = buf[p2 + 1 : p3].decode()
        bits = buf[p3]
    except (IndexError, UnicodeDecodeError):
        raise _cannot_decode(buf, start, end) from None
    if p3 + 1 != end:
        raise _cannot_decode(buf, start, end)
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def _ack(buf: bytes | bytearray, start: int, end: int) -> commands.Basic.Ack:
    if end - start != 13:
        raise _cannot_decode(buf, start, end)
    tag, bits = _TAG_BIT.unpack_from(buf, start + 4)
    ack = _new(_Ack)
    ack.delivery_tag = tag
    ack.multiple = bool(bits & 1)
    return ack


def _nack(buf: bytes | bytearray, start: int, end: int) -> commands.Basic.Nack:
    if end - start != 13:
        raise _cannot_decode(buf, start, end)
    tag, bits = _TAG_BIT.unpack_from(buf, start + 4)
    nack = _new(_Nack)
    nack.delivery_tag = tag
    nack.multiple = bool(bits & 1)
    nack.requeue = bool(bits & 2)
    return nack


def _reject(buf: bytes | bytearray, start: int, end: int) -> commands.Basic.Reject:
    if end - start != 13:
        raise _cannot_decode(buf, start, end)
    tag, bits = _TAG_BIT.unpack_from(buf, start + 4)
    reject = _new(_Reject)
    reject.delivery_tag = tag
    reject.requeue = bool(bits & 1)
    return reject


def _deliver(buf: bytes | bytearray, start: int, end: int) -> commands.Basic.Deliver:
    """basic.deliver: consumer-tag, delivery-tag(longlong, unsigned), redelivered, exchange,
    routing-key. pamqp reads the tag as signed; P10 needs all 64 bits."""
    try:
        p = start + 4
        p2 = p + 1 + buf[p]
        consumer_tag = buf[p + 1 : p2].decode()
        tag, bits = _TAG_BIT.unpack_from(buf, p2)
        p3 = p2 + 9
        p4 = p3 + 1 + buf[p3]
        exchange = buf[p3 + 1 : p4].decode()
        p5 = p4 + 1 + buf[p4]
        routing_key = buf[p4 + 1 : p5].decode()
    except (IndexError, UnicodeDecodeError, struct.error):
        raise _cannot_decode(buf, start, end) from None
    if p5 != end:
        raise _cannot_decode(buf, start, end)
    deliver = _new(_Deliver)
    deliver.consumer_tag = consumer_tag
    deliver.delivery_tag = tag
    deliver.redelivered = bool(bits & 1)
    deliver.exchange = exchange
    deliver.routing_key = routing_key
    return deliver


# pamqp types a Deliver's fields Optional; a decoded one has them all. A cast, not an
# `if TYPE_CHECKING` def: mypyc compiles that branch as the one that runs.
deliver_method = cast(  # for the client's fast path (ackmq.client.core)
    "Callable[[bytes | bytearray, int, int], DecodedDeliver]", _deliver)

_FAST = {_NACK: _nack, _REJECT: _reject, _DELIVER: _deliver, _ACK: _ack}
_UNSIGNED_64 = frozenset(("delivery_tag",))


def _method(buf: bytes | bytearray, start: int, end: int) -> Any:
    """Decode any method frame payload, checking that the arguments fill it exactly."""
    if end - start < 4:
        raise FrameError(FRAME_ERROR, f"cannot decode method frame {erlang_binary(buf[start:end])}")
    method_index = _U32.unpack_from(buf, start)[0]
    fast = _FAST.get(method_index)
    if fast is not None:
        return fast(buf, start, end)
    cls: Any = commands.INDEX_MAPPING.get(method_index)  # a pamqp Frame class
    if cls is None:
        class_id, method_id = divmod(method_index, 0x10000)
        raise FrameError(
            NOT_IMPLEMENTED,
            f"unknown method {{{class_id},{method_id}}}",
            class_id,
            method_id,
        )
    method = _new(cls)
    data = bytes(buf[start + 4 : end])
    offset = 0
    bit_index = -1
    value: Any  # a table, or whatever pamqp decodes for the argument's type
    try:
        for name in cls.__slots__:
            kind = cls.amqp_type(name)
            if kind == "bit":
                if bit_index == -1 or bit_index == 8:
                    if bit_index == 8:
                        offset += 1
                    bit_index = 0
                if offset >= len(data):
                    raise ValueError("bits truncated")
                setattr(method, name, bool(data[offset] & (1 << bit_index)))
                bit_index += 1
                continue
            if bit_index != -1:
                offset += 1
                bit_index = -1
            if kind == "table":  # bounded, strict (pamqp's recursion is neither)
                value, offset = read_table(data, offset)
            else:
                consumed, value = decode.by_type(data[offset:], kind)
                offset += consumed
            if kind == "longlong" and value < 0 and name in _UNSIGNED_64:
                value += 1 << 64  # pamqp reads longlong as signed
            setattr(method, name, value)
        if bit_index != -1:
            offset += 1
    except TableTooDeep as err:
        class_id, method_id = divmod(method_index, 0x10000)
        raise FrameError(SYNTAX_ERROR, str(err), class_id, method_id) from None
    except (ValueError, TypeError, IndexError, struct.error):
        raise _cannot_decode(buf, start, end) from None
    if offset != len(data):
        raise _cannot_decode(buf, start, end)
    return method
