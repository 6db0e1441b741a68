"""Structured Streaming source `ackmq`: a queue read into micro-batches, acked after commit.

Where each piece runs (PySpark 4.3): `latestOffset`, `partitions` and `commit` run in
one long-lived Python process on the driver side; `read()` runs in executor workers
and shares nothing with it. So:

* the driver-side process owns the only AMQP consumer (manual ack, bounded prefetch,
  exclusive) and the delivery tags, which belong to its channel;
* `latestOffset(start)` takes up to `maxMessagesPerTrigger` buffered messages and
  stages them durably in `<stagingLocation>/b-<begin>-<end>.arrow` before returning
  `{"n": end, "hwm": highest x-ackmq-seq staged}`; the offset Spark logs therefore
  always names a complete file, and a replayed batch reads the very same rows;
* Spark asks for the next batch only after it has committed the previous one to the
  sink, so `latestOffset(start)` is where everything staged up to `start` is acked
  (the reader's `commit(end)` lags a batch behind and never comes while the stream is
  idle; it acks too, harmlessly). Prefetch is 2 x maxMessagesPerTrigger, so the
  unacked batch in flight never stalls the next one;
* after any crash the broker redelivers everything unacked; a redelivered message
  whose `x-ackmq-seq` is at or below the `hwm` of the committed offset is already in
  the sink: it is acked and dropped (S2, no producer help). Without the header
  (RabbitMQ) the producers' `message_id`s in a window of recent batches do the same;
  messages with neither are delivered at least once (S4).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ackmq.spark.amqp import Delivery, QueueConsumer
from ackmq.spark.schema import SCHEMA_DDL, message_id_of, prepare_row, seq_of, to_arrow
from ackmq.spark.staging import Staged, from_ipc, staging_at, to_ipc

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
_TRACE = os.environ.get("ACKMQ_SPARK_TRACE")


def trace(*parts: Any) -> None:
    """Append one line to $ACKMQ_SPARK_TRACE: how tests see which call came when (both
    sources' readers write it)."""
    if _TRACE:
        with open(_TRACE, "a") as f:
            f.write(" ".join(str(p) for p in (os.getpid(), *parts)) + "\n")


def bool_option(v: str | None, default: bool) -> bool:
    return default if v is None else str(v).lower() in ("1", "true", "yes", "on")


def default_staging(url: str, queue: str) -> str:
    """A per (broker, queue) directory that survives driver restarts on this machine."""
    safe = url.split("@")[-1]
    key = hashlib.sha1(f"{safe}|{queue}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "ackmq-spark", key)


#: basic.qos prefetch-count is 16 bits: the most a consumer may hold unacked
MAX_PREFETCH = 65535
#: the memory bound on one batch's bodies (the reader holds it, its read tasks carry it)
DEFAULT_MAX_BYTES = 256 << 20

#: a read task carries its rows (S7); Spark refuses a task over spark.rpc.message.maxSize
#: (128 MiB) and a batch of big messages is split into more tasks to stay well below it
MAX_TASK_BYTES = 32 << 20


def _over_budget(got: list[Delivery], budget: int) -> int:
    """How many of `got` fit in `budget` bytes of bodies (always at least one)."""
    total = 0
    for i, d in enumerate(got):
        total += len(d.message.body)
        if total > budget and i > 0:
            return i
    return len(got)


class StagedPartition(InputPartition):
    """Rows [row_from, row_to) of the staged batch that starts at offset `begin`, carried
    in the partition itself as Arrow IPC bytes: executors need no file the driver wrote,
    so the source runs on a cluster whose executors share no disk with the driver."""

    def __init__(self, begin: int, row_from: int, row_to: int, data: bytes) -> None:
        super().__init__((begin, row_from, row_to))
        self.data = data


def split_rows(rows: int, nbytes: int, wanted: int) -> int:
    """Read tasks for a batch: `wanted` (numPartitions), fewer for a small batch (one per
    1,000 rows), more when the rows would make a task bigger than MAX_TASK_BYTES."""
    k = max(1, min(wanted, math.ceil(rows / 1000)))
    return max(1, min(rows, max(k, math.ceil(nbytes / MAX_TASK_BYTES))))


class AckmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring for the protocol; options are read case-insensitively."""

    def __init__(self, options: Any) -> None:
        self.url = options.get("url") or os.environ.get("ACKMQ_URL", DEFAULT_URL)
        self.queue = options.get("queue")
        if not self.queue:
            raise ValueError("the ackmq source needs option('queue', ...)")
        cap = options.get("maxMessagesPerTrigger")
        self.max_per_trigger = int(cap) if cap else None  # None: what is there (S5)
        self.prefetch = int(options.get("prefetch") or min(
            MAX_PREFETCH, 2 * (self.max_per_trigger or MAX_PREFETCH)))
        self.max_bytes = int(options.get("maxBytesPerTrigger") or DEFAULT_MAX_BYTES)
        self.num_partitions = int(options.get("numPartitions") or 2)
        self.dedupe_window = int(options.get("dedupeWindow") or 100000)
        self.exclusive = bool_option(options.get("exclusive"), True)
        self.idle_timeout = float(options.get("availableNowIdleTimeout") or 1.0)
        self.mqtt = bool_option(options.get("mqtt"), False)  # the topic and qos columns
        self.staging = staging_at(options.get("stagingLocation")
                                  or default_staging(self.url, self.queue))
        self._consumer: QueueConsumer | None = None
        self._staged: OrderedDict[int, tuple[int, list[Delivery], list[str]]] = OrderedDict()
        self._tables: dict[int, Any] = {}  # begin -> the staged batch's Arrow table
        self._window: set[str] | None = None
        self._window_files: list[tuple[Staged, int]] = []
        self._remaining: int | None = None  # Trigger.AvailableNow budget
        self._status: tuple[int, tuple[tuple[int, int], ...]] | None = None
        self._spans: tuple[tuple[int, int], ...] = ()  # staged [b, e), for the status
        self._status_lock: threading.Lock | None = None  # driver side (a lock won't pickle)

    # -- driver side ----------------------------------------------------------------------
    def _ensure(self) -> QueueConsumer:
        if self._consumer is None:
            self.staging.ensure()
            self._status_lock = threading.Lock()
            c = QueueConsumer(self.url, self.queue, self.prefetch, exclusive=self.exclusive)
            c.on_tick = self._report
            c.prepare = prepare_row
            c.start()
            self._consumer = c
        return self._consumer

    def initialOffset(self) -> dict:
        return {"n": 0, "hwm": -1}

    def getDefaultReadLimit(self) -> ReadLimit:
        """A set maxMessagesPerTrigger; else what is buffered (as Spark's Kafka source
        takes what is available), at most half the prefetch window so the next batch
        keeps arriving while this one lands, and at most maxBytesPerTrigger of bodies."""
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        c = self._ensure()
        staged = sum(len(items) for _, items, _ in self._staged.values())
        self._remaining = c.depth_at_start() - staged

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        c = self._ensure()
        n, hwm = int(start["n"]), int(start["hwm"])
        trace("latestOffset", n, hwm)
        # the acks the previous call sent are processed by now (one round trip, seldom a
        # wait); this call's own are confirmed by the next one, so the broker's ack work
        # overlaps Spark's batch instead of delaying it
        c.confirm_acks()
        self._settle(n)
        return self._next_batch(c, n, hwm, start, limit)

    def _next_batch(self, c: QueueConsumer, n: int, hwm: int, start: dict,
                    limit: ReadLimit) -> dict:
        self._drop_unlogged(n)
        window = self._load_window(n)
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else max(1, self.prefetch // 2)
        budget = self.max_bytes
        wait = 0.0
        if self._remaining is not None:
            cap = min(cap, self._remaining)
            wait = self.idle_timeout
            if not isinstance(limit, ReadMaxRows):
                self._fill(c, cap)
        taken: list[Delivery] = []
        ids: list[str] = []
        dupes: list[Delivery] = []
        while len(taken) < cap and budget > 0:
            got = c.take(cap - len(taken), wait=wait if not taken and not dupes else 0.0)
            if not got and self._remaining is not None and not taken and not dupes:
                got = self._await_available_now(c, cap)
            if not got:
                break
            over = _over_budget(got, budget)
            if over < len(got):  # the memory bound: the rest waits for the next batch
                c.push_front(got[over:])
                got, cap = got[:over], len(taken) + over
            budget -= sum(len(d.message.body) for d in got)
            if self._remaining is not None:
                self._remaining -= len(got)
                cap = min(cap, len(taken) + len(got) + max(self._remaining, 0))
            for d in got:
                seq = seq_of(d)
                mid = message_id_of(d)
                if (seq is not None and seq <= hwm) or (mid is not None and mid in window):
                    dupes.append(d)  # already in the committed sink
                    continue
                taken.append(d)
                if mid is not None:
                    window.add(mid)
                    ids.append(mid)
        if dupes:
            c.ack(dupes)
        if not taken:
            return start
        end = n + len(taken)
        table = to_arrow(taken, n)
        self.staging.write(n, end, table, ids)
        self._staged[n] = (end, taken, ids)
        self._tables[n] = table
        self._staged_changed()
        seqs = [s for s in (seq_of(d) for d in taken) if s is not None]
        return {"n": end, "hwm": max([hwm, *seqs])}

    def _staged_changed(self) -> None:
        self._spans = tuple((b, e) for b, (e, _, _) in self._staged.items())
        self._report()

    def _report(self) -> None:
        """Tell `pipeline land` what this reader holds: every delivery not acked yet, and
        which of them are in staged batches [b, e) (landed once offset e is committed).
        Called by the consumer thread every 0.1 s and after staging or acking; the file
        is rewritten only when that changed."""
        c = self._consumer
        if c is None or self._status_lock is None:
            return
        with self._status_lock:
            status = (c.unacked(), self._spans)
            if status == self._status:
                return
            self._status = status
            try:
                self.staging.write_status({"unacked": status[0],
                                           "staged": [list(sp) for sp in status[1]],
                                           "time": time.time()})
            except OSError:
                pass  # only the progress line reads it

    def _fill(self, c: QueueConsumer, want: int, settle: float = 0.2,
              most: float = 5.0) -> None:
        """AvailableNow with batches sized by what is there: the backlog is known and
        bounded, so let the prefetch window fill (up to `want`, while deliveries keep
        coming) instead of landing whatever arrived first as a small batch that costs
        Spark's whole per-batch overhead."""
        deadline = time.monotonic() + most
        seen, quiet = c.buffered(), time.monotonic() + settle
        while seen < want and time.monotonic() < min(deadline, quiet):
            time.sleep(0.01)
            now = c.buffered()
            if now != seen:
                seen, quiet = now, time.monotonic() + settle

    def _await_available_now(self, c: QueueConsumer, cap: int) -> list[Delivery]:
        """AvailableNow found nothing within the idle timeout: end only if the broker holds
        nothing ready either (a slow broker must not end the run early), 60 s at most."""
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and c.ready_count() > 0:
            got = c.take(cap, wait=self.idle_timeout)
            if got:
                return got
        return []

    def reportLatestOffset(self) -> dict | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        b, e = int(start["n"]), int(end["n"])
        trace("partitions", b, e)
        if b == e:
            return []
        table = self._tables.get(b)
        if table is None:  # a replay after a restart: the driver reads its staged copy
            if not self.staging.exists(b, e):
                raise FileNotFoundError(
                    f"staged batch {b}-{e} is missing from {self.staging.root}: the "
                    "checkpoint and stagingLocation must be kept together")
            table = self.staging.read(b, e)
        rows = e - b
        step = math.ceil(rows / split_rows(rows, table.nbytes, self.num_partitions))
        return [StagedPartition(b, i, min(rows, i + step),
                                to_ipc(table.slice(i, min(rows, i + step) - i)))
                for i in range(0, rows, step)]

    def commit(self, end: dict) -> None:
        trace("commit", end["n"])
        if self._consumer is not None:
            # no wait here: Spark calls commit() inside its offset-log write (walCommit);
            # the next latestOffset confirms the acks
            self._settle(int(end["n"]))

    def stop(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.confirm_acks()
            self._consumer.close()
            self._consumer = None

    # -- executor side --------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        p: StagedPartition = partition  # type: ignore[assignment]
        if not self.mqtt:
            yield from from_ipc(p.data)
            return
        from ackmq.spark.mqtt_columns import with_mqtt_columns

        for batch in from_ipc(p.data):
            yield with_mqtt_columns(batch)

    # -- bookkeeping ----------------------------------------------------------------------
    def _settle(self, n: int) -> None:
        """Everything staged below offset n is committed in the sink: ack, drop its file."""
        done = [b for b, (e, _, _) in self._staged.items() if e <= n]
        acks: list[Delivery] = []
        for b in done:
            acks.extend(self._staged.pop(b)[1])
            self._tables.pop(b, None)
        if done:
            self._staged_changed()
        if acks and self._consumer is not None:
            self._consumer.ack(acks)  # confirmed by the next latestOffset, commit or stop
            trace("acked", len(acks), "up to", n)
            self._report()  # the query may stop before the consumer thread's next tick
        for s in self.staging.batches():
            if s.end <= n:
                self.staging.remove(s)
        self._trim_window()

    def _drop_unlogged(self, n: int) -> None:
        """Staged at or beyond n, Spark never logged it: its messages go back to the buffer
        (this process still holds them) or come back redelivered (an earlier process)."""
        unlogged = [b for b in self._staged if b >= n]
        for b in unlogged:
            _, items, ids = self._staged.pop(b)
            self._tables.pop(b, None)
            if self._window is not None:
                self._window.difference_update(ids)
            assert self._consumer is not None
            self._consumer.push_front(items)
        if unlogged:
            self._staged_changed()
        for kind in ("arrow", "ids"):
            for s in self.staging.batches(kind):
                if s.begin >= n:
                    self.staging.remove(s, kind)
        self._window_files = [(s, k) for s, k in self._window_files if s.begin < n]

    def _load_window(self, n: int) -> set[str]:
        if self._window is None:
            self._window = set()
            for s in self.staging.batches("ids"):
                if s.end <= n:
                    ids = self.staging.ids(s)
                    self._window.update(ids)
                    self._window_files.append((s, len(ids)))
        for b, (e, _, ids) in self._staged.items():
            if (Staged(b, e), len(ids)) not in self._window_files:
                self._window_files.append((Staged(b, e), len(ids)))
        return self._window

    def _trim_window(self) -> None:
        """Keep the newest batches' ids until they hold `dedupeWindow` ids."""
        files = sorted(set(self._window_files), key=lambda x: x[0].begin)
        total, keep = 0, []
        for s, k in reversed(files):
            if total >= self.dedupe_window and s.begin not in self._staged:
                if self._window is not None:
                    self._window.difference_update(self.staging.ids(s))
                self.staging.remove(s, "ids")
                continue
            total += k
            keep.append((s, k))
        self._window_files = list(reversed(keep))


class AckmqDataSource(DataSource):
    """`spark.readStream.format("ackmq")` / `df.write[Stream].format("ackmq")`."""

    @classmethod
    def name(cls) -> str:
        return "ackmq"

    def _is_stream(self) -> bool:
        """option("stream", ...) reads a stream queue by offsets (stream_source.py);
        option("queue", ...) consumes a queue."""
        if self.options.get("stream"):
            if self.options.get("queue"):
                raise ValueError("the ackmq source takes option('queue') or "
                                 "option('stream'), not both")
            return True
        return False

    def schema(self) -> str:
        if self._is_stream():
            if bool_option(self.options.get("mqtt"), False):
                raise ValueError("option('mqtt') is for option('queue'): a stream's rows "
                                 "have no MQTT columns")
            from ackmq.spark.streamrows import STREAM_SCHEMA_DDL

            return STREAM_SCHEMA_DDL
        if bool_option(self.options.get("mqtt"), False):
            from ackmq.spark.mqtt_columns import MQTT_SCHEMA_DDL

            return SCHEMA_DDL + MQTT_SCHEMA_DDL
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self._is_stream():
            from ackmq.spark.stream_source import AckmqStreamSourceReader

            return AckmqStreamSourceReader(self.options)
        return AckmqStreamReader(self.options)

    def reader(self, schema: Any) -> Any:
        if not self._is_stream():
            raise ValueError("batch reads (spark.read) need option('stream', ...): a queue "
                             "is read with spark.readStream")
        from ackmq.spark.stream_source import AckmqStreamBatchReader

        return AckmqStreamBatchReader(self.options)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from ackmq.spark.sink import AckmqBatchWriter

        return AckmqBatchWriter(self.options, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from ackmq.spark.sink import AckmqStreamWriter

        return AckmqStreamWriter(self.options, schema)
