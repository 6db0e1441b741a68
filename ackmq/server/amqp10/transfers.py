"""AMQP 1.0's per-message half, compiled (mypyc), as AMQP 0-9-1's is in amqp/frames.py:
a read's plain transfers taken straight from the bytes (the fast lane), published
through the link to the session's model channel, and the model's confirms written as
settled dispositions.

The lane takes a read's whole frames while they are plain transfers (transfer.py reads
them) on an open connection with no alarm set; the first frame that is anything else
(or not all there) and everything after it go through the Decoder and the interpreted
handlers, so every error keeps its one place there. connection.py, session.py and
links.py derive from these classes and add everything else (attach, flow, detach,
deliveries).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from mypy_extensions import mypyc_attr

from ackmq.broker.confirms import take_settled
from ackmq.broker.errors import AccessRefused, ReplyError
from ackmq.broker.queue_type import ACK, REJECT, REQUEUE
from ackmq.protocol.amqp10 import Composite, DecodeError, decode_message, error
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.addresses import V2_QUEUE, Address, AddressError, parse_address
from ackmq.protocol.amqp10.amqp_map import from_amqp091
from ackmq.protocol.amqp10.composite import from_described
from ackmq.protocol.amqp10.kept import From091, To091
from ackmq.protocol.amqp10.transfer import delivery_frames, read_transfer, settled_disposition
from ackmq.protocol.amqp10.types import Described, UInt
from ackmq.server.amqp10 import management
from ackmq.server.amqp10.errors import AmqpError, LinkError, SessionError
from ackmq.server.amqp10.outcomes import (
    ACCEPTED,
    ENCODED,
    REJECTED,
    RELEASED,
    Reject,
    outcome,
    refusal,
    reply_condition,
)
from ackmq.server.amqp10.states import AMQP10State
from ackmq.server.delivery import delivery_properties
from ackmq.server.transport import ClientConnection

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.queue_type import QueueEntry

INCOMING_WINDOW: Final = 5000  # transfer frames a client may send before our next flow
CREDIT: Final = 256  # link credit a client sender gets, topped up below half
_OPEN: Final = AMQP10State.OPEN
_CLOSED: Final = AMQP10State.CLOSED


def terminus(v: Any) -> Composite | None:
    """An attach's source or target as its Composite (None: null)."""
    if isinstance(v, Composite):
        return v
    if isinstance(v, Described):
        try:
            c = from_described(v)
        except DecodeError as e:
            raise LinkError(F.DECODE_ERROR, str(e)) from None
        if c.kind in ("source", "target"):
            return c
    if v is None:
        return None
    raise LinkError(F.DECODE_ERROR, "a source or target that is not one")


@mypyc_attr(allow_interpreted_subclasses=True)
class Link:
    """A link of a session, by the client's handle (links.py: Incoming, Outgoing)."""

    def __init__(self, session: SessionTransfers, attach: Composite) -> None:
        self.session = session
        self.name: Any = attach.name
        self.handle = int(attach.handle)
        self.attach_frame = attach
        self.source = terminus(attach.source)
        self.target = terminus(attach.target)
        self.delivery_count = 0
        self.closed = False

    def refuse_attach(self) -> None:
        """Part 2.6.3: an attach whose terminus is null, then (by the caller) detach."""
        a = self.attach_frame
        our_role = not a.role
        self.session.write(Composite(  # our terminus null: the node is not there
            "attach", name=a.name, handle=UInt(self.handle), role=our_role,
            source=None if our_role is False else a.source,
            target=None if our_role is True else a.target,
            initial_delivery_count=UInt(0) if our_role is False else None))

    def detached(self) -> None:
        self.closed = True


