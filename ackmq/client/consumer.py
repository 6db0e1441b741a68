"""BaseConsumer: a subscription on its session's channel (or, with prefetch 0, a puller):
buffering, delayed redelivery, receive and listener dispatch, acks per mode. Written
once as steps (see steps.py).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from ackmq.protocol.amqp import Content, build_method, encode_nack
from ackmq.protocol.amqp.events import DecodedGetOk

from .errors import (
    ClientError,
    ConnectionLost,
    IllegalStateError,
)
from .message import (
    BUFFERED,
    DELAYED,
    DELIVERED,
    SEQ_HEADER,
    SETTLED,
    Message,
)
from .options import (
    AckMode,
    Destination,
    RedeliveryPolicy,
    extended_prefetch,
)
from .steps import CALL, Step, sleep_until, wait

if TYPE_CHECKING:
    from .session import BaseSession


log = logging.getLogger("ackmq.client")

CONSUME_ARGUMENTS = {SEQ_HEADER: True, "x-ackmq-delivery-count": True}


class BaseConsumer:
    """A subscription on the session's channel (or, with prefetch 0, a puller)."""

    def __init__(self, session: BaseSession, dest: Destination,
                 listener: Callable[[Message], Any] | None,
                 policy: RedeliveryPolicy | None) -> None:
        o = session.conn.options
        prefetch = dest.prefetch
        if prefetch is None:
            prefetch = o.queue_prefetch if dest.kind == "queue" else o.topic_prefetch
        if listener is not None and prefetch == 0:
            raise IllegalStateError("a message listener needs prefetch >= 1 (J4)")
        self.session = session
        self.dest = dest
        self.prefetch = prefetch
        self.listener = listener
        self.mode = "listener" if listener is not None else None
        self.policy = policy or o.redelivery_policy
        self.broker_backoff = False  # L6: ackmq holds redeliveries back for this consumer
        self.optimize = o.optimize_acknowledge and session.ack_mode == AckMode.AUTO  # J3
        self.optimize_timeout = o.optimize_acknowledge_timeout / 1000.0
        self.tag = ""
        self.queue = dest.name if dest.kind == "queue" else ""
        self.buffer: deque[Message] = deque()
        self.delayed: list[tuple[float, int, Message]] = []
        self.waiter: Any = None
        self.error: ClientError | None = None
        self.closed = False
        self.lazy = 0  # delivered, ack postponed (optimizeAcknowledge, DUPS_OK)
        self.last_ack = time.monotonic()
        self.in_listener = False

    # -- subscription ------------------------------------------------------------------
    def _begin_receive(self) -> None:
        """receive() makes the consumer synchronous (J5: not after a listener)."""
        if self.mode == "listener":
            raise IllegalStateError("this consumer has a message listener; receive() is not "
                                    "allowed (J5)")
        self.mode = "receive"

    def set_listener(self, listener: Callable[[Message], Any]) -> None:
        """Switch to push delivery (J4: prefetch >= 1; J5: not after receive())."""
        if self.mode == "receive":
            raise IllegalStateError("receive() was used on this consumer; a listener is not "
                                    "allowed (J5)")
        if self.prefetch == 0:
            raise IllegalStateError("a message listener needs prefetch >= 1 (J4)")
        self.listener = listener
        if self.mode != "listener":
            self.mode = "listener"
            self.session.conn._add_listener(self)

    def subscribe_g(self, deadline: float | None) -> Step:
        s = self.session
        conn = s.conn
        chan = s.chan
        assert chan is not None
        dest = self.dest
        stream = dest.stream_offset is not None  # a stream consumer (R2)
        if dest.kind == "queue":
            yield from conn._ensure_queue_g(dest.name, deadline,
                                            {"x-queue-type": "stream"} if stream else None)
            self.queue = dest.name
        else:
            ok = yield from wait(chan.rpc(build_method(
                C.Queue.Declare, queue="", exclusive=True, auto_delete=True),
                (C.Queue.DeclareOk,)), deadline)
            self.queue = ok.queue
            yield from wait(chan.rpc(build_method(
                C.Queue.Bind, queue=self.queue, exchange="amq.topic", routing_key=dest.name),
                (C.Queue.BindOk,)), deadline)
        if self.prefetch == 0:
            return  # J4: pull, one basic.get per receive()
        window = self.prefetch
        if s.ack_mode == AckMode.CLIENT:
            window = extended_prefetch(self.prefetch)  # J8
        yield from wait(chan.rpc(build_method(C.Basic.Qos, prefetch_count=window,
                                               global_=False), (C.Basic.QosOk,)), deadline)
        if not self.tag:
            self.tag = f"ackmq.{s.id}.{next(s._consumer_ids)}"
        s.consumers[self.tag] = self
        arguments: dict[str, Any] = dict(CONSUME_ARGUMENTS)
        if stream:
            arguments["x-stream-offset"] = dest.stream_offset
        backoff = None if stream or not conn.core.is_ackmq else self.policy.broker_arguments()
        if backoff:
            arguments.update(backoff)
        try:
            yield from wait(chan.rpc(build_method(
                C.Basic.Consume, queue=self.queue, consumer_tag=self.tag,
                exclusive=dest.exclusive, arguments=arguments),
                (C.Basic.ConsumeOk,)), deadline)
            self.broker_backoff = bool(backoff)
        except BaseException:
            s.consumers.pop(self.tag, None)
            raise

    # -- arrivals (called while the socket is read) ------------------------------------
    def arrived(self, m: Message) -> None:
        count = m.redelivery_count
        if count and not self.broker_backoff and not self.policy.exceeded(count):
            delay = self.policy.delay_for(count)
            if delay > 0:
                m.state = DELAYED
                heapq.heappush(self.delayed, (time.monotonic() + delay, m.delivery_tag, m))
                self.wake()
                return
        self.buffer.append(m)
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
        if self.mode == "listener":
            self.session.conn._wake_listeners(self)

    def release_due(self) -> None:
        """Delayed redeliveries whose time has come go to the front (ActiveMQ's
        enqueueFirst), in due order."""
        delayed = self.delayed
        if not delayed:
            return
        now = time.monotonic()
        due: list[Message] = []
        while delayed and delayed[0][0] <= now:
            m = heapq.heappop(delayed)[2]
            if m.state == DELAYED:
                m.state = BUFFERED
                due.append(m)
        for m in reversed(due):
            self.buffer.appendleft(m)

    def next_due(self) -> float | None:
        return self.delayed[0][0] if self.delayed else None

    def ready(self) -> bool:
        if self.buffer:
            return True
        return bool(self.delayed) and self.delayed[0][0] <= time.monotonic()

    # -- taking a message --------------------------------------------------------------
    def check(self) -> None:
        if self.closed:
            raise IllegalStateError("consumer is closed")
        self.session.check()
        if self.error is not None:
            raise self.error

    def next_g(self, deadline: float | None) -> Step:
        """The next message for the application, or None at the deadline. Messages past
        maximumRedeliveries (e.g. after crash loops: the broker kept counting) are
        poisoned here instead (ActiveMQ's pre-dispatch check)."""
        looked = False
        while True:
            self.check()
            self.release_due()
            if self.buffer:
                m = self.buffer.popleft()
                if m.state == SETTLED:
                    continue
                if self.policy.exceeded(m.redelivery_count):
                    yield from self.session.poison_g(
                        m, f"redelivery count {m.redelivery_count} exceeds "
                        f"maximumRedeliveries {self.policy.maximum_redeliveries} "
                        f"(at delivery)", self.session.conn.rpc_deadline())
                    continue
                return m
            if self.prefetch == 0:
                m = yield from self._pull_g(deadline)
                if m is None:
                    return None
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if looked:
                    return None
                looked = True  # one look at what has arrived (receive(timeout=0))
            until = deadline
            due = self.next_due()
            if due is not None and (until is None or due < until):
                until = due
            self.waiter = waiter = self.session.conn.new_future()
            try:
                yield (waiter, until)
            except TimeoutError:
                pass

    def _pull_g(self, deadline: float | None) -> Step:
        """J4 prefetch 0: basic.get until a message comes or the deadline passes (AMQP
        has no long-polling get, so empty answers are retried with a growing pause)."""
        s = self.session
        pause = 0.002
        while True:
            self.check()
            self.release_due()
            if self.buffer:
                return True
            assert s.chan is not None
            reply = yield from wait(s.chan.rpc(build_method(C.Basic.Get, queue=self.queue),
                                                (C.Basic.GetOk, C.Basic.GetEmpty)),
                                     s.conn.rpc_deadline())
            if isinstance(reply, Content):
                g: DecodedGetOk = reply.method
                m = Message(reply.body, g.exchange, g.routing_key, g.redelivered,
                            g.delivery_tag, reply.properties, self, s.generation,
                            s.conn.core.is_ackmq)
                if g.redelivered:
                    m.redelivery_count = s.conn.redelivery_count(m)
                s.unsettled[g.delivery_tag] = m
                self.arrived(m)
                self.waiter = None
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            until = now + pause
            due = self.next_due()
            if due is not None:
                until = min(until, due)
            if deadline is not None:
                until = min(until, deadline)
            yield from sleep_until(until)
            pause = min(pause * 2, 0.1)

    def delivered(self, m: Message, listener: bool = False) -> None:
        """The application gets `m` now: acks per the session's mode (J1, J3). For a
        listener, AUTO and DUPS_OK ack only once it has returned (`listener_done`)."""
        s = self.session
        m.state = DELIVERED
        s.n_delivered += 1
        mode = s.ack_mode
        if mode == AckMode.SESSION_TRANSACTED:
            s.tx_consumed.append(m)
        elif not listener:
            self._auto_ack(m)

    def listener_done(self, m: Message) -> None:
        """The listener returned normally."""
        if m.state == DELIVERED and m.generation == self.session.generation:
            self._auto_ack(m)

    def _auto_ack(self, m: Message) -> None:
        s = self.session
        mode = s.ack_mode
        if mode == AckMode.AUTO:
            if not self.optimize:
                s.ack_one(m)
                return
            self.lazy += 1
            now = time.monotonic()
            if (self.lazy >= self.prefetch * 0.65
                    or now >= self.last_ack + self.optimize_timeout):
                self.flush_lazy_acks()
        elif mode == AckMode.DUPS_OK:
            self.lazy += 1
            if self.lazy >= self.prefetch * 0.5:
                self.flush_lazy_acks()

    def flush_lazy_acks(self) -> None:
        """Send the postponed cumulative ack (optimizeAcknowledge / DUPS_OK)."""
        s = self.session
        if s.ack_mode not in (AckMode.AUTO, AckMode.DUPS_OK):
            return
        self.lazy = 0
        self.last_ack = time.monotonic()
        if s.error is None and s.chan is not None:
            s.ack_where(lambda m: m.consumer is self)

    def lazy_due(self) -> bool:
        return self.lazy > 0 and (self.session.ack_mode == AckMode.DUPS_OK or
                                  time.monotonic() >= self.last_ack + self.optimize_timeout)

    def dispatch_one_g(self) -> Step:
        """Dispatcher: take one message, call the listener (CALL), ack per mode; a
        listener that raises is a redelivery (J6). True when a message was dispatched."""
        try:
            m = yield from self.next_g(time.monotonic())
        except ClientError:
            return False
        if m is None:
            return False
        self.delivered(m, listener=True)
        self.in_listener = True
        try:
            yield (CALL, (self.listener, m))
            self.listener_done(m)
        except Exception as exc:  # noqa: BLE001 - the listener's failure, whatever it is
            log.debug("listener raised %r; redelivering %r", exc, m)
            try:
                yield from self.listener_failed_g(m, exc)
            except ClientError as err:
                log.warning("redelivery after a listener error failed: %r", err)
        finally:
            self.in_listener = False
        return True

    def listener_failed_g(self, m: Message, exc: BaseException) -> Step:
        """J6: a listener that raises causes a redelivery (a rollback in a transacted
        session)."""
        s = self.session
        deadline = s.conn.rpc_deadline()
        if s.transacted:
            yield from s.rollback_g(deadline, exc, culprit=m)
        else:
            yield from s.requeue_g(m, exc, deadline)

    def _acknowledge_message(self, m: Message) -> None:
        raise NotImplementedError

    def acknowledge_message(self, m: Message) -> None:
        """Message.acknowledge(): CLIENT acks the session's delivered messages,
        INDIVIDUAL this one, other modes nothing."""
        s = self.session
        if m.generation != s.conn.generation or (m.state == SETTLED and s.error is not None):
            raise ConnectionLost("this message came over a connection that has been lost; "
                                 "the broker delivers it again")
        mode = s.ack_mode
        if mode == AckMode.CLIENT:
            s.check()
            s.ack_where(lambda x: True)
        elif mode == AckMode.INDIVIDUAL:
            s.check()
            if m.state == DELIVERED:
                s.ack_one(m)

    def acknowledge_own(self) -> None:
        """consumer.acknowledge(): CLIENT mode, only this consumer's messages."""
        s = self.session
        s.check()
        if s.ack_mode in (AckMode.CLIENT, AckMode.INDIVIDUAL):
            s.ack_where(lambda m: m.consumer is self)

    def cancel_g(self, deadline: float | None) -> Step:
        if self.closed:
            return
        self.flush_lazy_acks()
        self.closed = True
        s = self.session
        self.wake()
        if self.tag and s.chan is not None and s.error is None:
            try:
                yield from wait(s.chan.rpc(build_method(C.Basic.Cancel, consumer_tag=self.tag),
                                            (C.Basic.CancelOk,)), deadline)
            except ClientError:
                pass
        s.consumers.pop(self.tag, None)
        # prefetched messages the application never saw go back now
        if s.chan is not None and s.error is None:
            out = []
            back = list(self.buffer) + [d[2] for d in self.delayed]
            s.conn.returned_unseen(back)
            for m in back:
                if m.state in (BUFFERED, DELAYED):
                    s.unsettled.pop(m.delivery_tag, None)
                    m.state = SETTLED
                    out.append(encode_nack(s.chan.number, m.delivery_tag, False, True))
            if out:
                s.chan.write(b"".join(out))
        self.buffer.clear()
        self.delayed.clear()

