"""L6 redelivery back-off kept by the broker: a requeued message waits out its delay
beside its queue, not in a consumer's prefetch, then returns to its place in the ready
list (RabbitMQ 4.3's quorum-queue "delayed retry", with LavinMQ's multiplier).

Arguments (queue arguments, or basic.consume arguments that override the queue's for
the messages that consumer requeues):

    x-delayed-retry-type        disabled | all | failed | returned
                                (failed: nack/reject with requeue; returned: channel or
                                connection closed, basic.recover, consumer timeout;
                                absent with a min: all)
    x-delayed-retry-min         ms before the first redelivery (> 0 enables)
    x-delayed-retry-max         ms cap on one delay (absent: no cap)
    x-delayed-retry-multiplier  absent: linear, min * n (RabbitMQ 4.3); m >= 1:
                                min * m ** (n - 1) (ActiveMQ's exponential back-off)

n is the message's delivery count after this return (1 for the first redelivery, the
value `x-delivery-count` carries). A requeued persistent message is already on disk in
its queue: the wait is in memory only, one heap and one timer per queue; after a
restart every such message is ready at once.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ackmq.broker import argument_table as table
from ackmq.broker.argument_table import MAX_DELAY_MS, as_number, as_text
from ackmq.broker.timers import Deadline, Timers

E = TypeVar("E")  # what waits: a queue's QueueEntry (retry stays below the queue types)

TYPE_ARG = "x-delayed-retry-type"
MIN_ARG = "x-delayed-retry-min"
MAX_ARG = "x-delayed-retry-max"
MULTIPLIER_ARG = "x-delayed-retry-multiplier"
RETRY_ARGS = (TYPE_ARG, MIN_ARG, MAX_ARG, MULTIPLIER_ARG)  # their rules: argument_table


@dataclass(frozen=True, slots=True)
class Backoff:
    """One back-off rule: which returns it delays and by how much."""

    kind: str  # "all", "failed" or "returned"
    min_ms: int
    max_ms: int | None
    multiplier: float | None  # None: linear

    def delay_ms(self, count: int, failed: bool) -> int:
        """The wait before redelivery number `count`; 0 when this return is not delayed."""
        if self.kind != "all" and (self.kind == "failed") != failed:
            return 0
        n = max(1, count)
        d: float
        if self.multiplier is None:
            d = self.min_ms * n
        else:
            m = self.multiplier
            if m <= 1:
                d = self.min_ms
            elif (n - 1) * math.log(m) >= math.log(MAX_DELAY_MS / self.min_ms):
                d = MAX_DELAY_MS  # m ** (n - 1) would overflow a float soon after
            else:
                d = self.min_ms * m ** (n - 1)
        if self.max_ms is not None and d > self.max_ms:
            d = self.max_ms
        return int(min(d, MAX_DELAY_MS))


def backoff_of(args: dict[str, Any]) -> Backoff | None:
    """The rule named by `args` (checked at declare/consume), None when off."""
    if not args or MIN_ARG not in args:
        return None
    kind = as_text(args.get(TYPE_ARG)) or "all"
    lo = as_number(args.get(MIN_ARG))
    if kind == "disabled" or lo is None or lo <= 0:
        return None
    hi = as_number(args.get(MAX_ARG))
    mult = as_number(args.get(MULTIPLIER_ARG))
    return Backoff(kind, int(lo), None if hi is None else int(hi),
                   None if mult is None else float(mult))


def check_retry_argument(key: str, v: Any, args: dict[str, Any]) -> str | None:
    """RabbitMQ's style of complaint for one back-off argument, None when fine (its
    check is declared in argument_table)."""
    check = table.INDEX.by_name[key].check
    return None if check is None else check(v, args)


class RetryHeap(Generic[E]):
    """A queue's messages waiting out their back-off, soonest first: O(log n) a push,
    one deadline (broker/timers.py) for the soonest, nothing done per message until it
    is due. `release` takes the due entries (in due order) back into the queue."""

    __slots__ = ("_heap", "_n", "_deadline", "_release")

    def __init__(self, timers: Timers, release: Callable[[list[E]], None]) -> None:
        self._heap: list[tuple[float, int, E]] = []
        self._n = 0  # tie-break: equal due times leave in the order they came
        self._deadline = Deadline(timers, self._fire)
        self._release = release

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, entry: E, delay_ms: int) -> None:
        due = time.monotonic() + delay_ms / 1000.0
        self._n += 1
        heapq.heappush(self._heap, (due, self._n, entry))
        self._deadline.arm_by(self._heap[0][0])

    def _fire(self) -> None:
        now = time.monotonic()
        heap = self._heap
        out: list[E] = []
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        if out:
            self._release(out)
        if heap:
            self._deadline.arm_by(heap[0][0])

    def clear(self) -> list[E]:
        """Stop the timer; the entries still waiting (purge, delete)."""
        self._deadline.cancel()
        out = [e for _due, _n, e in self._heap]
        self._heap.clear()
        return out
