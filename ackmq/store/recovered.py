"""A recovered queue's messages as the store hands them to the broker (the
`QueuedMessages` of ackmq.broker.storage), read lazily from the store's index."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator

from .index import QueueIndex


class RecoveredQueue:
    """The messages of one durable queue found by `open()`, without a Python object per
    message: a view of the store's per-queue index (two `array('Q')`, 16 bytes/message)
    plus a dict of delivery counts holding only messages delivered at least once.

    `len()` is the number of messages found at open. Iterating yields
    `(seq, location, delivery_count)` in seq order; `location` is `(qid << 64) | seq`,
    the handle `add` returns (valid across compaction: read the message with
    `Store.read_message`). Iteration reads the live index in chunks (under the store's
    lock), so it may run lazily while the store is in use: a message removed before its
    chunk is read is skipped, messages added after `open()` are never yielded.
    """

    __slots__ = ("qid", "_index", "_counts", "_lock", "_end", "_len")
    CHUNK = 4096

    def __init__(self, qid: int, index: QueueIndex, counts: dict[int, int],
                 lock: threading.Lock) -> None:
        self.qid = qid
        self._index = index
        self._counts = counts      # seq -> delivery count, only for counts > 0
        self._lock = lock
        self._end = index.seqs[-1] + 1 if len(index.seqs) else 0  # first seq after open
        self._len = len(index)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        top = self.qid << 64
        nxt = 0
        while True:
            with self._lock:  # the index arrays may be shrunk or replaced meanwhile
                idx = self._index
                start = bisect_left(idx.seqs, nxt, idx.head)
                stop = min(start + self.CHUNK, bisect_left(idx.seqs, self._end, start))
                seqs = idx.seqs[start:stop]
                locs = idx.locs[start:stop]
            if not seqs:
                return
            counts = self._counts
            for seq, loc in zip(seqs, locs, strict=True):
                if loc:  # 0: removed
                    yield seq, top | seq, counts.get(seq, 0)
            nxt = seqs[-1] + 1
