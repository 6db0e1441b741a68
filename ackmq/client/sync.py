"""The synchronous API. The connection owns a non-blocking socket and reads it in the
thread that waits (leader/followers): a thread that needs a reply, a confirm or a
delivery takes the reader role if it is free and reads the socket itself, so a
single-threaded program never pays a thread hop per message. Threads that find the role
taken wait on a condition the reader signals. Listeners run on one dispatch thread per
connection; a small heartbeat thread keeps an idle connection alive (H1) and notices a
dead one.
"""

from __future__ import annotations

import concurrent.futures
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ackmq.protocol.amqp import HEARTBEAT

from .browser import QueueBrowser
from .connection import BaseConnection
from .consumer import BaseConsumer
from .core import Core
from .errors import ClientError, ConfirmTimeout, ConnectionLost, IllegalStateError
from .message import BatchItem, Message, OutboundMessage
from .options import AckMode, Destination, Options, RedeliveryPolicy, parse_url
from .producer import BaseProducer
from .session import BaseSession
from .steps import CALL, IDLE, OPEN, RECONNECT, SLEEP, Step, deadline_in

# a non-blocking socket with nothing to read or no room; TLS says so with its own errors
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def _recv(sock: socket.socket) -> bytes:
    """What there is to read; over TLS also what the TLS layer already decrypted (poll
    does not see it: it is no longer in the kernel's buffer)."""
    data = sock.recv(_READ_SIZE)
    if data and isinstance(sock, ssl.SSLSocket):
        while sock.pending():
            data += sock.recv(_READ_SIZE)
    return data

log = logging.getLogger("ackmq.client")

_READ_SIZE = 1 << 18


class ClientFuture:
    """A future of the sync API, with concurrent.futures.Future's interface (done,
    result(timeout), exception(timeout), add_done_callback). It is settled by whichever
    thread reads the socket; result() and exception() read it themselves while they wait
    (no thread hop), so it needs no lock of its own: one is cheap enough to create per
    publish."""

    __slots__ = ("_conn", "_state", "_value", "_callbacks")

    _PENDING, _DONE, _FAILED = 0, 1, 2

    def __init__(self, conn: Connection | None = None) -> None:
        self._conn = conn
        self._state = 0
        self._value: Any = None
        self._callbacks: list[Callable[[ClientFuture], Any]] | None = None

    def done(self) -> bool:
        return self._state != 0

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return self._state == 0

    def cancel(self) -> bool:
        return False  # a publish on the wire cannot be taken back

    def set_result(self, value: Any) -> None:
        if self._state:
            raise concurrent.futures.InvalidStateError("already settled")
        self._value = value
        self._state = 1
        if self._callbacks:
            self._run_callbacks()

    def set_exception(self, exc: BaseException) -> None:
        if self._state:
            raise concurrent.futures.InvalidStateError("already settled")
        self._value = exc
        self._state = 2
        if self._callbacks:
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks or [], None
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("future callback")

    def add_done_callback(self, fn: Callable[[ClientFuture], Any]) -> None:
        """`fn(future)` once settled — on the thread that reads the socket: keep it short,
        never block or publish from it (J10)."""
        if self._state:
            fn(self)
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def _pump(self, timeout: float | None) -> None:
        conn = self._conn
        if self._state or conn is None:
            return
        deadline = deadline_in(timeout)
        while True:
            try:
                conn._flush(conn.rpc_deadline())
                conn._wait(self.done, deadline)
                return
            except ConnectionLost:
                if self._state or not conn.resending or conn.closed:
                    return  # the future carries the error
            except ClientError:
                return  # the future carries the error (or the caller times out)
            try:  # idempotent: kept across the loss, re-sent by the reconnect
                conn._ensure_connected()
            except ClientError:
                return

    def result(self, timeout: float | None = None) -> Any:
        self._pump(timeout)
        if self._state == 1:
            return self._value
        if self._state == 2:
            raise self._value
        raise TimeoutError("future not settled in time")

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._pump(timeout)
        if self._state == 0:
            raise TimeoutError("future not settled in time")
        return self._value if self._state == 2 else None


