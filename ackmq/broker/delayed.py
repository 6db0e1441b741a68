"""Delayed delivery (SPEC L1-L4, L8): the interface of RabbitMQ's
rabbitmq_delayed_message_exchange plugin, kept durable by the segment log.

- Exchange type `x-delayed-message`, argument `x-delayed-type` (the type it routes as:
  direct, fanout, topic, headers, or any other registered type), header `x-delay` (ms).
  A message with a positive `x-delay` that the exchange can route now waits in the
  exchange's timer store and is routed when due, with `x-delay` set to `-delay` (the
  plugin's marker: "already delayed", so a second delayed exchange on the way does not
  delay it again). Routing happens again at due time: the bindings of that moment decide.
- A delay on any exchange: an exchange declared with `x-delayed-delivery: true`
  (any type) honours the same header (`opts_in`); see docs/delays.md for why the
  exchange and not the queue opts in.

The timer store (`TimerStore`) is one hidden durable queue of the segment log per
delayed exchange (`amq.ackmq.delayed.<exchange>`): a persistent message to a durable
delayed exchange is an ADD record of that queue, written and fdatasynced before its
confirm like any queue's (group commit, P5c); when due, the REMOVE and the target
queues' ADDs go in the same turn's write, so kill -9 delivers it late, never twice, never
lost. The record's exchange field holds the due time (ms since the Unix epoch, as
decimal text): the exchange is the queue's owner, and the properties stay byte for byte
as published. Why not a new file format: the log already has group commit, checksums,
recovery, compaction and the power-cut simulator's coverage.

In memory: a stored message due within NEAR_MS is one heap int `(due_ms << 64) | seq`
(O(log n) per publish and per firing), with its body while HOT_MAX allows; one due
later is paged: its seq (8 bytes) in an array for its ~1 s due-time bucket, read back
into the heap LEAD_MS before the bucket starts (so a million pending cost ~32 bytes each,
store index included: tools/perf/delayed_memory.py). One loop timer per store, set for
the earliest heap entry or bucket: no task and no timer per message, nothing done for a
message until it is (nearly) due.
Transient messages (and every message of a non-durable exchange) stay in memory.
"""

from __future__ import annotations

import heapq
import logging
import time
from array import array
from typing import TYPE_CHECKING, Any

from ackmq.broker.errors import COMMAND_INVALID, PRECONDITION_FAILED, HardError, SoftError
from ackmq.broker.exchange import EXCHANGE_CLASSES, Exchange
from ackmq.broker.message import Message
from ackmq.broker.queue_type import Queue
from ackmq.broker.storage import QueueDef, QueuedMessages, Store
from ackmq.broker.timers import Deadline
from ackmq.protocol.amqp.properties import header_value, properties_with_header

if TYPE_CHECKING:
    from ackmq.broker.host import QueueHost

log = logging.getLogger("ackmq.broker")

EXCHANGE_TYPE = "x-delayed-message"
TYPE_ARG = "x-delayed-type"
OPT_IN_ARG = "x-delayed-delivery"  # any exchange: honour x-delay (docs/delays.md)
HEADER = "x-delay"
MAX_DELAY_MS = 4294967295  # the plugin's (Erlang's largest timer): ~49.7 days
HOLDER_PREFIX = "amq.ackmq.delayed."  # hidden store queues; clients cannot declare amq.*
HOT_MAX = 4096      # near messages per store kept with their bodies; others read back
NEAR_MS = 4096      # a stored message due later than this is paged: 8 bytes in a bucket
BUCKET_SHIFT = 10   # paged messages are kept by the ~1 s (1024 ms) bucket of their due time
LEAD_MS = 2048      # a bucket is read back into the heap this long before it is due
FIRE_BATCH = 2048   # messages routed per loop turn; then the loop runs other work
MASK64 = (1 << 64) - 1


