"""The asyncio API: the same sessions, consumers and producers as the sync one (the
behaviour lives in session.py, consumer.py, producer.py, connection.py), driven by an asyncio.Protocol. Output queued during one
loop turn is written once at its end."""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ackmq.protocol.amqp import HEARTBEAT

from .connection import BaseConnection
from .consumer import BaseConsumer
from .core import Core
from .errors import ClientError, ConfirmTimeout, ConnectionLost, IllegalStateError
from .message import BatchItem, Message, OutboundMessage
from .options import AckMode, Destination, Options, RedeliveryPolicy, parse_url
from .producer import BaseProducer
from .session import BaseSession
from .steps import CALL, IDLE, OPEN, RECONNECT, SLEEP, Step, deadline_in

log = logging.getLogger("ackmq.client")


class _Protocol(asyncio.Protocol):
    def __init__(self, conn: AsyncConnection, core: Core) -> None:
        self.conn = conn
        self.core = core
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types it BaseTransport; a TCP connection's is a Transport
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        core = self.core
        core.feed(data)
        conn = self.conn
        if core is conn.core:
            conn._flush()
            if core.error is not None:
                conn._lost(core.error, core)

    def connection_lost(self, exc: Exception | None) -> None:
        text = f"connection lost: {exc}" if exc else "connection closed by the broker (EOF)"
        self.conn._lost(ConnectionLost(text), self.core)

    def pause_writing(self) -> None:
        self.conn._write_paused = True

    def resume_writing(self) -> None:
        self.conn._resume_writing()