@mypyc_attr(allow_interpreted_subclasses=True)
class IncomingLink(Link):
    """The client's sender, our receiving end (A3): its transfers, published."""

    def __init__(self, session: SessionTransfers, attach: Composite) -> None:
        super().__init__(session, attach)
        self.management = False  # the management node's request link (A7)
        self.address: Address | None = None
        self.fixed_routing: tuple[str, str] | None = None  # the address's, when fixed
        self.credit = 0
        self.partial: bytearray | None = None  # a delivery's transfers so far (more)
        self.partial_id = 0
        self.partial_settled = False
        self.to091 = To091()  # conversions kept per publisher (kept.py)
        if attach.initial_delivery_count is not None:
            self.delivery_count = int(attach.initial_delivery_count)

    def top_up(self) -> None:
        if self.closed or self.credit >= CREDIT // 2:
            return
        self.credit = CREDIT
        self.session.session_flow(self)

    def transfer(self, delivery_id: int | None, settled: bool | None, more: bool,
                 aborted: bool, payload: bytes) -> None:
        if aborted:
            self.partial = None
            return
        ctx = self.session.conn.ctx
        partial = self.partial
        if partial is None:
            if delivery_id is None:
                raise LinkError(F.INVALID_FIELD, "first transfer of a delivery without "
                                                 "delivery-id")
            self.partial_id = delivery_id
            self.partial_settled = bool(settled)
            if more:
                self.partial = bytearray(payload)
                return
            data = payload
        else:
            partial += payload
            if settled:
                self.partial_settled = True
            if more:
                if len(partial) > ctx.config.max_message_size:
                    raise LinkError(F.MESSAGE_SIZE_EXCEEDED, "message larger than "
                                    f"{ctx.config.max_message_size} bytes")
                return
            data = bytes(partial)
            self.partial = None
        if len(data) > ctx.config.max_message_size:
            raise LinkError(F.MESSAGE_SIZE_EXCEEDED, "message larger than "
                            f"{ctx.config.max_message_size} bytes")
        if self.credit <= 0:
            raise LinkError(F.TRANSFER_LIMIT_EXCEEDED, "transfer without link credit")
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        self._publish(self.partial_id, self.partial_settled, data)
        if not ctx.blocking:
            self.top_up()

    def _publish(self, did: int, settled: bool, data: bytes) -> None:
        s = self.session
        if self.management:  # A7: a request to the management node, answered on the pair
            try:
                request = decode_message(data)
            except DecodeError as bad_request:
                raise LinkError(F.DECODE_ERROR, f"message: {bad_request}") from None
            if not settled:
                self._answer(did, outcome(ACCEPTED))
            reply = management.answer(s, request)
            if s.management_link is not None:
                s.management_link.reply(reply.encode())
            return
        try:
            msg, props, body = self.to091.convert(data)
        except DecodeError as bad:
            raise LinkError(F.DECODE_ERROR, f"message: {bad}") from None
        channel = s.channel
        try:
            target = self.address
            routing = self.fixed_routing
            if target is None:  # the anonymous terminus: `to` names the node
                to = msg.properties.to if msg.properties is not None else None
                if not isinstance(to, str):
                    raise Reject(F.PRECONDITION_FAILED, "no 'to' address on a message sent to "
                                                        "the anonymous terminus")
                try:
                    target = parse_address(to)
                except AddressError as bad_to:
                    raise Reject(F.INVALID_FIELD, str(bad_to)) from None
            if target.kind == V2_QUEUE and target.name not in channel.vhost.queues:
                # RabbitMQ 4: a /queues/ target that is not there (deleted since the
                # attach, or named by `to`) is `rejected` with amqp:not-found
                raise Reject(F.NOT_FOUND, f"no queue '{target.name}' in vhost "
                                          f"'{channel.vhost.name}'")
            if routing is None:
                props10 = msg.properties
                routing = target.routing(props10.subject if props10 is not None else None)
            exchange, key = routing
            seq, routed = channel.basic_publish(exchange, key, True, False, props, body)
        except Reject as r:
            if not settled:
                self._answer(did, outcome(REJECTED, error(r.condition, r.description)))
            return
        except AccessRefused as refused:  # RabbitMQ 4: ends the session (a topic
            raise refusal(refused) from None  # permission, or the anonymous terminus's `to`)
        except ReplyError as refusal_:
            if not settled:
                self._answer(did, outcome(REJECTED, error(reply_condition(refusal_),
                                                          refusal_.text)))
            return
        if settled:
            return
        s.pending[seq] = (self, did)
        if not routed:
            s.released.add(seq)

    def _answer(self, did: int, state: Composite) -> None:
        self.session.write(Composite("disposition", role=True, first=UInt(did), settled=True,
                                     state=state))


