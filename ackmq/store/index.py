"""Per-queue in-memory index: seq -> position of the ADD record on disk.

Two parallel `array('Q')` in seq order (16 bytes per message, plus slack for removed
entries until the next compaction of the arrays) instead of a dict (~100 bytes per
message): deep queues of millions of messages are the point of paging bodies to disk.
Adds arrive in seq order per queue (the broker's seqs only grow), so insertion is an
append; lookups are a C-level bisect starting at the first live slot.

A position packs `segment id << 32 | offset`. 0 means removed; PENDING means buffered
or being written (the writer fills the position in once the record is on disk).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import compress

PENDING = 1 << 63
DEAD = 0


class QueueIndex:
    __slots__ = ("seqs", "locs", "head", "live")

    def __init__(self) -> None:
        self.seqs = array("Q")
        self.locs = array("Q")
        self.head = 0   # every slot before head is dead
        self.live = 0

    def __len__(self) -> int:
        return self.live

    def _find(self, seq: int) -> int:
        seqs = self.seqs
        # the usual two first, without a bisect: the newest entry (the writer placing a
        # lone message it just wrote) and the oldest live one (acks in FIFO order)
        n = len(seqs)
        head = self.head
        if head < n:
            if seqs[n - 1] == seq:
                return n - 1
            if seqs[head] == seq:
                return head
        i = bisect_left(seqs, seq, head)
        if i < len(seqs) and seqs[i] == seq:
            return i
        return -1

    def insert(self, seq: int, loc: int) -> None:
        seqs = self.seqs
        if not seqs or seq > seqs[-1]:
            seqs.append(seq)
            self.locs.append(loc)
            self.live += 1
            return
        i = bisect_left(seqs, seq)
        if i < len(seqs) and seqs[i] == seq:
            if self.locs[i] == DEAD:
                self.live += 1
            self.locs[i] = loc
        else:
            seqs.insert(i, seq)
            self.locs.insert(i, loc)
            self.live += 1
        if i < self.head:
            self.head = i

    def get(self, seq: int) -> int:
        i = self._find(seq)
        return self.locs[i] if i >= 0 else DEAD

    def replace(self, seq: int, old: int, new: int) -> bool:
        """Set the position to `new` if it is still `old` (not removed meanwhile)."""
        i = self._find(seq)
        if i >= 0 and self.locs[i] == old:
            self.locs[i] = new
            return True
        return False

    def pop(self, seq: int) -> int:
        """Mark removed; returns the old position (DEAD when unknown)."""
        i = self._find(seq)
        if i < 0:
            return DEAD
        locs = self.locs
        old = locs[i]
        if old == DEAD:
            return DEAD
        locs[i] = DEAD
        self.live -= 1
        if i == self.head:
            n = len(locs)
            h = i + 1
            while h < n and locs[h] == DEAD:
                h += 1
            self.head = h
        self._maybe_shrink()
        return old

    def _maybe_shrink(self) -> None:
        n = len(self.seqs)
        dead = n - self.live
        if dead <= 1024 or dead <= self.live:
            return
        if dead == self.head:  # FIFO consumption: all dead slots are at the front
            del self.seqs[:self.head]
            del self.locs[:self.head]
        else:
            self.seqs = array("Q", compress(self.seqs, self.locs))
            self.locs = array("Q", (x for x in self.locs if x != DEAD))
        self.head = 0

    def items(self) -> Iterator[tuple[int, int]]:
        """(seq, position) of live entries, in seq order."""
        for s, loc in zip(self.seqs[self.head:], self.locs[self.head:], strict=True):
            if loc != DEAD:
                yield s, loc

    def nbytes(self) -> int:
        return self.seqs.buffer_info()[1] * 8 + self.locs.buffer_info()[1] * 8
