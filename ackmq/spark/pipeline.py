"""The two jobs behind `ackmq pipeline`: land a queue into Parquet, publish a table."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackmq.client import ClientError, ConnectionLost
from ackmq.spark.amqp import describe, is_permanent, safe_url, session_on
from ackmq.spark.progress import RECENT_PROGRESS, follow
from ackmq.spark.staging import staging_at, under

#: local[N, maxFailures]: plain local[N] never retries a failed task (Spark aborts the job
#: on the first failure), which would defeat S3's "a nack fails the task, Spark retries it"
DEFAULT_MASTER = "local[2,4]"
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"


def spark_session(app: str = "ackmq", master: str | None = None,
                  log_level: str = "ERROR") -> Any:
    """A small local session (the machine is shared): 2 cores, a failed task retried up to
    3 times, no UI, 2 shuffle partitions. `master` (or $ACKMQ_SPARK_MASTER) overrides."""
    from pyspark.sql import SparkSession

    import ackmq.spark

    master = master or os.environ.get("ACKMQ_SPARK_MASTER", DEFAULT_MASTER)
    # Spark's Python workers must import ackmq: run them on this interpreter (a venv's),
    # not whatever `python3` is first on PATH
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: loopback only
    spark = (SparkSession.builder.appName(app).master(master)
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", os.environ.get("ACKMQ_SPARK_DRIVER_MEMORY", "1g"))
             .config("spark.sql.streaming.pollingDelay", "50ms")
             .config("spark.ui.showConsoleProgress", "false")
             # small, short-lived jobs on a shared machine: a C1-only JIT and serial GC
             # start faster and burn less CPU than the defaults
             .config("spark.driver.extraJavaOptions",
                     os.environ.get("ACKMQ_SPARK_JAVA_OPTIONS", JAVA_OPTIONS))
             .getOrCreate())
    spark.sparkContext.setLogLevel(log_level)
    ackmq.spark.register(spark)
    return spark


class PipelineError(RuntimeError):
    """A permanent problem found before Spark starts (no such queue, bad login, ...)."""


def check_broker(url: str, *, queue: str | None = None, exchange: str | None = None,
                 stream: str | None = None) -> None:
    """Fail fast, before Spark's JVM starts, on what retrying cannot fix (404 no such
    queue/exchange, 403 bad login or no permission, 530 no such vhost). A broker that
    cannot be reached is left to the job, which keeps retrying (it may be restarting)."""
    what = f"broker {safe_url(url)}"
    try:
        with session_on(url) as s:
            if queue is not None:
                what = f"queue {queue!r} at {safe_url(url)}"
                s.queue_info(queue)
            if stream is not None:
                what = f"stream {stream!r} at {safe_url(url)}"
                s.queue_info(stream)
            if exchange:
                what = f"exchange {exchange!r} at {safe_url(url)}"
                s.check_exchange(exchange)
        if stream is not None:
            from ackmq.spark.amqp import ConsumerError
            from ackmq.spark.streamwire import first_offset

            try:
                first_offset(url, stream)  # 406 (RabbitMQ) or NotAStream: not a stream
            except ConsumerError as exc:
                raise PipelineError(str(exc)) from exc
    except ValueError as exc:  # a URL ackmq.client cannot read
        raise PipelineError(f"cannot use {what}: {exc}") from exc
    except ClientError as exc:
        if is_permanent(exc):
            doing = "cannot log in to" if isinstance(exc, ConnectionLost) else "cannot use"
            raise PipelineError(describe(exc, f"{doing} {what}")) from exc


def queue_backlog(url: str, queue: str) -> int | None:
    """Ready messages in `queue` (not delivered to anyone), or None when the broker cannot
    be asked. Messages delivered to a consumer and not acked yet are not in this count."""
    try:
        with session_on(url) as s:
            return int(s.queue_info(queue).message_count)
    except (ClientError, ValueError):
        return None


def held_by_reader(staging: str, committed: int) -> int | None:
    """Messages the `ackmq` source holds delivered-but-unacked that are not in a batch
    committed up to offset `committed` (its buffer and the batch being landed), from the
    status the reader leaves in its staging directory; None when there is none."""
    st = staging_at(staging).read_status()
    if st is None:
        return None
    landed = sum(e - b for b, e in st.get("staged", []) if e <= committed)
    return max(0, int(st.get("unacked", 0)) - landed)


def still_to_land(url: str, queue: str, staging: str, committed: int) -> str:
    """The progress line's backlog: the broker's ready count plus what the reader holds
    (up to its prefetch, 2 x maxMessagesPerTrigger), which the ready count leaves out."""
    ready = queue_backlog(url, queue)
    held = held_by_reader(staging, committed)
    if ready is None:
        return f"to land: ? (broker not answering; reader holds {held if held is not None else '?'})"
    if held is None:
        return f"to land: {ready}+ ({ready} ready in the queue, reader holdings unknown)"
    return f"to land: {ready + held} ({ready} ready in the queue + {held} held by the reader)"


def _end_offset(p: Any) -> int | None:
    """The source's end offset `n` of a progress event."""
    try:
        end = p.sources[0].endOffset
        d = json.loads(end) if isinstance(end, str) else end
        return int(d["n"] if "n" in d else d["offset"])
    except (IndexError, KeyError, TypeError, ValueError, AttributeError):
        return None


