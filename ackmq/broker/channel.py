"""A channel as the model sees it: delivery tags, unacked deliveries, prefetch,
confirm mode and transactions. Protocol-neutral: output goes through `ChannelOutput`
as data (entries, tags, codes); no wire format here.

Unacked deliveries live in an OrderedDict keyed by delivery tag (tags only grow), so an
ack of one tag is O(1) and a `multiple` ack of k tags pops k entries from the front.
"""

from __future__ import annotations

import base64
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from ackmq.broker import browse
from ackmq.broker.access import WRITE
from ackmq.broker.arguments import as_text
from ackmq.broker.confirms import ConfirmTracker
from ackmq.broker.consumer import Consumer
from ackmq.broker.dedup import EXCHANGE_TYPE
from ackmq.broker.errors import (
    ACCESS_REFUSED,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    HardError,
    SoftError,
    check_shortstr,
)
from ackmq.broker.exchange import Exchange
from ackmq.broker.message import Message
from ackmq.broker.operations import Operations
from ackmq.broker.queue_type import ACK, RECOVER, REJECT, REQUEUE, RETURN, Queue, QueueEntry
from ackmq.broker.scheduled import Bounds, store_of
from ackmq.broker.stats import MessageStats, ProtocolStats
from ackmq.broker.timers import Deadline
from ackmq.broker.vhost import REPLY_TO, VHostBroker
from ackmq.protocol.amqp.properties import FLAGS, PropertiesView, properties_edit

if TYPE_CHECKING:
    from ackmq.broker.vhost import VHost


@dataclass(slots=True, eq=False)
class Delivery:
    """One unacked delivery of a channel, by its delivery tag."""

    entry: QueueEntry
    consumer: Consumer | None  # None: a basic.get
    deadline: float | None  # monotonic time of the consumer timeout (H2), None: none

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, entry: QueueEntry, consumer: Consumer | None,
                 deadline: float | None) -> None:
        self.entry, self.consumer, self.deadline = entry, consumer, deadline


Taken = list[tuple[int, Delivery]]  # deliveries taken out of `unacked`, to be settled

# a publish's outcome (C2): (confirm sequence number, 0 when not confirming; routed?)
Outcome = tuple[int, bool]
ROUTED: Outcome = (0, True)
UNROUTED: Outcome = (0, False)

# W6's dead-letter policy for a NACK (`nack_with_limit`): where a message goes
QUEUE_DLX = (None, None)  # the queue's own dead-letter exchange


USER_ID_FLAG: Final = FLAGS["user_id"]  # in the low byte of the property flags
REPLY_TO_FLAG: Final = FLAGS["reply_to"] >> 8  # in the high byte


class ChannelOutput(Protocol):
    """What the model hands the protocol front end, as data: the front end (AMQP's
    server/channel.py, STOMP's) turns it into frames, headers and reply texts."""

    writable: bool
    number: int  # the channel's number on its connection, for error texts
    # L7: a consumer past its timeout is cancelled (`consumer_cancelled` with a reason)
    # rather than the channel closed: an AMQP client that advertised
    # consumer_cancel_notify, a STOMP subscription
    cancel_notify: bool

    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        """A push delivery: `entry` carries the message, `redelivered`, `delivery_count`
        and `seq`; `consumer` its tag and the headers it asked for."""

    def unroutable(self, message: Message) -> None:
        """A mandatory publish that reached no queue (AMQP: basic.return 312 NO_ROUTE)."""

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None: ...

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        """The broker ended a consumer (queue deleted; `reason`: consumer timeout, L7)."""

    def close(self, code: int, text: str) -> None: ...


class _Tx:
    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[tuple[Any, Message, bool]] = []
        # (action, deliveries): action in "ack", "requeue", "reject"
        self.settles: list[tuple[str, Taken]] = []


_NO_STATS = MessageStats()  # a channel made without open_channel counts into this