def delay_ms(message: Message) -> int:
    """The message's `x-delay` in ms: 0 for none, zero or negative (negative is the
    plugin's "already delayed" marker, delivered at once as the plugin does). Integers,
    floats (truncated) and numeric strings count, as in the plugin; anything else, and a
    delay above MAX_DELAY_MS, is refused with 406 — the plugin delivers those at once
    (or crashes on a non-numeric string), ackmq never silently drops a delay."""
    raw = message.properties
    if b"x-delay" not in raw:
        return 0  # the common case: no parse of the headers table
    v = header_value(raw, HEADER)
    if v is None:
        return 0
    n: int | None = None
    if isinstance(v, bool):
        n = None
    elif isinstance(v, int):
        n = v
    elif isinstance(v, float):
        n = int(v) if v == v and abs(v) != float("inf") else None
    elif isinstance(v, str | bytes | bytearray):
        s = v if isinstance(v, str) else bytes(v).decode("utf-8", "replace")
        try:
            n = int(s.strip(), 10)
        except ValueError:
            n = None
    if n is None:
        raise SoftError(PRECONDITION_FAILED, f"invalid message: 'x-delay' must be an "
                        f"integer number of milliseconds, got {v!r}")
    if n > MAX_DELAY_MS:
        raise SoftError(PRECONDITION_FAILED, f"invalid message: 'x-delay' {n} exceeds "
                        f"the largest delay, {MAX_DELAY_MS} ms")
    return n if n > 0 else 0


def opts_in(arguments: dict[str, Any]) -> bool:
    v = arguments.get(OPT_IN_ARG)
    return v is True or v in ("true", b"true")


def now_ms() -> int:
    return int(time.time() * 1000)