@mypyc_attr(allow_interpreted_subclasses=True)
class OutgoingLink(Link):
    """The client's receiver (A4, A5): its deliveries' payloads and its settlements."""

    def __init__(self, session: SessionTransfers, attach: Composite) -> None:
        super().__init__(session, attach)
        self.unsettled: dict[int, int] = {}  # delivery id -> the model's delivery tag
        self.from091 = From091()  # conversions kept per consumer (kept.py)
        self.tag = ""
        self.no_ack = attach.snd_settle_mode == 1
        self.management = False  # the management node's replies (A7), no consumer
        self.credit = 0  # the management link's own credit

    def payload(self, entry: QueueEntry) -> bytes:
        msg = entry.message
        assert msg is not None
        c = self.session.channel.consumers.get(self.tag)
        props = delivery_properties(entry, c is not None and c.seq_header,
                                    c is not None and c.count_header)
        exchange, key, count, first = (msg.exchange, msg.routing_key, entry.delivery_count,
                                       not entry.redelivered)
        return self.from091.payload(
            (props, exchange, key, count, first), props, msg.body,
            lambda b: from_amqp091(props, b, exchange, key, count, first).encode())

    def settle(self, dids: list[int], state: Any) -> None:
        ch = self.session.channel
        st = state
        if isinstance(state, Described):
            try:
                st = from_described(state)
            except DecodeError as bad_state:
                raise LinkError(F.DECODE_ERROR, str(bad_state)) from None
        kind = st.kind if isinstance(st, Composite) else None
        if kind == "accepted":
            action = ACK
        elif kind == "released" or kind is None:
            action = REQUEUE
        elif kind == "rejected":
            action = REJECT
        elif kind == "modified":
            action = REJECT if st.undeliverable_here else REQUEUE
        else:
            raise LinkError(F.INVALID_FIELD, f"unknown outcome {kind}")
        taken = []
        unsettled = self.unsettled
        for did in dids:
            tag = unsettled.pop(did, None)
            if tag is not None and tag in ch.unacked:
                taken += ch.take_for_consumer(self.tag, tag, False)
        if taken:
            try:
                ch.settle(action, taken)
            except ReplyError as refused:
                raise LinkError(reply_condition(refused), refused.text) from None


