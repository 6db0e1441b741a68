"""AMQP 1.0 links (SPEC A2-A5). `Incoming`: the client sends (its sender, our receiver):
transfers are published, link credit is granted in rounds of CREDIT and not while a
resource alarm is set (A10). `Outgoing`: the client receives: a model consumer whose
room is the link credit (A5), settled by the client's dispositions (A4):

    accepted                            ack
    released                            requeue
    rejected                            reject: dead-letter (or drop), as basic.reject
    modified delivery-failed            requeue, counting toward x-delivery-limit
    modified undeliverable-here         reject: dead-letter
    snd-settle-mode settled             no-ack (at most once)

A detached link or a lost connection requeues what the client held unsettled (D8).
"""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ackmq.broker.errors import AccessRefused, ReplyError
from ackmq.broker.queue_type import ACK, REJECT, REQUEUE
from ackmq.protocol.amqp10 import Composite, DecodeError, decode_message, error
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.addresses import (
    V2_EXCHANGE,
    V2_QUEUE,
    Address,
    AddressError,
    parse_address,
)
from ackmq.protocol.amqp10.amqp_map import from_amqp091
from ackmq.protocol.amqp10.composite import from_described
from ackmq.protocol.amqp10.kept import From091, To091
from ackmq.protocol.amqp10.types import Described, Timestamp, UInt, ULong
from ackmq.protocol.stomp.destinations import AMQQUEUE, EXCHANGE, QUEUE, TOPIC
from ackmq.server.amqp10 import management
from ackmq.server.amqp10.errors import AmqpError, LinkError, SessionError
from ackmq.server.delivery import delivery_properties

if TYPE_CHECKING:
    from ackmq.broker.queue import Queue
    from ackmq.broker.queue_type import QueueEntry
    from ackmq.server.amqp10.session import Session

log = logging.getLogger("ackmq.amqp10")

CREDIT = 256  # link credit a client sender gets, topped up below half
STREAM_PREFETCH = 1 << 20  # a stream consumer's model prefetch: the link credit decides
ACCEPTED, RELEASED, REJECTED = "accepted", "released", "rejected"
_CONDITIONS = {404: F.NOT_FOUND, 403: F.UNAUTHORIZED_ACCESS, 405: "amqp:resource-locked",
               406: F.PRECONDITION_FAILED, 530: F.NOT_ALLOWED}


def outcome(state: str, err: Composite | None = None) -> Composite:
    if state == REJECTED:
        return Composite("rejected", error=err)
    return Composite(state)


def reply_condition(e: ReplyError) -> str:
    return _CONDITIONS.get(e.code, F.INTERNAL_ERROR)


def refusal(e: ReplyError) -> AmqpError:
    """The model's refusal of an attach or a transfer, in AMQP 1.0's words. A missing
    permission (U3) ends the session with amqp:unauthorized-access and RabbitMQ 4's
    description, which names the permission ("write access to exchange 'x' in vhost
    '/' refused for user 'u'"), as RabbitMQ 4 does; anything else detaches the link."""
    if isinstance(e, AccessRefused):
        return SessionError(F.UNAUTHORIZED_ACCESS, f"{e.permission} {e.detail}")
    return LinkError(reply_condition(e), e.text)


def _terminus(v: Any) -> Composite | None:
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


def _address(t: Composite | None) -> Address | None:
    if t is None or t.address is None:
        return None
    if not isinstance(t.address, str):
        raise LinkError(F.INVALID_FIELD, "an address that is not a string")
    try:
        return parse_address(t.address)
    except AddressError as e:
        raise LinkError(F.INVALID_FIELD, str(e)) from None


class _Link:
    def __init__(self, session: Session, attach: Composite) -> None:
        self.session = session
        self.name = attach.name
        self.handle = int(attach.handle)
        self.attach_frame = attach
        self.source = _terminus(attach.source)
        self.target = _terminus(attach.target)
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


