"""A queue's ready messages, in seq order, with requeue at the original position (D6).

New messages arrive with growing seqs and go to the tail of a deque; requeued ones go to
a heap. The next message is the smaller head of the two, so a requeued message is served
before anything published after it: O(1) publish and consume, O(log n) requeue.
With `x-max-priority` there is one such pair per priority level, highest first.

Deep queues: past `hot_max` entries, or past HOT_FLOOR entries once the broker's
`HotBudget` (ready messages in memory, all queues together) is used up, new messages go
to the spill (one record each on disk) and the deque's cold tail is just their 8-byte
locations; they are read back in batches as the head drains. Memory per queued message
stays small at any depth, and in all stays bounded however many queues there are.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Iterator
from itertools import chain, islice
from typing import Any, Final

from ackmq.broker.paging import decode_entry, encode_entry
from ackmq.broker.queue_type import QueueEntry

REFILL: Final = 512  # entries read back from the spill at a time
STORED: Final = 1 << 63  # a cold-tail value with this bit is a seq in the durable store, not a spill
HOT_FLOOR: Final = REFILL  # what a queue keeps in memory even when the budget is used up
ENTRY_COST: Final = 256  # bytes an in-memory entry costs beyond its body (objects, deque slot)
# the defaults of --queue-hot-messages and --queue-memory-mb (server.config.Config)
QUEUE_HOT_MESSAGES: Final = 65536  # ready messages one queue keeps in memory, at most
QUEUE_MEMORY_MB: Final = 256       # ready messages in memory, all queues together


class HotBudget:
    """Bytes of ready messages held in memory by every queue of a broker. Past `limit`,
    queues page new messages to the spill: a burst into many queues stays in memory
    while it fits, and memory stays bounded however many deep queues there are."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class _Level:
    __slots__ = ("fresh", "back", "cold", "cold_pos")

    def __init__(self) -> None:
        self.fresh: deque[QueueEntry] = deque()
        self.back: list[QueueEntry] = []
        self.cold = array("Q")  # spill locations, after everything in `fresh`
        self.cold_pos = 0

    def __len__(self) -> int:
        return len(self.fresh) + len(self.back) + len(self.cold) - self.cold_pos

    def peek(self) -> QueueEntry | None:
        fresh, back = self.fresh, self.back
        if back:
            if fresh and fresh[0].seq < back[0].seq:
                return fresh[0]
            return back[0]
        return fresh[0] if fresh else None

    def pop(self) -> QueueEntry:
        fresh, back = self.fresh, self.back
        if back and (not fresh or back[0].seq < fresh[0].seq):
            return heapq.heappop(back)
        return fresh.popleft()


