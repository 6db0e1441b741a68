"""Reading a stream queue with Spark: offset ranges read by executors in parallel (R4).

Unlike the queue source (one driver-side consumer, staged batches, acks after commit),
a stream keeps its messages, so a micro-batch is just an offset range `[start, end)`:

* the driver-side reader learns offsets by probing (streamwire: `first`, `last`, a
  timestamp) and returns `{"offset": end}`; Spark logs it in the checkpoint's offset log
  before the batch runs, so a rerun of the batch reads the very same range;
* `partitions(start, end)` splits the range into `minPartitions` sub-ranges; each
  executor task opens its own consumer at its sub-range's start (`x-stream-offset`) and
  stops at its end - no state is shared, a failed task simply reads its range again;
* nothing is acked but prefetch credit, nothing is staged, `commit` has nothing to do;
* `failOnDataLoss` (Kafka's option, default true): when retention removed offsets a
  batch was to read - found when the batch is planned (its start is older than the
  stream's oldest message) or when a task reads its range (its consumer starts past the
  range's start, and so does the stream) - the query fails naming the lost offsets;
  with false a warning is logged and the batch goes on with what the stream holds.

Exactly-once then rests on the sink: Spark's file sink names a batch's files in its
`_spark_metadata` log only when the batch commits, and a replayed batch (same range,
same rows) writes its files anew.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ackmq.spark.source import DEFAULT_URL, trace
from ackmq.spark.streamproto import read_range as read_range_stream
from ackmq.spark.streamproto import stream_url_for, tls_of, unusable, with_tls_of
from ackmq.spark.streamrows import stream_batch
from ackmq.spark.streamwire import (
    data_loss,
    first_offset,
    last_offset,
    offset_at,
    read_range,
    report_loss,
    server_product,
)

PROTOCOLS = ("stream", "amqp")
log = logging.getLogger("ackmq.spark.stream")


def parse_position(text: str, what: str) -> str | int | dt.datetime:
    """`earliest`, `latest`, an offset, or an ISO-8601 timestamp (naive means UTC)."""
    t = str(text).strip()
    if t.lower() in ("earliest", "latest"):
        return t.lower()
    try:
        n = int(t)
    except ValueError:
        pass
    else:
        if n < 0:
            raise ValueError(f"{what} must not be negative, got {n}")
        return n
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what} must be earliest, latest, an offset or an ISO "
                         f"timestamp, got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def parse_bool(text: str, what: str) -> bool:
    t = str(text).strip().lower()
    if t not in ("true", "false"):
        raise ValueError(f"{what} must be true or false, got {text!r}")
    return t == "true"


class StreamRange(InputPartition):
    """Stream offsets [start, end) for one executor task."""

    def __init__(self, start: int, end: int, protocol: str | None = None) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end
        self.protocol = protocol  # None: the reader's (a range made by hand)


class _StreamOptions:
    """Options shared by the streaming and the batch reader (case-insensitive)."""

    def __init__(self, options: Any) -> None:
        self.url = options.get("url") or os.environ.get("ACKMQ_URL", DEFAULT_URL)
        self.stream = options.get("stream")
        if not self.stream:
            raise ValueError("the ackmq stream source needs option('stream', ...)")
        self.starting = parse_position(options.get("startingOffsets") or "earliest",
                                       "startingOffsets")
        self.min_partitions = max(1, int(options.get("minPartitions") or 2))
        self.prefetch = max(1, min(65535, int(options.get("prefetch") or 2000)))
        # how long a probe waits for a first delivery before it calls the stream empty:
        # short for the polls of a running query (a miss only delays a batch), longer
        # where the answer is kept (the initial offset, AvailableNow's end, a batch read)
        self.probe_timeout = float(options.get("probeTimeout") or 0.5)
        self.plan_timeout = float(options.get("planTimeout") or 3.0)
        self.fail_on_data_loss = parse_bool(options.get("failOnDataLoss") or "true",
                                            "failOnDataLoss")
        # how read tasks read their range: RabbitMQ's stream protocol or AMQP 0-9-1 (the
        # probes use AMQP either way). Unset: the stream protocol where it answers for
        # this broker and stream (checked once, when the first batch is planned), else
        # AMQP: docs/spark.md has the figures
        given = options.get("protocol")
        self.protocol: str | None = str(given).strip().lower() if given else None
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {given!r}")
        self.stream_url_given = options.get("streamUrl") or os.environ.get("ACKMQ_STREAM_URL")
        self.stream_url = ""
        if self.protocol != "amqp":
            # amqps:// -> rabbitmq-stream+tls:// (5551) with the same TLS options; a
            # given +tls streamUrl without TLS options takes the url's
            self.stream_url = with_tls_of(self.stream_url_given, self.url) \
                if self.stream_url_given else stream_url_for(self.url)
            tls_of(self.stream_url)  # a bad scheme or option fails here, not in a task

    def check_start(self, start: int, end: int) -> int:
        """Planning a range [start, end): when retention already removed its head (the
        stream's oldest message is past `start`), fail (failOnDataLoss) or warn and
        start at what is left."""
        if end <= start:
            return start
        loss = data_loss(self.url, self.stream, start, end, None)
        if loss is None:
            return start
        trace("dataloss-plan", loss.start, loss.end)
        report_loss(loss, self.fail_on_data_loss)
        return loss.end

    def resolve(self, where: str | int | dt.datetime) -> int:
        """An offset for a position: `latest` is one past the last offset (so a start at
        `latest` reads only what comes next)."""
        if isinstance(where, int):
            return where
        wait = self.plan_timeout
        if where == "earliest":
            first = first_offset(self.url, self.stream, wait)
            return first if first is not None else 0
        last = last_offset(self.url, self.stream, wait)
        if where == "latest":
            return last + 1 if last is not None else 0
        at = offset_at(self.url, self.stream, where, wait)  # type: ignore[arg-type]
        if at is not None:
            return at
        return last + 1 if last is not None else 0  # nothing written since `where`

    def read_protocol(self) -> str:
        """The read tasks' protocol: as given, or (unset) the stream protocol when it
        answers for this broker and stream, else AMQP with a warning saying why. Decided
        once, in the driver; the partitions carry it to the executors."""
        if self.protocol is None:
            why = unusable(self.stream_url, self.stream, server_product(self.url))
            self.protocol = "stream" if why is None else "amqp"
            trace("protocol", self.protocol)
            if why is not None:
                log.warning("stream %r: read tasks read over AMQP 0-9-1, not the stream "
                            "protocol: %s", self.stream, why)
        return self.protocol

    def split(self, start: int, end: int, k: int) -> list[StreamRange]:
        """k ranges of (nearly) equal offset span; fewer if the range is smaller."""
        span = end - start
        if span <= 0:
            return []
        k = max(1, min(k, span))
        step = math.ceil(span / k)
        protocol = self.read_protocol()
        return [StreamRange(s, min(end, s + step), protocol)
                for s in range(start, end, step)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        p: StreamRange = partition  # type: ignore[assignment]
        trace("read", p.start, p.end)
        _kill_hook(p)
        protocol = getattr(p, "protocol", None) or self.read_protocol()
        if protocol == "stream":
            reads = read_range_stream(self.stream_url, self.stream, p.start, p.end,
                                      amqp_url=self.url,
                                      fail_on_data_loss=self.fail_on_data_loss)
        else:
            reads = read_range(self.url, self.stream, p.start, p.end,
                               prefetch=self.prefetch,
                               fail_on_data_loss=self.fail_on_data_loss)
        for items in reads:
            yield stream_batch(items)


def _kill_hook(p: StreamRange) -> None:
    """Tests: $ACKMQ_SPARK_KILL_READ_ONCE names a file; the first read task that creates
    it SIGKILLs its own Python worker (an executor task killed mid-batch)."""
    path = os.environ.get("ACKMQ_SPARK_KILL_READ_ONCE")
    if not path:
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()} {p.start} {p.end}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), 9)


class AckmqStreamSourceReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("ackmq").option("stream", ...)`: offsets {"offset": n}."""

    def __init__(self, options: Any) -> None:
        self.o = _StreamOptions(options)
        cap = options.get("maxMessagesPerTrigger")
        self.max_per_trigger = int(cap) if cap else None
        self._last: int | None = None  # highest offset known to exist
        self._target: int | None = None  # Trigger.AvailableNow: end at this offset

    def initialOffset(self) -> dict:
        start = self.o.resolve(self.o.starting)
        trace("initialOffset", start)
        return {"offset": start}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        last = last_offset(self.o.url, self.o.stream, self.o.plan_timeout)
        self._target = last + 1 if last is not None else 0

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        s = int(start["offset"])
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        want = s + cap if cap else None
        if self._target is not None:
            end = self._target if want is None else min(want, self._target)
        else:
            if want is None or self._last is None or self._last + 1 < want:
                last = last_offset(self.o.url, self.o.stream, self.o.probe_timeout)
                if last is not None:
                    self._last = last
            if self._last is None:
                return start
            end = self._last + 1 if want is None else min(want, self._last + 1)
        trace("latestOffset", s, max(s, end))
        return {"offset": max(s, end)}

    def reportLatestOffset(self) -> dict | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        b, e = int(start["offset"]), int(end["offset"])
        trace("partitions", b, e)
        return self.o.split(self.o.check_start(b, e), e, self.o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.o.read(partition)

    def commit(self, end: dict) -> None:
        trace("commit", end["offset"])  # the offsets are Spark's: nothing to settle


class AckmqStreamBatchReader(DataSourceReader):
    """`spark.read.format("ackmq").option("stream", ...)`: startingOffsets (earliest) to
    endingOffsets (latest: one past the last offset at planning time), exclusive."""

    #: a batch read splits into ranges of at most this many offsets (bounded task memory)
    MAX_SPAN = 200_000

    def __init__(self, options: Any) -> None:
        self.o = _StreamOptions(options)
        self.ending = parse_position(options.get("endingOffsets") or "latest", "endingOffsets")
        if self.ending == "earliest":
            raise ValueError("endingOffsets cannot be earliest")

    def partitions(self) -> Sequence[InputPartition]:
        start = self.o.resolve(self.o.starting)
        end = self.o.resolve(self.ending)
        start = self.o.check_start(start, end)
        k = max(self.o.min_partitions, math.ceil(max(0, end - start) / self.MAX_SPAN))
        return self.o.split(start, end, k) or [StreamRange(0, 0, "amqp")]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.o.read(partition)