class TimerStore(Queue):
    """A delayed exchange's pending messages, due-time ordered (see the module doc).

    A `Queue` so that routing (vhost.route) and the channel's confirm rule treat it as a
    destination; it is in no listing and takes no consumers."""

    kind = "timer"
    vhost: QueueHost
    hidden = True

    def __init__(self, vhost: QueueHost, owner: Exchange | Queue | None, durable: bool,
                 name: str = "") -> None:
        """`owner`: a delaying exchange (a due message is routed by it) or a queue that
        opted in (a due message goes to it alone); None for a subclass that says where
        a due message goes (`_deliver`) and gives its own `name`."""
        self.vhost = vhost
        self.owner = owner
        self.target = owner if isinstance(owner, Queue) else None
        if owner is not None:
            name = HOLDER_PREFIX + ("q." if self.target is not None else "x.") + owner.name
        self.name = name
        self.durable = durable
        self.exclusive_owner = None
        self.auto_delete = False
        self.arguments = {}
        self.deleted = False
        self.consumers = {}
        self.consumer_timeout = None
        self.seq_header = self.count_header = False
        self.persistent_store: Store | None = vhost.store if durable else None
        self._heap: list[int] = []
        self._hot: dict[int, Message] = {}
        # paged (far) messages: seqs by due-time bucket, the buckets in a heap
        self._far: dict[int, array[int]] = {}
        self._far_keys: list[int] = []
        self._far_count = 0
        self._next = (vhost.broker.epoch << 40) + 1
        self._deadline = Deadline(vhost.broker.timers, self.fire)
        self.fired = 0   # routed when due, so far (introspection)

    # -- counters -----------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return len(self._heap) + self._far_count

    @property
    def unacked_count(self) -> int:
        return 0

    # -- life -----------------------------------------------------------------------
    def save(self) -> None:
        store = self.vhost.store
        if self.durable and store is not None:
            store.save_queue(QueueDef(self.name, True, False, {}))
            self.persistent_store = store

    def destroy(self) -> None:
        self.deleted = True
        self._deadline.cancel()
        self._heap.clear()
        self._hot.clear()
        self._far.clear()
        self._far_keys.clear()
        self._far_count = 0
        store = self.vhost.store
        if self.durable and store is not None:
            store.delete_queue(self.name)

    def recover(self, messages: QueuedMessages, hot: int | None) -> int:
        """Every stored message is read back once (its due time is in the record): those
        due soon go in the heap, the rest are paged (`_hold`)."""
        store = self.persistent_store
        if store is None:
            return 0
        n = 0
        for seq, _loc, _count in messages:
            try:
                sm = store.read_queued(self.name, seq)
                due, msg = self._stored(sm)
            except Exception as e:  # a damaged record: logged, the rest go on
                log.error("delayed message %d of %s unreadable: %s", seq, self.name, e)
                continue
            self._hold(seq, due, msg, True)
            self._next = max(self._next, seq + 1)
            n += 1
        self._arm()
        return n

    # -- publish --------------------------------------------------------------------
    def publish(self, message: Message) -> bool:
        """False (refused: a nack, as reject-publish) when the vhost's
        max-scheduled-messages is reached (broker/scheduled.py)."""
        vh = self.vhost
        limit = vh.broker.vhost_limit(vh.name, "max-scheduled-messages")
        if limit is not None and sum(t.message_count for t in vh.hidden.values()) >= limit:
            return False
        self.enqueue(self.next_seq(), now_ms() + delay_ms(message), message)
        return True

    def next_seq(self) -> int:
        seq = self._next
        self._next = seq + 1
        return seq

    def enqueue(self, seq: int, due: int, message: Message) -> None:
        """Hold `message` until `due` (ms since the epoch): stored when persistent."""
        store = self.persistent_store
        stored = False
        if store is not None and message.persistent:
            store.add(self.name, seq, self._record_exchange(due, message, seq),
                      message.routing_key, message.properties, message.body)
            stored = True
        self._wake_by(self._hold(seq, due, message, stored))

    def _hold(self, seq: int, due: int, message: Message, stored: bool) -> int:
        """Keep a pending message: in the heap when due within NEAR_MS (its body too,
        while HOT_MAX allows, or always when it is not stored), else paged — its seq in
        the bucket of its due time, read back LEAD_MS before that bucket starts. Returns
        when the store must wake for it."""
        if stored and due - now_ms() > NEAR_MS:
            b = due >> BUCKET_SHIFT
            seqs = self._far.get(b)
            if seqs is None:
                seqs = self._far[b] = array("Q")
                heapq.heappush(self._far_keys, b)
            seqs.append(seq)
            self._far_count += 1
            return (b << BUCKET_SHIFT) - LEAD_MS
        heapq.heappush(self._heap, (due << 64) | seq)
        if not stored or len(self._hot) < HOT_MAX:
            self._hot[seq] = message
        return due

    def _load_far(self, now: int) -> None:
        """Buckets starting within LEAD_MS go into the heap, bodies read back now."""
        store = self.persistent_store
        keys = self._far_keys
        while keys and store is not None and (keys[0] << BUCKET_SHIFT) - LEAD_MS <= now:
            seqs = self._far.pop(heapq.heappop(keys))
            self._far_count -= len(seqs)
            for seq in seqs:
                try:
                    due, msg = self._stored(store.read_queued(self.name, seq))
                except Exception as e:  # a damaged record: logged, the rest go on
                    log.error("delayed message %d of %s unreadable: %s", seq, self.name, e)
                    continue
                heapq.heappush(self._heap, (due << 64) | seq)
                self._hot[seq] = msg  # due within seconds: held until then

    def _wake_by(self, wake: int) -> None:
        """Fire no later than `wake` (ms since the epoch, on the broker's one timers)."""
        d = self._deadline
        d.arm_by(d.timers.now() + (wake - now_ms()) / 1000.0)

    def _arm(self) -> None:
        self._deadline.cancel()
        if self.deleted or not (self._heap or self._far_keys):
            return
        wake = self._heap[0] >> 64 if self._heap else 1 << 62
        if self._far_keys:
            wake = min(wake, (self._far_keys[0] << BUCKET_SHIFT) - LEAD_MS)
        self._wake_by(wake)

    def fire(self) -> None:
        """Route what is due (at most FIRE_BATCH now; the rest next turn), then re-arm."""
        if self.deleted:
            return
        heap, now, n, moved = self._heap, now_ms(), 0, 0
        self._load_far(now)
        while heap and heap[0] >> 64 <= now and n < FIRE_BATCH:
            key = heapq.heappop(heap)
            n += 1
            moved += self._route(key & MASK64, key >> 64)
        if moved:
            # the move (this store's REMOVE, the targets' ADDs: one frame) is synced now,
            # not lazily as acks are: a power cut after the copy was delivered must not
            # fire it again (L2: never twice)
            self.vhost.broker.await_commit_callback(_synced, waiter=False)
        if n:
            self.vhost.broker.request_flush()
        if heap and n >= FIRE_BATCH and heap[0] >> 64 <= now:
            self._deadline.arm_in(0)
        else:
            self._arm()

    def _route(self, seq: int, due: int) -> int:
        """Route one due message; 1 if it moved out of the store, else 0."""
        msg = self._hot.pop(seq, None)
        store = self.persistent_store
        stored = store is not None and (msg is None or msg.persistent)
        if msg is None:
            if store is None:
                return 0
            try:
                msg = self._stored(store.read_queued(self.name, seq))[1]
            except Exception as e:
                log.error("delayed message %d of %s unreadable: %s", seq, self.name, e)
                return 0
        if stored and store is not None:
            store.remove(self.name, seq)
        self.fired += 1
        self._deliver(seq, due, msg)
        return 1 if stored else 0

    def _deliver(self, seq: int, due: int, msg: Message) -> None:
        """Due now: route it (x-delay swapped to -delay, as the plugin) or hand it to the
        queue that opted in."""
        delay = _delay_or_zero(msg)
        out = Message(msg.exchange, msg.routing_key,
                      properties_with_header(msg.properties, HEADER, -delay), msg.body,
                      trusted=True)
        out.cc, out.cc_visible = msg.cc, msg.cc_visible
        if self.target is not None:
            queues = [] if self.target.deleted else [self.target]
        else:
            x = self.owner
            queues = self.vhost.route(x, out)  # type: ignore[arg-type]  # x-delay <= 0: at once
            x.stat_out += len(queues)  # type: ignore[union-attr]
        for q in queues:
            q.stat_published += 1
            q.publish(out)


    def _record_exchange(self, due: int, message: Message, seq: int) -> str:
        """The stored record's exchange field: the due time; for a queue's timer store
        also the exchange it was published to (the queue does not know it)."""
        if self.target is None:
            return str(due)
        text = f"{due} {message.exchange}"
        return text if len(text.encode("utf-8")) <= 255 else str(due)

    def _stored(self, sm: Any) -> tuple[int, Message]:
        due, _, exchange = sm.exchange.partition(" ")
        if self.target is None and self.owner is not None:
            exchange = self.owner.name
        return int(due), Message(exchange, sm.routing_key, sm.properties, sm.body,
                                 trusted=True)


