"""Channels at the frame level, on the same asyncio connection and parser as the
sessions: for load generators (`ackmq bench`) and connectors that pipeline pre-encoded
publishes and want confirms and deliveries as plain values, with no object, future or
task per message.

    conn = await open_connection(url, connection_name="loader")
    ch = await conn.channel()
    await ch.confirm_select()
    ch.on_confirm = lambda tag, multiple, ack: ...   # called from data_received
    ch.on_deliver = lambda tag, redelivered, body: conn.queue(ch.ack_bytes(tag))
    conn.write(ch.publish_bytes("", "q", b"x") * 256)
    if conn.paused: await conn.drain()
    conn.on_blocked = lambda blocked, reason: ...      # connection.blocked/unblocked
    error = await ch.wait_closed(2.0)   # ChannelClosed / ConnectionLost, None if open

Callbacks run on the I/O path: bookkeeping only, never a blocking call (J10).
Bytes handed to `queue()` go out with the replies of the same read, in one write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pamqp import commands as C

from ackmq.protocol.amqp import Content, encode_ack, encode_publish
from ackmq.protocol.amqp.events import DecodedDeliver
from ackmq.protocol.amqp.properties import FLAGS

from .aio import AsyncConnection
from .core import Chan, RawConfirm, RawDeliver
from .errors import ClientError
from .options import parse_url

_REPLIES: dict[type, tuple[type, ...]] = {}


def _replies(method: Any) -> tuple[type, ...]:
    """The reply classes of a synchronous method (pamqp names them as strings)."""
    kind = type(method)
    found = _REPLIES.get(kind)
    if found is None:
        names = getattr(kind, "valid_responses", None) or []
        found = tuple(getattr(getattr(C, n.split(".")[0]), n.split(".")[1]) for n in names)
        _REPLIES[kind] = found
    return found


_DELIVERY_MODE_ONLY = FLAGS["delivery_mode"].to_bytes(2, "big")


def delivery_mode_properties(delivery_mode: int) -> bytes:
    """Raw content-header properties carrying only delivery-mode."""
    return _DELIVERY_MODE_ONLY + bytes((delivery_mode,))


class _Listener:
    """A raw channel's ChannelListener (core.py): the rare paths the fast parser hands
    on, and the channel's end for wait_closed."""

    def __init__(self, chan: Chan, closed: asyncio.Future[None]) -> None:
        self.chan = chan
        self.closed = closed

    def on_deliver(self, content: Content[DecodedDeliver]) -> None:
        """A basic.deliver that came through the general decoder: to the raw hook too."""
        hook = self.chan.raw_deliver
        if hook is not None:
            m = content.method
            hook(m.delivery_tag, m.redelivered, content.body)

    def on_cancel(self, consumer_tag: str) -> None:
        """basic.cancel from the broker: nothing to do at this level."""

    def on_failed(self, error: ClientError) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class RawChannel:
    """One AMQP channel driven by hand. `on_confirm(tag, multiple, ack)` and
    `on_deliver(tag, redelivered, body)` are the hot callbacks; everything else is an
    awaited RPC."""

    def __init__(self, conn: RawConnection, chan: Chan) -> None:
        self.conn = conn
        self.chan = chan
        self.number = chan.number
        self._closed: asyncio.Future[None] = conn.loop.create_future()
        chan.listener = _Listener(chan, self._closed)

    async def wait_closed(self, timeout: float | None = None) -> ClientError | None:
        """Wait for the end of this channel: the broker's channel.close (ChannelClosed)
        or connection.close, or the socket's end (ConnectionLost); code, text,
        class_id and method_id are the broker's. None if still open after `timeout` s."""
        if self.chan.error is None:
            try:  # (asyncio.timeout: 3.11's wait_for may drop a cancel, see `wait`)
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self._closed)
            except TimeoutError:
                pass
        return self.chan.error

    @property
    def on_confirm(self) -> RawConfirm | None:
        return self.chan.raw_confirm

    @on_confirm.setter
    def on_confirm(self, fn: RawConfirm | None) -> None:
        self.chan.raw_confirm = fn

    @property
    def on_deliver(self) -> RawDeliver | None:
        return self.chan.raw_deliver

    @on_deliver.setter
    def on_deliver(self, fn: RawDeliver | None) -> None:
        self.chan.raw_deliver = fn

    async def call(self, method: Any) -> Any:
        """A synchronous method; returns its reply (raises ChannelClosed with the
        broker's code and text, or ConnectionLost)."""
        fut = self.chan.rpc(method, _replies(method))
        self.conn._flush()
        return await self.conn.wait(fut)

    def send(self, method: Any) -> None:
        """A method without a reply (queued; out with the next write)."""
        self.chan.send(method)
        self.conn._flush_soon()

    def publish_bytes(self, exchange: str, routing_key: str, body: bytes,
                      delivery_mode: int = 1, mandatory: bool = False) -> bytes:
        """basic.publish + header + body for this channel, to write (or multiply) later."""
        return encode_publish(self.number, exchange, routing_key, mandatory, False,
                              delivery_mode_properties(delivery_mode), body,
                              self.conn.frame_max)

    def ack_bytes(self, tag: int, multiple: bool = False) -> bytes:
        return encode_ack(self.number, tag, multiple)

    async def confirm_select(self) -> None:
        await self.call(C.Confirm.Select())

    async def tx_select(self) -> None:
        await self.call(C.Tx.Select())

    async def declare_queue(self, name: str, durable: bool = False,
                            arguments: dict[str, Any] | None = None) -> int:
        """queue.declare; returns the queue's message count."""
        ok = await self.call(C.Queue.Declare(queue=name, durable=durable, arguments=arguments))
        return ok.message_count

    async def queue_count(self, name: str) -> int:
        ok = await self.call(C.Queue.Declare(queue=name, passive=True))
        return ok.message_count

    async def qos(self, prefetch: int) -> None:
        await self.call(C.Basic.Qos(prefetch_count=prefetch))

    async def consume(self, queue: str, no_ack: bool = False) -> str:
        ok = await self.call(C.Basic.Consume(queue=queue, no_ack=no_ack))
        return ok.consumer_tag

    async def cancel(self, consumer_tag: str) -> None:
        await self.call(C.Basic.Cancel(consumer_tag=consumer_tag))

    async def close(self) -> None:
        if self.chan.error is None:
            fut = self.conn.core.close_channel(self.chan)
            self.conn._flush()
            await self.conn.wait(fut)