@mypyc_attr(allow_interpreted_subclasses=True)
class SessionTransfers:
    """A session's transfers in and its publishers' outcomes out; session.py's Session
    (which opens the model channel and sets these) adds the rest."""

    conn: TransferConnection
    channel_number: int
    channel: ChannelModel
    links: dict[int, Link]  # by the client's handle
    detaching: set[int]  # handles we detached: the client's detach answers
    next_incoming_id: int
    incoming_window: int
    # confirm seq -> (link, delivery id) of a transfer the client did not settle
    pending: OrderedDict[int, tuple[IncomingLink, int]]
    released: set[int]  # seqs of unroutable publishes
    management_link: Any  # where management replies go (A7)
    by_tag: dict[str, OutgoingLink]  # consumer tag -> link
    delivered_on: dict[int, OutgoingLink]  # unsettled delivery id -> its link
    next_outgoing_id: int
    remote_incoming_window: int

    def transfer(self, handle: int, delivery_id: int | None, settled: bool | None,
                 more: bool, aborted: bool, payload: bytes) -> None:
        """A transfer frame on this session: a link error detaches the link, a session
        error ends the session; anything else is the connection's."""
        try:
            self.next_incoming_id = (self.next_incoming_id + 1) & 0xFFFFFFFF
            self.incoming_window -= 1
            if self.incoming_window < 0:
                raise AmqpError(F.WINDOW_VIOLATION,
                                "transfer past the session's incoming-window")
            if handle in self.detaching:
                return  # sent before the client saw our detach
            link = self.links.get(handle)
            if link is None:
                raise SessionError(F.UNATTACHED_HANDLE, f"handle {handle} is not attached")
            if not isinstance(link, IncomingLink):
                raise AmqpError(F.NOT_ALLOWED, "transfer on a link the client receives on")
            link.transfer(delivery_id, settled, more, aborted, payload)
            if self.incoming_window < INCOMING_WINDOW // 2:
                self.incoming_window = INCOMING_WINDOW
                self.session_flow(None)
        except LinkError as link_err:
            self.link_error(handle, link_err)
        except SessionError as session_err:
            self.end(session_err)

    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        """ChannelOutput: a delivery as a transfer on the consumer's link."""
        link = self.by_tag.get(consumer.tag)
        if link is None:
            return
        if consumer.credit is not None:
            consumer.credit -= 1
        did = self.next_outgoing_id
        frames = delivery_frames(self.channel_number, link.handle, did,
                                 delivery_tag.to_bytes(8, "big"), consumer.no_ack,
                                 link.payload(entry), self.conn.max_frame_size)
        conn = self.conn
        for fr in frames:
            conn.write(fr)
        if not consumer.no_ack:
            link.unsettled[did] = delivery_tag
            self.delivered_on[did] = link
        self.next_outgoing_id = (did + 1) & 0xFFFFFFFF
        self.remote_incoming_window -= len(frames)
        link.delivery_count = (link.delivery_count + 1) & 0xFFFFFFFF

    def disposition(self, role: bool | None, first: int, last: int | None,
                    settled: bool | None, state: Any) -> None:
        """A client's disposition: as a receiver (role true) it settles what we
        delivered; as a sender it tells us nothing (we settle every transfer we
        answer)."""
        if role is not True:
            return
        end = last if last is not None else first
        if end < first or end - first > 1_000_000:
            raise AmqpError(F.INVALID_FIELD, f"disposition range {first}..{end}")
        owner = self.delivered_on
        if end - first < len(owner):
            ids = [d for d in range(first, end + 1) if d in owner]
        else:  # a wide range over few unsettled deliveries: walk those instead
            ids = sorted(d for d in owner if first <= d <= end)
        by_link: dict[int, list[int]] = {}
        links: dict[int, OutgoingLink] = {}
        for did in ids:
            link = owner.pop(did)
            links[id(link)] = link
            by_link.setdefault(id(link), []).append(did)
        for key, dids in by_link.items():
            links[key].settle(dids, state)
        if not settled and by_link:
            self.write(Composite("disposition", role=False, first=UInt(first),
                                 last=UInt(end) if end != first else None, settled=True,
                                 state=state))
        self.conn.ctx.request_flush()

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        """ChannelOutput: the model's confirms as settled dispositions, one per run of
        consecutive delivery ids with one outcome."""
        done = take_settled(self.pending, delivery_tag, multiple)
        released = self.released
        state = ""
        first = last = -1
        for seq, (_link, did) in done:
            if released and seq in released:
                released.discard(seq)
                st = RELEASED
            else:
                st = ACCEPTED if ack else REJECTED
            if first >= 0 and last == did - 1 and st == state:
                last = did
                continue
            if first >= 0:
                self._settle(first, last, state)
            first = last = did
            state = st
        if first >= 0:
            self._settle(first, last, state)

    def _settle(self, first: int, last: int, state: str) -> None:
        self.conn.write(settled_disposition(self.channel_number, True, first,
                                            last if last != first else None, ENCODED[state]))

    # -- session.py's ---------------------------------------------------------------------
    def write(self, p: Composite, payload: bytes = b"") -> None:
        raise NotImplementedError

    def session_flow(self, link: Link | None) -> None:
        raise NotImplementedError

    def link_error(self, handle: int, e: LinkError) -> None:
        raise NotImplementedError

    def end(self, e: AmqpError) -> None:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class TransferConnection(ClientConnection):
    """A connection's reads: plain transfers through the lane, the rest through the
    Decoder; connection.py's AMQP10Connection adds the handshake and the frames."""

    decoder: F.Decoder
    sessions: dict[int, Any]  # connection.py's Sessions
    max_frame_size: int  # what the peer takes from us

    def _input(self, data: bytes) -> None:
        if self.state == _CLOSED:
            return
        dec = self.decoder
        if self.state == _OPEN and not dec.buf and not dec.want_header \
                and not self.ctx.blocking:  # U5/A10: a transfer during an alarm waits
            pos = self._lane(data)
            if pos:
                self.ctx.request_flush()
                if pos == len(data) or self.state == _CLOSED:
                    return
                data = data[pos:]
        self._read(data)

    def _lane(self, data: bytes) -> int:
        """The whole plain transfers at the start of `data`, handled; where they end."""
        n = len(data)
        pos = 0
        limit = self.decoder.max_frame_size
        while n - pos >= 8 and self.state == _OPEN:
            size = ((data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8)
                    | data[pos + 3])
            if size > n - pos or size > limit or data[pos + 4] != 2 or data[pos + 5] != 0:
                break  # not all here, too large, an extended header or a SASL frame
            t = read_transfer(data, pos + 8, pos + size)
            if t is None:
                break
            s: SessionTransfers | None = self.sessions.get((data[pos + 6] << 8) | data[pos + 7])
            if s is None:
                break  # the Decoder's path says why
            pos += size
            try:
                s.transfer(t.handle, t.delivery_id, t.settled, t.more, t.aborted, t.payload)
            except AmqpError as err:
                self.close_connection(err.condition, err.description)
            except ReplyError as refused:  # the model refused something no handler caught
                self.close_connection(F.INTERNAL_ERROR, refused.text)
        return pos

    # -- connection.py's --------------------------------------------------------------------
    def _read(self, data: bytes) -> None:
        raise NotImplementedError

    def close_connection(self, condition: str, description: str) -> None:
        raise NotImplementedError