class AsyncConnection(BaseConnection):
    """`async with await connect_async(url) as conn:`"""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self.loop = asyncio.get_running_loop()
        self.core = Core(options, self.new_future)
        self._transport: asyncio.Transport | None = None
        self._lost_fut: asyncio.Future[None] = self.loop.create_future()
        self._flush_scheduled = False
        self._deferred = 0  # bytes publish() queued since the last write
        self._write_paused = False  # the transport's buffer is over its high-water mark
        self._drain_waiter: asyncio.Future[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._dispatch_task: asyncio.Task[None] | None = None
        self._listener_event = asyncio.Event()
        self._listener_consumers: list[BaseConsumer] = []
        self._reconnect_lock = asyncio.Lock()

    def new_future(self) -> asyncio.Future[Any]:
        return self.loop.create_future()

    # -- I/O ---------------------------------------------------------------------------
    def _flush(self) -> None:
        self._deferred = 0
        core = self.core
        if core.out and self._transport is not None and core.error is None:
            data = b"".join(core.out)
            core.out.clear()
            self._transport.write(data)
            core.last_write = time.monotonic()
        elif core.error is not None:
            core.out.clear()

    def _flush_soon(self) -> None:
        """Coalesce the writes of one loop turn (publish() in a tight loop)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _resume_writing(self) -> None:
        self._write_paused = False
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is full (TCP backpressure from the
        broker); a load generator awaits this between pipelined writes."""
        if self._write_paused and self.core.error is None:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = self.loop.create_future()
            await asyncio.wait([self._drain_waiter, self._lost_fut],
                               return_when=asyncio.FIRST_COMPLETED)
        if self.core.error is not None:
            raise self.core.error

    def _lost(self, error: ConnectionLost, core: Core) -> None:
        if core is not self.core:
            return
        core.lost(error)
        self._resume_writing()
        if not self._lost_fut.done():
            self._lost_fut.set_result(None)
        if self._transport is not None:
            self._transport.abort()
            self._transport = None
        self._listener_event.set()

    async def _drive(self, gen: Step) -> Any:
        """Run a step generator (steps.py): its waits are awaits."""
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                self._flush()
                return stop.value
            self._flush()
            fut, deadline = step
            value, error = None, None
            if type(fut) is object:  # an I/O step (steps.py)
                try:
                    await self._io_step(fut, deadline)
                except ClientError as err:
                    error = err
                except Exception as err:  # noqa: BLE001 - a listener's, thrown back (CALL)
                    if fut is not CALL:
                        raise
                    error = err
                continue
            if fut is None or not fut.done():
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                lost = self._lost_fut
                waiters = [lost] if fut is None else [fut, lost]
                await asyncio.wait(waiters, timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
            if fut is not None and fut.done():
                if fut.exception() is not None:
                    error = fut.exception()
                else:
                    value = fut.result()
            elif self.core.error is not None:
                error = self.core.error
            else:
                error = TimeoutError()

    async def _io_step(self, op: object, arg: Any) -> None:
        if op is RECONNECT:
            await self._ensure_connected()
        elif op is OPEN:
            await self._open()
        elif op is SLEEP:
            await asyncio.sleep(max(0.0, arg - time.monotonic()))
        elif op is CALL:
            fn, message = arg
            result = fn(message)
            if inspect.isawaitable(result):
                await result
        elif op is IDLE:
            self._flush()
            self._listener_event.clear()
            if any(c.ready() for c in self._listener_consumers):
                return
            try:
                await asyncio.wait_for(self._listener_event.wait(),
                                       max(0.0, arg - time.monotonic()))
            except TimeoutError:
                pass

    # -- connect / close ---------------------------------------------------------------
    async def _open(self) -> None:
        o = self.options
        core = Core(o, self.new_future)
        self.core = core
        self._lost_fut = self.loop.create_future()
        tls: dict[str, Any] = {}
        if o.tls is not None:
            tls = {"ssl": o.tls.context(), "server_hostname": o.tls.server_hostname(o.host)
                   or ""}
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a caller's cancel
            # that lands as the awaited future completes (a shovel replaced while it
            # connected then never stopped)
            async with asyncio.timeout(o.connect_timeout):
                transport, _ = await self.loop.create_connection(
                    lambda: _Protocol(self, core), o.host, o.port, **tls)
        except (TimeoutError, OSError) as err:  # ssl.SSLError is an OSError
            lost = ConnectionLost(f"cannot connect to {o.host}:{o.port}: {err!r}")
            core.lost(lost)
            raise (core.error or lost) from None
        self._transport = transport
        self._flush()
        try:
            async with asyncio.timeout(o.connect_timeout):
                await asyncio.shield(core.opened)
        except TimeoutError:
            lost = ConnectionLost(f"no AMQP handshake with {o.host}:{o.port} within "
                                  f"{o.connect_timeout} s")
            self._lost(lost, core)
            raise (core.error or lost) from None
        except ClientError:
            self._lost(core.error or ConnectionLost("handshake failed"), core)
            raise
        self.opened_now()
        if core.heartbeat and (self._heartbeat_task is None or self._heartbeat_task.done()):
            self._heartbeat_task = self.loop.create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        while not self.closed:
            core = self.core
            interval = core.heartbeat
            if not interval:
                return
            await asyncio.sleep(min(interval / 2.0, 1.0))
            if core.error is not None:
                if not self.options.reconnect:
                    return
                continue
            now = time.monotonic()
            if now - core.last_write >= interval / 2.0:
                core.out.append(HEARTBEAT)
                self._flush()
            if now - core.last_read > 2 * interval:
                self._lost(ConnectionLost(f"no data from the broker for {2 * interval} s "
                                          f"(missed heartbeats)"), core)

    async def _ensure_connected(self) -> None:
        if self.closed:
            raise IllegalStateError("connection is closed")
        if self.core.error is None and not self._reconnect_lock.locked():
            return  # open, and no task restoring sessions on it
        if self.core.error is not None and not self.options.reconnect:
            raise self.core.error
        async with self._reconnect_lock:
            if self.core.error is None:
                return
            await self._drive(self.reconnect_g())
            self._listener_event.set()

    async def close(self) -> None:
        if self.closed:
            return
        try:
            await self._drive(self.close_g(time.monotonic() + self.options.close_timeout))
        finally:
            self.closed_now()
            if not self._lost_fut.done():
                self._lost_fut.set_result(None)
            if self._transport is not None:
                self._transport.close()
                self._transport = None
            self._listener_event.set()
            for task in (self._heartbeat_task, self._dispatch_task):
                if task is not None and task is not asyncio.current_task():
                    task.cancel()

    def abort(self) -> None:
        """Drop the socket (a crash, as the broker sees it)."""
        self.closed = True
        lost = ConnectionLost("connection aborted by the client")
        self._lost(lost, self.core)
        self.give_up_resend(lost)  # no reconnect will re-send them

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def is_open(self) -> bool:
        return not self.closed and self.core.error is None

    @property
    def is_ackmq(self) -> bool:
        return self.core.is_ackmq

    @property
    def server_properties(self) -> dict[str, Any]:
        return self.core.server_properties

    # -- API ---------------------------------------------------------------------------
    async def session(self, ack_mode: AckMode = AckMode.AUTO,
                      transacted: bool = False) -> AsyncSession:
        await self._ensure_connected()
        s = AsyncSession(self, ack_mode, transacted)
        await self._drive(s.open_g(self.rpc_deadline()))
        self.sessions.append(s)
        return s

    async def declare_queue(self, name: str, durable: bool = True,
                            arguments: dict[str, Any] | None = None) -> str:
        await self._ensure_connected()
        ok = await self._drive(self.declare_queue_g(name, durable, arguments,
                                                    self.rpc_deadline()))
        return ok.queue

    # -- listeners ---------------------------------------------------------------------
    def _add_listener(self, consumer: BaseConsumer) -> None:
        self._listener_consumers.append(consumer)
        if self._dispatch_task is None or self._dispatch_task.done():
            self._dispatch_task = self.loop.create_task(self._dispatch_loop())
        self._listener_event.set()

    def _wake_listeners(self, consumer: BaseConsumer) -> None:
        self._listener_event.set()

    async def _dispatch_loop(self) -> None:
        """The dispatch task (BaseConnection.dispatch_loop_g)."""
        try:
            await self._drive(self.dispatch_loop_g(self._listener_consumers))
        except ClientError:
            pass


class AsyncSession(BaseSession):
    conn: AsyncConnection

    async def producer(self, destination: str | Destination) -> AsyncProducer:
        self.check()
        p = AsyncProducer(self, self._destination(destination))
        await self.conn._drive(p.prepare_g(self.conn.rpc_deadline()))
        return p

    async def consumer(self, destination: str | Destination,
                       listener: Callable[[Message], Any] | None = None,
                       redelivery_policy: RedeliveryPolicy | None = None) -> AsyncConsumer:
        """`listener` may be a plain function or a coroutine function."""
        await self.conn._ensure_connected()
        self.check()
        c = AsyncConsumer(self, self._destination(destination), listener, redelivery_policy)
        await self.conn._drive(c.subscribe_g(self.conn.rpc_deadline()))
        self._all_consumers.append(c)
        if listener is not None:
            self.conn._add_listener(c)
        return c

    async def commit(self) -> None:
        await self.conn._ensure_connected()
        await self.conn._drive(self.commit_g(self.conn.rpc_deadline()))

    async def rollback(self) -> None:
        await self.conn._ensure_connected()
        await self.conn._drive(self.rollback_g(self.conn.rpc_deadline()))

    async def recover(self) -> None:
        """JMS Session.recover() (see the sync Session.recover)."""
        await self.conn._drive(self.recover_g(self.conn.rpc_deadline()))

    def acknowledge(self) -> None:
        BaseSession.acknowledge(self)
        self.conn._flush()

    async def close(self) -> None:
        if self.conn.core.error is not None:
            self.closed = True
            return
        await self.conn._drive(self.close_g(self.conn.rpc_deadline()))

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncProducer(BaseProducer):
    session: AsyncSession

    async def send(self, body: bytes | str | OutboundMessage,
                   headers: dict[str, Any] | None = None, *, persistent: bool = True,
                   message_id: str | None = None, timeout: float | None = None,
                   **props: Any) -> None:
        """Publish and wait for the confirm (NackError, ReturnedError, ConfirmTimeout)."""
        conn = self.session.conn
        await conn._ensure_connected()
        msg = self.build(body, headers, persistent, message_id, props)
        deadline = deadline_in(timeout) if timeout is not None else conn.rpc_deadline()
        await conn._drive(self.send_g(msg, deadline))

    async def send_batch(self, messages: Sequence[BatchItem],
                         timeout: float | None = None) -> None:
        conn = self.session.conn
        await conn._ensure_connected()
        msgs = [self.build(item[0], item[1], True, None, {}) if isinstance(item, tuple)
                else self.build(item, None, True, None, {}) for item in messages]
        deadline = deadline_in(timeout) if timeout is not None else conn.rpc_deadline()
        await conn._drive(self.send_batch_g(msgs, deadline))

    def publish(self, body: bytes | str | OutboundMessage,
                headers: dict[str, Any] | None = None, *, persistent: bool = True,
                message_id: str | None = None, **props: Any) -> asyncio.Future[None]:
        """Publish without waiting; the asyncio Future resolves on the confirm. Nacked
        and returned messages also go to take_failed() for re-publishing."""
        conn = self.session.conn
        msg = self.build(body, headers, persistent, message_id, props)
        fut = self.publish_now(msg, self.failed)
        self.track_seq()
        conn._deferred += len(msg.body) + 64
        if conn._deferred >= 65536:  # a tight publish() loop: stream, do not hoard
            conn._flush()
        else:
            conn._flush_soon()
        return fut

    async def wait_for_confirms(self, timeout: float | None = None) -> None:
        conn = self.session.conn
        conn._flush()
        deadline = deadline_in(timeout) if timeout is not None else conn.rpc_deadline()
        await conn._drive(self.wait_for_confirms_g(deadline))


class AsyncConsumer(BaseConsumer):
    session: AsyncSession

    async def receive(self, timeout: float | None = None) -> Message | None:
        self._begin_receive()
        conn = self.session.conn
        deadline = deadline_in(timeout)
        while True:
            try:
                await conn._ensure_connected()
                m = await conn._drive(self.next_g(deadline))
                if m is not None:
                    self.delivered(m)
                elif self.lazy:
                    self.flush_lazy_acks()
                conn._flush()
                return m
            except ConnectionLost:
                if not conn.options.reconnect or conn.closed or (
                        deadline is not None and time.monotonic() >= deadline):
                    raise

    def _acknowledge_message(self, m: Message) -> None:
        self.acknowledge_message(m)
        self.session.conn._flush()

    def acknowledge(self) -> None:
        self.acknowledge_own()
        self.session.conn._flush()

    async def close(self) -> None:
        conn = self.session.conn
        if conn.core.error is not None:
            self.closed = True
            return
        await conn._drive(self.cancel_g(conn.rpc_deadline()))

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Message:
        m = await self.receive()
        if m is None:
            raise StopAsyncIteration
        return m


async def connect_async(url: str = "amqp://guest:guest@127.0.0.1:5672/",
                        **options: Any) -> AsyncConnection:
    """Open a connection from asyncio code: `async with await connect_async(url) as c:`."""
    conn = AsyncConnection(parse_url(url, **options))
    await conn._open()
    return conn


__all__ = ["AsyncConnection", "AsyncConsumer", "AsyncProducer", "AsyncSession",
           "ConfirmTimeout", "connect_async"]
