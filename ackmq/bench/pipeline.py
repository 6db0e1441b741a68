"""Pipelined publishing with asynchronous confirm tracking (SPEC J10's third strategy)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from ackmq.broker.confirms import take_settled
from ackmq.client.lowlevel import RawChannel, RawConnection

CHUNK = 256  # messages per socket write


class OutstandingConfirms:
    """Sorted map of unconfirmed publish sequence numbers, as the Java tutorial's
    ConcurrentSkipListMap: `multiple` settles every number up to the tag.

    Sequence numbers are issued in increasing order, so an OrderedDict is sorted by
    construction and settling a prefix pops from the front in O(settled).
    """

    def __init__(self) -> None:
        self.pending: OrderedDict[int, object] = OrderedDict()
        self.next_seq = 1
        self.acked = 0
        self.nacked: list[object] = []   # handed back to the publishing side, never re-sent here
        self._waiter: asyncio.Future[None] | None = None
        self.on_settle: Callable[[int, object, bool], None] | None = None

    def add(self, payload: object = None) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.pending[seq] = payload
        return seq

    def settle(self, tag: int, multiple: bool, ack: bool) -> None:
        """The confirm callback: runs on the I/O path, so it only does bookkeeping."""
        pending = self.pending
        for seq, payload in take_settled(pending, tag, multiple):
            if ack:
                self.acked += 1
            else:
                self.nacked.append(payload)
            if self.on_settle is not None:
                self.on_settle(seq, payload, ack)
        if not pending and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_all(self, timeout: float = 600.0) -> None:
        if not self.pending:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(self._waiter, timeout)


async def confirming_channel(conn: RawConnection, queue: str
                             ) -> tuple[RawChannel, OutstandingConfirms]:
    """A channel in confirm mode whose confirms settle the returned tracker; `queue`
    declared durable."""
    ch = await conn.channel()
    await ch.declare_queue(queue, durable=True)
    await ch.confirm_select()
    oc = OutstandingConfirms()
    ch.on_confirm = oc.settle
    return ch, oc


async def publish_pipelined(ch: RawChannel, queue: str, n: int, body: bytes, delivery_mode: int,
                            exchange: str = "", confirms: OutstandingConfirms | None = None) -> None:
    """Publish n copies of body as fast as TCP lets us, tracking confirms if given.

    Nacked messages are re-published by this (publishing) side after the first pass,
    until every message is acked.
    """
    conn = ch.conn
    one = ch.publish_bytes(exchange, queue, body, delivery_mode)
    todo = n
    while todo:
        sent = 0
        while sent < todo:
            k = min(CHUNK, todo - sent)
            if confirms is not None:
                for _ in range(k):
                    confirms.add(None)
            conn.write(one * k)
            sent += k
            if conn.paused:
                await conn.drain()
            else:
                await asyncio.sleep(0)  # let confirms in
        if confirms is None:
            return
        await confirms.wait_all()
        todo = len(confirms.nacked)
        confirms.nacked.clear()
