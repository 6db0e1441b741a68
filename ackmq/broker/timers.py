"""C5: one timer service for every deadline in the broker and its front ends.

Delayed and scheduled fire times, retry back-off, consumer timeouts, queue TTL and
x-expires, heartbeats, handshake and close timeouts are all `Deadline`s of one `Timers`:
a heap of (due, seq, deadline) entries, O(log n) to arm, O(1) to cancel (the entry is
marked dead and skipped when it reaches the top; the heap is rebuilt when dead entries
outnumber live ones). Nothing runs per deadline until it is due: no task, no thread.

The service is plain Python and never waits. Whoever owns time drives it: the server
keeps one loop timer at `soonest()` (told through `wake` when the soonest gets earlier)
and calls `run()` when it fires (server/timers.py); a test drives it with a fake clock.
A `Deadline` is one re-armable slot ("fire `fn` at `due`"): the "re-arm only if earlier,
cancel, fire" that each timer user used to spell out is `arm_by` here, once.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable

log = logging.getLogger("ackmq.timers")


class Timers:
    """Every armed deadline, soonest first."""

    __slots__ = ("_heap", "_armed", "_n", "now", "wake", "_woken")

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._heap: list[tuple[float, int]] = []  # (due, seq); a seq not in _armed is dead
        self._armed: dict[int, Deadline] = {}
        self._n = 0  # seq: equal due times fire in the order they were armed
        self.now = now
        # the driver's hook: called with the new soonest due time when it gets earlier
        # than the one it was last told (the driver re-arms its one loop timer)
        self.wake: Callable[[float], None] = _ignore
        self._woken: float | None = None

    def __len__(self) -> int:
        """Armed deadlines (the heap may also hold cancelled entries)."""
        return len(self._armed)

    def _push(self, due: float, d: Deadline) -> int:
        self._n = seq = self._n + 1
        heapq.heappush(self._heap, (due, seq))
        self._armed[seq] = d
        if self._woken is None or due < self._woken:
            self._woken = due
            self.wake(due)
        return seq

    def _drop(self, seq: int) -> None:
        armed = self._armed
        del armed[seq]
        heap = self._heap
        if len(heap) > 64 and len(heap) > 2 * len(armed):
            self._heap = [e for e in heap if e[1] in armed]
            heapq.heapify(self._heap)

    def soonest(self) -> float | None:
        """The due time of the soonest armed deadline, None when none is armed."""
        heap, armed = self._heap, self._armed
        while heap and heap[0][1] not in armed:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def run(self) -> int:
        """Fire every deadline due by now, in due order; returns how many fired. One
        armed (again) by a callback fires on the next run, never in this one, so a
        callback that re-arms at once cannot starve the loop."""
        now = self.now()
        heap, armed = self._heap, self._armed
        due: list[int] = []
        while heap and (heap[0][1] not in armed or heap[0][0] <= now):
            seq = heapq.heappop(heap)[1]
            if seq in armed:
                due.append(seq)
        self._woken = None
        n = 0
        for seq in due:
            d = armed.pop(seq, None)
            if d is None:  # cancelled by a callback fired before it in this run
                continue
            d._seq = 0
            n += 1
            try:
                d.fn()
            except Exception:  # one failing callback never stops the others
                log.exception("timer callback %r failed", d.fn)
        nxt = self.soonest()
        if nxt is not None and (self._woken is None or nxt < self._woken):
            self._woken = nxt
            self.wake(nxt)
        return n


def _ignore(_due: float) -> None:
    pass


class Deadline:
    """One re-armable deadline of `timers`: `fn()` runs once at `due` unless re-armed
    or cancelled first. `due` is None while it is not armed."""

    __slots__ = ("timers", "fn", "_seq", "_due")

    def __init__(self, timers: Timers, fn: Callable[[], None]) -> None:
        self.timers = timers
        self.fn = fn
        self._seq = 0  # the armed entry's seq, 0 while not armed
        self._due = 0.0

    @property
    def due(self) -> float | None:
        return self._due if self._seq else None

    @property
    def armed(self) -> bool:
        return self._seq != 0

    def arm(self, due: float) -> None:
        """Fire at `due` (monotonic seconds), earlier or later than before."""
        if self._seq:
            self.timers._drop(self._seq)
        self._due = due
        self._seq = self.timers._push(due, self)

    def arm_in(self, delay: float, fn: Callable[[], None] | None = None) -> None:
        """Fire `delay` seconds from now (`fn` instead, when given: one slot whose
        action changes, as a connection's handshake, then close, timeout)."""
        if fn is not None:
            self.fn = fn
        self.arm(self.timers.now() + delay)

    def arm_by(self, due: float) -> None:
        """Fire no later than `due`: re-armed only when that is earlier than now set."""
        if not self._seq or due < self._due:
            self.arm(due)

    def cancel(self) -> None:
        if self._seq:
            self.timers._drop(self._seq)
            self._seq = 0
