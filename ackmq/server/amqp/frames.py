"""AMQP 0-9-1's per-message half of a connection and its channels, compiled (mypyc): a
read fed to the decoder, its events dispatched (publishes and acks straight to the
channel's model), deliveries and confirms written as frames.

The method handlers (connection.py, channel.py) stay interpreted and derive from these
classes: they read the fields of pamqp's methods, which a client fills, and compiled
code checks each read against its annotation (a start-ok whose mechanism pamqp gave as
bytes raised TypeError there instead of the refusal). Here only our decoder's events
are read, and of a client's methods only basic.ack, whose fields the decoder makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr
from pamqp import commands as C

from ackmq.broker.errors import HardError, ReplyError, SoftError
from ackmq.protocol.amqp import (
    PROTOCOL_HEADER,
    BadProtocolHeader,
    ChannelFault,
    Content,
    Decoder,
    FrameError,
    Heartbeat,
    Method,
    ProtocolHeader,
    Publish,
    encode_ack,
    encode_deliver,
    encode_nack,
    encode_return,
)
from ackmq.protocol.amqp.constants import CHANNEL_ERROR, NO_ROUTE
from ackmq.protocol.foreign import name_bytes
from ackmq.server.amqp.states import AMQPState
from ackmq.server.delivery import delivery_properties
from ackmq.server.transport import ClientConnection, events_from

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.message import Message
    from ackmq.broker.queue_type import QueueEntry

# the states read per frame, bound once
_OPEN, _CLOSING, _CLOSED = AMQPState.OPEN, AMQPState.CLOSING, AMQPState.CLOSED
_BASIC_ACK = C.Basic.Ack


def class_method(m: Any) -> tuple[int, int]:
    """The class and method ids of a method (0, 0 for none), for a close's fields."""
    idx = getattr(m, "index", 0) or 0
    return idx >> 16, idx & 0xFFFF


@mypyc_attr(allow_interpreted_subclasses=True)
class ChannelFrames:
    """One channel number's per-message output (the model's ChannelOutput: deliveries,
    returns, confirms); channel.py's AMQPChannel adds the method handlers."""

    model: ChannelModel  # set by the subclass, which opens it

    def __init__(self, conn: FrameConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.closing = False  # we sent channel.close and wait for close-ok

    @property
    def writable(self) -> bool:
        return self.conn.writable

    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        msg = entry.message
        assert msg is not None  # only a purge's spilled entries come without one
        self.conn.write(encode_deliver(
            self.number, consumer.tag, delivery_tag, entry.redelivered, msg.exchange,
            msg.routing_key, delivery_properties(entry, consumer.seq_header,
                                                 consumer.count_header),
            msg.body, self.conn.frame_max))

    def unroutable(self, message: Message) -> None:
        self.conn.write(encode_return(self.number, NO_ROUTE, "NO_ROUTE", message.exchange,
                                      message.routing_key, message.properties, message.body,
                                      self.conn.frame_max))

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        if ack:
            self.conn.write(encode_ack(self.number, delivery_tag, multiple))
        else:
            self.conn.write(encode_nack(self.number, delivery_tag, multiple, False))

    def fail(self, err: SoftError, class_id: int = 0, method_id: int = 0,
             text: str | None = None) -> None:
        """Soft error: close this channel only (channel.py)."""
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class FrameConnection(ClientConnection):
    """A connection's reads: decoded, dispatched; connection.py's AMQPConnection adds the
    handshake and the methods' dispatch (`_method`)."""

    decoder: Decoder
    channels: dict[int, ChannelFrames]
    # channels the client closed: frames it pipelined after its channel.close are
    # dropped, as RabbitMQ does, instead of closing the connection with 504
    closed_by_client: set[int]
    frame_max: int

    def _input(self, data: bytes) -> None:
        if self.state == _CLOSED:
            return
        try:
            events = self.decoder.feed(data)
        except BadProtocolHeader as bad:  # (one name per except: compiled, a name has one type)
            # as the 0-9-1 spec says (4.2.2): our header, then close; one line naming
            # what came (RabbitMQ logs {bad_header, <<...>>})
            self.log.warning("AMQP 0-9-1 protocol header expected from %s, got %s: sent "
                             "AMQP 0-9-1's header and closed", self.peer, name_bytes(bad.head))
            self.write(PROTOCOL_HEADER)
            self._shutdown()
            return
        except FrameError as e:
            # the good frames read ahead of the bad one count (published, confirmed)
            self._events(getattr(e, "events", []))
            self.close_connection(e.reply_code, e.reply_text, e.class_id, e.method_id)
            return
        if events:  # a read holding only part of a frame changes nothing: no turn's end
            self._events(events)
            self.ctx.request_flush()

    def _events(self, events: list[Any]) -> None:
        blocking = self.ctx.blocking  # U5: alarms change between reads, never within
        for ev in events:
            if self.state == _CLOSING or self.state == _CLOSED:
                if self.state == _CLOSING and isinstance(ev, Method) and ev.channel == 0:
                    self._closing_method(ev.method)
                continue
            try:
                if type(ev) is Publish:
                    if blocking:  # as RabbitMQ: a publish during a resource alarm waits,
                        self.block_for_alarm(events_from(events, ev))  # unread after (U5)
                        return
                    ch = self.channels.get(ev.channel)
                    if ch is None:
                        self._no_channel(ev.channel)
                        continue
                    if ch.closing:
                        continue
                    try:
                        ch.model.basic_publish(ev.exchange, ev.routing_key, ev.mandatory,
                                               ev.immediate, ev.properties, ev.body)
                    except SoftError as soft:
                        ch.fail(soft, 60, 40)
                elif type(ev) is Method:
                    m = ev.method
                    if type(m) is _BASIC_ACK and self.state == _OPEN:
                        # the consumer's ack, as `_method` and the handler would take it
                        ack = self.channels.get(ev.channel)
                        if ack is not None and not ack.closing:
                            try:
                                ack.model.basic_ack(m.delivery_tag, m.multiple)
                            except SoftError as soft_ack:
                                ack.fail(soft_ack, 60, 80)
                            continue
                    self._method(ev.channel, m)
                elif type(ev) is Heartbeat:
                    pass
                elif type(ev) is Content:  # basic.deliver / return / get-ok from a client
                    self._method(ev.channel, ev.method)
                elif type(ev) is ProtocolHeader:
                    self._start()
                elif type(ev) is ChannelFault:
                    faulty = self.channels.get(ev.channel)
                    if faulty is None:
                        self._no_channel(ev.channel)
                        continue
                    faulty.fail(SoftError(ev.reply_code, ""), ev.class_id, ev.method_id,
                                text=ev.reply_text)
            except HardError as hard:
                cid, mid = class_method(getattr(ev, "method", None))
                if type(ev) is Publish:
                    cid, mid = 60, 40
                self.close_connection(hard.code, hard.text, cid, mid)
                return
            except ReplyError as err:  # a channel error outside a channel: treat as hard
                self.close_connection(err.code, err.text, 0, 0)
                return

    def _no_channel(self, number: int) -> None:
        """A frame for a channel that is not open: dropped if the client closed it (it
        was pipelined behind the close, as RabbitMQ drops it), else 504."""
        if number not in self.closed_by_client:
            raise HardError(CHANNEL_ERROR, "expected 'channel.open'")

    # -- connection.py's -------------------------------------------------------------
    def _method(self, number: int, m: Any) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _closing_method(self, m: Any) -> None:
        raise NotImplementedError

    def close_connection(self, code: int, text: str, class_id: int = 0,
                         method_id: int = 0) -> None:
        raise NotImplementedError
