"""The two AMQP roles the Spark connector needs, on ackmq.client (the project's client).

`QueueConsumer` keeps one connection whose deliveries a daemon thread moves into a
bounded buffer in batches, because the Spark driver-side reader process only gets
control when Spark calls it: deliveries must keep flowing between calls (heartbeats are
the client's I/O thread's job). Acks are sent from the caller's thread (ackmq.client is
thread-safe, leader/follower reading: no hop to another thread) and confirmed by a
synchronous round trip on the same channel, so once `ack()` returns the broker has
processed them (methods on a channel are handled in order).

`ConfirmingPublisher` publishes with asynchronous confirms (a window of outstanding
sequence numbers, `multiple` acks settle many) and raises on nack, return, timeout or a
channel/connection the broker closed, which is what makes a Spark write task fail and
retry (S3).

Errors the broker reports as permanent (404 NOT_FOUND, 403 ACCESS_REFUSED, 406
PRECONDITION_FAILED, bad credentials, unknown vhost) fail at once with the broker's reply
code and text; a broker that cannot be reached (refused, restarting) is retried.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ackmq.client import (
    AckMode,
    ChannelClosed,
    ClientError,
    Connection,
    ConnectionLost,
    Destination,
    Message,
    OutboundMessage,
    RedeliveryPolicy,
    connect,
)
from ackmq.client.consumer import CONSUME_ARGUMENTS
from ackmq.client.message import DEDUP_HEADER
from ackmq.protocol.amqp.constants import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    INVALID_PATH,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)

log = logging.getLogger(__name__)

# The connector settles messages itself (ack after commit, dedupe by seq): no client-side
# redelivery delay, no dead-lettering however often a message comes back.
NO_REDELIVERY_POLICY = RedeliveryPolicy(maximum_redeliveries=-1, initial_redelivery_delay=0,
                                        redelivery_delay=0)

# basic.consume arguments asking ackmq for x-ackmq-seq (S2's dedupe key) and
# x-delivery-count; RabbitMQ ignores consume arguments it does not know. ackmq.client
# sends them on every consumer.
DELIVERY_HEADERS = CONSUME_ARGUMENTS
assert DELIVERY_HEADERS == {"x-ackmq-seq": True, "x-ackmq-delivery-count": True}

_TAKE = 4096  # deliveries moved from the client to the buffer per call


class Delivery:
    """One message as received; `gen` names the connection its delivery tag belongs to.
    `row` is what staging needs of it (schema.prepare_row), computed by the consumer
    thread as the message arrives, off the path of Spark's calls."""

    __slots__ = ("gen", "message", "received_at", "row")

    def __init__(self, gen: int, message: Message, received_at: float,
                 row: Any = None) -> None:
        self.gen = gen
        self.message = message
        self.received_at = received_at
        self.row = row

    @property
    def tag(self) -> int:
        return self.message.delivery_tag

    @property
    def redelivered(self) -> bool:
        return self.message.redelivered

    @property
    def body(self) -> bytes:
        return self.message.body


class ConsumerError(RuntimeError):
    """The consumer cannot go on (bad queue, broker gone for too long, ...)."""


def safe_url(url: str) -> str:
    """`url` without its credentials, for messages."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else url.rsplit("@", 1)[-1]


def reply_of(exc: BaseException) -> tuple[int, str] | None:
    """(reply code, reply text) of a broker close carried by `exc`, if any."""
    if isinstance(exc, ChannelClosed):
        return int(exc.code), str(exc.text)
    if isinstance(exc, ConnectionLost) and exc.code:
        return int(exc.code), str(exc.text)
    return None


def _exclusive_use(code: int, text: str) -> bool:
    """Another consumer holds the queue: a dead predecessor the broker has not dropped yet."""
    return code == RESOURCE_LOCKED or (code == ACCESS_REFUSED and "exclusive" in text)


def is_permanent(exc: BaseException) -> bool:
    """True for errors retrying cannot fix: 404, 403 (except exclusive use), 406, 530, auth."""
    r = reply_of(exc)
    if r is None:
        return False  # refused, reset, timed out: the broker may be restarting
    code, text = r
    if _exclusive_use(code, text):
        return False
    return code in PERMANENT


# reply codes retrying cannot fix (a wrong name, argument, permission or vhost; a client bug)
PERMANENT = frozenset((INVALID_PATH, ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED,
                       FRAME_ERROR, SYNTAX_ERROR, COMMAND_INVALID, CHANNEL_ERROR,
                       UNEXPECTED_FRAME, NOT_ALLOWED, NOT_IMPLEMENTED))

_HINTS = {
    INVALID_PATH: "check the URL",
    ACCESS_REFUSED: "check the user and password in the URL and the user's permissions",
    NOT_FOUND: "declare it first or check the name",
    PRECONDITION_FAILED: "the broker refused an argument: check the queue's or exchange's "
                         "declared arguments",
    NOT_ALLOWED: "check the virtual host in the URL",
}


def describe(exc: BaseException, what: str) -> str:
    """One line: what failed, the broker's reply code and text, and what to fix."""
    r = reply_of(exc)
    if r is None:
        return f"{what}: {exc!r} (is the broker running at that address?)"
    code, text = r
    if _exclusive_use(code, text):
        hint = ("another consumer holds the queue exclusively (another land job on it?); "
                "stop it, or read with exclusive=false")
    else:
        hint = _HINTS.get(code, "see the broker's log")
    return f"{what}: {code} {text} ({hint})"


