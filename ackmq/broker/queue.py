"""The classic queue type: ready messages in seq order, consumers served round-robin,
and the rules that make messages leave (ack, TTL, max-length, delivery limit,
dead-lettering). Reached through the `Queue` interface of queue_type.py.

Dispatch never scans idle consumers: only consumers with room sit in `_active`; a consumer
at its prefetch cap leaves it and comes back when an ack frees room (Q2, Q6).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from ackmq.broker.arguments import (
    DELIVERY_COUNT_ARG,
    SEQ_ARG,
    as_text,
    declared_type,
    opt_in,
)
from ackmq.broker.arguments import (
    equivalence_keys as type_equivalence_keys,
)
from ackmq.broker.consumer import Consumer
from ackmq.broker.dedup import QUEUE_ARG, DedupExchange, QueueIds, message_id
from ackmq.broker.delayed import delay_ms
from ackmq.broker.hold import HeldBatch, Holding
from ackmq.broker.message import Message
from ackmq.broker.queue_type import ACK, QUEUE_TYPES, REJECT, REQUEUE, Queue, QueueEntry
from ackmq.broker.readylist import ReadyList
from ackmq.broker.retry import Backoff, RetryHeap, backoff_of
from ackmq.broker.timers import Deadline

if TYPE_CHECKING:
    from ackmq.broker.host import QueueHost
    from ackmq.broker.storage import QueuedMessages

log = logging.getLogger("ackmq.queue")

SEQ_BITS: Final = 40  # seq = (epoch << 40) | n: grows across restarts (x-ackmq-seq, S2)


def _int_arg(args: dict[str, Any], name: str) -> int | None:
    """An integer argument (checked at declare by `check_queue_arguments`; a recovered
    queue's odd value is ignored rather than refused)."""
    v = args.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return None
    return v


def _str_arg(args: dict[str, Any], name: str) -> str | None:
    return as_text(args.get(name))


class ClassicQueue(Queue):
    kind = "classic"

    def __init__(self, vhost: QueueHost, name: str, durable: bool = False, exclusive_owner: Any = None,
                 auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                 epoch: int = 0) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments, epoch)
        self.host = vhost  # the vhost as this type sees it (the seam knows only its name)
        a = self.arguments
        self._retry: RetryHeap[QueueEntry] | None = None  # L6: messages waiting out a back-off
        self._held: Holding | None = None  # waiting for their commit (MQTT QoS 2, hold.py)
        self._settings(vhost.broker.policies.queue_arguments(self))
        self.max_priority = min(_int_arg(a, "x-max-priority") or 0, 255)
        broker = vhost.broker
        self.ready = ReadyList(self.max_priority, broker.spill, self, broker.queue_hot_messages,
                               broker.hot_budget)
        # keyed by id(): consumer tags are unique per channel only
        self.consumers: dict[int, Consumer] = {}
        self._active: deque[Consumer] = deque()
        self._prioritized = 0  # consumers with an x-priority: dispatch picks the highest
        # x-single-active-consumer: only `_single` is served; the others wait, in order
        self.single_active = a.get("x-single-active-consumer") is True
        self._single: Consumer | None = None
        self._unacked = 0
        self.epoch = epoch
        self._n = 0
        self.deleted = False
        self.had_consumers = False
        timers = vhost.broker.timers
        self._ttl = Deadline(timers, self._on_ttl)  # the head's message TTL
        self._expiry = Deadline(timers, self._expired_unused)  # x-expires
        self.persistent_store = vhost.store if durable else None
        self.recovered_counts: dict[int, int] = {}  # seq -> deliveries before a restart
        # x-message-deduplication: the ids of the messages held (broker/dedup.py)
        self.dedup: QueueIds | None = QueueIds() if opt_in(a, QUEUE_ARG) else None
        self.touch()

    def _settings(self, a: dict[str, Any]) -> None:
        """What the effective arguments (declared ⊕ policy ⊕ operator policy, from
        broker/policy.py) set; read at creation and on every policy change (M7)."""
        self.message_ttl = _int_arg(a, "x-message-ttl")
        self.expires = _int_arg(a, "x-expires") or None
        self.max_length = _int_arg(a, "x-max-length")
        self.max_length_bytes = _int_arg(a, "x-max-length-bytes")
        self.delivery_limit = _int_arg(a, "x-delivery-limit")
        self.consumer_timeout = _int_arg(a, "x-consumer-timeout")
        self.backoff = backoff_of(a)  # L6: requeued messages wait this out (retry.py)
        # ackmq's delivery headers, off unless asked (clients see what was published):
        # x-ackmq-seq on every delivery, x-delivery-count on redeliveries (always with a
        # delivery limit or a back-off, as RabbitMQ's quorum queues)
        self.seq_header = opt_in(a, SEQ_ARG)
        self.count_header = opt_in(a, DELIVERY_COUNT_ARG) or self.delivery_limit is not None \
            or self.backoff is not None
        overflow = _str_arg(a, "x-overflow")
        self.overflow = overflow if overflow in ("reject-publish", "reject-publish-dlx") \
            else "drop-head"
        self.dlx = _str_arg(a, "x-dead-letter-exchange")
        self.dlrk = _str_arg(a, "x-dead-letter-routing-key")

    def apply_policy(self) -> None:
        """A policy changed (M7): new settings at once. A lower max-length drops (or
        dead-letters) from the head as a publish would (drop-head; RabbitMQ keeps the
        excess under reject-publish); a new TTL applies to messages published from now
        on, as RabbitMQ's per-message expiry; the x-expires countdown restarts."""
        expires = self.expires
        self._settings(self.host.broker.policies.queue_arguments(self))
        if self.expires != expires:
            self._expiry.cancel()
            self.touch()
        if self.overflow == "drop-head":
            ml, mlb, ready = self.max_length, self.max_length_bytes, self.ready
            while len(ready) and ((ml is not None and len(ready) > ml)
                                  or (mlb is not None and ready.bytes > mlb)):
                self._drop(ready.pop_oldest(), "maxlen")

    # -- identity -----------------------------------------------------------------
    @property
    def equivalence_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        """Compared on redeclare: the declared type's arguments (a quorum queue's are not a
        classic queue's), read only then."""
        return type_equivalence_keys(declared_type(self.arguments))

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    def next_seq(self) -> int:
        self._n += 1
        return (self.epoch << SEQ_BITS) | self._n

    @property
    def message_count(self) -> int:
        held = self._held
        return len(self.ready) + (len(held) if held is not None else 0)

    @property
    def unacked_count(self) -> int:
        return self._unacked

    def browse(self, offset: int, count: int) -> list[QueueEntry]:
        return self.ready.browse(offset, count)

    @property
    def delayed_retry_count(self) -> int:
        """Requeued messages waiting out their back-off (L6): neither ready nor unacked."""
        return len(self._retry) if self._retry is not None else 0

    # -- publish ------------------------------------------------------------------
    def publish(self, message: Message) -> bool:
        """Take a message; False when refused (x-overflow=reject-publish, P6). A duplicate
        (x-message-deduplication) is taken and dropped: True, so it is confirmed."""
        if self.timers is not None and delay_ms(message) > 0:
            return self.timers.publish(message)  # x-delayed-delivery (broker/delayed.py)
        key = None
        ids = self.dedup
        if ids is not None:
            key = message_id(message)
            if key is not None and key in ids:
                ids.duplicates += 1
                return True
        if self._over_limit(message, incoming=True):
            if self.overflow == "drop-head":
                while len(self.ready) and self._over_limit(message, incoming=True):
                    self._drop(self.ready.pop_oldest(), "maxlen")
                if self._over_limit(message, incoming=True):  # max-length 0
                    entry = QueueEntry(message, self.next_seq(), self)
                    self._dead_letter(entry, "maxlen")
                    return True
            else:
                if self.overflow == "reject-publish-dlx":
                    self._dead_letter(QueueEntry(message, self.next_seq(), self), "maxlen")
                return False
        entry = QueueEntry(message, self.next_seq(), self)
        ttl = self.message_ttl
        if message.expiration_ms is not None:
            ttl = message.expiration_ms if ttl is None else min(ttl, message.expiration_ms)
        if ttl == 0:
            # TTL 0: delivered only if a consumer can take it right now, else expired
            if not self._active or len(self.ready) or self._held is not None:
                self._dead_letter(entry, "expired")
                return True
            if ids is not None and key is not None:
                ids.add(key, entry.seq)
            self.ready.append(entry)
            self.dispatch()
            if self.ready.peek() is entry:
                self._drop(self.ready.pop(), "expired")
            return True
        if ttl is not None:
            entry.expires_at = time.monotonic() + ttl / 1000.0
        store = self.persistent_store
        if store is not None and message.persistent:
            store.add(self.name, entry.seq, message.exchange, message.routing_key,
                      message.properties, message.body)
            entry.persisted = True
        if ids is not None and key is not None:
            ids.add(key, entry.seq)
        held = self._held
        if held is not None:  # behind a held publish: waits for its commit too
            held.add(entry)
            return True
        self.ready.append(entry)
        if self._active:
            self.dispatch()
        if entry.expires_at is not None and self.ready.peek() is entry:
            self._schedule_ttl()
        return True

    def hold(self) -> None:
        """From this publish on, new entries wait for this turn's commit (hold.py)."""
        if self.persistent_store is None or self.deleted:
            return  # nothing is written: nothing to wait for
        held = self._held
        if held is None:
            held = self._held = Holding()
        batch = held.start()
        self.host.broker.await_commit_callback(lambda exc: self._held_durable(batch),
                                                waiter=False)

    def _held_durable(self, batch: HeldBatch) -> None:
        """A held batch's commit is done: its entries (and those of every done batch
        after it) become ready. A failed commit releases them too, as it leaves every
        other message it carried in its queue (their publishers have their nacks)."""
        held = self._held
        if held is None or self.deleted:
            return
        entries = held.durable(batch)
        if not held:
            self._held = None
        if not entries:
            return
        ready = self.ready
        for e in entries:
            ready.append(e)
        self._schedule_ttl()
        if self._active:
            self.dispatch()
        self.host.broker.request_flush()

    def recover(self, messages: QueuedMessages, hot: int | None) -> int:
        if self.max_priority:
            hot = None  # a priority queue orders by priority: it needs every entry
        if self.dedup is not None or self.host.feeds_dedup(self):
            hot = None  # every stored message's id is remembered again (broker/dedup.py)
        n = 0
        for seq, _location, delivered in messages:
            if delivered:
                self.recovered_counts[seq] = delivered
            if hot is not None and n >= hot:
                self.ready.append_stored(seq)
            else:
                self.restore(self.load_stored(seq))
            n += 1
        return n

    def load_stored(self, seq: int, keep: bool = False) -> QueueEntry:
        """A recovered message read back from the store by its seq; `keep`: only looked
        at (V3 peek), its delivery count stays for the real read."""
        assert self.persistent_store is not None
        sm = self.persistent_store.read_queued(self.name, seq)
        e = QueueEntry(Message(sm.exchange, sm.routing_key, sm.properties, sm.body, trusted=True),
                       seq, self)
        e.persisted = True
        counts = self.recovered_counts
        count = counts.get(seq, 0) if keep else counts.pop(seq, 0)
        e.redelivered = count > 0
        e.delivery_count = count
        return e

    def restore(self, entry: QueueEntry) -> None:
        """Put back a message recovered from the store (keeps its seq; call in seq order)."""
        msg = entry.message
        if msg is not None and b"x-deduplication-header" in msg.properties:
            key = message_id(msg)
            if self.dedup is not None and key is not None:
                self.dedup.add(key, entry.seq)
            x = self.host.exchanges.get(msg.exchange)
            if isinstance(x, DedupExchange):
                x.seed(msg)
        self.ready.append(entry)

    def _over_limit(self, message: Message, incoming: bool) -> bool:
        ml, mlb = self.max_length, self.max_length_bytes
        if ml is not None and len(self.ready) + (1 if incoming else 0) > ml:
            return True
        if mlb is not None and self.ready.bytes + (len(message.body) if incoming else 0) > mlb:
            return True
        return False

    # -- consumers ------------------------------------------------------------------
    def add_consumer(self, c: Consumer) -> None:
        self.consumers[id(c)] = c
        self.had_consumers = True
        if c.priority:
            self._prioritized += 1
        self.touch()
        if self.single_active:
            if self._single is not None:
                return  # waits until the active one goes
            self._single = c
        self.activate(c)

    def remove_consumer(self, c: Consumer) -> None:
        if self.consumers.pop(id(c), None) is None:
            return
        if c.active:
            try:
                self._active.remove(c)
            except ValueError:
                pass
            c.active = False
        if c.priority:
            self._prioritized -= 1
        self.touch()
        if self._single is c:  # the next consumer, in the order they came, takes over
            self._single = next(iter(self.consumers.values()), None)
            if self._single is not None:
                self.activate(self._single)
        if self.auto_delete and not self.consumers and self.had_consumers and not self.deleted:
            self.host.delete_queue(self, notify=False)

    def activate(self, c: Consumer) -> None:
        """A consumer has room again: put it back in the round-robin and deliver."""
        if c.active or id(c) not in self.consumers:
            return
        if self.single_active and c is not self._single:
            return
        if not c.has_room():
            c.channel.park(c)  # the channel will wake it when it has room
            return
        c.active = True
        self._active.append(c)
        if len(self.ready):
            self.dispatch()

    def dispatch(self) -> None:
        active, ready = self._active, self.ready
        now = 0.0
        while active and len(ready):
            head = ready.peek()
            assert head is not None
            if head.expires_at is not None:
                now = now or time.monotonic()
                if head.expires_at <= now:
                    self._drop(ready.pop(), "expired")
                    continue
            c = active.popleft() if not self._prioritized else self._highest(active)
            if not c.has_room():
                c.active = False
                c.channel.park(c)
                continue
            entry = ready.pop()
            c.channel.deliver(c, entry)
            if c.has_room():
                active.append(c)
            else:
                c.active = False
                c.channel.park(c)

    @staticmethod
    def _highest(active: deque[Consumer]) -> Consumer:
        """Consumer priorities (RabbitMQ's x-priority): the first of the highest priority
        among those with room; lower ones get messages only while all higher are full."""
        best = max(c.priority for c in active)
        for i, c in enumerate(active):
            if c.priority == best:
                del active[i]
                return c
        raise AssertionError("unreachable")

    # -- pull -----------------------------------------------------------------------
    def get(self) -> QueueEntry | None:
        self.touch()
        self._expire_head()
        if not len(self.ready):
            return None
        return self.ready.pop()

    # -- settlement -------------------------------------------------------------------
    def delivered(self, entry: QueueEntry, ack_required: bool) -> None:
        if not ack_required:
            self.settled(entry)  # D3: gone once written to the socket
            return
        self._unacked += 1
        store = self.persistent_store
        if entry.persisted and not self.deleted and store is not None:
            store.delivered(self.name, entry.seq, entry.delivery_count + 1)

    def settle(self, entry: QueueEntry, action: str, backoff: Backoff | None = None) -> bool:
        self._unacked -= 1
        if action == ACK:
            self.settled(entry)
            return False
        if action == REJECT:
            self.reject(entry)
            return False
        self.requeue(entry, dispatch=False, failed=action == REQUEUE, backoff=backoff)
        return True

    def settled(self, entry: QueueEntry) -> None:
        """An ack (or no-ack delivery): the message leaves the queue for good."""
        if self.dedup is not None:
            self.dedup.discard_seq(entry.seq)
        store = self.persistent_store
        if entry.persisted and not self.deleted and store is not None:
            store.remove(self.name, entry.seq)

    def requeue(self, entry: QueueEntry, dispatch: bool = True, failed: bool = True,
                backoff: Backoff | None = None) -> None:
        """Back at its original position (D6, D8), or dead-lettered past x-delivery-limit
        (D10); with a back-off (`backoff`, else the queue's; `failed`: a client's nack or
        reject, else a return) only once its delay is over (L6)."""
        if self.deleted:
            return
        entry.delivery_count += 1
        entry.redelivered = True
        if self.delivery_limit is not None and entry.delivery_count > self.delivery_limit:
            self._drop(entry, "delivery_limit")
            return
        rule = backoff or self.backoff
        if rule is not None:
            delay = rule.delay_ms(entry.delivery_count, failed)
            if delay > 0:
                if self._retry is None:
                    self._retry = RetryHeap(self.host.broker.timers, self._retry_due)
                self._retry.push(entry, delay)
                return
        self._back_in_place(entry, dispatch)

    def _retry_due(self, entries: list[QueueEntry]) -> None:
        """Back-offs over (L6): the messages return to their places and are delivered."""
        if self.deleted:
            return
        for e in entries:
            self._back_in_place(e, False)
        self.dispatch()
        self.host.broker.request_flush()

    def _back_in_place(self, entry: QueueEntry, dispatch: bool) -> None:
        self.ready.requeue(entry)
        if entry.expires_at is not None:
            self._schedule_ttl()
        if dispatch and self._active:
            self.dispatch()

    def reject(self, entry: QueueEntry) -> None:
        """requeue=false: dead-letter (reason rejected) or drop (D6)."""
        if self.deleted:
            return
        self._drop(entry, "rejected")

    def _drop(self, entry: QueueEntry, reason: str) -> None:
        self._dead_letter(entry, reason)
        self.settled(entry)

    def _dead_letter(self, entry: QueueEntry, reason: str) -> None:
        if self.host.trace is not None:
            self.host.trace.dropped(self, entry, reason)
        if self.dlx is not None:
            self.host.dead_letter(self, entry, reason)

    # -- admin --------------------------------------------------------------------
    def purge(self) -> int:
        entries = self.ready.clear()
        if self._held is not None:  # in the queue, waiting for their commit
            entries.extend(self._held.take_all())
        if self._retry is not None:  # waiting out a back-off: in the queue, not with a consumer
            entries.extend(self._retry.clear())
        for e in entries:
            self.settled(e)
        return len(entries)

    def touch(self) -> None:
        """Used now: restart the x-expires countdown."""
        if self.expires is None or self.deleted:
            return
        self._expiry.arm_in(self.expires / 1000.0)

    def _expired_unused(self) -> None:
        if self.deleted:
            return
        if self.consumers:
            self.touch()
            return
        log.info("queue %r expired (x-expires)", self.name)
        self.host.delete_queue(self, notify=True)

    def destroy(self) -> None:
        """Called by the vhost on delete: stop timers, forget everything."""
        self.deleted = True
        self._held = None
        self._ttl.cancel()
        self._expiry.cancel()
        if self._retry is not None:
            self._retry.clear()
        self.ready.discard()
        self._active.clear()
        if self.dedup is not None:
            self.dedup.clear()

    def page_out(self) -> int:
        """U5: the in-memory ready messages go to the front of the spilled tail."""
        return self.ready.page_out()

    # -- TTL --------------------------------------------------------------------------
    def _expire_head(self) -> None:
        ready = self.ready
        now = time.monotonic()
        while len(ready):
            head = ready.peek()
            if head is None or head.expires_at is None or head.expires_at > now:
                break
            self._drop(ready.pop(), "expired")

    def _schedule_ttl(self) -> None:
        head = self.ready.peek()
        if head is None or head.expires_at is None:
            return
        self._ttl.arm_by(head.expires_at)

    def _on_ttl(self) -> None:
        if self.deleted:
            return
        self._expire_head()
        self.host.broker.request_flush()
        # RabbitMQ expires only at the head; a later message with a shorter TTL waits
        self._schedule_ttl()


QUEUE_TYPES["classic"] = ClassicQueue
QUEUE_TYPES["quorum"] = ClassicQueue  # one node: a classic queue already keeps its promises
