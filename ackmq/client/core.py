"""The AMQP 0-9-1 client state machine, sans I/O: bytes in (`feed`), bytes out (`out`),
futures resolved as replies, confirms and deliveries arrive.

The sync and asyncio connections own the socket and drive this object; they hand it a
future factory (sync.ClientFuture, whose result() reads the socket while it waits, or
loop.create_future), so everything above works on either.
"""

from __future__ import annotations

import platform
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from pamqp import commands as C
from pamqp.base import Frame

from ackmq.protocol.amqp import (
    PROTOCOL_HEADER,
    Content,
    Decoder,
    FrameError,
    Heartbeat,
    Method,
    PropertiesView,
    build_method,
    encode_method,
    encode_publish,
)
from ackmq.protocol.amqp.constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    FRAME_ERROR,
    FRAME_MAX_DEFAULT,
    UNEXPECTED_FRAME,
)
from ackmq.protocol.amqp.decoder import deliver_method
from ackmq.protocol.amqp.events import ChannelFault, DecodedDeliver, DecodedReturn
from ackmq.protocol.amqp.properties import check_properties
from ackmq.version import VERSION

from .errors import ChannelClosed, ClientError, ConnectionLost, NackError, ReturnedError
from .message import OutboundMessage
from .options import Options

CLIENT_FRAME_MAX = FRAME_MAX_DEFAULT
CLIENT_CHANNEL_MAX = 2047

_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
_TAG_BIT = struct.Struct(">QB")
_CONTENT_HEAD = struct.Struct(">HHQ")
_HEADER_FRAME = struct.Struct(">BHIHHQ").pack
_BODY_FRAME = struct.Struct(">BBHI").pack  # frame-end of the header, then the body's head
_M_ACK = BASIC_ACK
_M_NACK = BASIC_NACK
_M_DELIVER = BASIC_DELIVER

# (raw delivery) delivery_tag, redelivered, body
RawDeliver = Callable[[int, bool, bytes], None]
# (raw confirm) delivery_tag, multiple, ack
RawConfirm = Callable[[int, bool, bool], None]


class FutureLike(Protocol):
    def done(self) -> bool: ...
    def result(self) -> Any: ...
    def set_result(self, value: Any) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...
    def exception(self) -> BaseException | None: ...


class ChannelListener(Protocol):
    """What a session gets told by its channel."""

    def on_deliver(self, content: Content[DecodedDeliver]) -> None: ...
    def on_cancel(self, consumer_tag: str) -> None: ...
    def on_failed(self, error: ClientError) -> None: ...


def _settle(fut: FutureLike | None, value: Any = None, error: BaseException | None = None) -> None:
    if fut is None or fut.done():
        return
    if error is None:
        fut.set_result(value)
    else:
        fut.set_exception(error)


def _seen(fut: FutureLike | None) -> None:
    """Retrieve a settled future's exception: a publish() failure is also handed back
    by take_failed(), so asyncio must not log it as 'never retrieved'."""
    if fut is not None and fut.done():
        fut.exception()


class Pending:
    """An unconfirmed publish: what to resolve and what to hand back on failure."""

    __slots__ = ("future", "message", "returned", "failed")

    def __init__(self, future: FutureLike | None, message: OutboundMessage,
                 failed: list[OutboundMessage] | None) -> None:
        self.future = future
        self.message = message
        self.returned: tuple[int, str] | None = None
        self.failed = failed  # the producer's hand-back list (J10)

    def give_back(self, error: ClientError) -> None:
        """Failed with `error`; a publish() message goes back through take_failed()."""
        _settle(self.future, error=error)
        if self.failed is not None:  # handed back, so the error counts as seen
            self.failed.append(self.message)
            _seen(self.future)


class Incoming:
    """A basic.deliver being assembled by Core's fast path; one per channel, reused.
    `method` is None on a raw channel (lowlevel.py: only tag, redelivered and body);
    `remaining` is -1 until the content header has come, then the body bytes still due."""

    __slots__ = ("method", "tag", "redelivered", "remaining", "properties", "parts")

    def __init__(self) -> None:
        self.begin(None, 0, False)

    def begin(self, method: DecodedDeliver | None, tag: int, redelivered: bool) -> Incoming:
        self.method = method
        self.tag = tag
        self.redelivered = redelivered
        self.remaining = -1
        self.properties = b""
        self.parts: list[bytes] = []
        return self