class Connection(BaseConnection):
    """`with connect(url) as conn:` — see ackmq/client/__init__.py and docs/client.md."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._rio = threading.Lock()   # the reader role
        self._wio = threading.Lock()   # the writer role
        self._reconnecting = threading.Lock()
        self._reconnector: int | None = None  # the thread reconnecting, if any
        self._sock: socket.socket | None = None
        self._poll: Any = None
        self._dispatcher: threading.Thread | None = None
        self._io_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._deferred = 0  # bytes publish() left for the I/O thread
        self._listener_consumers: list[BaseConsumer] = []
        self._listener_ready = False
        self.core = Core(options, self.new_future)
        self._publishes = 0

    # -- futures and waiting -----------------------------------------------------------
    def new_future(self) -> ClientFuture:
        return ClientFuture(self)

    def _drive(self, gen: Step) -> Any:
        """Run a step generator (steps.py) to completion: its steps under the lock, its waits
        by reading the socket (or waiting for the thread that reads it)."""
        value: Any = None
        error: BaseException | None = None
        while True:
            with self._lock:
                try:
                    if error is not None:
                        step = gen.throw(error)
                    else:
                        step = gen.send(value)
                except StopIteration as stop:
                    result = stop.value
                    break
            fut, deadline = step
            value, error = None, None
            try:
                if type(fut) is object:  # an I/O step (steps.py)
                    self._io_step(fut, deadline)
                    continue
                self._flush(self.rpc_deadline())
                if fut is None:
                    self._wait(_never, deadline)
                    value, error = None, TimeoutError()
                elif self._wait(fut.done, deadline):
                    value, error = (fut._value, None) if fut._state == 1 else \
                        (None, fut._value)
                else:
                    value, error = None, TimeoutError()
            except ClientError as err:
                value, error = None, err
            except Exception as err:  # noqa: BLE001 - a listener's, thrown back (CALL)
                if fut is not CALL:
                    raise
                value, error = None, err
        self._flush(self.rpc_deadline())
        return result

    def _io_step(self, op: object, arg: Any) -> None:
        if op is RECONNECT:
            self._ensure_connected()
        elif op is OPEN:
            self._open()
        elif op is SLEEP:
            time.sleep(max(0.0, arg - time.monotonic()))
        elif op is CALL:
            fn, message = arg
            fn(message)
        elif op is IDLE:
            with self._lock:
                self._listener_ready = False
            self._flush(self.rpc_deadline())
            self._wait(self._listener_work, arg)

    def _listener_work(self) -> bool:
        return self._listener_ready or self.closed or any(
            c.ready() for c in self._listener_consumers)

    def _wait(self, pred: Callable[[], bool], deadline: float | None) -> bool:
        """Until pred() or the deadline (False). Reads the socket when no other thread
        does (at least one look, even with the deadline already past); raises
        ConnectionLost when the connection is gone."""
        looked = False
        while True:
            with self._lock:
                if pred():
                    return True
                if self.core.error is not None:
                    raise self.core.error
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                if looked:
                    return False
                looked = True
                self._poll_now()
                continue
            if self._rio.acquire(blocking=False):
                try:
                    self._read_once(0.5 if remaining is None else min(remaining, 0.5))
                finally:
                    with self._cond:
                        self._rio.release()
                        self._cond.notify_all()
            else:
                with self._cond:
                    if pred():
                        return True
                    if self.core.error is not None:
                        raise self.core.error
                    if not self._rio.locked():
                        continue
                    self._cond.wait(0.5 if remaining is None else min(remaining, 0.5))

    def _read_once(self, timeout: float) -> None:
        """Caller holds the reader role: wait up to `timeout` for bytes, feed them."""
        with self._lock:
            sock, poll, core = self._sock, self._poll, self.core
        if sock is None:
            if timeout > 0:
                time.sleep(min(timeout, 0.05))
            return
        try:
            ready = poll.poll(max(0, int(timeout * 1000)))
            if not ready:
                return
            data = _recv(sock)
        except _WOULD_BLOCK:
            return
        except OSError as err:
            self._lost(ConnectionLost(f"connection lost: {err}"), core)
            return
        if not data:
            self._lost(ConnectionLost("connection closed by the broker (EOF)"), core)
            return
        with self._cond:
            if core is not self.core:
                return
            core.feed(data)
            self._cond.notify_all()
        if core.out:
            self._flush(self.rpc_deadline(), block=False, reading=True)
        if core.error is not None:
            self._close_socket(sock)

    def _poll_now(self) -> None:
        """Read whatever has arrived, if no other thread is reading (non-blocking)."""
        if self._rio.acquire(blocking=False):
            try:
                self._read_once(0)
            finally:
                with self._cond:
                    self._rio.release()
                    self._cond.notify_all()

    def _lost(self, error: ConnectionLost, core: Core | None = None) -> None:
        """`core`'s connection is gone (ignored if a reconnect has replaced it)."""
        with self._cond:
            if core is not None and core is not self.core:
                return
            sock = self._sock
            self.core.lost(error)
            self._cond.notify_all()
        self._close_socket(sock)

    def _close_socket(self, sock: socket.socket | None = None) -> None:
        with self._lock:
            if sock is None or sock is self._sock:
                sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    # -- writing -----------------------------------------------------------------------
    def _flush(self, deadline: float | None, block: bool = True,
               reading: bool = False) -> None:
        """Write out what the core has queued. The writer role keeps frames of different
        threads from interleaving; a non-blocking caller (the reader) leaves its bytes to
        the current writer, which looks again after it lets go of the role."""
        core = self.core
        while core.out:
            if block:
                timeout = -1 if deadline is None else max(0.0, deadline - time.monotonic())
                if not self._wio.acquire(timeout=timeout):
                    raise ConnectionLost("could not write within the timeout")
            elif not self._wio.acquire(blocking=False):
                return
            try:
                while True:
                    with self._lock:
                        if not core.out:
                            break
                        data = b"".join(core.out) if len(core.out) > 1 else core.out[0]
                        core.out.clear()
                    self._send_all(data, deadline, reading)
            finally:
                self._wio.release()
            if core.error is not None:
                core.out.clear()
                return

    def _send_all(self, data: bytes, deadline: float | None, held: bool = False) -> None:
        """Write all of `data`; `held`: the caller already holds the reader role."""
        with self._lock:
            sock, core = self._sock, self.core
        if sock is None:
            return
        view = memoryview(data)
        while view:
            try:
                n = sock.send(view)
                view = view[n:]
                continue
            except _WOULD_BLOCK:
                pass
            except OSError as err:
                self._lost(ConnectionLost(f"connection lost: {err}"), core)
                return
            # the socket is full: wait for room, reading meanwhile if nobody else does
            # (a broker that stops reading us while we stop reading it would deadlock)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self._lost(ConnectionLost("write timed out: the broker reads nothing"), core)
                return
            reading = held or self._rio.acquire(blocking=False)
            try:
                events = select.POLLOUT | (select.POLLIN if reading else 0)
                p = select.poll()
                p.register(sock, events)
                ready = p.poll(int(min(remaining if remaining is not None else 1.0, 1.0) * 1000))
                if reading and any(ev & select.POLLIN for _, ev in ready):
                    try:
                        chunk = _recv(sock)
                    except _WOULD_BLOCK:
                        chunk = None
                    except OSError as err:
                        self._lost(ConnectionLost(f"connection lost: {err}"), core)
                        return
                    if chunk == b"":
                        self._lost(ConnectionLost("connection closed by the broker (EOF)"),
                                   core)
                        return
                    if chunk:
                        with self._cond:
                            if core is self.core:
                                core.feed(chunk)
                            self._cond.notify_all()
            finally:
                if reading and not held:
                    with self._cond:
                        self._rio.release()
                        self._cond.notify_all()
        core.last_write = time.monotonic()

    # -- connect / close ---------------------------------------------------------------
    def _open(self) -> None:
        o = self.options
        deadline = time.monotonic() + o.connect_timeout
        try:
            sock = socket.create_connection((o.host, o.port), timeout=o.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if o.tls is not None:  # the handshake blocks (within the timeout), then not
                sock = o.tls.context().wrap_socket(
                    sock, server_hostname=o.tls.server_hostname(o.host))
        except OSError as err:  # ssl.SSLError is an OSError
            raise ConnectionLost(f"cannot connect to {o.host}:{o.port}: {err}") from None
        sock.setblocking(False)
        with self._lock:
            self.core = Core(o, self.new_future)
            self._sock = sock
            self._poll = select.poll()
            self._poll.register(sock, select.POLLIN)
        opened = self.core.opened
        self._flush(deadline)
        if not self._wait(opened.done, deadline):
            self._lost(ConnectionLost(f"no AMQP handshake with {o.host}:{o.port} within "
                                      f"{o.connect_timeout} s"))
        exc = opened._value if opened._state == 2 else None
        if exc is not None:
            self._close_socket()
            raise exc
        self.opened_now()
        self._start_io_thread()

    def _start_io_thread(self) -> None:
        if self._io_thread is None or not self._io_thread.is_alive():
            self._io_thread = threading.Thread(target=self._io_loop,
                                               name="ackmq.client-io", daemon=True)
            self._io_thread.start()

    def _kick_writer(self) -> None:
        """Have the I/O thread write what is buffered (publish() bursts)."""
        if not self._kick.is_set():
            self._kick.set()

    def _io_loop(self) -> None:
        """The connection's helper thread: writes what publish() left buffered (a burst
        goes out in large writes instead of one syscall per message), sends a heartbeat
        when nothing was written for half an interval, reads when no one else does, and
        declares the peer dead after two silent intervals (H1)."""
        while not self._stop.is_set():
            core = self.core
            interval = core.heartbeat
            kicked = self._kick.wait(min(interval / 2.0, 1.0) if interval else 1.0)
            if self._stop.is_set():
                return
            if kicked:
                self._kick.clear()
            if core.error is not None or self._sock is None:
                if self.closed:
                    return
                continue
            try:
                if core.out:
                    self._flush(self.rpc_deadline())
                if not interval:
                    continue
                now = time.monotonic()
                if now - core.last_write >= interval / 2.0:
                    with self._lock:
                        core.out.append(HEARTBEAT)
                    self._flush(now + interval)
                if not kicked:
                    self._poll_now()
                if time.monotonic() - core.last_read > 2 * interval:
                    self._lost(ConnectionLost(f"no data from the broker for {2 * interval} s "
                                              f"(missed heartbeats)"), core)
            except ClientError:
                pass
            except Exception:  # never let the keep-alive die silently
                log.exception("ackmq.client I/O thread")

    def _ensure_connected(self) -> None:
        """reconnect=True: a lost connection is re-established (sessions, consumers)."""
        if self.closed:
            raise IllegalStateError("connection is closed")
        if self.core.error is None and self._reconnector in (None, threading.get_ident()):
            return  # open, and no other thread restoring sessions on it
        if self.core.error is not None and not self.options.reconnect:
            raise self.core.error
        if not self._reconnecting.acquire(timeout=self.options.reconnect_timeout):
            raise ConnectionLost("reconnect still under way in another thread")
        try:
            if self.core.error is None:
                return
            self._reconnector = threading.get_ident()
            try:
                self._drive(self.reconnect_g())
            finally:
                self._reconnector = None
            log.info("ackmq.client: reconnected to %s:%s", self.options.host,
                     self.options.port)
            with self._cond:
                self._cond.notify_all()
        finally:
            self._reconnecting.release()

    def close(self) -> None:
        """Close sessions (postponed acks are sent), then the connection; bounded by
        close_timeout."""
        if self.closed:
            return
        try:
            self._drive(self.close_g(time.monotonic() + self.options.close_timeout))
        finally:
            self._stop.set()
            self._kick.set()
            with self._cond:
                self.closed_now()
                self._cond.notify_all()
            self._close_socket()
            t = self._dispatcher
            if t is not None and t is not threading.current_thread():
                t.join(self.options.close_timeout)

    def abort(self) -> None:
        """Drop the socket without closing anything (what a crash looks like to the
        broker): postponed acks are not sent, unacked deliveries come back (D8)."""
        self._stop.set()
        self.closed = True
        lost = ConnectionLost("connection aborted by the client")
        self._lost(lost)
        with self._cond:
            self.give_up_resend(lost)  # no reconnect will re-send them

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        return not self.closed and self.core.error is None

    @property
    def server_properties(self) -> dict[str, Any]:
        return self.core.server_properties

    @property
    def is_ackmq(self) -> bool:
        return self.core.is_ackmq

    # -- API ---------------------------------------------------------------------------
    def session(self, ack_mode: AckMode = AckMode.AUTO, transacted: bool = False) -> Session:
        """A session (one channel) with one acknowledge mode (J1, J2)."""
        self._ensure_connected()
        s = Session(self, ack_mode, transacted)
        self._drive(s.open_g(self.rpc_deadline()))
        self.sessions.append(s)
        return s

    def declare_queue(self, name: str, durable: bool = True,
                      arguments: dict[str, Any] | None = None) -> str:
        """Declare a queue (its x-dead-letter-exchange is then known to consumers of this
        connection for poison messages). Returns its name (server-named when "")."""
        self._ensure_connected()
        ok = self._drive(self.declare_queue_g(name, durable, arguments, self.rpc_deadline()))
        return ok.queue

    def _run(self, gen: Step) -> Any:
        self._ensure_connected()
        return self._drive(gen)

    # -- listeners ---------------------------------------------------------------------
    def _add_listener(self, consumer: BaseConsumer) -> None:
        with self._lock:
            self._listener_consumers.append(consumer)
            if self._dispatcher is None or not self._dispatcher.is_alive():
                self._dispatcher = threading.Thread(target=self._dispatch_loop,
                                                    name="ackmq.client-dispatch", daemon=True)
                self._dispatcher.start()
            self._listener_ready = True
            self._cond.notify_all()

    def _wake_listeners(self, consumer: BaseConsumer) -> None:
        self._listener_ready = True  # under the lock; the reader notifies after feeding

    def _dispatch_loop(self) -> None:
        """The dispatch thread (BaseConnection.dispatch_loop_g); while no listener has work it is
        the socket reader."""
        try:
            self._drive(self.dispatch_loop_g(self._listener_consumers))
        except ClientError:
            pass


class Session(BaseSession):
    """A session: producers, consumers, and (transacted) commit/rollback."""

    conn: Connection

    def producer(self, destination: str | Destination) -> Producer:
        """A producer for a queue name ("orders", "queue://orders") or "topic://key"."""
        self.check()
        p = Producer(self, self._destination(destination))
        self.conn._drive(p.prepare_g(self.conn.rpc_deadline()))
        return p

    def consumer(self, destination: str | Destination,
                 listener: Callable[[Message], Any] | None = None,
                 redelivery_policy: RedeliveryPolicy | None = None) -> Consumer:
        """A consumer; with `listener`, messages are pushed to it on the connection's
        dispatch thread, otherwise call receive()."""
        self.conn._ensure_connected()
        self.check()
        c = Consumer(self, self._destination(destination), listener, redelivery_policy)
        self.conn._drive(c.subscribe_g(self.conn.rpc_deadline()))
        self._all_consumers.append(c)
        if listener is not None:
            self.conn._add_listener(c)
        return c

    def browser(self, queue: str, selector: Callable[[Message], bool] | None = None
                ) -> QueueBrowser:
        """JMS's QueueBrowser: a stream queue's messages, not consumed (browser.py)."""
        return QueueBrowser(self.conn, queue, selector)

    def commit(self) -> None:
        self.conn._ensure_connected()
        self.conn._drive(self.commit_g(self.conn.rpc_deadline()))

    def rollback(self) -> None:
        self.conn._ensure_connected()
        self.conn._drive(self.rollback_g(self.conn.rpc_deadline()))

    def recover(self) -> None:
        """JMS Session.recover(): deliver every delivered-unacknowledged message again,
        each counting as a redelivery (J6). Not in a transacted session."""
        self.conn._drive(self.recover_g(self.conn.rpc_deadline()))

    def acknowledge(self) -> None:
        with self.conn._lock:
            BaseSession.acknowledge(self)
        self.conn._flush(self.conn.rpc_deadline())

    def acknowledge_messages(self, messages: list[Message]) -> int:
        """Ack exactly these delivered messages (any ack mode; a `multiple` ack where
        they are a run at the front). Returns how many were acked. Call
        `queue_info()` after it to know the broker has processed the acks."""
        with self.conn._lock:
            n = BaseSession.acknowledge_messages(self, messages)
        self.conn._flush(self.conn.rpc_deadline())
        return n

    def queue_info(self, queue: str) -> Any:
        """Passive queue.declare on this session's channel: `.message_count` (ready),
        `.consumer_count`. A round trip after everything sent before on the session
        (acks included); a missing queue raises ChannelClosed(404) and ends the
        session."""
        self.conn._ensure_connected()
        return self.conn._drive(self.passive_declare_g("queue", queue,
                                                       self.conn.rpc_deadline()))

    def check_exchange(self, exchange: str) -> None:
        """Passive exchange.declare on this session's channel; ChannelClosed(404) if it
        does not exist (the session then ends)."""
        self.conn._ensure_connected()
        self.conn._drive(self.passive_declare_g("exchange", exchange,
                                                self.conn.rpc_deadline()))

    def producer_to(self, exchange: str, routing_key: str = "",
                    mandatory: bool = False) -> Producer:
        """A producer for any exchange and routing key, declaring nothing (a missing
        exchange closes the channel with 404 at the first publish). `publish()` also
        takes OutboundMessage.build(...) with its own exchange and routing key."""
        self.check()
        p = Producer(self, Destination("topic", exchange or "(default)"))
        p.exchange, p.routing_key, p.mandatory = exchange, routing_key, mandatory
        return p

    def close(self) -> None:
        if self.conn.core.error is not None:
            self.closed = True
            return
        self.conn._drive(self.close_g(self.conn.rpc_deadline()))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Producer(BaseProducer):
    """send() waits for each confirm; send_batch() for a batch; publish() returns a
    Future and tracks confirms asynchronously (J10)."""

    session: Session

    def _msg(self, body: bytes | str | OutboundMessage, headers: dict[str, Any] | None,
             persistent: bool, message_id: str | None, props: dict[str, Any]
             ) -> OutboundMessage:
        return self.build(body, headers, persistent, message_id, props)

    def send(self, body: bytes | str | OutboundMessage, headers: dict[str, Any] | None = None,
             *, persistent: bool = True, message_id: str | None = None,
             timeout: float | None = None, **props: Any) -> None:
        """Publish and wait for the broker's confirm. Raises NackError, ReturnedError
        (mandatory, no queue), ConfirmTimeout (after `timeout`, default
        jms.sendTimeout). In a transacted session it takes effect at commit()."""
        conn = self.session.conn
        conn._ensure_connected()
        msg = self._msg(body, headers, persistent, message_id, props)
        deadline = deadline_in(timeout) if timeout is not None else conn.rpc_deadline()
        conn._drive(self.send_g(msg, deadline))

    def send_batch(self, messages: Sequence[BatchItem], timeout: float | None = None) -> None:
        """Publish all, then one wait for all their confirms. Items are bodies,
        (body, headers) pairs or OutboundMessages. Raises NackError/ReturnedError with
        every failed message in `.messages`, or ConfirmTimeout."""
        conn = self.session.conn
        conn._ensure_connected()
        msgs = []
        for item in messages:
            if isinstance(item, tuple):
                msgs.append(self._msg(item[0], item[1], True, None, {}))
            else:
                msgs.append(self._msg(item, None, True, None, {}))
        deadline = deadline_in(timeout) if timeout is not None else conn.rpc_deadline()
        conn._drive(self.send_batch_g(msgs, deadline))

    def publish(self, body: bytes | str | OutboundMessage,
                headers: dict[str, Any] | None = None, *, persistent: bool = True,
                message_id: str | None = None, **props: Any) -> ClientFuture:
        """Publish without waiting: the Future resolves when the broker confirms (None) or
        refuses (NackError / ReturnedError; the message also goes to take_failed()).
        Blocks only when max_outstanding_confirms publishes are unconfirmed."""
        conn = self.session.conn
        if conn.core.error is not None:
            conn._ensure_connected()
        msg = self._msg(body, headers, persistent, message_id, props)
        chan = self.session.chan
        if chan is not None and len(chan.outstanding) >= conn.options.max_outstanding_confirms:
            limit = conn.options.max_outstanding_confirms
            conn._flush(conn.rpc_deadline())
            try:
                if not conn._wait(lambda: len(chan.outstanding) < limit, conn.rpc_deadline()):
                    raise ConfirmTimeout(f"{len(chan.outstanding)} publishes unconfirmed")
            except ConnectionLost:
                if not conn.resending:
                    raise
                conn._ensure_connected()  # the unconfirmed ones are re-sent
        while True:
            with conn._lock:
                try:
                    fut = self.publish_now(msg, self.failed)
                except ConnectionLost:
                    if not conn.resending:
                        raise
                    fut = None
                else:
                    self.track_seq()
                    conn._deferred += len(msg.body) + 64
                    flush_now = conn._deferred >= 65536
            if fut is not None:
                break
            conn._ensure_connected()  # idempotent: lost just now; publish after it
        if flush_now:
            conn._deferred = 0
            conn._flush(conn.rpc_deadline())
            conn._poll_now()
        else:
            conn._kick_writer()
        return fut

    def wait_for_confirms(self, timeout: float | None = None) -> None:
        """Until every publish() of this producer is settled; failures are in
        take_failed(). Raises ConfirmTimeout."""
        conn = self.session.conn
        deadline = deadline_in(timeout) if timeout is not None else conn.rpc_deadline()
        conn._drive(self.wait_for_confirms_g(deadline))


class Consumer(BaseConsumer):
    """receive() (pull style) or a listener (push), never both (J5)."""

    session: Session

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after `timeout` seconds (None: wait until one comes
        or the connection is lost). AUTO: acked before it is returned (J1)."""
        self._begin_receive()
        conn = self.session.conn
        deadline = deadline_in(timeout)
        while True:
            try:
                conn._ensure_connected()
                with conn._lock:
                    m = self._take_now()
                if m is None:
                    m = conn._drive(self.next_g(deadline))
                    if m is not None:
                        with conn._lock:
                            self.delivered(m)
                if m is None:
                    if self.lazy:
                        with conn._lock:
                            self.flush_lazy_acks()
                conn._flush(conn.rpc_deadline())
                return m
            except ConnectionLost:
                if not conn.options.reconnect or conn.closed or (
                        deadline is not None and time.monotonic() >= deadline):
                    raise

    def receive_batch(self, max_messages: int, timeout: float | None = None
                      ) -> list[Message]:
        """Up to `max_messages` messages in one call: waits (as receive()) for the
        first, then takes what is already buffered without waiting. Why: a consumer
        that hands messages on in batches pays one call per batch, not per message."""
        first = self.receive(timeout)
        if first is None:
            return []
        out = [first]
        conn = self.session.conn
        with conn._lock:
            while len(out) < max_messages:
                m = self._take_now()
                if m is None:
                    break
                out.append(m)
        conn._flush(conn.rpc_deadline())
        return out

    def _take_now(self) -> Message | None:
        """Fast path without a generator: a buffered message that needs no poisoning."""
        self.check()
        self.release_due()
        buffer = self.buffer
        while buffer:
            m = buffer[0]
            if m.state == 3:  # SETTLED
                buffer.popleft()
                continue
            if m.redelivery_count and self.policy.exceeded(m.redelivery_count):
                return None
            buffer.popleft()
            self.delivered(m)
            return m
        return None

    def _acknowledge_message(self, m: Message) -> None:
        conn = self.session.conn
        with conn._lock:
            self.acknowledge_message(m)
        conn._flush(conn.rpc_deadline())

    def acknowledge(self) -> None:
        """CLIENT mode: ack only this consumer's delivered messages."""
        conn = self.session.conn
        with conn._lock:
            self.acknowledge_own()
        conn._flush(conn.rpc_deadline())

    def close(self) -> None:
        conn = self.session.conn
        if conn.core.error is not None:
            self.closed = True
            return
        conn._drive(self.cancel_g(conn.rpc_deadline()))

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Message:
        m = self.receive()
        if m is None:
            raise StopIteration
        return m


def connect(url: str = "amqp://guest:guest@127.0.0.1:5672/", **options: Any) -> Connection:
    """Open a connection. `options` override the URL's (reconnect=True,
    heartbeat=..., redelivery_policy=RedeliveryPolicy(...), ...)."""
    conn = Connection(parse_url(url, **options))
    conn._open()
    return conn


def _never() -> bool:
    return False
