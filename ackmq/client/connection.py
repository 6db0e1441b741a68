"""What the sync and asyncio connections share (BaseConnection): the core, the admin
channel, reconnection and restore, local redelivery counts, dead-lettering. Written
once as steps (see steps.py); sync.py and aio.py subclass and drive it.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from ackmq.protocol.amqp import build_method
from ackmq.protocol.amqp.client_codec import with_headers
from ackmq.protocol.amqp.constants import NOT_FOUND

from .core import Chan, Core
from .errors import (
    ChannelClosed,
    ClientError,
    ConfirmTimeout,
    ConnectionLost,
    IllegalStateError,
    ReturnedError,
)
from .message import (
    BUFFERED,
    DELAYED,
    DELIVERY_COUNT_HEADER,
    DLQ_CAUSE_HEADER,
    Message,
    OutboundMessage,
)
from .options import (
    Destination,
    Options,
)
from .steps import IDLE, OPEN, RECONNECT, SLEEP, Step, wait

if TYPE_CHECKING:
    from .consumer import BaseConsumer
    from .session import BaseSession


DLQ_NAME = "ackmq.DLQ"
_LOCAL_COUNTS_MAX = 100_000


def message_key(m: Message) -> str:
    """What identifies a message across its redeliveries: its message_id, else ackmq's
    per-queue sequence number, else (best effort) a hash of where it went and its body."""
    mid = m.message_id
    if mid is not None:
        return mid
    seq = m.seq
    if seq is not None:
        return f"seq:{m.consumer.queue if m.consumer else ''}:{seq}"
    h = hashlib.blake2b(digest_size=16)
    h.update(m.exchange.encode())
    h.update(b"\0")
    h.update(m.routing_key.encode())
    h.update(b"\0")
    h.update(m.body)
    return "h:" + h.hexdigest()



class BaseConnection:
    """What the sync and asyncio connections share: options, the core, the admin channel
    (declares, dead-letter publishes), the sessions to restore after a reconnect."""

    core: Core

    def __init__(self, options: Options) -> None:
        self.options = options
        self.generation = 0
        self.sessions: list[BaseSession] = []
        self._admin: Chan | None = None
        self._admin_ready: Any = None
        self._known_queues: set[str] = set()
        self._dead_letter: dict[str, tuple[str, str | None]] = {}
        self._local_counts: OrderedDict[str, int] = OrderedDict()
        self._unseen: dict[str, int] = {}
        self._ids = itertools.count(1)
        self.closed = False
        # the first broker's kind, kept: a reconnect under way (a new Core not yet
        # open) must not turn idempotence off for other threads
        self.broker_is_ackmq: bool | None = None

    # -- for subclasses ----------------------------------------------------------------
    def new_future(self) -> Any:
        raise NotImplementedError

    def _add_listener(self, consumer: BaseConsumer) -> None:
        """`consumer` has a message listener now: the dispatcher must serve it."""
        raise NotImplementedError

    def _wake_listeners(self, consumer: BaseConsumer) -> None:
        """A listener consumer has a message ready (the dispatcher must look)."""

    def opened_now(self) -> None:
        """The drivers call this after each handshake."""
        self.generation += 1
        if self.broker_is_ackmq is None:
            self.broker_is_ackmq = self.core.is_ackmq

    def rpc_deadline(self) -> float:
        return time.monotonic() + self.options.send_timeout / 1000.0

    @property
    def idempotent(self) -> bool:
        """Producers put their message id in `x-deduplication-header` (docs/dedup.md):
        the `idempotent` option, by default on against ackmq when reconnecting (without
        a reconnect there is nothing to re-send; messages then stay as they were)."""
        o = self.options.idempotent
        return self.options.reconnect and bool(self.broker_is_ackmq) if o is None else o

    @property
    def resending(self) -> bool:
        """Unconfirmed publishes are kept across a reconnect and re-sent."""
        return self.options.reconnect and self.idempotent

    def give_up_resend(self, error: ClientError) -> None:
        """No reconnect after all (it failed, or the connection is closed): publishes kept
        for re-sending fail with `error` and go back through take_failed()."""
        for session in self.sessions:
            session.give_up_resend(error)

    # -- algorithms the sync and asyncio connections share (their drivers do the I/O) ----
    def reconnect_g(self) -> Step:
        """Open a new connection and restore every session, retrying with a growing pause
        for reconnect_timeout; then give up (kept publishes fail) with ConnectionLost."""
        deadline = time.monotonic() + self.options.reconnect_timeout
        pause = 0.05
        while True:
            try:
                yield (OPEN, None)
                yield from self.restore_g(self.rpc_deadline())
                return
            except ClientError as err:
                if time.monotonic() + pause > deadline:
                    lost = ConnectionLost(f"reconnect failed for "
                                          f"{self.options.reconnect_timeout} s: {err}")
                    self.give_up_resend(lost)
                    raise lost from None
            yield (SLEEP, time.monotonic() + pause)
            pause = min(pause * 2, 1.0)

    def close_g(self, deadline: float) -> Step:
        """Close every session (postponed acks are sent), then the connection, within
        `deadline`; what does not answer in time is dropped by the driver after this."""
        if self.core.error is not None:
            return
        for session in list(self.sessions):
            try:
                yield from session.close_g(deadline)
            except (ClientError, TimeoutError):
                pass  # close_timeout: the socket is dropped afterwards
        try:
            yield from wait(self.core.close(), deadline)
        except (ClientError, TimeoutError):
            pass

    def closed_now(self) -> None:
        """After close_g (or instead of it): the connection is gone for good."""
        self.closed = True
        if self.core.error is None:
            self.core.lost(ConnectionLost("connection closed by the client", 200))
        self.give_up_resend(ConnectionLost("connection closed by the client", 200))

    def dispatch_loop_g(self, listening: list[BaseConsumer]) -> Step:
        """The connection's listener dispatcher (a thread or a task): listeners are called
        one message at a time, in arrival order per consumer; postponed acks go out when
        due; it waits (IDLE) when no listener has work; it reconnects when allowed."""
        while not self.closed:
            consumers = [c for c in listening if not c.closed]
            listening[:] = consumers  # in place: the connection adds to the same list
            if not consumers:
                return
            try:
                yield (RECONNECT, None)
            except ClientError:
                if self.closed or not self.options.reconnect:
                    return
                yield (SLEEP, time.monotonic() + 0.2)
                continue
            worked = False
            for c in consumers:
                if not c.closed and c.ready():
                    worked = (yield from c.dispatch_one_g()) or worked
            if worked:
                continue
            for c in consumers:
                if c.lazy and c.lazy_due():
                    c.flush_lazy_acks()
            due = [d for d in (c.next_due() for c in consumers) if d is not None]
            try:
                yield (IDLE, min([time.monotonic() + 1.0, *due]))
            except ClientError:
                if not self.options.reconnect:
                    return

    def check_open(self) -> None:
        if self.closed:
            raise IllegalStateError("connection is closed")
        self.core.check()

    # -- admin channel -----------------------------------------------------------------
    def _admin_g(self, deadline: float | None) -> Step:
        """The connection's own confirm channel, (re)opened on first use."""
        chan = self._admin
        if chan is not None and chan.error is None and chan.core is self.core:
            if self._admin_ready is not None and not self._admin_ready.done():
                yield from wait(self._admin_ready, deadline)
            return chan
        chan, fut = self.core.open_channel()
        self._admin = chan
        self._admin_ready = ready = self.new_future()
        try:
            yield from wait(fut, deadline)
            chan.confirm = True
            yield from wait(chan.rpc(C.Confirm.Select(), (C.Confirm.SelectOk,)), deadline)
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err if isinstance(err, ClientError)
                                    else ClientError(repr(err)))
            raise
        ready.set_result(None)
        return chan

    def _ensure_queue_g(self, name: str, deadline: float | None,
                        arguments: dict[str, Any] | None = None) -> Step:
        """A queue destination exists: passive declare, else create it durable (queues
        spring into existence on first use, as in ActiveMQ) with `arguments`."""
        if name in self._known_queues:
            return
        admin = yield from self._admin_g(deadline)
        try:
            yield from wait(admin.rpc(build_method(C.Queue.Declare, queue=name, passive=True),
                                       (C.Queue.DeclareOk,)), deadline)
        except ChannelClosed as err:
            if err.code != NOT_FOUND:
                raise
            admin = yield from self._admin_g(deadline)
            yield from wait(admin.rpc(build_method(C.Queue.Declare, queue=name, durable=True,
                                                    arguments=arguments or {}),
                                       (C.Queue.DeclareOk,)), deadline)
        self._known_queues.add(name)

    def declare_queue_g(self, name: str, durable: bool, arguments: dict[str, Any] | None,
                        deadline: float | None) -> Step:
        admin = yield from self._admin_g(deadline)
        ok = yield from wait(admin.rpc(build_method(
            C.Queue.Declare, queue=name, durable=durable, arguments=arguments or {}),
            (C.Queue.DeclareOk,)), deadline)
        self._known_queues.add(ok.queue)
        dlx = (arguments or {}).get("x-dead-letter-exchange")
        if dlx is not None:
            self._dead_letter[ok.queue] = (str(dlx),
                                           (arguments or {}).get("x-dead-letter-routing-key"))
        return ok

    # -- redelivery counts -------------------------------------------------------------
    def redelivery_count(self, m: Message) -> int:
        """Broker-kept when the delivery says (x-delivery-count: ackmq, RabbitMQ quorum
        queues); else what this connection counted itself, at least 1 when redelivered.
        Returns of prefetched messages the application never saw (consumer or session
        closed) are not redeliveries: this connection counts them (until the message is
        settled) and takes them off."""
        if not m.redelivered:
            return 0
        key = message_key(m)
        unseen = self._unseen.get(key, 0) if self._unseen else 0
        headers = m.view.headers or {}
        count = headers.get(DELIVERY_COUNT_HEADER)
        if isinstance(count, int) and not isinstance(count, bool):
            return max(0, count - unseen)
        local = self._local_counts.get(key)
        if local is not None:
            return local
        return 0 if unseen else 1

    def returned_unseen(self, messages: list[Message]) -> None:
        """These prefetched messages go back to the broker without the application
        having seen them (their next delivery is flagged redelivered all the same)."""
        unseen = self._unseen
        for m in messages:
            if m.state in (BUFFERED, DELAYED):
                key = message_key(m)
                unseen[key] = unseen.get(key, 0) + 1
        while len(unseen) > _LOCAL_COUNTS_MAX:
            del unseen[next(iter(unseen))]

    def remember_redelivery(self, m: Message, count: int) -> None:
        key = message_key(m)
        counts = self._local_counts
        counts[key] = count
        counts.move_to_end(key)
        if len(counts) > _LOCAL_COUNTS_MAX:
            counts.popitem(last=False)

    def forget_redelivery(self, m: Message) -> None:
        """`m` is settled for good: drop what this connection counted for it."""
        if m.redelivered and (self._local_counts or self._unseen):
            key = message_key(m)
            self._local_counts.pop(key, None)
            self._unseen.pop(key, None)

    # -- dead-letter queue -------------------------------------------------------------
    def dead_letter_g(self, m: Message, queue: str, dest: Destination, cause: str,
                      deadline: float | None) -> Step:
        """Publish a poisoned message, with its cause, to the queue's dead-letter exchange
        (known from the destination options or a declare through this connection), else
        to the durable queue ackmq.DLQ; returns once the broker has confirmed it."""
        headers = dict(m.headers)
        headers[DLQ_CAUSE_HEADER] = cause
        headers["x-ackmq-dlq-queue"] = queue
        headers["x-ackmq-dlq-delivery-count"] = m.delivery_count
        raw = with_headers(m.raw_properties, headers)
        target = None
        if dest.dead_letter_exchange is not None:
            target = (dest.dead_letter_exchange, dest.dead_letter_routing_key)
        else:
            target = self._dead_letter.get(queue)
        if target is not None:
            exchange, key = target
            msg = OutboundMessage(m.body, exchange, key if key is not None else m.routing_key,
                                  raw, m.message_id, True)
            admin = yield from self._admin_g(deadline)
            try:
                yield from wait(self._publish_on(admin, msg), deadline)
                return
            except ReturnedError:
                pass  # the DLX routes it nowhere: never drop it, use ackmq.DLQ
        yield from self._ensure_queue_g(DLQ_NAME, deadline)
        admin = yield from self._admin_g(deadline)
        msg = OutboundMessage(m.body, "", DLQ_NAME, raw, m.message_id, True)
        try:
            yield from wait(self._publish_on(admin, msg), deadline)
        except TimeoutError:
            raise ConfirmTimeout(f"dead-letter publish of {m!r} not confirmed") from None

    def _publish_on(self, chan: Chan, msg: OutboundMessage) -> Any:
        fut = self.new_future()
        chan.publish(msg, fut, None)
        return fut

    # -- sessions ----------------------------------------------------------------------
    def restore_g(self, deadline: float | None) -> Step:
        """After a reconnect: reopen every session's channel and consumers."""
        self._admin = None
        self._known_queues.clear()
        for session in list(self.sessions):
            if not session.closed:
                yield from session.restore_g(deadline)

