"""The broker: vhosts, the store, and the once-per-turn work (group commit, confirms).

The server calls `end_of_turn()` once per event-loop turn in which anything happened:
everything buffered in the store during that turn goes to disk in one commit, and every
channel with settled confirms sends them, coalesced. The broker itself never waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from ackmq.broker import scheduled
from ackmq.broker.channel import ChannelModel
from ackmq.broker.delayed import HOLDER_PREFIX
from ackmq.broker.errors import NOT_ALLOWED, HardError
from ackmq.broker.exchange import EXCHANGE_CLASSES
from ackmq.broker.policy import PolicyBook
from ackmq.broker.queue_type import Queue
from ackmq.broker.readylist import QUEUE_HOT_MESSAGES, QUEUE_MEMORY_MB, HotBudget
from ackmq.broker.stats import BrokerStats
from ackmq.broker.storage import QueuedMessages, Store, StreamStorage
from ackmq.broker.timers import Timers
from ackmq.broker.vhost import VHost
from ackmq.broker.vhost_store import VHostStore, split

log = logging.getLogger("ackmq.broker")


class Scheduler(Protocol):
    """The turn for the model, supplied by the server (asyncio) or a test. Time is the
    broker's `timers` (broker/timers.py), driven by whoever owns the clock."""

    def request_flush(self) -> None:
        """Ask for `BrokerModel.end_of_turn` to run soon (after the current callbacks)."""

    def send_output(self) -> None:
        """Write what the connections gathered so far (deliveries, replies) to their
        sockets now: the broker is about to block in an inline fdatasync that only the
        turn's confirms need to wait for."""


class NullScheduler:
    """A Scheduler whose flush requests do nothing, for driving the model without a
    server (model tests, in-process benches): the caller runs `end_of_turn` itself, and
    the broker's timers fire only when it runs them."""

    def request_flush(self) -> None:
        pass

    def send_output(self) -> None:
        pass


# A commit with at most this many waiters (publishes to confirm, tx.commits, receipts),
# while recent commits averaged at most INLINE_SYNC_AVG, may be fdatasynced inline: a
# lone confirm-each publisher. Many publishers share the sync thread's group commit
# instead: an inline fsync stalls the loop, and one every other fsync halved how many
# waiters each fsync served (32 publishers: 0.8x the throughput).
INLINE_SYNC_WAITERS = 4
INLINE_SYNC_AVG = 1.5
RECOVER_HOT = 4096  # entries a recovered queue reads back at start; the rest stay in the store


class _Join:
    """A callback for `n` commits: `fn(first error or None)` once all have called it."""

    __slots__ = ("n", "fn", "exc")

    def __init__(self, n: int, fn: Callable[[BaseException | None], None]) -> None:
        self.n, self.fn = n, fn
        self.exc: BaseException | None = None

    def __call__(self, exc: BaseException | None) -> None:
        self.exc = self.exc or exc
        self.n -= 1
        if self.n == 0:
            self.fn(self.exc)