class Chan:
    """One AMQP channel: RPC replies in order, confirm tracking, deliveries to a listener.

    Confirm tracking (J10): `outstanding` is an OrderedDict keyed by sequence number;
    numbers are assigned in increasing order, so insertion order is sorted order and a
    `multiple` ack pops from the front in O(settled).
    """

    def __init__(self, core: Core, number: int) -> None:
        self.core = core
        self.number = number
        self.rpcs: deque[tuple[tuple[type, ...], FutureLike]] = deque()
        self.error: ClientError | None = None
        self.open = False
        self.confirm = False
        self.transactional = False
        self.next_seq = 1
        self.outstanding: OrderedDict[int, Pending] = OrderedDict()
        self._by_id: dict[str, list[int]] = {}
        self.tx_returns: list[tuple[int, str, OutboundMessage]] = []
        # idempotent producers' session: where unconfirmed publishes go when the
        # connection is lost, futures unsettled, to be re-sent after the reconnect
        self.resend: list[Pending] | None = None
        self.listener: ChannelListener | None = None
        self._publish_heads: dict[tuple[str, str, bool], bytes] = {}
        # low-level hooks (ackmq.client.lowlevel): when set, confirms and deliveries go
        # to them as plain values instead of the session machinery
        self.raw_confirm: RawConfirm | None = None
        self.raw_deliver: RawDeliver | None = None
        # the basic.deliver being assembled by Core's fast path, if any
        self.content: Incoming | None = None
        self._incoming = Incoming()

    # -- requests ----------------------------------------------------------------------
    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def rpc(self, method: Frame, replies: tuple[type, ...]) -> Any:
        """Send a synchronous method; the future gets the reply (method or Content)."""
        self.check()
        fut = self.core.new_future()
        self.core.out.append(encode_method(self.number, method))
        self.rpcs.append((replies, fut))
        return fut

    def send(self, method: Frame) -> None:
        """Send a method that has no reply (nowait, ack, ...)."""
        self.check()
        self.core.out.append(encode_method(self.number, method))

    def write(self, data: bytes) -> None:
        self.check()
        self.core.out.append(data)

    def publish(self, msg: OutboundMessage, future: FutureLike | None,
                failed: list[OutboundMessage] | None) -> int:
        """basic.publish; on a confirm channel returns its sequence number (P3)."""
        if self.error is not None:
            raise self.error
        body = msg.body
        size = len(body)
        if 0 < size <= self.core.frame_max - 8:
            key = (msg.exchange, msg.routing_key, msg.mandatory)
            head = self._publish_heads.get(key)
            if head is None:  # basic.publish for this address, encoded once
                head = encode_publish(self.number, key[0], key[1], key[2], False, b"", b"",
                                      self.core.frame_max)
                head = head[:8 + _FRAME_HEAD.unpack_from(head)[2]]
                self._publish_heads[key] = head
            props = msg.raw_properties
            self.core.out.append(b"".join((
                head, _HEADER_FRAME(2, self.number, 12 + len(props), 60, 0, size), props,
                _BODY_FRAME(0xCE, 3, self.number, size), body, b"\xce")))
        else:
            self.core.out.append(encode_publish(self.number, msg.exchange, msg.routing_key,
                                                msg.mandatory, False, msg.raw_properties,
                                                body, self.core.frame_max))
        if not self.confirm:
            return 0
        seq = self.next_seq
        self.next_seq = seq + 1
        self.outstanding[seq] = Pending(future, msg, failed)
        if msg.mandatory and msg.message_id is not None:
            seqs = self._by_id.get(msg.message_id)
            if seqs is None:
                self._by_id[msg.message_id] = [seq]
            else:
                seqs.append(seq)
        return seq

    # -- events ------------------------------------------------------------------------
    def reply(self, value: Any) -> None:
        if not self.rpcs:
            self.core.protocol_error(f"unexpected {type(value).__name__} on channel "
                                     f"{self.number}")
            return
        replies, fut = self.rpcs[0]
        kind = type(value.method) if isinstance(value, Content) else type(value)
        if kind not in replies:
            self.core.protocol_error(f"expected {[r.__name__ for r in replies]}, got "
                                     f"{kind.__name__} on channel {self.number}")
            return
        self.rpcs.popleft()
        _settle(fut, value)

    def on_confirm(self, ack: bool, tag: int, multiple: bool) -> None:
        out = self.outstanding
        if multiple:
            while out:
                seq = next(iter(out))
                if seq > tag:
                    break
                self._settle_publish(seq, out.popitem(last=False)[1], ack)
        else:
            pending = out.pop(tag, None)
            if pending is not None:
                self._settle_publish(tag, pending, ack)

    def _settle_publish(self, seq: int, p: Pending, ack: bool) -> None:
        msg = p.message
        if msg.mandatory and msg.message_id is not None:
            seqs = self._by_id.get(msg.message_id)
            if seqs is not None:
                try:
                    seqs.remove(seq)
                except ValueError:
                    pass
                if not seqs:
                    del self._by_id[msg.message_id]
        if ack and p.returned is None:
            fut = p.future
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        if p.returned is not None:
            code, text = p.returned
            err: ClientError = ReturnedError(f"{code} {text}: {msg!r}", [msg], code)
        else:
            err = NackError(f"broker nacked {msg!r}", [msg])
        _settle(p.future, error=err)
        if p.failed is not None:  # publish(): handed back, so the error counts as seen
            p.failed.append(msg)
            _seen(p.future)

    def on_return(self, content: Content[DecodedReturn]) -> None:
        m = content.method
        view = PropertiesView(content.properties)
        mid = view.message_id
        seqs = self._by_id.get(mid) if mid is not None else None
        if seqs:
            for seq in seqs:
                pending = self.outstanding.get(seq)
                if pending is not None and pending.returned is None:
                    pending.returned = (m.reply_code, m.reply_text)
                    return
        msg = OutboundMessage(content.body, m.exchange, m.routing_key, content.properties,
                              mid, True)
        self.tx_returns.append((m.reply_code, m.reply_text, msg))

    def fail(self, error: ClientError) -> None:
        """The channel is gone: every waiter gets `error`, unconfirmed publishes are
        handed back to their producers (they may or may not have been taken)."""
        if self.error is not None and not isinstance(error, ConnectionLost):
            return
        first = self.error is None
        self.error = error
        self.open = False
        while self.rpcs:
            _settle(self.rpcs.popleft()[1], error=error)
        out, self.outstanding = self.outstanding, OrderedDict()
        self._by_id.clear()
        keep = self.resend if isinstance(error, ConnectionLost) else None
        for p in out.values():
            if keep is not None:
                keep.append(p)
                continue
            p.give_back(error)
        if first and self.listener is not None:
            self.listener.on_failed(error)


