"""The two AMQP roles the Spark connector needs, on plain pika.

`QueueConsumer` runs one connection on its own thread because the Spark driver-side
reader process only gets control when Spark calls it: heartbeats and deliveries must
keep flowing between calls. Acks are handed to that thread (pika is not thread-safe)
and confirmed by a synchronous round trip on the same channel, so once `ack()`
returns the broker has processed them (methods on a channel are handled in order).

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
import queue as _queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pika.spec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Delivery:
    """One message as received; `gen` names the connection its tag belongs to."""

    gen: int
    tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: pika.spec.BasicProperties
    body: bytes
    received_at: float


class ConsumerError(RuntimeError):
    """The consumer cannot go on (bad queue, broker gone for too long, ...)."""


def safe_url(url: str) -> str:
    """`url` without its credentials, for messages."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else url.rsplit("@", 1)[-1]


# basic.consume arguments asking ackmq for x-ackmq-seq (S2's dedupe key) and
# x-delivery-count; RabbitMQ ignores consume arguments it does not know
DELIVERY_HEADERS = {"x-ackmq-seq": True, "x-ackmq-delivery-count": True}

_CLOSE = re.compile(r"\((\d{3})\) ['\"](.*)['\"]")


def reply_of(exc: BaseException) -> tuple[int, str] | None:
    """(reply code, reply text) of a broker close carried by `exc`, if any."""
    if isinstance(exc, (pika.exceptions.ChannelClosedByBroker,
                        pika.exceptions.ConnectionClosedByBroker)):
        return int(exc.reply_code), str(exc.reply_text)
    if isinstance(exc, (pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError,
                        pika.exceptions.ProbableAccessDeniedError)):
        # pika wraps the broker's connection.close: "ConnectionClosedByBroker: (403) '...'"
        m = _CLOSE.search(str(exc))
        if m:
            return int(m.group(1)), m.group(2)
        if isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
            return 530, "NOT_ALLOWED - access to the virtual host refused"
        return 403, "ACCESS_REFUSED - login refused"
    return None


def _exclusive_use(code: int, text: str) -> bool:
    """Another consumer holds the queue: a dead predecessor the broker has not dropped yet."""
    return code == 405 or (code == 403 and "exclusive" in text)


def is_permanent(exc: BaseException) -> bool:
    """True for errors retrying cannot fix: 404, 403 (except exclusive use), 406, 530, auth."""
    if isinstance(exc, (pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AuthenticationError,
                        pika.exceptions.ProbableAccessDeniedError)):
        return True
    r = reply_of(exc)
    if r is None:
        return False  # refused, reset, timed out: the broker may be restarting
    code, text = r
    if _exclusive_use(code, text):
        return False
    return code in (402, 403, 404, 406, 501, 502, 503, 504, 505, 530, 540)