def batch_end(p: Any) -> float:
    """When a batch finished: its trigger's start plus its triggerExecution time."""
    import datetime as dt

    try:
        start = dt.datetime.fromisoformat(str(p.timestamp).replace("Z", "+00:00"))
        return start.timestamp() + p.durationMs.get("triggerExecution", 0) / 1000.0
    except (ValueError, AttributeError):
        return time.time()


def _is_batch_file(name: str) -> bool:
    return name.isdigit()


def clear_unlogged_start(checkpoint: str | os.PathLike[str]) -> list[str]:
    """A driver killed while Spark wrote the first offset-log entry of a fresh
    checkpoint leaves the temporary file of that write (`offsets/.0.<uuid>.tmp` and its
    `.crc`) and no `offsets/0`. Spark then sees no logged batch, starts at batch 0 and
    refuses (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY: offsets/ "should be empty on
    batch 0"). With no batch logged nothing was landed or acked (the source acks only
    committed batches, and a staged batch Spark never logged is dropped and redelivered),
    so those leftovers are removed and the restart is a fresh start. Returns what was
    removed. A checkpoint with any logged batch is left alone."""
    removed: list[str] = []
    offsets = Path(checkpoint) / "offsets"
    if not offsets.is_dir() or any(_is_batch_file(p.name) for p in offsets.iterdir()):
        return removed
    for sub in ("offsets", "commits"):
        d = Path(checkpoint) / sub
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if p.is_file() and not _is_batch_file(p.name):
                p.unlink()
                removed.append(str(p))
    return removed


@dataclass
class LandStats:
    batches: int = 0
    rows: int = 0
    seconds: float = 0.0
    #: (end of the batch, epoch seconds by Spark's own clock, rows) per non-empty batch
    ends: list[tuple[float, int]] = field(default_factory=list)
    #: the landing ended because `land(stop=...)` was set (a signal), not by itself
    stopped: bool = False


def stream_backlog(url: str, stream: str, committed: int | None) -> str:
    """The progress line's backlog for a stream: offsets from the committed end to one
    past the stream's last offset (offsets may have gaps: an upper bound on messages)."""
    from ackmq.spark.amqp import ConsumerError
    from ackmq.spark.streamwire import last_offset

    try:
        last = last_offset(url, stream)
    except ConsumerError:
        return "to land: ? (broker not answering)"
    end = 0 if last is None else last + 1
    if committed is None:
        return f"stream ends at offset {end}"
    return f"to land: {max(0, end - committed)} (offsets {committed}..{end} of the stream)"