class ReadyList:
    __slots__ = ("_levels", "_count", "bytes", "spill", "owner", "hot_max", "budget")

    def __init__(self, max_priority: int = 0, spill: Any = None, owner: Any = None,
                 hot_max: int = QUEUE_HOT_MESSAGES, budget: HotBudget | None = None) -> None:
        self._levels = [_Level() for _ in range(max_priority + 1)]
        self._count = 0
        self.bytes = 0  # body bytes of every ready message, in memory or spilled
        self.spill = spill
        self.owner = owner
        self.hot_max = hot_max
        self.budget = budget if budget is not None else HotBudget(1 << 62)

    @property
    def spilled(self) -> int:
        return sum(len(lv.cold) - lv.cold_pos for lv in self._levels)

    def _refill(self, level: _Level) -> None:
        """The hot head ran dry: read the next batch back from the spill."""
        cold, spill, owner = level.cold, self.spill, self.owner
        end = min(len(cold), level.cold_pos + REFILL)
        locs = cold[level.cold_pos:end].tolist()
        before = len(level.fresh)
        if locs[0] & STORED or locs[-1] & STORED:
            for loc in locs:
                if loc & STORED:  # recovered after a restart, never spilled
                    entry = owner.load_stored(loc & ~STORED)
                    self.bytes += entry.size
                else:
                    entry = decode_entry(spill.get(loc), owner)
                    spill.release(loc)
                level.fresh.append(entry)
        else:
            for loc, rec in zip(locs, spill.get_many(locs), strict=True):
                entry = decode_entry(rec, owner)
                spill.release(loc)
                level.fresh.append(entry)
        self.budget.used += sum(e.size for e in islice(level.fresh, before, None)) \
            + ENTRY_COST * (len(level.fresh) - before)
        level.cold_pos = end
        if end == len(cold):
            del cold[:]
            level.cold_pos = 0
        elif end > 65536:
            del cold[:end]
            level.cold_pos = 0

    def __len__(self) -> int:
        return self._count

    def _level(self, entry: QueueEntry) -> _Level:
        levels = self._levels
        if len(levels) == 1:
            return levels[0]
        return levels[min(entry.priority, len(levels) - 1)]

    def append(self, entry: QueueEntry) -> None:
        level = self._level(entry)
        self._count += 1
        self.bytes += entry.size
        budget = self.budget
        if self.spill is not None and (
                len(level.cold) or len(level.fresh) >= self.hot_max
                or (budget.used > budget.limit and len(level.fresh) >= HOT_FLOOR)):
            try:
                level.cold.append(self.spill.put(encode_entry(entry)))
                return
            except OSError:
                # the spill cannot take it: keep it in memory, after the spilled ones
                heapq.heappush(level.back, entry)
                budget.used += entry.size + ENTRY_COST
                return
        level.fresh.append(entry)
        budget.used += entry.size + ENTRY_COST

    def append_stored(self, seq: int) -> None:
        """A recovered message left in the store: 8 bytes here until it is needed
        (its size joins `bytes` when it is read back)."""
        self._levels[0].cold.append(seq | STORED)
        self._count += 1

    def requeue(self, entry: QueueEntry) -> None:
        heapq.heappush(self._level(entry).back, entry)
        self._count += 1
        self.bytes += entry.size
        self.budget.used += entry.size + ENTRY_COST

    def peek(self) -> QueueEntry | None:
        for level in reversed(self._levels):
            if level:
                if not level.fresh and len(level.cold) > level.cold_pos:
                    self._refill(level)
                return level.peek()
        return None

    def pop(self) -> QueueEntry:
        for level in reversed(self._levels):
            if level:
                if not level.fresh and len(level.cold) > level.cold_pos:
                    self._refill(level)
                return self._left(level.pop())
        raise IndexError("pop from an empty ReadyList")

    def pop_oldest(self) -> QueueEntry:
        """The head for x-max-length drop-head: oldest of the lowest priority, as RabbitMQ."""
        for level in self._levels:
            if level:
                if not level.fresh and len(level.cold) > level.cold_pos:
                    self._refill(level)
                return self._left(level.pop())
        raise IndexError("pop from an empty ReadyList")

    def _left(self, entry: QueueEntry) -> QueueEntry:
        """`entry` left memory (and the list)."""
        self._count -= 1
        self.bytes -= entry.size
        self.budget.used -= entry.size + ENTRY_COST
        return entry

    def clear(self) -> list[QueueEntry]:
        """Empty the list; spilled entries come back without their message (seq, flags)."""
        out = list(self)
        for e in out:
            self._left(e)
        for level in self._levels:
            for i in range(level.cold_pos, len(level.cold)):
                loc = level.cold[i]
                self._count -= 1
                if loc & STORED:
                    e = QueueEntry(None, loc & ~STORED, self.owner)
                    e.persisted = True
                else:
                    e = decode_entry(self.spill.get(loc), self.owner, with_message=False)
                    self.spill.release(loc)
                    self.bytes -= e.size
                out.append(e)
            del level.cold[:]
            level.cold_pos = 0
            level.fresh.clear()
            level.back.clear()
        return out

    def page_out(self) -> int:
        """Memory alarm (U5): send every level's in-memory tail to the spill, in front of
        what is spilled already, as RabbitMQ pages queues out to clear the alarm. Order
        is kept (the fresh deque comes before the cold tail); requeued entries (`back`)
        stay. Returns how many entries moved."""
        if self.spill is None:
            return 0
        moved = 0
        for level in self._levels:
            fresh = level.fresh
            if not fresh:
                continue
            locs = array("Q")
            try:
                for entry in fresh:
                    locs.append(self.spill.put(encode_entry(entry)))
            except OSError:  # the spill cannot take them: keep them in memory
                for loc in locs:
                    self.spill.release(loc)
                continue
            self.budget.used -= sum(e.size for e in fresh) + ENTRY_COST * len(fresh)
            moved += len(fresh)
            fresh.clear()
            level.cold = locs + level.cold[level.cold_pos:]
            level.cold_pos = 0
        return moved

    def discard(self) -> None:
        """Forget everything without reading the spill back (queue deleted)."""
        for level in self._levels:
            self.budget.used -= sum(e.size + ENTRY_COST for e in (*level.fresh, *level.back))
            for i in range(level.cold_pos, len(level.cold)):
                if not level.cold[i] & STORED:
                    self.spill.release(level.cold[i])
            del level.cold[:]
            level.cold_pos = 0
            level.fresh.clear()
            level.back.clear()
        self._count = 0
        self.bytes = 0

    def browse(self, offset: int, count: int) -> list[QueueEntry]:
        """Entries `offset` .. `offset + count` in the order they would be delivered,
        spilled and stored ones included, without changing anything (V3 peek): a spilled
        record is read and not released, a stored one read back without being kept.
        Only the window is read, except in a level with requeued entries, where the
        spilled records before the window are read for their seqs (the merge order)."""
        out: list[QueueEntry | int] = []
        for level in reversed(self._levels):
            if len(out) >= count:
                break
            n = len(level)
            if offset >= n:
                offset -= n
                continue
            want = count - len(out)
            if level.back:
                out.extend(e for _seq, e in islice(self._browse_level(level), offset,
                                                    offset + want))
            else:
                out.extend(self._browse_plain(level, offset, want))
            offset = 0
        return [e if isinstance(e, QueueEntry) else self.owner.load_stored(e, keep=True)
                for e in out]

    def _browse_plain(self, level: _Level, offset: int, want: int
                      ) -> list[QueueEntry | int]:
        """A level without requeued entries: `fresh` then the cold tail, by index."""
        fresh = level.fresh
        got: list[QueueEntry | int] = list(islice(fresh, offset, offset + want))
        start = level.cold_pos + max(0, offset - len(fresh))
        for i in range(start, min(len(level.cold), start + want - len(got))):
            loc = level.cold[i]
            got.append(loc & ~STORED if loc & STORED
                       else decode_entry(self.spill.get(loc), self.owner))
        return got

    def _browse_level(self, level: _Level) -> Iterator[tuple[int, QueueEntry | int]]:
        """(seq, entry or stored seq) of one level in delivery order: `fresh` then the
        cold tail (both in seq order), merged by seq with the requeued heap."""
        ordered = chain(((e.seq, e) for e in level.fresh), self._browse_cold(level))
        if not level.back:
            return ordered
        back = ((e.seq, e) for e in sorted(level.back))
        return heapq.merge(ordered, back, key=lambda p: p[0])

    def _browse_cold(self, level: _Level) -> Iterator[tuple[int, QueueEntry | int]]:
        for i in range(level.cold_pos, len(level.cold)):
            loc = level.cold[i]
            if loc & STORED:
                yield loc & ~STORED, loc & ~STORED
            else:
                e = decode_entry(self.spill.get(loc), self.owner)
                yield e.seq, e

    def __iter__(self) -> Iterator[QueueEntry]:
        """Entries held in memory (not the spilled tail), in seq order per level."""
        for level in reversed(self._levels):
            yield from sorted([*level.fresh, *level.back], key=lambda e: e.seq)