_HINTS = {
    402: "check the URL",
    403: "check the user and password in the URL and the user's permissions",
    404: "declare it first or check the name",
    406: "the broker refused an argument: check the queue's or exchange's declared arguments",
    530: "check the virtual host in the URL",
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


class QueueConsumer:
    """A manual-ack consumer with bounded prefetch, serviced by a daemon thread."""

    def __init__(self, url: str, queue: str, prefetch: int, *, exclusive: bool = True,
                 connect_timeout: float = 60.0) -> None:
        self.url = url
        self.queue = queue
        self.prefetch = max(1, min(int(prefetch), 65535))
        self.exclusive = exclusive
        self.connect_timeout = connect_timeout
        self.gen = 0
        self._buf: deque[Delivery] = deque()
        self._cond = threading.Condition()
        self._requests: _queue.Queue[tuple[str, Any, threading.Event, list[Any]]] = _queue.Queue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._parent = os.getppid()
        self._outstanding: set[int] = set()
        #: called from the consumer thread at most every 0.1 s (the reader's status file)
        self.on_tick: Any = None
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
            out: list[Delivery] = []
            while self._buf and len(out) < n:
                d = self._buf.popleft()
                if d.gen == self.gen:
                    out.append(d)
            return out

    def push_front(self, items: list[Delivery]) -> None:
        """Give deliveries back (a staged batch Spark never logged); stale ones are dropped."""
        with self._cond:
            for d in reversed(items):
                if d.gen == self.gen:
                    self._buf.appendleft(d)

    def ack(self, items: list[Delivery], timeout: float = 30.0) -> None:
        """Ack deliveries and wait until the broker has processed the acks."""
        gen = self.gen
        tags = sorted(d.tag for d in items if d.gen == gen)
        if tags:
            self._call("ack", (gen, tags), timeout)

    def unacked(self) -> int:
        """Deliveries this consumer holds unacked (buffered, staged or being landed)."""
        return len(self._outstanding)

    def queue_depth(self, timeout: float = 30.0) -> int:
        """Messages in the queue now: ready ones plus those delivered to us and unacked."""
        return int(self._call("depth", None, timeout))

    def ready_count(self, timeout: float = 30.0) -> int:
        """Messages the broker holds ready (not delivered to anyone)."""
        return int(self._call("ready", None, timeout))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)

    # -- internals ----------------------------------------------------------------------
    def _what(self) -> str:
        return f"cannot consume from queue {self.queue!r} at {safe_url(self.url)}"

    def _raise_if_failed(self) -> None:
        if self._error is not None and not self._thread.is_alive():
            if isinstance(self._error, ConsumerError):
                raise self._error
            raise ConsumerError(f"{self._what()}: {self._error!r}") from self._error

    def _call(self, op: str, arg: Any, timeout: float) -> Any:
        self._raise_if_failed()
        done = threading.Event()
        result: list[Any] = []
        self._requests.put((op, arg, done, result))
        if not done.wait(timeout):
            raise ConsumerError(f"{op} timed out after {timeout}s")
        if result and isinstance(result[0], BaseException):
            raise ConsumerError(f"{op} failed: {result[0]}") from result[0]
        return result[0] if result else None

    def _connect(self) -> tuple[pika.BlockingConnection, Any]:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.url))
                ch = conn.channel()
                ch.queue_declare(self.queue, passive=True)
                ch.basic_qos(prefetch_count=self.prefetch)
                self.gen += 1
                gen = self.gen
                with self._cond:
                    self._buf.clear()  # older tags are dead with their connection
                self._outstanding = set()

                def on_message(_ch: Any, m: Any, props: Any, body: bytes, gen: int = gen) -> None:
                    d = Delivery(gen, m.delivery_tag, bool(m.redelivered), m.exchange or "",
                                 m.routing_key or "", props, body, time.time())
                    self._outstanding.add(m.delivery_tag)
                    with self._cond:
                        self._buf.append(d)
                        self._cond.notify_all()

                ch.basic_consume(self.queue, on_message, auto_ack=False,
                                 exclusive=self.exclusive, arguments=DELIVERY_HEADERS)
                return conn, ch
            except pika.exceptions.AMQPError as exc:
                # 404/403/406/bad login: fail now. A dead predecessor's exclusive consumer
                # still registered (403 "exclusive use"), or the broker restarting: retry
                # until the deadline.
                self._error = exc
                if is_permanent(exc):
                    raise ConsumerError(describe(exc, self._what())) from exc
                if time.monotonic() > deadline:
                    raise ConsumerError(describe(exc, self._what())
                                        + f" [gave up after {self.connect_timeout:.0f}s]") from exc
                time.sleep(0.5)

    def _serve(self, conn: pika.BlockingConnection, ch: Any, op: str, arg: Any) -> Any:
        if op == "ack":
            gen, tags = arg
            if gen != self.gen:
                return None  # a reconnect came between: those tags died with their channel
            top = tags[-1]
            if sum(1 for t in self._outstanding if t <= top) == len(tags):
                ch.basic_ack(top, multiple=True)  # they are every outstanding tag up to top
            else:
                for t in tags:
                    ch.basic_ack(t)
            self._outstanding.difference_update(tags)
            ch.basic_qos(prefetch_count=self.prefetch)  # round trip: acks are processed
            return None
        if op == "ready":
            return ch.queue_declare(self.queue, passive=True).method.message_count
        if op == "depth":
            ready = ch.queue_declare(self.queue, passive=True).method.message_count
            conn.process_data_events(time_limit=0)  # dispatch deliveries that came before
            return ready + len(self._outstanding)
        raise ValueError(op)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, ch = self._connect()
            except BaseException as exc:  # noqa: BLE001 - reported to the reader
                self._error = exc
                return
            self._error = None
            self._ready.set()
            ticked = 0.0
            try:
                while not self._stop.is_set():
                    if os.getppid() != self._parent:
                        os._exit(0)  # Spark's JVM is gone: let the broker requeue our messages
                    conn.process_data_events(time_limit=0.02)
                    if self.on_tick is not None and time.monotonic() - ticked >= 0.1:
                        ticked = time.monotonic()
                        self.on_tick()
                    while True:
                        try:
                            op, arg, done, result = self._requests.get_nowait()
                        except _queue.Empty:
                            break
                        try:
                            result.append(self._serve(conn, ch, op, arg))
                        except BaseException as exc:  # noqa: BLE001
                            result.append(exc)
                        done.set()
                conn.close()
            except pika.exceptions.AMQPError as exc:
                log.warning("ackmq consumer connection lost (%s); reconnecting", exc)
                self._error = exc
                time.sleep(0.5)


