"""S2/S5: the landed count - every batch counted once from a query's progress, no JVM.

`pipeline land`, `pipeline audit`, `demo`'s check, the benchmark and `stop_when` all
take their count from `ackmq.spark.progress.follow`. The query here stands in for
Spark's `StreamingQuery`: its progress gains a batch at every read, as when batches
finish while the driver polls, and an idle trigger's event carries the id of the batch
that runs next with no rows (what PySpark 4.3 reports: seen as `(2, 0)` before batch 2's
`(2, 100)` in a real query idle for longer than `noDataProgressEventInterval`). The
real-Spark test of the same count is in test_spark_pipeline.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from ackmq.spark.progress import BatchCounter, follow


def _event(batch: int, rows: int) -> SimpleNamespace:
    return SimpleNamespace(batchId=batch, numInputRows=rows, sources=[],
                           durationMs={"triggerExecution": 100},
                           timestamp="2026-11-28T12:00:00.000Z")


class GrowingQuery:
    """A query whose `recentProgress` gains the next event at every read and that ends
    after the last one; keeps Spark's bounded history (`retention` newest events)."""

    def __init__(self, events: list[SimpleNamespace], retention: int = 100) -> None:
        self.pending, self.shown = list(events), []  # type: list[SimpleNamespace]
        self.retention, self.reads, self.stopped = retention, 0, False

    @property
    def recentProgress(self) -> list[SimpleNamespace]:  # noqa: N802 - Spark's name
        self.reads += 1
        if self.pending:
            self.shown.append(self.pending.pop(0))
        return self.shown[-self.retention:]

    @property
    def isActive(self) -> bool:  # noqa: N802 - Spark's name
        return bool(self.pending) and not self.stopped

    @property
    def lastProgress(self) -> SimpleNamespace | None:  # noqa: N802 - Spark's name
        return self.shown[-1] if self.shown else None

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": False}

    def awaitTermination(self, timeout: float | None = None) -> bool:  # noqa: N802
        return not self.isActive

    def stop(self) -> None:
        self.stopped = True


def _follow(events: list[SimpleNamespace], **kw: Any) -> tuple[list[int], int, GrowingQuery]:
    q = GrowingQuery(events)
    seen: list[int] = []
    rows = 0

    def on_batch(p: Any, last: bool) -> None:
        nonlocal rows
        seen.append(p.batchId)
        rows += int(p.numInputRows)

    follow(q, on_batch, poll=0.0, **kw)
    return seen, rows, q


def test_S2_landed_count_has_every_batch_once_when_batches_finish_between_reads() -> None:
    """60 batches of 1..60 rows, one finishing at every read of the progress: each is
    counted once and the total is the rows landed (the code before this read the
    progress twice per poll, so the batch finishing between the reads was skipped)."""
    events = [_event(b, b + 1) for b in range(60)]
    seen, rows, _ = _follow(events)
    assert seen == list(range(60))
    assert rows == sum(range(1, 61))


def test_S2_landed_count_after_an_idle_event_with_the_next_batch_id() -> None:
    """An idle stretch reports `(next batch id, 0 rows)`; the batch then runs with that
    id and its rows: it is counted (the code before took the idle event's id as seen
    and never counted that batch - `landed 188022` for 198,044 rows in issue 40)."""
    events = [_event(0, 100), _event(1, 0), _event(1, 0), _event(1, 250), _event(2, 0),
              _event(2, 7)]
    seen, rows, _ = _follow(events)
    assert (seen, rows) == ([0, 1, 2], 357)


def test_S2_batches_that_end_after_the_last_poll_are_counted() -> None:
    """The query ends with batches reported after the poll that saw it running: the
    read after termination counts them."""
    q = GrowingQuery([_event(0, 5)])
    q.shown = [_event(0, 5)]
    q.pending = []  # already ended: the loop never polls
    got: list[int] = []
    follow(q, lambda p, last: got.append(p.batchId), poll=0.0)
    assert got == [0]


def test_S2_counter_takes_one_read_and_marks_only_batches_with_rows() -> None:
    c = BatchCounter()
    assert [p.batchId for p in c.new([_event(0, 3), _event(1, 0)])] == [0]
    assert [p.batchId for p in c.new([_event(0, 3), _event(1, 0), _event(1, 4)])] == [1]
    assert c.new([_event(1, 4)]) == []


def test_S2_a_stop_request_ends_the_landing_between_batches() -> None:
    """`stop` set (a signal handler's): the query is stopped and `follow` says so."""
    stop = threading.Event()
    stop.set()
    seen, _, q = _follow([_event(b, 1) for b in range(10)], stop=stop)
    assert q.stopped and len(seen) < 10