def land(spark: Any, *, url: str, queue: str | None = None, to: str, checkpoint: str,
         max_per_trigger: int | None = None, available_now: bool = False,
         staging: str | None = None, num_partitions: int = 2,
         progress: Callable[[str], None] | None = None,
         stop_when: Callable[[LandStats], bool] | None = None,
         stream: str | None = None, starting_offsets: str = "earliest",
         fail_on_data_loss: bool = True, stream_protocol: str | None = None,
         stream_url: str | None = None,
         transform: Callable[[Any], Any] | None = None,
         stop: threading.Event | None = None, mqtt: bool = False) -> LandStats:
    """Land `queue` (staged batches live with the checkpoint) or `stream` (offset ranges,
    `num_partitions` read tasks per batch, from `starting_offsets` on a new checkpoint,
    failing on data loss unless told not to, read over `stream_protocol`: the source's
    `protocol` option, at `stream_url`) into Parquet at `to`; `transform` maps the
    message rows first (the audit's lifecycle columns: spark/audit.py); `mqtt` adds the
    queue source's `topic` and `qos` columns (S11). Setting `stop`
    (a signal handler's) ends the landing at the next batch boundary (`LandStats.stopped`)."""
    clear_unlogged_start(checkpoint)
    r = spark.readStream.format("ackmq").option("url", url)
    if max_per_trigger:  # else the source's default: what is available, memory-bounded
        r = r.option("maxMessagesPerTrigger", max_per_trigger)
    if stream is not None:
        df = (r.option("stream", stream).option("startingOffsets", starting_offsets)
              .option("minPartitions", num_partitions)
              .option("failOnDataLoss", str(fail_on_data_loss).lower()))
        if stream_protocol:
            df = df.option("protocol", stream_protocol)
        if stream_url:
            df = df.option("streamUrl", stream_url)
        df = df.load()
        name = stream
    else:
        assert queue is not None, "land() needs queue or stream"
        staging = staging or under(checkpoint, "ackmq-staging")
        staging_at(staging).clear_status()  # a killed run's: it counts what that run held
        df = (r.option("queue", queue).option("numPartitions", num_partitions)
              .option("stagingLocation", staging).option("mqtt", str(mqtt).lower()).load())
        name = queue
    if transform is not None:
        df = transform(df)
    w = (df.writeStream.format("parquet").option("path", to)
         .option("checkpointLocation", checkpoint).queryName(f"land-{name}"))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="0 seconds")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(RECENT_PROGRESS))
    q = w.start()
    stats, t0 = LandStats(), time.monotonic()

    def on_batch(p: Any, last: bool) -> None:
        """Count a batch; its progress line (the poll's last also says what is left)."""
        rows = int(p.numInputRows)
        stats.batches += 1
        stats.rows += rows
        stats.ends.append((batch_end(p), rows))
        if not progress:
            return
        dur = max(p.durationMs.get("triggerExecution", 0), 1) / 1000.0
        line = (f"batch {p.batchId}: {rows} rows, {rows / dur:,.0f} rows/s; "
                f"landed {stats.rows} in {stats.batches} batches")
        end = _end_offset(p)
        if last and stream is not None:
            line += "; " + stream_backlog(url, stream, end)
        elif last:  # what is left now, after the newest batch
            assert queue is not None and staging is not None
            line += "; " + (still_to_land(url, queue, staging, end) if end is not None
                            else f"{queue_backlog(url, queue)} ready in the queue")
        progress(line)

    try:
        stats.stopped = follow(q, on_batch, stop=stop,
                               done=None if stop_when is None else lambda: stop_when(stats))
    finally:
        if q.isActive:
            q.stop()
    stats.seconds = time.monotonic() - t0
    return stats


def publish(spark: Any, *, source: str, url: str, exchange: str = "",
            routing_key: str | None = None, routing_key_column: str | None = None,
            confirm_timeout: float = 30.0, write_id: str | None = None) -> int:
    """Publish every row of a Parquet table with confirms; returns the row count.

    Message ids are `<write_id>/0/<partition>/<row>`: re-running a failed publish with the
    same `write_id` (same input files, same Spark settings) gives every row the id it had,
    so consumers can drop the copies of rows the failed run got confirmed."""
    df = spark.read.parquet(source)
    w = (df.write.format("ackmq").mode("append").option("url", url).option("exchange", exchange)
         .option("confirmTimeout", confirm_timeout)
         .option("writeId", write_id or uuid.uuid4().hex))
    if routing_key is not None:
        w = w.option("routingKey", routing_key)
    if routing_key_column:
        w = w.option("routingKeyColumn", routing_key_column)
    w.save()
    return df.count()


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
