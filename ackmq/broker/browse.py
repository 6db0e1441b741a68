"""Browsing a queue without consuming it (V3 peek, JMS's QueueBrowser): a read-only
window over a queue's ready messages, in the order they would be delivered (spilled and
stored ones included), or over its unacked deliveries, across the channels that hold
them. Nothing moves: no redelivered flag, no delivery count, no reorder, no counter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackmq.broker.queue_type import Queue, QueueEntry

READY, UNACKED = "ready", "unacked"
STATES = (READY, UNACKED)


def entries(q: Queue, state: str, offset: int, count: int,
            channels: Iterable[Any] = ()) -> list[QueueEntry]:
    """`count` entries from `offset`. Ready: the queue type's own `browse` (a stream:
    `offset` is the stream offset). Unacked: the deliveries of `channels` (every
    open `ChannelModel`) from this queue, in seq order."""
    if state == READY:
        return q.browse(offset, count)
    held = sorted((d.entry for ch in channels for d in list(ch.unacked.values())
                   if d.entry.queue is q), key=lambda e: e.seq)
    return held[offset:offset + count]
