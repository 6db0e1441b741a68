"""Reading a stream queue over AMQP 0-9-1: offset probes and offset-range reads (R4).

What an AMQP 0-9-1 client can learn of a stream (RabbitMQ 3.10, probed): a passive
`queue.declare` reports message_count 0 whatever the stream holds, so offsets come only
from deliveries: every one carries `x-stream-offset` (a signed long). A consumer from
`first` gets the oldest retained message, from `last` the last chunk (its last delivery
is the stream's last offset), from a timestamp the first chunk written at or after it.
Offsets are increasing but may have gaps. Consumers need `basic.qos` and manual acks
(acks only release prefetch room) and must never nack or reject (540 NOT_IMPLEMENTED
closes the connection): so this module uses ackmq.client's frame-level channel with its
own delivery listener, acking `multiple` every half prefetch and closing the channel when
done, instead of a session (whose close gives prefetched messages back with a reject).

Each call opens its own connection on its own event loop: the probes run in the
driver-side reader process, `read_range` in an executor's Python worker, and neither
keeps anything between Spark's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Iterator
from typing import Any

from pamqp import commands as C

from ackmq.client import ClientError
from ackmq.client.lowlevel import RawChannel, RawConnection, open_connection
from ackmq.spark.amqp import ConsumerError, describe, safe_url
from ackmq.spark.schema import properties_columns

OFFSET_HEADER = "x-stream-offset"
#: a probe ends when no delivery came for this long after the last one
SETTLE = 0.05
log = logging.getLogger("ackmq.spark.stream")


class NotAStream(ConsumerError):
    """The queue's deliveries carry no x-stream-offset: it is not a stream queue (or the
    broker does not support streams). Nothing was acked."""


class DataLossError(ConsumerError):
    """Offsets [start, end) of a planned range are no longer in the stream (retention
    removed them before they were read); `first` is its oldest message's offset now
    (None: it holds none)."""

    def __init__(self, stream: str, start: int, end: int, first: int | None,
                 planned: tuple[int, int]) -> None:
        self.stream, self.start, self.end, self.first = stream, start, end, first
        now = "it holds no message now" if first is None else \
            f"its oldest message is at offset {first} now"
        self.what = (f"data loss on stream {stream!r}: offsets [{start}, {end}) of the range "
                     f"[{planned[0]}, {planned[1]}) are no longer in the stream ({now}): "
                     "retention (x-max-length-bytes / x-max-age) removed them before they "
                     "were read")
        super().__init__(f"{self.what}. Set the source option failOnDataLoss=false to go on "
                         "from what the stream still holds.")


def data_loss(url: str, stream: str, start: int, end: int, seen: int | None) -> DataLossError | None:
    """Whether [start, end) lost its head: None when offset `start` may still be read.
    `seen` is the first offset a consumer from `start` got (None: not known). A stream's
    offsets have gaps (RabbitMQ's tracking chunks take offsets), so a consumer starting
    past `start` is a loss only when the stream's oldest message is past `start` too. A
    stream holding no message at all (RabbitMQ's retention can leave only a segment
    without messages) lost the whole range."""
    if seen is not None and seen <= start:
        return None
    first = first_offset(url, stream, 3.0)
    if first is not None and first <= start:
        return None
    if first is None:
        return DataLossError(stream, start, end, None, (start, end))
    upto = min(end, first if seen is None else min(seen, first))
    return DataLossError(stream, start, max(upto, start + 1), first, (start, end))


def report_loss(loss: DataLossError, fail: bool) -> None:
    """failOnDataLoss: raise the loss, or log it and go on."""
    if fail:
        raise loss
    log.warning("%s; failOnDataLoss=false: going on from offset %d", loss.what, loss.end)


class Delivered:
    """One delivery: its stream offset, the deliver method, raw properties and body."""

    __slots__ = ("offset", "method", "properties", "headers", "props", "body")

    def __init__(self, offset: int, method: Any, props: tuple[Any, ...],
                 headers: dict[str, Any], body: bytes) -> None:
        self.offset, self.method, self.props = offset, method, props
        self.headers, self.body = headers, body


class _Reader:
    """A channel's delivery listener: keeps deliveries with start <= offset < end, stops at
    the first offset >= end - 1, acks `multiple` every half prefetch (credit only)."""

    def __init__(self, conn: RawConnection, ch: RawChannel, start: int, end: int | None,
                 prefetch: int, stream: str) -> None:
        self.conn, self.ch, self.start, self.end = conn, ch, start, end
        self.stream = stream
        self.ack_every = max(1, prefetch // 2)
        self.unacked = 0
        # credit: a stream sends as many deliveries as it has prefetch room for, so past
        # the range's end a task would receive up to a whole prefetch window for nothing.
        # More room is granted (by acks) only while the range may still hold messages.
        self.granted = prefetch
        self.skipped = 0  # deliveries before `start` (a chunk's head)
        self.items: list[Delivered] = []
        self.done = False
        self.error: BaseException | None = None
        self.last_at = time.monotonic()
        self.seen = 0
        self.first_seen: int | None = None  # the offset of the first delivery
        self.waiter: asyncio.Future[None] | None = None
        self.want = 1

    # ChannelListener
    def on_deliver(self, content: Any) -> None:
        if self.done or self.error is not None:
            return
        m = content.method
        props, headers = properties_columns(content.properties)
        off = headers.get(OFFSET_HEADER) if headers else None
        if headers is None or isinstance(off, bool) or not isinstance(off, int):
            # a classic queue (or no stream support): never ack, the broker requeues
            self.error = NotAStream(
                f"queue {self.stream!r} is not a stream: its deliveries carry no "
                f"{OFFSET_HEADER} (declare it with x-queue-type=stream; does the broker "
                "support streams?)")
            self._wake()
            return
        self.seen += 1
        if self.first_seen is None:
            self.first_seen = off
        self.last_at = time.monotonic()
        self.unacked += 1
        end = self.end
        if off < self.start:
            self.skipped += 1
        if self.unacked >= self.ack_every and (
                end is None or self.granted < end - self.start + self.skipped):
            self.conn.queue(self.ch.ack_bytes(m.delivery_tag, True))
            self.granted += self.unacked
            self.unacked = 0
        if end is not None and off >= end:
            self.done = True
        elif off >= self.start:  # a broker may start at its chunk's first offset
            del headers[OFFSET_HEADER]
            self.items.append(Delivered(off, m, props, headers, content.body))
            if end is not None and off >= end - 1:
                self.done = True
        if self.done or len(self.items) >= self.want:
            self._wake()

    def on_cancel(self, consumer_tag: str) -> None:
        self.error = ConsumerError(f"the broker cancelled the consumer on stream "
                                   f"{self.stream!r} (deleted?)")
        self._wake()

    def on_failed(self, error: ClientError) -> None:
        self.error = error
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, want: int, timeout: float) -> None:
        """Until `want` items are held, the range is done, an error, or `timeout`."""
        self.want = want
        if self.done or self.error is not None or len(self.items) >= want:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.waiter, timeout)
        self.waiter = None

    def take(self) -> list[Delivered]:
        out, self.items = self.items, []
        return out


class _Session:
    """One connection + channel + consumer on a private event loop (sync facade)."""

    def __init__(self, url: str, stream: str) -> None:
        self.url, self.stream = url, stream
        self.loop = asyncio.new_event_loop()
        self.conn: RawConnection | None = None

    def run(self, coro: Any) -> Any:
        try:
            return self.loop.run_until_complete(coro)
        except ClientError as exc:
            raise ConsumerError(describe(exc, self.what())) from exc
        except OSError as exc:
            raise ConsumerError(f"{self.what()}: {exc!r} (is the broker running at that "
                                "address?)") from exc

    def what(self) -> str:
        return f"cannot read stream {self.stream!r} at {safe_url(self.url)}"

    def consume(self, offset: Any, start: int, end: int | None, prefetch: int) -> _Reader:
        async def go() -> _Reader:
            self.conn = await open_connection(self.url, connection_name="ackmq-spark-stream",
                                              connect_timeout=10.0)
            ch = await self.conn.channel()
            reader = _Reader(self.conn, ch, start, end, prefetch, self.stream)
            ch.chan.listener = reader
            await ch.call(C.Basic.Qos(prefetch_count=prefetch))
            await ch.call(C.Basic.Consume(queue=self.stream,
                                          arguments={OFFSET_HEADER: offset}))
            return reader
        return self.run(go())

    def close(self) -> None:
        conn = self.conn
        if conn is not None:
            # a stream consumer is never rejected to: just close (RabbitMQ drops the
            # unacked deliveries of a closed channel; a classic queue requeues them)
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(asyncio.wait_for(conn.close(), 5.0))
            with contextlib.suppress(Exception):
                conn.abort()
        self.loop.close()


def server_product(url: str) -> str:
    """The broker's `product` server property (RabbitMQ, ackmq): which broker answers."""
    s = _Session(url, "")

    async def go() -> str:
        s.conn = await open_connection(url, connection_name="ackmq-spark-stream",
                                       connect_timeout=10.0)
        p = s.conn.core.server_properties.get("product", "")
        return p.decode("utf-8", "replace") if isinstance(p, bytes) else str(p)
    try:
        return str(s.run(go()))
    finally:
        s.close()


def _offset_arg(where: str | int | dt.datetime) -> Any:
    return where


def probe(url: str, stream: str, where: str | int | dt.datetime, *, last: bool = False,
          timeout: float = 0.5) -> int | None:
    """The offset of the first delivery a consumer from `where` gets (or, with `last`,
    the highest offset delivered until deliveries pause for SETTLE), None if nothing
    came within `timeout` (an empty stream, or `where` past its end)."""
    s = _Session(url, stream)
    try:
        # one delivery answers `first` and a timestamp; `last` takes the last chunk
        reader = s.consume(_offset_arg(where), -(1 << 63), None, 2000 if last else 1)
        s.run(reader.wait(1, timeout))
        if reader.error is not None:
            raise reader.error
        if not reader.items:
            return None
        if not last:
            return reader.items[0].offset
        high = reader.items[-1].offset
        deadline = time.monotonic() + 0.25  # a live stream never pauses: any seen offset will do
        while time.monotonic() < deadline:
            reader.take()
            s.run(reader.wait(1 << 30, SETTLE))
            if reader.error is not None:
                raise reader.error
            if not reader.items:
                break
            high = reader.items[-1].offset
        return high
    finally:
        s.close()


def last_offset(url: str, stream: str, timeout: float = 0.5) -> int | None:
    """The stream's last offset (its last chunk, read from `last`), None when empty."""
    return probe(url, stream, "last", last=True, timeout=timeout)


def first_offset(url: str, stream: str, timeout: float = 0.5) -> int | None:
    """The oldest offset the stream retains, None when empty."""
    return probe(url, stream, "first", timeout=timeout)


def offset_at(url: str, stream: str, when: dt.datetime, timeout: float = 0.5) -> int | None:
    """The first offset of the first chunk written at or after `when` (seconds
    resolution, as AMQP timestamps), None if nothing was written since."""
    return probe(url, stream, when, timeout=timeout)


def read_range(url: str, stream: str, start: int, end: int, *, prefetch: int = 2000,
               rows: int = 4096, stall: float = 60.0,
               fail_on_data_loss: bool = True) -> Iterator[list[Delivered]]:
    """Deliveries with start <= offset < end, in offset order, `rows` at a time. Ends at
    the first offset >= end - 1 (offsets may have gaps; end - 1 is always one the driver
    saw). Fails if nothing arrives for `stall` seconds (stream deleted or truncated past
    the range). When retention removed the range's head before this read (the consumer
    starts past `start`, and so does the stream), raises DataLossError, or with
    `fail_on_data_loss` false logs a warning and yields what is left."""
    if end <= start:
        return
    s = _Session(url, stream)
    try:
        reader = s.consume(start, start, end, max(1, min(prefetch, end - start)))
        checked = False
        while True:
            s.run(reader.wait(rows, 1.0))
            if reader.error is not None:
                raise reader.error
            if not checked and reader.first_seen is not None:
                checked = True
                if reader.first_seen > start:
                    loss = data_loss(url, stream, start, end, reader.first_seen)
                    if loss is not None:
                        report_loss(loss, fail_on_data_loss)
            got = reader.take()
            if got:
                yield got
            if reader.done:
                return
            if time.monotonic() - reader.last_at > stall:
                raise ConsumerError(
                    f"{s.what()}: no delivery for {stall:.0f}s while reading offsets "
                    f"[{start}, {end}) ({reader.seen} received; stream deleted, or "
                    "truncated by retention past the range?)")
    finally:
        s.close()