class PublishError(RuntimeError):
    """A publish was nacked, returned, or not confirmed in time: the task must fail."""


class ConfirmingPublisher:
    """Publishes on a confirm channel, keeping at most `window` publishes unconfirmed."""

    def __init__(self, url: str, *, window: int = 1000, confirm_timeout: float = 30.0,
                 mandatory: bool = False) -> None:
        self.window = window
        self.confirm_timeout = confirm_timeout
        self.mandatory = mandatory
        self._where = safe_url(url)
        self._next = 1
        self._outstanding: set[int] = set()
        self._failure: str | None = None
        self.published = 0
        self.confirmed = 0
        try:
            self.conn = pika.BlockingConnection(pika.URLParameters(url))
            self.ch = self.conn.channel()
        except pika.exceptions.AMQPError as exc:
            raise PublishError(describe(exc, f"cannot publish to {self._where}")) from exc
        self._impl = self.ch._impl  # async publish: BlockingChannel waits per message
        # a broker-closed channel (404 no exchange, 403, 406, ...) fails at once: its
        # publishes will never be confirmed
        self._impl.add_on_close_callback(self._on_close)
        selected = threading.Event()
        self._impl.confirm_delivery(self._on_confirm, callback=lambda _f: selected.set())
        if mandatory:
            self._impl.add_on_return_callback(self._on_return)
        while not selected.is_set():
            self._pump(0.05)

    def _on_close(self, _ch: Any, reason: BaseException) -> None:
        if self._failure is None:
            self._failure = describe(reason, f"the broker closed the channel at {self._where}"
                                     f" ({len(self._outstanding)} publishes unconfirmed)")

    def _on_confirm(self, frame: Any) -> None:
        m = frame.method
        tag = m.delivery_tag
        done = [t for t in self._outstanding if t <= tag] if m.multiple else [tag]
        self._outstanding.difference_update(done)
        self.confirmed += len(done)
        if isinstance(m, pika.spec.Basic.Nack):
            self._failure = f"broker nacked publish {tag} (multiple={m.multiple})"

    def _on_return(self, _ch: Any, m: Any, _props: Any, _body: bytes) -> None:
        self._failure = f"message returned: {m.reply_code} {m.reply_text} ({m.routing_key!r})"

    def _pump(self, time_limit: float) -> None:
        """Process I/O; a lost or broker-closed connection raises PublishError now."""
        try:
            self.conn.process_data_events(time_limit=time_limit)
        except pika.exceptions.AMQPError as exc:
            raise PublishError(describe(exc, f"connection to {self._where} lost with "
                                             f"{len(self._outstanding)} publishes unconfirmed")
                               ) from exc
        if self._failure:
            raise PublishError(self._failure)

    def publish(self, exchange: str, routing_key: str, body: bytes,
                props: pika.spec.BasicProperties) -> None:
        if self._failure:
            raise PublishError(self._failure)
        try:
            self._impl.basic_publish(exchange, routing_key, body, props,
                                     mandatory=self.mandatory)
        except pika.exceptions.AMQPError as exc:  # channel or connection already gone
            self._pump(0)
            raise PublishError(describe(exc, f"cannot publish to {self._where}")) from exc
        self._outstanding.add(self._next)
        self._next += 1
        self.published += 1
        if len(self._outstanding) >= self.window:
            self._wait(self.window // 2)
        elif self.published % 64 == 0:
            self._pump(0)

    def _wait(self, at_most: int) -> None:
        deadline = time.monotonic() + self.confirm_timeout
        while len(self._outstanding) > at_most:
            if self._failure:
                raise PublishError(self._failure)
            if time.monotonic() > deadline:
                raise PublishError(f"{len(self._outstanding)} publishes unconfirmed after "
                                   f"{self.confirm_timeout}s")
            self._pump(0.01)
        if self._failure:
            raise PublishError(self._failure)

    def flush(self) -> None:
        """Block until every publish so far is confirmed; raise if any was not."""
        self._wait(0)

    def close(self) -> None:
        try:
            if self.conn.is_open:
                self.conn.close()
        except pika.exceptions.AMQPError:
            pass