def open_connection(url: str, **options: Any) -> Connection:
    """An ackmq.client connection for the connector; a URL ackmq.client cannot parse is
    a permanent error (ValueError)."""
    return connect(url, redelivery_policy=NO_REDELIVERY_POLICY, **options)


@contextmanager
def session_on(url: str) -> Iterator[Any]:
    """A short-lived connection and session (passive checks, queue counts)."""
    conn = open_connection(url, connect_timeout=10.0)
    try:
        yield conn.session(AckMode.INDIVIDUAL)
    finally:
        try:
            conn.close()
        except ClientError:
            pass


class QueueConsumer:
    """A manual-ack consumer with bounded prefetch, fed into a buffer by a daemon thread."""

    def __init__(self, url: str, queue: str, prefetch: int, *, exclusive: bool = True,
                 connect_timeout: float = 60.0) -> None:
        self.url = url
        self.queue = queue
        self.prefetch = max(1, min(int(prefetch), 65535))
        self.exclusive = exclusive
        self.connect_timeout = connect_timeout
        self.gen = 1  # bumped when a connection is lost: its deliveries are stale
        self._buf: deque[Delivery] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._parent = os.getppid()
        self._conn: Connection | None = None
        self._session: Any = None
        #: called from the consumer thread at most every 0.1 s (the reader's status file)
        self.on_tick: Any = None
        #: message -> Delivery.row, called by the consumer thread for each arrival
        self.prepare: Any = None
        self._acks_sent = False
        #: the queue's ready count read just before basic.consume on the first
        #: connection (None once reconnected), and whether take() has returned anything
        self._first_depth: int | None = None
        self._taken_any = False
        self._thread = threading.Thread(target=self._run, name="ackmq-consumer", daemon=True)

    # -- called from the reader (Spark's thread) --------------------------------------
    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + self.connect_timeout + 5
        while not self._ready.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                err = self._error
                if isinstance(err, ConsumerError):
                    raise err
                raise ConsumerError(self._what() + f": {err!r}") from err

    def buffered(self) -> int:
        with self._cond:
            return len(self._buf)

    def take(self, n: int, wait: float = 0.0) -> list[Delivery]:
        """Up to `n` buffered deliveries of the current connection, oldest first."""
        self._raise_if_failed()
        deadline = time.monotonic() + wait
        with self._cond:
            while not self._buf and wait > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            buf = self._buf
            if len(buf) <= n:  # the common case: everything at once
                out = list(buf)
                buf.clear()
            else:
                out = [buf.popleft() for _ in range(n)]
            gen = self.gen  # the buffer holds the current connection's deliveries only
            self._taken_any = self._taken_any or bool(out)
            return out if not out or out[0].gen == out[-1].gen == gen else \
                [d for d in out if d.gen == gen]

    def push_front(self, items: list[Delivery]) -> None:
        """Give deliveries back (a staged batch Spark never logged); stale ones are dropped."""
        with self._cond:
            self._buf.extendleft(d for d in reversed(items) if d.gen == self.gen)

    def ack(self, items: list[Delivery]) -> None:
        """Send the acks of these deliveries; `confirm_acks()` waits until the broker has
        processed them (in between the caller does other work: one round trip, overlapped)."""
        gen, session = self.gen, self._session
        msgs = [d.message for d in items if d.gen == gen]
        if not msgs or session is None:
            return  # a reconnect came between: those tags died with their channel
        try:
            session.acknowledge_messages(msgs)
            self._acks_sent = True
        except ClientError as exc:
            self._ack_failed(exc, gen, session)

    def confirm_acks(self) -> None:
        """Return once the broker has processed every ack sent so far: a round trip on
        the consumer's channel (methods on a channel are handled in order)."""
        if not self._acks_sent:
            return
        self._acks_sent = False
        gen, session = self.gen, self._session
        if session is None:
            return
        try:
            session.queue_info(self.queue)
        except ClientError as exc:
            self._ack_failed(exc, gen, session)

    def _ack_failed(self, exc: ClientError, gen: int, session: Any) -> None:
        if isinstance(exc, ConnectionLost) or gen != self.gen or \
                isinstance(session.error, ConnectionLost):
            return  # those tags died with the connection: the broker redelivers them
        raise ConsumerError(f"ack failed: {exc}") from exc

    def unacked(self) -> int:
        """Deliveries this consumer holds unacked (buffered, staged or being landed)."""
        s = self._session
        return s.unacked if s is not None else 0

    def queue_depth(self, timeout: float = 30.0) -> int:
        """Messages in the queue now: ready ones plus those delivered to us and unacked."""
        s = self._require_session()
        ready = self._call(lambda: s.queue_info(self.queue).message_count)
        return int(ready) + s.unacked  # deliveries sent before the reply are counted

    def depth_at_start(self) -> int:
        """Messages in the queue when this consumer started: the ready count read just
        before its basic.consume, while nothing was on its way to it, as long as nothing
        has been taken and the first connection still stands; else `queue_depth()`.
        A count read after basic.consume can be off by the deliveries in flight: RabbitMQ
        answers the passive declare ahead of deliveries its queue sent earlier."""
        self._require_session()
        with self._cond:
            first = None if self._taken_any else self._first_depth
        return first if first is not None else self.queue_depth()

    def ready_count(self, timeout: float = 30.0) -> int:
        """Messages the broker holds ready (not delivered to anyone)."""
        s = self._require_session()
        return int(self._call(lambda: s.queue_info(self.queue).message_count))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        self._close_connection()

    def _close_connection(self) -> None:
        """Close the current connection, if any; a broker already gone is fine."""
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except ClientError:
                pass

    # -- internals ----------------------------------------------------------------------
    def _what(self) -> str:
        return f"cannot consume from queue {self.queue!r} at {safe_url(self.url)}"

    def _raise_if_failed(self) -> None:
        if self._error is not None and not self._thread.is_alive():
            if isinstance(self._error, ConsumerError):
                raise self._error
            raise ConsumerError(f"{self._what()}: {self._error!r}") from self._error

    def _require_session(self) -> Any:
        self._raise_if_failed()
        deadline = time.monotonic() + self.connect_timeout
        while self._session is None:  # reconnecting
            if time.monotonic() > deadline:
                raise ConsumerError(f"{self._what()}: no connection")
            self._raise_if_failed()
            time.sleep(0.05)
        return self._session

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except ClientError as exc:
            raise ConsumerError(f"{self._what()}: {exc}") from exc

    def _connect(self) -> tuple[Connection, Any, Any]:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            conn: Connection | None = None
            try:
                conn = open_connection(self.url, connect_timeout=10.0)
                session = conn.session(AckMode.INDIVIDUAL)
                # 404 here: never let the client create it
                ready = session.queue_info(self.queue).message_count
                if self.gen == 1:
                    self._first_depth = int(ready)
                consumer = session.consumer(Destination(
                    "queue", self.queue, prefetch=self.prefetch, exclusive=self.exclusive))
                return conn, session, consumer
            except (ClientError, OSError, ValueError) as exc:
                # 404/403/406/bad login: fail now. A dead predecessor's exclusive consumer
                # still registered (403 "exclusive use"), or the broker restarting: retry
                # until the deadline.
                if conn is not None:
                    conn.abort()
                self._error = exc
                if isinstance(exc, ValueError) or is_permanent(exc):
                    raise ConsumerError(describe(exc, self._what())) from exc
                if time.monotonic() > deadline:
                    raise ConsumerError(describe(exc, self._what())
                                        + f" [gave up after {self.connect_timeout:.0f}s]") from exc
                time.sleep(0.5)

    def _run(self) -> None:
        ticked = 0.0
        while not self._stop.is_set():
            try:
                conn, session, consumer = self._connect()
            except BaseException as exc:  # noqa: BLE001 - reported to the reader
                self._error = exc
                return
            with self._cond:
                gen = self.gen
                self._conn, self._session = conn, session
            self._error = None
            self._ready.set()
            try:
                while not self._stop.is_set():
                    if os.getppid() != self._parent:
                        os._exit(0)  # Spark's JVM is gone: let the broker requeue our messages
                    got = consumer.receive_batch(_TAKE, timeout=0.05)
                    if got:
                        now = time.time()
                        prepare = self.prepare
                        batch = [Delivery(gen, m, now, prepare(m) if prepare else None)
                                 for m in got]
                        with self._cond:
                            self._buf.extend(batch)
                            self._cond.notify_all()
                    if self.on_tick is not None and time.monotonic() - ticked >= 0.1:
                        ticked = time.monotonic()
                        self.on_tick()
            except ClientError as exc:
                log.warning("ackmq consumer connection lost (%s); reconnecting", exc)
                self._error = exc
                with self._cond:  # the buffered tags are dead with their connection
                    self.gen += 1
                    self._first_depth = None
                    self._buf.clear()
                    self._session = None
                conn.abort()
                time.sleep(0.5)
        self._close_connection()