class Core:
    """Connection-level protocol: handshake, channels, close, heartbeats' bookkeeping."""

    def __init__(self, options: Options, new_future: Callable[[], Any]) -> None:
        self.options = options
        self.new_future = new_future
        self.decoder = Decoder(frame_max=CLIENT_FRAME_MAX, expect_header=False)
        self._buf: bytes | bytearray = b""
        self._payload_max = CLIENT_FRAME_MAX - 8
        self.out: list[bytes] = [PROTOCOL_HEADER]
        self.frame_max = CLIENT_FRAME_MAX
        self.channel_max = CLIENT_CHANNEL_MAX
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self.is_ackmq = False
        self.opened = new_future()
        self.close_ok: Any = None
        self.error: ConnectionLost | None = None
        self.channels: dict[int, Chan] = {}
        self._next_channel = 1
        self.blocked = False
        # told of connection.blocked (True, reason) / unblocked (False, "") as they come
        self.on_blocked: Callable[[bool, str], None] | None = None
        now = time.monotonic()
        self.last_read = now
        self.last_write = now

    # -- input -------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes from the broker. The hot frames (publisher confirms, basic.deliver with
        its header and body) are parsed here in one flat loop, without an event object
        per frame; every other frame goes through the shared Decoder, one whole frame at
        a time, so its checks and error texts apply unchanged."""
        self.last_read = time.monotonic()
        buf = self._buf
        if buf:
            buf += data
        else:
            buf = data
        n = len(buf)
        pos = 0
        channels = self.channels
        unpack_head = _FRAME_HEAD.unpack_from
        payload_max = self._payload_max
        decoder = self.decoder
        max_size = decoder.max_message_size
        busy = decoder.busy  # the same dict for the decoder's life
        while n - pos >= 8 and self.error is None:
            ftype, number, size = unpack_head(buf, pos)
            start = pos + 7
            end = start + size
            if size > payload_max or (end < n and buf[end] != 0xCE):
                self._slow(buf[pos:])  # the Decoder raises the exact FRAME_ERROR
                pos = n
                break
            if end >= n:
                break
            pos = end + 1
            chan = channels.get(number)
            if chan is not None and (content := chan.content) is not None:
                if ftype == 3 and 0 < size == content.remaining and not content.parts:
                    # the whole body in one frame (the common case)
                    if content.method is None:  # a raw channel: straight to its callback
                        chan.content = None
                        hook = chan.raw_deliver
                        if hook is not None:
                            hook(content.tag, content.redelivered, bytes(buf[start:end]))
                    else:
                        content.parts.append(bytes(buf[start:end]))
                        self._delivered(chan, content)
                    continue
                if (ftype == 2 and content.remaining < 0 and content.method is None
                        and size >= 14):
                    class_id, weight, body_size = _CONTENT_HEAD.unpack_from(buf, start)
                    if class_id == 60 and not weight and 0 < body_size <= max_size:
                        content.remaining = body_size  # a raw channel's header: the size
                        continue
                if not self._content_frame(chan, content, ftype, buf, start, end):
                    pos = n
                    break
                continue
            if ftype == 1 and chan is not None and size >= 4 and number not in busy:
                mid = _METHOD_ID.unpack_from(buf, start)[0]
                if (mid == _M_ACK or mid == _M_NACK) and size == 13:
                    tag, bits = _TAG_BIT.unpack_from(buf, start + 4)
                    confirm_hook = chan.raw_confirm
                    if confirm_hook is not None:
                        confirm_hook(tag, bool(bits & 1), mid == _M_ACK)
                    else:
                        chan.on_confirm(mid == _M_ACK, tag, bool(bits & 1))
                    continue
                if mid == _M_DELIVER:
                    if chan.raw_deliver is not None:
                        p = start + 4
                        p += 1 + buf[p]
                        if p + 9 > end:
                            self._slow(buf[start - 7:])
                            pos = n
                            break
                        tag, bits = _TAG_BIT.unpack_from(buf, p)
                        c = chan.content = chan._incoming  # inline begin(): hot
                        c.method, c.tag, c.redelivered = None, tag, bool(bits & 1)
                        c.remaining, c.parts = -1, []
                    else:
                        try:
                            method = deliver_method(buf, start, end)
                        except FrameError as err:
                            self.protocol_error(err.reply_text, err.reply_code)
                            pos = n
                            break
                        chan.content = chan._incoming.begin(method, method.delivery_tag,
                                                            method.redelivered)
                    continue
            self._slow(buf[start - 7:pos])
        if pos >= n:
            self._buf = b""
        elif pos:
            self._buf = bytearray(buf[pos:])
        elif buf is data:
            self._buf = bytearray(data)

    def _slow(self, frame: bytes | bytearray) -> None:
        """Whole frames through the Decoder (the general path)."""
        try:
            events = self.decoder.feed(bytes(frame))
        except FrameError as err:
            for event in getattr(err, "events", []):
                self._event(event)
            self.protocol_error(err.reply_text, err.reply_code)
            return
        for event in events:
            self._event(event)

    def _content_frame(self, chan: Chan, c: Incoming, ftype: int, buf: bytes | bytearray,
                       start: int, end: int) -> bool:
        """A frame on a channel whose basic.deliver is being assembled (fast path);
        False on a protocol error (the connection is then lost)."""
        if ftype == 3 and c.remaining >= 0:
            c.parts.append(bytes(buf[start:end]))
            c.remaining -= end - start
            if c.remaining < 0:
                self.protocol_error("content body exceeds declared size", UNEXPECTED_FRAME)
                return False
            if c.remaining == 0:
                self._delivered(chan, c)
            return True
        if ftype == 2 and c.remaining < 0:
            if end - start < 14:
                self.protocol_error("cannot decode content header", FRAME_ERROR)
                return False
            class_id, weight, body_size = _CONTENT_HEAD.unpack_from(buf, start)
            if class_id != 60 or weight or body_size > self.decoder.max_message_size:
                self.protocol_error(f"bad content header (class {class_id}, weight "
                                    f"{weight}, size {body_size})", UNEXPECTED_FRAME)
                return False
            if c.method is not None:  # a session consumer reads the properties: check them
                props = bytes(buf[start + 12:end])
                try:
                    check_properties(props)
                except (ValueError, IndexError, struct.error) as err:
                    self.protocol_error(f"cannot decode content header properties: {err}",
                                        FRAME_ERROR)
                    return False
                c.properties = props
            c.remaining = body_size
            if body_size == 0:
                self._delivered(chan, c)
            return True
        self.protocol_error("expected content " + ("body" if c.remaining >= 0 else "header") +
                            f", got a frame of type {ftype} on channel {chan.number}",
                            UNEXPECTED_FRAME)
        return False

    def _delivered(self, chan: Chan, c: Incoming) -> None:
        chan.content = None
        parts = c.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        if c.method is None:
            hook = chan.raw_deliver
            if hook is not None:
                hook(c.tag, c.redelivered, body)
        elif chan.listener is not None:
            chan.listener.on_deliver(Content(chan.number, c.method, c.properties, body))

    def _event(self, event: Any) -> None:
        if type(event) is Content:
            chan = self.channels.get(event.channel)
            if chan is None:
                return
            kind = type(event.method)
            if kind is C.Basic.Deliver:
                if chan.listener is not None:
                    chan.listener.on_deliver(event)
            elif kind is C.Basic.Return:
                chan.on_return(event)
            else:
                chan.reply(event)
        elif type(event) is Method:
            if event.channel == 0:
                self._connection_method(event.method)
            else:
                self._channel_method(event.channel, event.method)
        elif type(event) is Heartbeat:
            pass
        elif type(event) is ChannelFault:
            chan = self.channels.get(event.channel)
            if chan is not None:
                self._close_channel_locally(chan, ChannelClosed(event.reply_code,
                                                                event.reply_text))

    def _channel_method(self, number: int, m: Any) -> None:
        chan = self.channels.get(number)
        if chan is None:
            return
        kind = type(m)
        if kind is C.Basic.Ack or kind is C.Basic.Nack:
            if chan.raw_confirm is not None:
                chan.raw_confirm(m.delivery_tag, m.multiple, kind is C.Basic.Ack)
            else:
                chan.on_confirm(kind is C.Basic.Ack, m.delivery_tag, m.multiple)
        elif kind is C.Channel.Close:
            self.out.append(encode_method(number, C.Channel.CloseOk()))
            self.channels.pop(number, None)
            chan.fail(ChannelClosed(m.reply_code, m.reply_text, m.class_id, m.method_id))
        elif kind is C.Basic.Cancel:
            if chan.listener is not None:
                chan.listener.on_cancel(m.consumer_tag)
        elif kind is C.Channel.Flow:
            self.out.append(encode_method(number, C.Channel.FlowOk(active=m.active)))
        elif kind is C.Channel.CloseOk:
            self.channels.pop(number, None)
            chan.reply(m)
            chan.fail(ChannelClosed(200, "channel closed by the client"))
        else:
            chan.reply(m)

    def _connection_method(self, m: Any) -> None:
        kind = type(m)
        if kind is C.Connection.Start:
            self._start(m)
        elif kind is C.Connection.Tune:
            self._tune(m)
        elif kind is C.Connection.OpenOk:
            _settle(self.opened, None)
        elif kind is C.Connection.Close:
            self.out.append(encode_method(0, C.Connection.CloseOk()))
            self.lost(ConnectionLost(m.reply_text, m.reply_code, m.class_id, m.method_id))
        elif kind is C.Connection.CloseOk:
            _settle(self.close_ok, None)
            self.lost(ConnectionLost("connection closed by the client", 200))
        elif kind is C.Connection.Blocked:
            self.blocked = True
            if self.on_blocked is not None:
                self.on_blocked(True, m.reason or "")
        elif kind is C.Connection.Unblocked:
            self.blocked = False
            if self.on_blocked is not None:
                self.on_blocked(False, "")

    def _start(self, m: Any) -> None:
        self.server_properties = dict(m.server_properties or {})
        product = self.server_properties.get("product", "")
        if isinstance(product, bytes):
            product = product.decode("utf-8", "replace")
        self.is_ackmq = "ackmq" in str(product).lower()
        mechanisms = m.mechanisms.decode() if isinstance(m.mechanisms, bytes) else m.mechanisms
        if "PLAIN" not in str(mechanisms).split():
            self.protocol_error(f"server offers no PLAIN login ({mechanisms})")
            return
        o = self.options
        client_properties = {
            "product": "ackmq.client",
            "version": VERSION,
            "platform": f"Python {platform.python_version()}",
            "capabilities": {
                "publisher_confirms": True,
                "exchange_exchange_bindings": True,
                "basic.nack": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "authentication_failure_close": True,
                "per_consumer_qos": True,
            },
        }
        if o.connection_name:
            client_properties["connection_name"] = o.connection_name
        self.out.append(encode_method(0, build_method(
            C.Connection.StartOk, client_properties=client_properties, mechanism="PLAIN",
            response=f"\0{o.username}\0{o.password}", locale="en_US")))

    def _tune(self, m: Any) -> None:
        self.channel_max = min(m.channel_max or CLIENT_CHANNEL_MAX, CLIENT_CHANNEL_MAX)
        self.frame_max = min(m.frame_max or CLIENT_FRAME_MAX, CLIENT_FRAME_MAX)
        ours = self.options.heartbeat
        self.heartbeat = 0 if ours == 0 else (ours if m.heartbeat == 0 else min(ours, m.heartbeat))
        self.decoder.frame_max = self.frame_max
        self._payload_max = self.frame_max - 8
        self.out.append(encode_method(0, build_method(
            C.Connection.TuneOk, channel_max=self.channel_max, frame_max=self.frame_max,
            heartbeat=self.heartbeat)))
        self.out.append(encode_method(0, build_method(
            C.Connection.Open, virtual_host=self.options.vhost)))

    # -- requests ----------------------------------------------------------------------
    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def open_channel(self) -> tuple[Chan, Any]:
        """A new channel and the future of its channel.open-ok."""
        self.check()
        number = self._free_channel()
        chan = Chan(self, number)
        self.channels[number] = chan
        fut = chan.rpc(C.Channel.Open(), (C.Channel.OpenOk,))
        return chan, fut

    def _free_channel(self) -> int:
        for _ in range(self.channel_max):
            number = self._next_channel
            self._next_channel = number % self.channel_max + 1
            if number not in self.channels:
                return number
        raise ClientError(f"all {self.channel_max} channels in use")

    def close_channel(self, chan: Chan) -> Any:
        """channel.close; the future resolves on close-ok."""
        return chan.rpc(build_method(C.Channel.Close, reply_code=200, reply_text="Goodbye",
                                     class_id=0, method_id=0), (C.Channel.CloseOk,))

    def _close_channel_locally(self, chan: Chan, error: ClientError) -> None:
        if chan.error is None:
            self.out.append(encode_method(chan.number, build_method(
                C.Channel.Close, reply_code=error.code if isinstance(error, ChannelClosed)
                else 200, reply_text="client-side fault", class_id=0, method_id=0)))
        chan.fail(error)

    def close(self) -> Any:
        """connection.close; the future resolves on close-ok (or when the peer is gone)."""
        if self.close_ok is None:
            self.close_ok = self.new_future()
            if self.error is not None:
                _settle(self.close_ok, None)
            else:
                self.out.append(encode_method(0, build_method(
                    C.Connection.Close, reply_code=200, reply_text="Normal shutdown",
                    class_id=0, method_id=0)))
        return self.close_ok

    def protocol_error(self, text: str, code: int = 0) -> None:
        self.lost(ConnectionLost(f"protocol error: {text}", code or None))

    def lost(self, error: ConnectionLost) -> None:
        """The connection is gone; every channel and waiter learns it now."""
        if self.error is not None:
            return
        self.error = error
        _settle(self.opened, error=error)
        _settle(self.close_ok, None)
        for chan in list(self.channels.values()):
            chan.fail(error)
        self.channels.clear()