class Incoming(_Link):
    """The client's sender: our receiving end (A3)."""

    def __init__(self, session: Session, attach: Composite) -> None:
        super().__init__(session, attach)
        self.address: Address | None = None
        self.credit = 0
        self.partial: bytearray | None = None
        self.partial_id = 0
        self.partial_settled = False
        self.to091 = To091()  # conversions kept per publisher (kept.py)
        if attach.initial_delivery_count is not None:
            self.delivery_count = int(attach.initial_delivery_count)

    def attach(self) -> None:
        s = self.session
        self.management = self.target is not None and self.target.address == management.ADDRESS
        self.address = None if self.management else _address(self.target)
        if self.address is not None:
            try:
                self._check_node(self.address)
            except ReplyError as e:
                raise refusal(e) from None
        a = self.attach_frame
        s.write(Composite("attach", name=a.name, handle=UInt(self.handle), role=True,
                          snd_settle_mode=a.snd_settle_mode, rcv_settle_mode=0,
                          source=a.source, target=a.target,
                          max_message_size=ULong(s.conn.ctx.config.max_message_size)))
        if not s.conn.ctx.blocking:
            self.top_up()

    def _check_node(self, addr: Address) -> None:
        """At attach, what AMQP 0-9-1 checks (U3), as RabbitMQ 4: a declaring address
        (/queue/, a bare name) needs configure on the queue, declared or not (as
        queue.declare); every target needs write on the exchange its messages are
        published to (`amq.default` for a queue). A topic permission depends on each
        message's routing key: basic.publish checks it per transfer."""
        ch = self.session.channel
        vh = ch.vhost
        if addr.kind in (V2_QUEUE, AMQQUEUE):
            ch.declare_queue(addr.name, passive=True)  # 404 (amqp:not-found), 405
        elif addr.kind == QUEUE:
            ch.ensure_queue(addr.name)
        elif addr.kind in (V2_EXCHANGE, EXCHANGE):
            vh.exchange(addr.name)
        elif addr.kind == TOPIC:
            vh.exchange("amq.topic")
        ch.check_publisher(addr.routing(None)[0])

    def flow_fields(self) -> dict[str, Any]:
        return dict(handle=UInt(self.handle), delivery_count=UInt(self.delivery_count),
                    link_credit=UInt(self.credit))

    def top_up(self) -> None:
        if self.closed or self.credit >= CREDIT // 2:
            return
        self.credit = CREDIT
        self.session._session_flow(self)

    def flow(self, p: Composite) -> None:
        if p.delivery_count is not None:
            self.delivery_count = int(p.delivery_count)
        if p.echo:
            self.session._session_flow(self)

    def transfer(self, p: Composite, payload: bytes) -> None:
        if p.aborted:
            self.partial = None
            return
        if self.partial is None:
            if p.delivery_id is None:
                raise LinkError(F.INVALID_FIELD, "first transfer of a delivery without "
                                                 "delivery-id")
            self.partial_id = int(p.delivery_id)
            self.partial_settled = bool(p.settled)
            if p.more:
                self.partial = bytearray(payload)
                return
            data = payload
        else:
            self.partial += payload
            if p.settled:
                self.partial_settled = True
            if p.more:
                if len(self.partial) > self.session.conn.ctx.config.max_message_size:
                    raise LinkError(F.MESSAGE_SIZE_EXCEEDED, "message larger than "
                                    f"{self.session.conn.ctx.config.max_message_size} bytes")
                return
            data = bytes(self.partial)
            self.partial = None
        if len(data) > self.session.conn.ctx.config.max_message_size:
            raise LinkError(F.MESSAGE_SIZE_EXCEEDED, "message larger than "
                            f"{self.session.conn.ctx.config.max_message_size} bytes")
        if self.credit <= 0:
            raise LinkError(F.TRANSFER_LIMIT_EXCEEDED, "transfer without link credit")
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        self._publish(self.partial_id, self.partial_settled, data)
        if not self.session.conn.ctx.blocking:
            self.top_up()

    def _publish(self, did: int, settled: bool, data: bytes) -> None:
        s = self.session
        try:
            if self.management:
                msg = decode_message(data)
            else:
                msg, props, body = self.to091.convert(data)
        except DecodeError as e:
            raise LinkError(F.DECODE_ERROR, f"message: {e}") from None
        if self.management:  # A7: a request to the management node, answered on the pair
            if not settled:
                self._answer(did, outcome(ACCEPTED))
            reply = management.answer(s, msg)
            if s.management_link is not None:
                s.management_link.reply(reply.encode())
            return
        addr = self.address
        subject = msg.properties.subject if msg.properties is not None else None
        try:
            if addr is None:  # the anonymous terminus: `to` names the node
                to = msg.properties.to if msg.properties is not None else None
                if not isinstance(to, str):
                    raise _Reject(F.PRECONDITION_FAILED, "no 'to' address on a message sent to "
                                                         "the anonymous terminus")
                try:
                    target = parse_address(to)
                except AddressError as e:
                    raise _Reject(F.INVALID_FIELD, str(e)) from None
            else:
                target = addr
            if target.kind == V2_QUEUE and target.name not in s.channel.vhost.queues:
                # RabbitMQ 4: a /queues/ target that is not there (deleted since the
                # attach, or named by `to`) is `rejected` with amqp:not-found
                raise _Reject(F.NOT_FOUND, f"no queue '{target.name}' in vhost "
                                           f"'{s.channel.vhost.name}'")
            exchange, key = target.routing(subject)
            seq, routed = s.channel.basic_publish(exchange, key, True, False, props, body)
        except _Reject as r:
            if not settled:
                self._answer(did, outcome(REJECTED, error(r.condition, r.description)))
            return
        except AccessRefused as e:  # RabbitMQ 4: ends the session (a topic permission,
            raise refusal(e) from None  # or the anonymous terminus's `to`)
        except ReplyError as e:
            if not settled:
                self._answer(did, outcome(REJECTED, error(reply_condition(e), e.text)))
            return
        if settled:
            return
        s.pending[seq] = (self, did)
        if not routed:
            s.released.add(seq)

    def _answer(self, did: int, state: Composite) -> None:
        self.session.write(Composite("disposition", role=True, first=UInt(did), settled=True,
                                     state=state))