class SinkPublishError(RuntimeError):
    """A publish was nacked, returned, or not confirmed in time: the task must fail."""


class ConfirmingPublisher:
    """Publishes on a confirm channel, keeping at most `window` publishes unconfirmed.

    `idempotent` (default: when the broker is ackmq): each message's `message_id` also
    goes in `x-deduplication-header`, so a target that deduplicates (docs/dedup.md)
    keeps one copy when a failed task's retry publishes its rows again."""

    def __init__(self, url: str, *, window: int = 1000, confirm_timeout: float = 30.0,
                 mandatory: bool = False, idempotent: bool | None = None) -> None:
        self.window = max(1, int(window))
        self.confirm_timeout = confirm_timeout
        self.mandatory = mandatory
        self._where = safe_url(url)
        self.published = 0
        self._futures: deque[Any] = deque()
        try:
            # publish() blocks at `window` unconfirmed, at most confirm_timeout (>= 5 s:
            # the same timeout bounds opening the channel)
            self.conn = open_connection(url, max_outstanding_confirms=self.window,
                                        send_timeout=int(max(confirm_timeout, 5.0) * 1000))
            self.session = self.conn.session(AckMode.AUTO)
            self.producer = self.session.producer_to("", "", mandatory)
        except (ClientError, OSError, ValueError) as exc:
            raise SinkPublishError(describe(exc, f"cannot publish to {self._where}")) from exc
        self.idempotent = self.conn.is_ackmq if idempotent is None else idempotent

    @property
    def confirmed(self) -> int:
        """Publishes the broker has confirmed so far."""
        chan = self.session.chan
        pending = len(chan.outstanding) if chan is not None else 0
        return self.published - pending - len(self.producer.failed)

    def _failure(self) -> str | None:
        """What went wrong, once a publish failed (nack, return, channel or connection
        closed): the first failed future says it with the broker's code and text."""
        if not self.producer.failed:
            return None
        for fut in self._futures:
            if fut.done():
                exc = fut.exception(0)
                if exc is not None:
                    return self._explain(exc)
        return f"{len(self.producer.failed)} publishes not taken by the broker"

    def _explain(self, exc: BaseException) -> str:
        if isinstance(exc, ChannelClosed):
            return describe(exc, f"the broker closed the channel at {self._where}")
        if isinstance(exc, ConnectionLost):
            return describe(exc, f"connection to {self._where} lost")
        name = type(exc).__name__
        if name == "NackError":
            return f"broker nacked a publish: {exc}"
        if name == "ReturnedError":
            return f"message returned: {exc}"
        return f"publish failed: {exc!r}"

    def publish(self, exchange: str, routing_key: str, body: bytes, *,
                headers: dict[str, Any] | None = None, persistent: bool = True,
                message_id: str | None = None, **props: Any) -> None:
        """Publish one message (confirm tracked); raises SinkPublishError as soon as any
        publish so far has failed. `props`: ackmq.client's basic properties
        (content_type, correlation_id, timestamp, message_type, ...)."""
        if self.producer.failed:
            raise SinkPublishError(self._failure())
        if self.idempotent and message_id is not None and (
                headers is None or DEDUP_HEADER not in headers):
            headers = {**(headers or {}), DEDUP_HEADER: message_id}
        msg = OutboundMessage.build(body, exchange, routing_key, self.mandatory, message_id,
                                    headers=headers, persistent=persistent, **props)
        try:
            fut = self.producer.publish(msg)
        except ClientError as exc:
            raise SinkPublishError(self._failure() or self._explain(exc)) from exc
        self.published += 1
        futures = self._futures
        futures.append(fut)
        if len(futures) > 2 * self.window:  # forget the confirmed ones
            while futures and futures[0].done() and futures[0].exception(0) is None:
                futures.popleft()

    def flush(self) -> None:
        """Block until every publish so far is confirmed; raise if any was not."""
        try:
            self.producer.wait_for_confirms(timeout=self.confirm_timeout)
        except TimeoutError as exc:
            chan = self.session.chan
            n = len(chan.outstanding) if chan is not None else 0
            raise SinkPublishError(f"{n} publishes unconfirmed after {self.confirm_timeout}s"
                               ) from exc
        except ClientError as exc:
            raise SinkPublishError(self._failure() or self._explain(exc)) from exc
        failure = self._failure()
        if failure:
            raise SinkPublishError(failure)

    def close(self) -> None:
        try:
            self.conn.close()
        except ClientError:
            pass