class RawConnection(AsyncConnection):
    """An AsyncConnection that also hands out RawChannels and takes pre-encoded bytes."""

    async def channel(self) -> RawChannel:
        await self._ensure_connected()
        chan, fut = self.core.open_channel()
        self._flush()
        await self.wait(fut)
        chan.open = True
        return RawChannel(self, chan)

    async def wait(self, fut: Any) -> Any:
        """A core future's value, within the RPC timeout (jms.sendTimeout). A lost
        connection or closed channel settles the future with the error (Core.lost,
        Chan.fail), so awaiting it alone cannot hang past the timeout."""
        if not fut.done():
            async with asyncio.timeout(self.options.send_timeout / 1000.0):  # (aio._open)
                await fut
        return fut.result()

    @property
    def frame_max(self) -> int:
        return self.core.frame_max

    @property
    def blocked(self) -> bool:
        """True between connection.blocked and connection.unblocked (U5)."""
        return self.core.blocked

    @property
    def on_blocked(self) -> Callable[[bool, str], None] | None:
        """Called with (True, reason) on connection.blocked, (False, "") on unblocked,
        from data_received (bookkeeping only)."""
        return self.core.on_blocked

    @on_blocked.setter
    def on_blocked(self, fn: Callable[[bool, str], None] | None) -> None:
        self.core.on_blocked = fn

    @property
    def paused(self) -> bool:
        """True while the transport's send buffer is full: `await drain()` before more."""
        return self._write_paused

    def write(self, data: bytes) -> None:
        """Bytes now, after anything already queued (keeps frame order)."""
        core = self.core
        if core.error is not None:
            raise core.error
        core.out.append(data)
        self._flush()

    def queue(self, data: bytes) -> None:
        """Bytes with the next write (acks from on_deliver go out once per read)."""
        self.core.out.append(data)


async def open_connection(url: str, connection_name: str | None = None,
                          heartbeat: int = 0, **options: Any) -> RawConnection:
    """A RawConnection (heartbeats off by default: a load generator reads all the time)."""
    conn = RawConnection(parse_url(url, connection_name=connection_name, heartbeat=heartbeat,
                                   **options))
    await conn._open()
    return conn


__all__ = ["RawChannel", "RawConnection", "delivery_mode_properties", "open_connection"]