def _delay_or_zero(msg: Message) -> int:
    try:
        return delay_ms(msg)
    except SoftError:
        return 0


class Delaying:
    """What a delaying exchange adds to its type (mixed in before it): the timer store,
    made when the vhost declares the exchange and destroyed with it, and the check of
    `x-delay` after routing."""

    timers: TimerStore | None = None
    name: str
    durable: bool

    def declared(self, vhost: QueueHost) -> None:
        t = TimerStore(vhost, self, self.durable)  # type: ignore[arg-type]
        t.save()
        vhost.hidden[t.name] = t
        self.timers = t

    def removed(self) -> None:
        t = self.timers
        if t is not None:
            t.vhost.hidden.pop(t.name, None)
            t.destroy()
            self.timers = None

    @property
    def messages_delayed(self) -> int:
        """The plugin's `messages_delayed` (/api/exchanges, the UI, /metrics)."""
        return self.timers.message_count if self.timers is not None else 0

    def route(self, routing_key: str, message: Message) -> list[Any]:
        dests = self.route_now(routing_key, message)
        # unroutable now: [] at once (mandatory returns it, L4); else held until due
        if dests and self.timers is not None and delay_ms(message) > 0:
            return [self.timers]
        return dests

    def route_now(self, routing_key: str, message: Message) -> list[Any]:
        return super().route(routing_key, message)  # type: ignore[misc]