class BrokerModel:
    def __init__(self, scheduler: Scheduler, store: Store | None = None,
                 consumer_timeout_ms: int | None = None, spill: Any = None,
                 queue_hot_messages: int = QUEUE_HOT_MESSAGES,
                 queue_memory: int = QUEUE_MEMORY_MB << 20,
                 streams: StreamStorage | None = None) -> None:
        self.scheduler = scheduler
        self.timers = Timers()  # C5: every deadline (broker/timers.py)
        self.store = store
        self.streams = streams  # stream queues' logs (R1), committed before the store
        self.spill = spill  # deep queues keep their tails there (ackmq.store.spill)
        self.queue_hot_messages = queue_hot_messages  # per queue, at most
        self.hot_budget = HotBudget(queue_memory)     # all queues together
        self.consumer_timeout_ms = consumer_timeout_ms
        self.notify_on_timeout = True  # L7: cancel a consumer that can be told (else close)
        self.epoch = 0
        self.vhosts: dict[str, VHost] = {}
        self._dirty: dict[int, ChannelModel] = {}
        self._commit_waiters: list[tuple[ChannelModel, int]] = []
        self._commit_callbacks: list[Callable[[BaseException | None], None]] = []
        self._riders = 0  # of those, callbacks no one waits on (await_commit_callback)
        self._waiters_avg = 0.0  # waiters per commit that had any (moving average)
        # inside end_of_turn: a commit synced inline confirms in this same turn (the
        # _dirty loop below), so it asks for another turn only if it left work behind
        self._in_turn = False
        self._again = False
        self.store_failures = 0
        self.stats = BrokerStats()  # /metrics, the UI (broker/stats.py)
        self.policies = PolicyBook(self)  # policies, operator policies (M5-M7)
        self.schedule_bounds = scheduled.Bounds()  # what one scheduled SEND may ask (L5)
        # a vhost's limit by key (the access model's, set by the server): None for none
        self.vhost_limit: Callable[[str, str], int | None] = lambda vhost, key: None

    # -- start-up -----------------------------------------------------------------
    def start(self, vhosts: tuple[str, ...] | list[str] = ("/",)) -> None:
        """Recover durable state from the store (or start empty). `vhosts`: the vhosts
        that exist (the access model's); stored definitions of any other are skipped."""
        for name in vhosts:
            self.vhosts[name] = VHost(self, name)
        if self.store is None:
            return
        rec = self.store.open()
        self.store.set_before_sync(self.scheduler.send_output)
        self.epoch = rec.epoch
        store, self.store = self.store, None  # recovery must not write back
        skipped: set[str] = set()
        orphans: list[str] = []
        holders: list[tuple[VHost, str, str]] = []

        def where(stored: str) -> tuple[VHost | None, str]:
            vname, name = split(stored)
            vh = self.vhosts.get(vname)
            if vh is None:
                skipped.add(vname)
            return vh, name

        try:
            for x in rec.exchanges:
                vh, name = where(x.name)
                if vh is None or name in vh.exchanges or x.type not in EXCHANGE_CLASSES:
                    continue
                vh.declare_exchange(name, x.type, False, True, x.auto_delete, x.internal,
                                    x.arguments, check=False)
            for qd in rec.queues:
                vh, name = where(qd.name)
                if vh is None:
                    continue
                if name.startswith(HOLDER_PREFIX):  # a timer store (broker/delayed.py)
                    holders.append((vh, name, qd.name))
                    continue
                q = vh.declare_queue(name, False, True, False, qd.auto_delete, qd.arguments,
                                     None, check=False)
                q.persistent_store = store if vh.name == "/" else VHostStore(store, vh.name)
            for vh, name, stored in holders:  # once their owners exist
                timers = vh.hidden.get(name)
                if timers is None and name == scheduled.STORE_NAME:
                    timers = scheduled.store_of(vh)
                if timers is None:
                    orphans.append(stored)
                else:
                    timers.persistent_store = store if vh.name == "/" else \
                        VHostStore(store, vh.name)
            for b in rec.bindings:
                vh, source = where(b.source)
                if vh is None or source not in vh.exchanges:
                    continue
                dname = split(b.destination)[1]
                dest = (vh.queues.get(dname) if b.destination_kind == "queue"
                        else vh.exchanges.get(dname))
                if dest is not None:
                    vh.bind(source, dest, b.routing_key, b.arguments)
            count = 0
            for qname in list(rec.messages):
                msgs = rec.messages.pop(qname)
                vh, name = where(qname)
                held = None if vh is None else vh.queues.get(name) or vh.hidden.get(name)
                if held is not None:
                    count += self._restore_queue(held, msgs)
        finally:
            self.store = store
        for orphan in orphans:  # its exchange was deleted before its timer store
            store.delete_queue(orphan)
        for vh in self.vhosts.values():
            for timers in vh.hidden.values():
                if timers.persistent_store is None:
                    timers.save()  # type: ignore[attr-defined]
        if skipped:
            log.warning("stored definitions of deleted vhosts %s were not recovered",
                        sorted(skipped))
        log.info("recovered %d exchanges, %d queues, %d bindings, %d messages (epoch %d)",
                 len(rec.exchanges), len(rec.queues), len(rec.bindings), count, self.epoch)

    def add_vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(self, name)
        return vh

    def delete_vhost(self, name: str) -> None:
        """U2: the vhost's queues go (their stored messages with them), then its
        exchanges and bindings. Its connections are closed by the server first."""
        self.policies.forget_vhost(name)
        vh = self.vhosts.pop(name, None)
        if vh is None:
            return
        for q in list(vh.queues.values()):
            vh.delete_queue(q, notify=False)
        for x in list(vh.exchanges.values()):
            if x.name and not x.name.startswith("amq.") and vh.exchanges.get(x.name) is x:
                vh._remove_exchange(x)
        for timers in list(vh.hidden.values()):  # the vhost's STOMP schedules
            timers.destroy()
        vh.hidden.clear()

    def user_deleted(self, name: str) -> None:
        """The schedules the user made end with them (broker/scheduled.py)."""
        for vh in self.vhosts.values():
            scheduled.user_gone(vh, name)

    def _restore_queue(self, q: Queue, msgs: QueuedMessages) -> int:
        """Messages of one recovered queue: the first few thousand are read back now; the
        rest stay references into the store, read back as the queue drains (so a restart
        with millions of messages needs memory for none of their bodies)."""
        hot = min(self.queue_hot_messages, RECOVER_HOT) if self.spill is not None else None
        return q.recover(msgs, hot)

    def vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            raise HardError(NOT_ALLOWED, f"vhost {name} not found")
        return vh

    def open_channel(self, vhost: VHost, owner: Any, output: Any,
                     user: str | None = None, protocol: str = "amqp091") -> ChannelModel:
        """`user`: who logged in (a publish's `user_id` must name them, as RabbitMQ);
        `protocol`: whose message counters it bumps ("amqp091", "stomp")."""
        ch = ChannelModel(self, vhost, owner, output, self.consumer_timeout_ms, user)
        ch.stats = self.stats.protocol(protocol).channel()
        ch.protocol_stats = self.stats.protocol(protocol)
        self.stats.churn.channels_opened += 1
        return ch

    # -- confirms and group commit --------------------------------------------------
    def mark_dirty(self, ch: ChannelModel) -> None:
        self._dirty[id(ch)] = ch

    def await_commit(self, ch: ChannelModel, seq: int) -> None:
        self._commit_waiters.append((ch, seq))

    def await_commit_callback(self, fn: Callable[[BaseException | None], None],
                              waiter: bool = True) -> None:
        """`fn(error or None)` once this turn's commit is durable. `waiter` False: no
        client waits on it (a held publish's release, broker/hold.py, rides on the
        commit its confirm waits for), so it does not count towards the inline sync."""
        self._commit_callbacks.append(fn)
        if not waiter:
            self._riders += 1

    def channel_closed(self, ch: ChannelModel) -> None:
        self._dirty.pop(id(ch), None)
        self.stats.churn.channels_closed += 1
        if ch.protocol_stats is not None:
            ch.protocol_stats.retire(ch.stats)

    def request_flush(self) -> None:
        self.scheduler.request_flush()

    def end_of_turn(self) -> None:
        self._in_turn = True
        try:
            self._end_of_turn()
        finally:
            self._in_turn = False
        if self._again:
            self._again = False
            store = self.store
            if self._dirty or self._commit_waiters or self._commit_callbacks or (
                    store is not None and store.pending):
                self.scheduler.request_flush()

    def _end_of_turn(self) -> None:
        if self.spill is not None:
            try:
                self.spill.flush()
            except OSError as e:  # kept in memory; retried next turn
                log.warning("%s", e)
        store, streams = self.store, self.streams
        if streams is not None and streams.pending:
            if self._commit_waiters or self._commit_callbacks:
                # a turn with stream appends and confirms owed: they go once both the
                # streams and the main store have synced what the turn wrote (P5c)
                waiters, callbacks = self._commit_waiters, self._commit_callbacks
                self._commit_waiters, self._commit_callbacks = [], []
                self._riders = 0
                done = _Join(2 if store is not None else 1,
                             lambda exc: self._committed(waiters, callbacks, exc))
                streams.commit(done)
                if store is not None:
                    store.commit(done)
                store = None  # committed
            else:
                streams.commit(self._streams_synced)
        if store is None:
            pass
        elif not (self._commit_waiters or self._commit_callbacks):
            if store.pending:  # acks, deliveries, moves: no one waits for their fsync
                err = store.write()
                if err is not None:  # the removes stay buffered for the next commit
                    self.store_failures += 1
                    log.error("store write failed: %s", err)
        else:
            waiters, callbacks = self._commit_waiters, self._commit_callbacks
            self._commit_waiters, self._commit_callbacks = [], []
            n = len(waiters) + len(callbacks) - self._riders
            self._riders = 0
            if n:
                self._waiters_avg += (n - self._waiters_avg) * 0.25
            # few waiters, and few lately: sync on this thread when the store's sync thread
            # is idle (the confirms leave in this turn); else the thread's group commit
            t0 = time.monotonic()  # once per commit: publish→confirm latency
            store.commit(lambda exc: self._committed(waiters, callbacks, exc, t0),
                         inline=0 < n <= INLINE_SYNC_WAITERS
                         and self._waiters_avg <= INLINE_SYNC_AVG)
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            for ch in dirty.values():
                ch.flush_confirms()

    def _streams_synced(self, exc: BaseException | None) -> None:
        if exc is not None:  # nothing was waiting for it; the next commits will say more
            self.store_failures += 1
            log.error("stream write failed: %s", exc)

    def _committed(self, waiters: list[tuple[ChannelModel, int]],
                   callbacks: list[Callable[[BaseException | None], None]],
                   exc: BaseException | None, t0: float = 0.0) -> None:
        """The store made a batch durable (or failed): confirm (or nack, P6) its publishes."""
        if exc is not None:
            self.store_failures += 1
            log.error("store commit failed, nacking %d publishes: %s", len(waiters), exc)
        if waiters and exc is None:
            self.stats.confirm_latency.observe(time.monotonic() - t0, len(waiters))
        for ch, seq in waiters:
            if ch.vhost.trace is not None:  # S10: confirm.<exchange> events
                ch.vhost.trace.committed(ch, seq, t0, exc is not None)
            if ch.open and ch.confirms is not None:
                if exc is None:
                    ch.confirms.ack(seq)
                    ch.stats.confirmed += 1
                else:
                    ch.confirms.nack(seq)
                self._dirty[id(ch)] = ch
        for fn in callbacks:
            fn(exc)
        if self._in_turn:  # synced inline: end_of_turn confirms these now
            self._again = True
        else:
            self.scheduler.request_flush()

    # -- introspection ------------------------------------------------------------------
    def queues(self) -> list[Queue]:
        return [q for vh in self.vhosts.values() for q in vh.queues.values()]

    def page_out(self) -> int:
        """Memory alarm (U5): every queue's ready messages held in memory go to the spill."""
        return sum(q.page_out() for q in self.queues())

    def close(self) -> None:
        if self.streams is not None:
            self.streams.close()
        if self.store is not None:
            self.store.close()
        if self.spill is not None:
            self.spill.close()