class ChannelBroker(VHostBroker, Protocol):
    """The broker as a channel sees it (`BrokerModel`, above the channel in broker's
    inner layers, satisfies it): the turn's commit and confirms, the consumer-timeout
    rule, the scheduled-message bounds."""

    @property
    def notify_on_timeout(self) -> bool: ...
    @property
    def schedule_bounds(self) -> Bounds: ...
    def mark_dirty(self, ch: ChannelModel) -> None: ...
    def await_commit(self, ch: ChannelModel, seq: int) -> None: ...
    def await_commit_callback(self, fn: Callable[[BaseException | None], None],
                              waiter: bool = True) -> None: ...
    def channel_closed(self, ch: ChannelModel) -> None: ...


class ChannelModel(Operations):
    def __init__(self, broker: ChannelBroker, vhost: VHost, owner: Any, output: ChannelOutput,
                 consumer_timeout_ms: int | None = None, user: str | None = None) -> None:
        self.vhost = vhost
        self.user = user
        self.reply_to: Queue | None = None  # direct reply-to: this channel's reply queue
        self.broker = broker
        self.owner = owner  # the connection: exclusive queues belong to it
        self.output = output
        self.open = True
        self.next_tag = 1
        self.unacked: OrderedDict[int, Delivery] = OrderedDict()
        self.consumers: dict[str, Consumer] = {}
        self.prefetch_count = 0       # for consumers created from now on (global=false)
        self.global_prefetch = 0      # whole channel (global=true)
        self.global_unacked = 0
        self.confirms: ConfirmTracker | None = None
        self.tx: _Tx | None = None
        self.consumer_timeout_ms = consumer_timeout_ms
        # H2/L7: one deadline per channel, at its soonest unacked delivery's timeout
        self._timeout = Deadline(vhost.broker.timers, self._check_timeout)
        # L7: tags of deliveries taken back from timed-out consumers; a late ack or nack
        # of one is ignored (RabbitMQ 4.3), not a 406 unknown delivery tag
        self._reclaimed: set[int] = set()
        # consumers with room of their own that stopped because the channel had none
        # (global prefetch, socket full): wake() takes them in order, so an ack costs
        # O(consumers it frees), not O(consumers of the channel)
        self._parked: deque[Consumer] = deque()         # manual acks: need has_room()
        self._parked_no_ack: deque[Consumer] = deque()  # no-ack: need can_send() only
        # the queue most recently declared on this channel: an empty queue name in
        # bind/unbind/purge/delete/consume/get means it (RabbitMQ's shortcut)
        self.last_queue = ""
        # U3: the user's permission checks for this channel (ackmq.broker.access.
        # ChannelAccess), set by the front end; None = no checks (embedded/internal use)
        self.access: Any = None
        self.superuser = False  # the admin socket's: no exclusivity either (operations.py)
        # this channel's message counters, summed into its protocol's totals
        # (RabbitMQ's global counters) by `protocol_stats` (both set by open_channel)
        self.stats = _NO_STATS
        self.protocol_stats: ProtocolStats | None = None

    # -- room (Q1-Q3) ---------------------------------------------------------------
    def can_send(self) -> bool:
        return self.open and self.output.writable

    def has_room(self) -> bool:
        return self.can_send() and (self.global_prefetch == 0
                                    or self.global_unacked < self.global_prefetch)

    def park(self, c: Consumer) -> None:
        """`c` left its queue's round-robin for lack of room. If the channel is what stops
        it, wait for wake(); if its own prefetch is full, its own acks bring it back."""
        if c.parked or not c.own_room():
            return
        c.parked = True
        (self._parked_no_ack if c.no_ack else self._parked).append(c)

    def _unpark(self, c: Consumer) -> None:
        if c.parked:
            c.parked = False
            (self._parked_no_ack if c.no_ack else self._parked).remove(c)

    def wake(self) -> None:
        """Room may have appeared (ack, qos, socket drained): parked consumers go back to
        their queues, oldest first, while the channel has room."""
        if not (self._parked or self._parked_no_ack) or not self.can_send():
            return
        for parked, room in ((self._parked_no_ack, self.can_send),
                             (self._parked, self.has_room)):
            while parked and room():
                c = parked.popleft()
                c.parked = False
                if not c.active and self.consumers.get(c.tag) is c:
                    c.queue.activate(c)

    # -- publish --------------------------------------------------------------------
    def basic_publish(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool,
                      properties: bytes, body: bytes, scheduled: bool = False,
                      hold: bool = False) -> Outcome:
        """The publish verb (C2): returns its outcome, (confirm sequence number or 0,
        routed?): routed False is a message no queue took (returned to the output when
        `mandatory`); the confirm of that number comes later through the output. In a
        transaction nothing is routed until the commit: (0, True). `scheduled`: held by
        the vhost's scheduled store and routed when due (STOMP's AMQ_SCHEDULED_*
        headers, broker/scheduled.py). `hold`: a persistent message reaches no consumer
        of a durable queue before the commit that writes it is durable (MQTT QoS 2,
        broker/hold.py)."""
        if immediate:
            raise HardError(NOT_IMPLEMENTED, "immediate=true")
        if len(routing_key) > 63:  # only STOMP and HTTP can send more than a shortstr
            check_shortstr("routing key", routing_key)
        access = self.access  # U3: write on the exchange, cached per channel
        topic = False
        if access is not None and exchange not in access.write_exchanges:
            topic = access.check_publish(exchange)  # True: a topic permission applies
        x = self.vhost.exchange(exchange)
        if x.internal:
            raise SoftError(ACCESS_REFUSED, f"cannot publish to internal exchange "
                                               f"'{exchange}' in vhost '{self.vhost.name}'")
        if topic:
            access.check_topic(WRITE, x, routing_key)
        if self.user is not None and properties[1] & USER_ID_FLAG:
            uid = PropertiesView(properties).user_id
            if uid is not None and uid != self.user:
                raise SoftError(PRECONDITION_FAILED, f"user_id property set to '{uid}' but "
                                                     f"authenticated user was '{self.user}'")
        if properties[0] & REPLY_TO_FLAG and PropertiesView(properties).reply_to == REPLY_TO:
            q = self.reply_to
            if q is None or q.deleted:
                raise SoftError(PRECONDITION_FAILED, "fast reply consumer does not exist")
            properties = properties_edit(properties, set_short={"reply_to": q.name})
        msg = Message(exchange, routing_key, properties, body)  # 406 on a bad expiration,
        # raised before the publish gets a confirm number: it is never confirmed
        mode = msg.delivery_mode
        if mode is not None and mode not in (1, 2):
            raise SoftError(PRECONDITION_FAILED,
                               f"invalid message: {{delivery_mode_unknown,{mode}}}")
        if scheduled:  # the vhost's max-scheduled-messages, and who scheduled it
            msg = store_of(self.vhost).admit(msg, self.user)
        stats = self.stats
        stats.received += 1
        if self.tx is not None:
            self.tx.publishes.append((x, msg, mandatory))
            return ROUTED
        confirms = self.confirms
        if confirms is None:
            return ROUTED if self._enqueue(x, msg, mandatory, scheduled, hold)[2] else UNROUTED
        seq = confirms.publish()
        stored, refused, routed = self._enqueue(x, msg, mandatory, scheduled, hold)
        if self.vhost.trace is not None:
            self.vhost.trace.confirm_owed(self, seq, x, msg, stored, refused)
        stats.received_confirm += 1
        if refused:
            confirms.nack(seq)
        elif stored:
            confirms.wait(seq)
            self.broker.await_commit(self, seq)
            return seq, routed
        else:
            confirms.ack(seq)
            stats.confirmed += 1
        self.broker.mark_dirty(self)
        return seq, routed

    def _enqueue(self, x: Exchange, msg: Message, mandatory: bool,
                 scheduled: bool = False, hold: bool = False) -> tuple[bool, bool, bool]:
        """Route and hand to queues: (written to the store?, refused by a queue?,
        routed?)."""
        queues: list[Queue] = [store_of(self.vhost)] if scheduled else \
            self.vhost.route(x, msg)
        if self.vhost.trace is not None:  # a timer store is no routed queue (yet)
            self.vhost.trace.published(self, x, msg, [q for q in queues if not q.hidden])
        x.stat_in += 1  # the exchange's publish_in and publish_out (management API)
        if not queues:
            if mandatory:
                self.stats.unroutable_returned += 1
                self.output.unroutable(msg)
            else:
                self.stats.unroutable_dropped += 1
            # a dedup exchange's duplicate: confirmed after the next commit, so never
            # before the original it duplicates is fsynced (broker/dedup.py)
            return (x.type == EXCHANGE_TYPE and msg.persistent
                    and self.vhost.store is not None), False, False
        self.stats.routed += 1
        if not queues[0].hidden:  # a timer store's message is counted out when it fires
            x.stat_out += len(queues)
        if hold and msg.persistent:
            for q in queues:
                q.hold()
        stored = refused = False
        for q in queues:
            q.stat_published += 1
            if not q.publish(msg):
                refused = True
            elif msg.persistent and q.persistent_store is not None:
                stored = True
        return stored, refused, True

    # -- deliver --------------------------------------------------------------------
    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        queue = entry.queue
        stats = self.stats  # (`delivered` is the sum of the four delivered_* counters)
        queue.stat_delivered += 1
        if entry.redelivered:
            stats.redelivered += 1
        if not consumer.no_ack:
            stats.delivered_consume_manual_ack += 1
            self.unacked[tag] = Delivery(entry, consumer, self._deadline(queue, consumer))
            consumer.unacked += 1
            self.global_unacked += 1
        else:
            stats.delivered_consume_auto_ack += 1
        queue.delivered(entry, not consumer.no_ack)
        if self.vhost.trace is not None:
            self.vhost.trace.delivered(self, entry)
        self.output.deliver(consumer, tag, entry)

    def timeout_ms(self, queue: Queue, consumer: Consumer | None) -> int | None:
        """L7: the consumer's x-consumer-timeout, else the queue's, else the broker's."""
        if consumer is not None and consumer.timeout_ms is not None:
            return consumer.timeout_ms
        ms = queue.consumer_timeout
        return ms if ms is not None else self.consumer_timeout_ms

    def _deadline(self, queue: Queue, consumer: Consumer | None) -> float | None:
        """When a delivery that needs an ack times out; the channel's one deadline is
        moved earlier when this is sooner (not one timer per delivery)."""
        ms = self.timeout_ms(queue, consumer)
        if not ms:
            return None
        deadline = time.monotonic() + ms / 1000.0
        self._timeout.arm_by(deadline)
        return deadline

    def _check_timeout(self) -> None:
        """H2/L7: an unacked delivery older than its timeout cancels its consumer (the
        front end tells it; its deliveries return) or, for a client that cannot be
        told and for a basic.get, closes the channel (RabbitMQ 3.10's 406)."""
        if not self.open:
            return
        now = time.monotonic()
        soonest = None
        expired: dict[int, Consumer] = {}
        notify = self.broker.notify_on_timeout and getattr(self.output, "cancel_notify", False)
        for d in self.unacked.values():
            deadline = d.deadline
            if deadline is None or (d.consumer is not None and id(d.consumer) in expired):
                continue
            if deadline <= now:
                c = d.consumer
                if c is None or not notify:
                    ms = self.timeout_ms(d.entry.queue, c)
                    self.output.close(PRECONDITION_FAILED,
                                      f"PRECONDITION_FAILED - delivery acknowledgement on channel "
                                      f"{self.output.number} timed out. Timeout value used: {ms} ms. This timeout value "
                                      "can be configured, see consumers doc guide to learn more")
                    return
                expired[id(c)] = c
                continue
            if soonest is None or deadline < soonest:
                soonest = deadline
        for c in expired.values():
            self._time_out(c)
        if self.open and soonest is not None:
            self._timeout.arm_by(soonest)

    def _time_out(self, c: Consumer) -> None:
        """L7 (RabbitMQ 4.3): cancel `c`, tell its client, and return its unacked
        deliveries to their queues (delivery count +1, as any return). A consumer its
        client already cancelled only loses its deliveries: there is no one to tell."""
        tags = [t for t, d in self.unacked.items() if d.consumer is c]
        subscribed = self.consumers.get(c.tag) is c
        if subscribed:
            del self.consumers[c.tag]
            c.queue.remove_consumer(c)
        taken = [(t, self.unacked.pop(t)) for t in tags]
        self._reclaimed.update(tags)
        self._settle(RETURN, taken)
        self._unpark(c)
        if subscribed:
            ms = self.timeout_ms(c.queue, c)
            self.output.consumer_cancelled(
                c.tag, f"consumer timeout: a delivery was not acknowledged within {ms} ms")

    # -- consume ----------------------------------------------------------------------
    def basic_consume(self, queue_name: str, consumer_tag: str, no_ack: bool, exclusive: bool,
                      arguments: dict[str, Any], prefetch: int | None = None) -> str:
        """`prefetch`: this consumer's own cap instead of the channel's basic.qos value
        (a STOMP subscription carries its own prefetch header)."""
        if queue_name == REPLY_TO:
            q = self._reply_queue(no_ack)
        else:
            name = self.queue_name(queue_name)
            if self.access is not None:
                self.access.read("queue", name)
            q = self._queue(name)
        if not consumer_tag:
            consumer_tag = "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode()[:22]
        elif consumer_tag in self.consumers:
            raise HardError(NOT_ALLOWED, f"attempt to reuse consumer tag '{consumer_tag}'")
        limit = self.prefetch_count if prefetch is None else prefetch
        q.check_consume(arguments or {}, no_ack, exclusive, limit)
        c = Consumer(consumer_tag, self, q, no_ack, exclusive, limit, arguments)
        self.consumers[consumer_tag] = c
        return consumer_tag

    def _reply_queue(self, no_ack: bool) -> Queue:
        """Direct reply-to: consuming `amq.rabbitmq.reply-to` (no-ack, once per channel)
        gives the channel its own reply queue; publishes on the channel with that
        reply_to get its real name."""
        if not no_ack:
            raise SoftError(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_to is not None and not self.reply_to.deleted:
            raise SoftError(PRECONDITION_FAILED, "reply consumer already set")
        self.reply_to = self.vhost.reply_queue(self.owner)
        return self.reply_to

    def start_consumer(self, consumer_tag: str) -> None:
        """Begin delivering — after consume-ok has been queued for the socket."""
        c = self.consumers.get(consumer_tag)
        if c is not None:
            c.queue.add_consumer(c)

    def basic_cancel(self, consumer_tag: str) -> None:
        c = self.consumers.pop(consumer_tag, None)
        if c is not None:
            self._unpark(c)
            c.queue.remove_consumer(c)

    def consumer_gone(self, c: Consumer, notify: bool) -> None:
        """The queue went away under the consumer (deleted, expired)."""
        self._unpark(c)
        if self.consumers.pop(c.tag, None) is not None and notify and self.open:
            self.output.consumer_cancelled(c.tag)

    # -- get --------------------------------------------------------------------------
    def basic_get(self, queue_name: str, no_ack: bool) -> tuple[int, QueueEntry, int] | None:
        name = self.queue_name(queue_name)
        if self.access is not None:
            self.access.read("queue", name)
        q = self._queue(name)
        entry = q.get()
        stats = self.stats
        if entry is None:
            stats.get_empty += 1
            return None
        tag = self.next_tag
        self.next_tag = tag + 1
        q.stat_delivered += 1
        if entry.redelivered:
            stats.redelivered += 1
        if not no_ack:
            stats.delivered_get_manual_ack += 1
            self.unacked[tag] = Delivery(entry, None, self._deadline(q, None))
        else:
            stats.delivered_get_auto_ack += 1
        q.delivered(entry, not no_ack)
        if self.vhost.trace is not None:
            self.vhost.trace.delivered(self, entry)
        return tag, entry, q.message_count

    def browse(self, queue_name: str, state: str, offset: int, count: int,
               channels: Iterable[ChannelModel] = ()) -> tuple[Queue, list[QueueEntry]]:
        """V3 peek: look at messages without taking them; what a get needs (read on the
        queue, not another connection's exclusive queue). broker/browse.py."""
        name = self.queue_name(queue_name)
        if self.access is not None:
            self.access.read("queue", name)
        q = self.vhost.queue(name, self.owner)
        return q, browse.entries(q, state, offset, count, channels)

    # -- acks (D4-D7) -------------------------------------------------------------------
    def _take(self, tag: int, multiple: bool) -> Taken:
        unacked = self.unacked
        if self._reclaimed and (multiple or tag in self._reclaimed) \
                and self._forget_reclaimed(tag, multiple):
            # L7: a late settle of a delivery taken back from a timed-out consumer
            if not multiple:
                return []
            late: Taken = []
            while unacked and next(iter(unacked)) <= tag:
                late.append(unacked.popitem(last=False))
            return late
        if multiple:
            if tag == 0:
                taken = list(unacked.items())
                unacked.clear()
                return taken
            if tag not in unacked:
                raise SoftError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            taken = []
            while unacked:
                first = next(iter(unacked))
                if first > tag:
                    break
                taken.append(unacked.popitem(last=False))
            return taken
        d = unacked.pop(tag, None)
        if d is None:
            raise SoftError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        return [(tag, d)]

    def _forget_reclaimed(self, tag: int, multiple: bool) -> bool:
        """Drop reclaimed tags a settle covers; True when `tag` itself was one."""
        r = self._reclaimed
        late = tag in r
        if multiple and tag == 0:
            r.clear()
        elif multiple:
            r.difference_update([t for t in r if t <= tag])
        else:
            r.discard(tag)
        return late

    def unacked_of(self, consumer_tag: str) -> list[int]:
        """The delivery tags of one consumer's unacked deliveries, oldest first."""
        return [t for t, d in self.unacked.items()
                if d.consumer is not None and d.consumer.tag == consumer_tag]

    def check_unacked(self, consumer_tag: str, tag: int) -> Delivery:
        """`tag` as an unacked delivery of that consumer; refused as D7 refuses a tag
        otherwise (406 unknown delivery tag)."""
        d = self.unacked.get(tag)
        if d is None or d.consumer is None or d.consumer.tag != consumer_tag:
            raise SoftError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        return d

    def take_for_consumer(self, consumer_tag: str, tag: int, multiple: bool) -> Taken:
        """STOMP's acks name one subscription: `tag` alone, or with `multiple` every unacked
        delivery of the same consumer up to it (STOMP `client` mode); other consumers'
        deliveries on the channel stay. A tag that is not an unacked delivery of that
        consumer is refused as D7 refuses it. Settle what this returns with `settle` or
        `nack_with_limit`."""
        d = self.check_unacked(consumer_tag, tag)
        unacked = self.unacked
        if not multiple:
            del unacked[tag]
            return [(tag, d)]
        consumer = d.consumer
        tags = []
        for t, other in unacked.items():
            if t > tag:
                break
            if other.consumer is consumer:
                tags.append(t)
        return [(t, unacked.pop(t)) for t in tags]

    def settle(self, action: str, taken: Taken) -> None:
        """Apply "ack", "requeue", "return" or "reject" to deliveries from `take_for_consumer`."""
        self._check_settle(action, taken)
        self._settle(action, taken)

    def nack_with_limit(self, taken: Taken, requeue: bool, fallback_queue: str | None,
                        default_limit: int) -> None:
        """A NACK under a redelivery limit (W6, ActiveMQ's redelivery policy): the queue's
        x-delivery-limit, else `default_limit`, applies when the message has a dead-letter
        target: the queue's dead-letter exchange, else `fallback_queue` (declared durable
        on first use: ActiveMQ.DLQ). A message past the limit, or not requeued, goes
        there; without a target the limit does not apply and a NACK requeues for ever
        (or drops with requeue=false), as RabbitMQ. `taken` comes from one queue."""
        self._check_settle(REQUEUE if requeue else REJECT, taken)  # streams refuse (540)
        q = taken[0][1].entry.queue
        target = self._dead_letter_target(q, fallback_queue)
        if not requeue:
            if target is None or target == QUEUE_DLX:
                self._settle(REJECT, taken)  # the queue's DLX, or dropped (as RabbitMQ)
            else:
                self._dead_letter(taken, "rejected", target)
            return
        limit = _delivery_limit(q)
        if target is None or (limit is not None and target == QUEUE_DLX):
            self._settle(REQUEUE, taken)  # RabbitMQ's form: back to the queue (D10 applies)
            return
        if limit is None:
            limit = default_limit
        over = [td for td in taken if td[1].entry.delivery_count + 1 > limit]
        if over:
            taken = [td for td in taken if td[1].entry.delivery_count + 1 <= limit]
            self._dead_letter(over, "delivery_limit", target)
        if taken:
            self._settle(REQUEUE, taken)

    def _dead_letter_target(self, q: Queue, fallback_queue: str | None
                            ) -> tuple[str | None, str | None] | None:
        """(exchange, routing key) for a dead letter; QUEUE_DLX: the queue's own."""
        if as_text(q.arguments.get("x-dead-letter-exchange")) is not None:
            return QUEUE_DLX
        if fallback_queue is not None:
            if fallback_queue not in self.vhost.queues:
                self.vhost.declare_queue(fallback_queue, False, True, False, False, {},
                                         self.owner)
            return "", fallback_queue
        return None

    def _dead_letter(self, taken: Taken, reason: str,
                     target: tuple[str | None, str | None]) -> None:
        for _tag, d in taken:
            q = d.entry.queue
            if not q.deleted:
                self.vhost.dead_letter(q, d.entry, reason, target[0], target[1])
        self._settle(ACK, taken, "nack")  # the copy is dead-lettered: the original is
        # settled (a NACK for the lifecycle events, not an ack)

    def basic_ack(self, tag: int, multiple: bool) -> None:
        taken = self._take(tag, multiple)
        if self.tx is not None:
            self.tx.settles.append((ACK, taken))
            return
        self._settle(ACK, taken)

    def basic_nack(self, tag: int, multiple: bool, requeue: bool, verb: str = "nack") -> None:
        taken = self._take(tag, multiple)
        action = REQUEUE if requeue else REJECT
        self._check_settle(action, taken)
        if self.tx is not None:
            self.tx.settles.append((action, taken))
            return
        self._settle(action, taken, verb)

    def basic_reject(self, tag: int, requeue: bool) -> None:
        self.basic_nack(tag, False, requeue, "reject")

    def _settle(self, action: str, taken: Taken, verb: str = "") -> None:
        """`verb`: what the client said, for the lifecycle events (nack or reject)."""
        if self.vhost.trace is not None:
            self.vhost.trace.settled(verb or ("ack" if action == ACK else "nack"), action,
                                     taken)
        ack = action == ACK
        if ack:
            self.stats.acknowledged += len(taken)
        touched: dict[int, Queue] = {}
        for _tag, d in taken:
            entry, consumer = d.entry, d.consumer
            q = entry.queue
            if ack:
                q.stat_acked += 1
            if consumer is not None:
                consumer.unacked -= 1
                self.global_unacked -= 1
                if not consumer.active and not consumer.parked:
                    self.park(consumer)  # it may have been at its own prefetch
            # L6: a consumer's own back-off covers what it fails while subscribed; what a
            # cancelled consumer hands back (prefetched, never seen) gets the queue's
            backoff = consumer.backoff if consumer is not None and consumer.backoff is not None \
                and self.consumers.get(consumer.tag) is consumer else None
            if q.settle(entry, action, backoff):
                touched[id(q)] = q
        for q in touched.values():
            q.dispatch()
        self.wake()

    def basic_recover(self, requeue: bool) -> None:
        if not requeue:
            raise HardError(NOT_IMPLEMENTED, "requeue=false")
        taken = self._take(0, True)
        self._check_settle(RECOVER, taken)
        self._settle(RETURN, taken)

    def _check_settle(self, action: str, taken: Taken) -> None:
        """Each queue type may refuse a settlement (streams: nack, reject, recover); the
        deliveries then stay unacked, to be requeued as the connection closes."""
        try:
            for q in {id(d.entry.queue): d.entry.queue for _t, d in taken}.values():
                q.check_settle(action)
        except Exception:
            for t, d in taken:
                self.unacked[t] = d
            self.unacked = OrderedDict(sorted(self.unacked.items()))
            raise

    def basic_qos(self, prefetch_size: int, prefetch_count: int, global_: bool) -> None:
        if prefetch_size:
            raise HardError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({prefetch_size})")
        if global_:
            self.global_prefetch = prefetch_count
        else:
            self.prefetch_count = prefetch_count
        self.wake()

    def channel_flow(self, active: bool) -> None:
        """A client asking the broker to pause deliveries: RabbitMQ 3.10 refuses it (540,
        closing the connection), and so does ackmq; active=true is a no-op."""
        if not active:
            raise HardError(NOT_IMPLEMENTED, "active=false")

    # -- confirm mode and transactions (P1, P2, T1-T3) -------------------------------
    def confirm_select(self) -> None:
        if self.tx is not None:
            raise SoftError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = ConfirmTracker()

    def flush_confirms(self) -> None:
        if self.confirms is None or not self.open:
            return
        for ack, tag, multiple in self.confirms.drain():
            self.output.confirm(ack, tag, multiple)

    def tx_select(self) -> None:
        if self.confirms is not None:
            raise SoftError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = _Tx()

    def tx_commit(self, done: Callable[[BaseException | None], None]) -> None:
        """Apply the transaction; `done` runs once persistent messages are fsynced (T3)."""
        tx = self.tx
        if tx is None:
            raise SoftError(PRECONDITION_FAILED, "channel is not transactional")
        self.tx = _Tx()
        for action, taken in tx.settles:
            self._settle(action, taken)
        stored = False
        for x, msg, mandatory in tx.publishes:
            s = self._enqueue(x, msg, mandatory)[0]
            stored = stored or s
        if stored:
            self.broker.await_commit_callback(done)
        else:
            done(None)

    def tx_rollback(self) -> None:
        tx = self.tx
        if tx is None:
            raise SoftError(PRECONDITION_FAILED, "channel is not transactional")
        self.tx = _Tx()
        if tx.settles:  # rolled-back acks leave the deliveries unacked (T1)
            for _action, taken in tx.settles:
                for tag, d in taken:
                    self.unacked[tag] = d
            self.unacked = OrderedDict(sorted(self.unacked.items()))

    # -- close (D8) -------------------------------------------------------------------
    def close(self) -> None:
        """Cancel consumers first, then requeue every unacked delivery in tag order."""
        if not self.open:
            return
        self.open = False
        self._timeout.cancel()
        for c in list(self.consumers.values()):
            c.queue.remove_consumer(c)
        self.consumers.clear()
        self._parked.clear()
        self._parked_no_ack.clear()
        pending: Taken = []
        if self.tx is not None:
            for _action, taken in self.tx.settles:
                pending.extend(taken)
            self.tx = None
        pending.extend(self.unacked.items())
        self.unacked.clear()
        pending.sort(key=lambda td: td[0])
        touched: dict[int, Queue] = {}
        for _tag, d in pending:
            q = d.entry.queue
            if q.settle(d.entry, RETURN, d.consumer.backoff if d.consumer is not None else None):
                touched[id(q)] = q
        for q in touched.values():
            q.dispatch()
        self.broker.channel_closed(self)


def _delivery_limit(q: Queue) -> int | None:
    """The queue's own x-delivery-limit (D10), read from its arguments (any queue type)."""
    v = q.arguments.get("x-delivery-limit")
    return v if type(v) is int and v >= 0 else None
