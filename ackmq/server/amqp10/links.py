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

from ackmq.broker.errors import ReplyError
from ackmq.broker.queue_type import REQUEUE
from ackmq.protocol.amqp10 import Composite
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.addresses import (
    V2_EXCHANGE,
    V2_QUEUE,
    Address,
    AddressError,
    parse_address,
)
from ackmq.protocol.amqp10.types import Described, Timestamp, UInt, ULong
from ackmq.protocol.stomp.destinations import AMQQUEUE, EXCHANGE, QUEUE, TOPIC
from ackmq.server.amqp10 import management
from ackmq.server.amqp10.errors import LinkError
from ackmq.server.amqp10.outcomes import refusal
from ackmq.server.amqp10.transfers import IncomingLink, OutgoingLink

if TYPE_CHECKING:
    from ackmq.broker.queue import Queue
    from ackmq.server.amqp10.session import Session

log = logging.getLogger("ackmq.amqp10")

STREAM_PREFETCH = 1 << 20  # a stream consumer's model prefetch: the link credit decides


def _address(t: Composite | None) -> Address | None:
    if t is None or t.address is None:
        return None
    if not isinstance(t.address, str):
        raise LinkError(F.INVALID_FIELD, "an address that is not a string")
    try:
        return parse_address(t.address)
    except AddressError as e:
        raise LinkError(F.INVALID_FIELD, str(e)) from None


class Incoming(IncomingLink):
    """The client's sender: our receiving end (A3); its transfers: transfers.py."""

    session: Session

    def attach(self) -> None:
        s = self.session
        self.management = self.target is not None and self.target.address == management.ADDRESS
        self.address = None if self.management else _address(self.target)
        self.fixed_routing = self.address.fixed_routing() if self.address is not None else None
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

    def flow(self, p: Composite) -> None:
        if p.delivery_count is not None:
            self.delivery_count = int(p.delivery_count)
        if p.echo:
            self.session.session_flow(self)


class Outgoing(OutgoingLink):
    """The client's receiver: a model consumer on the source's queue (A4, A5)."""

    session: Session

    def __init__(self, session: Session, attach: Composite) -> None:
        super().__init__(session, attach)
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
                s.session_flow(self)
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
            s.session_flow(self)

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