class _Reject(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


class Outgoing(_Link):
    """The client's receiver: a model consumer on the source's queue (A4, A5)."""

    def __init__(self, session: Session, attach: Composite) -> None:
        super().__init__(session, attach)
        self.unsettled: dict[int, int] = {}  # delivery id -> the model's delivery tag
        self.from091 = From091()  # conversions kept per consumer (kept.py)
        self.tag = ""
        self.no_ack = attach.snd_settle_mode == 1
        self.management = False  # the management node's replies (A7), no consumer
        self.credit = 0  # the management link's own credit
        self.replies: list[bytes] = []

    def reply(self, payload: bytes) -> None:
        self.replies.append(payload)
        self._send_replies()

    def _send_replies(self) -> None:
        while self.replies and self.credit > 0 and not self.closed:
            self.credit -= 1
            self.session.send_transfer(self, self.replies.pop(0))

    def attach(self) -> None:
        s = self.session
        if self.source is not None and self.source.address == management.ADDRESS:
            self.management = True
            s.management_link = self
            a = self.attach_frame
            s.write(Composite("attach", name=a.name, handle=UInt(self.handle), role=False,
                              snd_settle_mode=1, rcv_settle_mode=0, source=a.source,
                              target=a.target, initial_delivery_count=UInt(0)))
            return
        dynamic = self.source is not None and bool(self.source.dynamic)
        addr = None if dynamic else _address(self.source)
        if addr is None and not dynamic:
            raise LinkError(F.INVALID_FIELD, "a receiving link needs a source address")
        made: list[Queue] = []  # a queue made for this link: gone again if it is refused
        try:
            if dynamic:  # OASIS 3.5.3: a node made for this link (a server-named exclusive
                # queue, gone with the link's connection), its address in our attach
                q = s.channel.declare_queue("", False, False, True, True)
                made.append(q)
                assert self.source is not None
                self.source.address = "/queues/" + quote(q.name, safe="")
            else:
                assert addr is not None
                q = self._source_queue(addr, made)
            tag = f"amqp10-{s.channel_number}-{self.handle}-{self.name}"[:255]
            args, prefetch = self._stream_args(q)
            self.tag = s.channel.basic_consume(q.name, tag, self.no_ack, False, args, prefetch)
        except ReplyError as e:
            for q in made:
                s.channel.vhost.delete_queue(q, notify=False)
            raise refusal(e) from None
        c = s.channel.consumers[self.tag]
        c.credit = 0
        s.by_tag[self.tag] = self
        a = self.attach_frame
        s.write(Composite("attach", name=a.name, handle=UInt(self.handle), role=False,
                          snd_settle_mode=a.snd_settle_mode, rcv_settle_mode=0,
                          source=self.source if dynamic else a.source, target=a.target,
                          initial_delivery_count=UInt(0)))
        s.channel.start_consumer(self.tag)

    def _stream_args(self, q: Queue) -> tuple[dict[str, Any], int]:
        """A6: a stream's consumer starts where the source's filter
        `rabbitmq:stream-offset-spec` says (first, last, next, an offset, a timestamp),
        as RabbitMQ 4; the link credit is its room (the model's required prefetch is
        set high so the credit alone decides)."""
        if q.arguments.get("x-queue-type") != "stream":
            return {}, 0
        args: dict[str, Any] = {}
        filters = self.source.filter if self.source is not None else None
        for key, v in (filters or {}).items():
            if str(key) != "rabbitmq:stream-offset-spec":
                continue
            value = v.value if isinstance(v, Described) else v
            if isinstance(value, Timestamp):
                args["x-stream-offset"] = datetime.datetime.fromtimestamp(
                    int(value) / 1000, datetime.UTC)
            elif isinstance(value, (str, int)) and not isinstance(value, bool):
                args["x-stream-offset"] = value if isinstance(value, str) else int(value)
        return args, STREAM_PREFETCH

    def _source_queue(self, addr: Address, made: list[Queue]) -> Queue:
        """The queue a source address consumes from. /queue/ and a bare name declare it
        (configure, as queue.declare); /exchange/ and /topic/ give the link a
        server-named exclusive queue bound by the bind verb (U3: write on the queue,
        read on the exchange, the topic permission on the binding key, before the
        exchange is looked up, as RabbitMQ 4). Reading it (consume)
        is basic.consume's own check."""
        ch = self.session.channel
        if addr.kind in (V2_QUEUE, AMQQUEUE):
            return ch.declare_queue(addr.name, passive=True)
        if addr.kind == QUEUE:
            return ch.ensure_queue(addr.name)
        if addr.kind == V2_EXCHANGE:
            raise LinkError(F.NOT_ALLOWED, "RabbitMQ 4 consumes from queues only: attach to "
                                           "/queues/:queue")
        exchange, key = ("amq.topic", addr.name) if addr.kind == TOPIC \
            else (addr.name, addr.key or "")
        q = ch.declare_queue("", False, False, True, True)
        made.append(q)
        ch.bind("queue", q.name, exchange, key)
        return q

    def payload(self, entry: QueueEntry) -> bytes:
        msg = entry.message
        assert msg is not None
        c = self.session.channel.consumers.get(self.tag)
        props = delivery_properties(entry, bool(c and c.seq_header), bool(c and c.count_header))
        exchange, key, count, first = (msg.exchange, msg.routing_key, entry.delivery_count,
                                       not entry.redelivered)
        return self.from091.payload(
            (props, exchange, key, count, first), props, msg.body,
            lambda b: from_amqp091(props, b, exchange, key, count, first).encode())

    def flow_fields(self) -> dict[str, Any]:
        if self.management:
            return dict(handle=UInt(self.handle), delivery_count=UInt(self.delivery_count),
                        link_credit=UInt(self.credit))
        c = self.session.channel.consumers.get(self.tag)
        credit = c.credit if c is not None and c.credit is not None else 0
        q = c.queue if c is not None else None
        return dict(handle=UInt(self.handle), delivery_count=UInt(self.delivery_count),
                    link_credit=UInt(max(0, credit)),
                    available=UInt(len(q.ready)) if q is not None and hasattr(q, "ready")
                    else None)

    def flow(self, p: Composite) -> None:
        s = self.session
        if self.management:
            if p.link_credit is not None:
                base = int(p.delivery_count) if p.delivery_count is not None else 0
                self.credit = max(0, base + int(p.link_credit) - self.delivery_count)
            self._send_replies()
            if p.echo or p.drain:
                if p.drain:
                    self.delivery_count += self.credit
                    self.credit = 0
                s._session_flow(self)
            return
        c = s.channel.consumers.get(self.tag)
        if c is None:
            return
        if p.link_credit is not None:
            base = int(p.delivery_count) if p.delivery_count is not None else 0
            c.credit = max(0, (base + int(p.link_credit) - self.delivery_count) & 0xFFFFFFFF
                           if base + int(p.link_credit) >= self.delivery_count else 0)
            if c.credit > 0 and not c.active:
                c.queue.activate(c)  # delivers now what the credit allows
        if p.drain and c.credit:
            # part 2.6.7: no more to send: use up the credit by advancing delivery-count
            self.delivery_count = (self.delivery_count + c.credit) & 0xFFFFFFFF
            c.credit = 0
            s.write(Composite("flow", next_incoming_id=UInt(s.next_incoming_id),
                              incoming_window=UInt(max(0, s.incoming_window)),
                              next_outgoing_id=UInt(s.next_outgoing_id),
                              outgoing_window=UInt(0xFFFFFFFF), drain=True,
                              **self.flow_fields()))
        elif p.echo:
            s._session_flow(self)

    def settle(self, dids: list[int], state: Any) -> None:
        s = self.session
        ch = s.channel
        st = state
        if isinstance(state, Described):
            try:
                st = from_described(state)
            except DecodeError as e:
                raise LinkError(F.DECODE_ERROR, str(e)) from None
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
        for did in dids:
            tag = self.unsettled.pop(did, None)
            if tag is not None and tag in ch.unacked:
                taken += ch.take_for_consumer(self.tag, tag, False)
        if taken:
            try:
                ch.settle(action, taken)
            except ReplyError as e:
                raise LinkError(reply_condition(e), e.text) from None

    def detached(self) -> None:
        """D8: what the client held goes back; the consumer goes."""
        super().detached()
        s = self.session
        if self.management:
            if s.management_link is self:
                s.management_link = None
            return
        ch = s.channel
        s.by_tag.pop(self.tag, None)
        if not ch.open or not self.tag:
            return
        ch.basic_cancel(self.tag)
        held = ch.unacked_of(self.tag)
        taken = [t for tag in held for t in ch.take_for_consumer(self.tag, tag, False)]
        if taken:
            try:
                ch.settle(REQUEUE, taken)
            except ReplyError:
                pass  # a stream keeps nothing to requeue
        for did in self.unsettled:
            s.delivered_on.pop(did, None)
        self.unsettled.clear()