class DelayedExchange(Delaying, Exchange):
    """`x-delayed-message`: routes as its `x-delayed-type`, after `x-delay` ms."""

    type = EXCHANGE_TYPE

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        inner = self.arguments.get(TYPE_ARG)
        if isinstance(inner, bytes):
            inner = inner.decode("utf-8", "replace")
        cls = EXCHANGE_CLASSES.get(inner) if isinstance(inner, str) else None
        if cls is None or cls is DelayedExchange:
            cls = EXCHANGE_CLASSES["direct"]  # recovery of a definition checked once
        self.inner = cls(self.name, arguments=self.arguments)

    @staticmethod
    def validate(args: dict[str, Any]) -> None:
        """The plugin's validate/1, in its order and with its texts."""
        t = args.get(TYPE_ARG)
        if isinstance(t, bytes):
            t = t.decode("utf-8", "replace")
        if t == EXCHANGE_TYPE:
            raise SoftError(PRECONDITION_FAILED, "Invalid argument, 'x-delayed-message' "
                            "can't be used for 'x-delayed-type'")
        if not isinstance(t, str):
            raise SoftError(PRECONDITION_FAILED, "Invalid argument, 'x-delayed-type' must "
                            "be an existing exchange type")
        cls = EXCHANGE_CLASSES.get(t)
        if cls is None:  # rabbit_exchange:check_type
            raise HardError(COMMAND_INVALID, f"unknown exchange type '{t}'")
        cls.validate(args)

    def _added(self, b: Any) -> None:
        self.inner.bind(b)

    def _removed(self, b: Any) -> None:
        self.inner.unbind(b.key)

    def route_now(self, routing_key: str, message: Message) -> list[Any]:
        return self.inner.route(routing_key, message)


_OPTED: dict[type[Exchange], type[Exchange]] = {}


def exchange_class(cls: type[Exchange], arguments: dict[str, Any]) -> type[Exchange]:
    """The class a declare makes: `cls`, or with `x-delayed-delivery: true` the same type
    delaying by `x-delay` (L1 on any exchange)."""
    if not opts_in(arguments) or issubclass(cls, Delaying):
        return cls
    opted = _OPTED.get(cls)
    if opted is None:
        opted = _OPTED[cls] = type("Delaying" + cls.__name__, (Delaying, cls), {})
    return opted


def queue_declared(vhost: QueueHost, q: Queue) -> None:
    """A new (or recovered) queue with `x-delayed-delivery: true` gets its timer store:
    a message routed to it with a positive `x-delay` waits there (L1, any exchange)."""
    if opts_in(q.arguments) and q.timers is None:
        t = q.timers = TimerStore(vhost, q, q.durable and q.exclusive_owner is None)
        t.save()
        vhost.hidden[t.name] = t


def queue_deleted(vhost: QueueHost, q: Queue) -> None:
    t = q.timers
    if t is not None:
        vhost.hidden.pop(t.name, None)
        t.destroy()
        q.timers = None


EXCHANGE_CLASSES[EXCHANGE_TYPE] = DelayedExchange


def _synced(exc: BaseException | None) -> None:
    """A fired move's commit is done (its failure is the store's to log)."""
