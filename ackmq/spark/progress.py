"""Counting a streaming query's landed batches from its progress, each batch once.

`StreamingQuery.recentProgress` is a snapshot that keeps growing while the query runs:
two reads in one poll can differ (a batch finishing between them), so a poll takes one
read and derives everything from it. Progress events with no input rows (an idle
trigger's event, which Spark posts every `noDataProgressEventInterval`, may carry the id
of the batch that runs next) neither count nor move the marker: the batch itself is
reported later with its rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: `spark.sql.streaming.numRecentProgressUpdates` for a landing: Spark keeps the last 100
#: events by default; a poll (once a second) must find every batch since the previous
#: one, and each read converts every kept event (py4j): 200 is twice the default, read
#: once a poll where the old code read 100 twice
RECENT_PROGRESS = 200


class BatchCounter:
    """The batches of a query not counted yet, from one read of its progress a poll."""

    def __init__(self) -> None:
        self.last = -1  # the newest batch id counted

    def new(self, progress: Iterable[Any]) -> list[Any]:
        """The events of `progress` (one read of `recentProgress`, oldest first) for
        batches with rows not returned before, oldest first."""
        fresh = []
        for p in progress:
            if p.batchId > self.last and int(p.numInputRows) > 0:
                fresh.append(p)
                self.last = p.batchId
        return fresh


#: how long a stop request waits for the running micro-batch to finish before it stops
#: the query anyway (that batch is then not committed: the next run lands it)
STOP_GRACE = 30.0


def follow(q: Any, on_batch: Callable[[Any, bool], None], *,
           done: Callable[[], bool] | None = None, stop: threading.Event | None = None,
           poll: float = 1.0) -> bool:
    """Follow query `q` until it ends: once per `poll`, one read of its progress, and
    `on_batch(event, last_of_this_poll)` for each batch not seen before, in order. Stops
    the query when `done()` says so, or when `stop` is set (then at a batch boundary:
    once no trigger is running, `STOP_GRACE` at most). A last read after the query ended
    counts the batches that finished after the previous one. Returns whether `stop`
    ended it."""
    counter = BatchCounter()

    def read() -> None:
        new = counter.new(q.recentProgress)  # the poll's one read
        for i, p in enumerate(new):
            on_batch(p, i == len(new) - 1)

    stopped = False
    while q.isActive:
        if stop is not None and stop.is_set():
            stopped = True
            _stop_between_batches(q)
            break
        q.awaitTermination(poll)
        read()
        if done is not None and done():
            q.stop()
    q.awaitTermination()
    read()
    return stopped


def _stop_between_batches(q: Any) -> None:
    """Stop `q` when no trigger runs or the running one has reported its progress (a
    batch just committed), `STOP_GRACE` at most. Stopping at any other moment is safe
    too (a batch logged and not committed is replayed from its logged offsets by the
    next run), but throws away the batch's work."""
    def stamp() -> Any:
        p = q.lastProgress
        return None if p is None else (p.batchId, p.timestamp)

    before, deadline = stamp(), time.monotonic() + STOP_GRACE
    while q.isActive and time.monotonic() < deadline:
        if not q.status.get("isTriggerActive", False) or stamp() != before:
            break
        time.sleep(0.05)
    q.stop()
