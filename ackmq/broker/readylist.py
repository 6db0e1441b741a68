"""A queue's ready messages, in seq order, with requeue at the original position (D6).

New messages arrive with growing seqs and go to the tail of a deque; requeued ones go to
a heap. The next message is the smaller head of the two, so a requeued message is served
before anything published after it: O(1) publish and consume, O(log n) requeue.
With `x-max-priority` there is one such pair per priority level, highest first.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from ackmq.broker.message import QueueEntry


class _Level:
    __slots__ = ("fresh", "back")

    def __init__(self) -> None:
        self.fresh: deque[QueueEntry] = deque()
        self.back: list[QueueEntry] = []

    def __len__(self) -> int:
        return len(self.fresh) + len(self.back)

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
    __slots__ = ("_levels", "_count", "bytes")

    def __init__(self, max_priority: int = 0) -> None:
        self._levels = [_Level() for _ in range(max_priority + 1)]
        self._count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self._count

    def _level(self, entry: QueueEntry) -> _Level:
        levels = self._levels
        if len(levels) == 1:
            return levels[0]
        return levels[min(entry.message.priority, len(levels) - 1)]

    def append(self, entry: QueueEntry) -> None:
        self._level(entry).fresh.append(entry)
        self._count += 1
        self.bytes += len(entry.message.body)

    def requeue(self, entry: QueueEntry) -> None:
        heapq.heappush(self._level(entry).back, entry)
        self._count += 1
        self.bytes += len(entry.message.body)

    def peek(self) -> QueueEntry | None:
        for level in reversed(self._levels):
            if level:
                return level.peek()
        return None

    def pop(self) -> QueueEntry:
        for level in reversed(self._levels):
            if level:
                entry = level.pop()
                self._count -= 1
                self.bytes -= len(entry.message.body)
                return entry
        raise IndexError("pop from an empty ReadyList")

    def pop_oldest(self) -> QueueEntry:
        """The head for x-max-length drop-head: oldest of the lowest priority, as RabbitMQ."""
        for level in self._levels:
            if level:
                entry = level.pop()
                self._count -= 1
                self.bytes -= len(entry.message.body)
                return entry
        raise IndexError("pop from an empty ReadyList")

    def clear(self) -> list[QueueEntry]:
        out = list(self)
        for level in self._levels:
            level.fresh.clear()
            level.back.clear()
        self._count = 0
        self.bytes = 0
        return out

    def __iter__(self) -> Iterator[QueueEntry]:
        for level in reversed(self._levels):
            yield from sorted([*level.fresh, *level.back], key=lambda e: e.seq)
