"""R4, failOnDataLoss: retention removes offsets the Spark stream source planned to read,
against ackmq and RabbitMQ's streams. A small stream (1,000-byte segments, 3,000 bytes
kept) loses its head when more is published; the loss is found when a range is planned
(its start is older than the stream's oldest message) and when a task reads a range
planned before the loss. Default: the read fails naming the lost offsets; with
failOnDataLoss=false a warning is logged and what is left is read.

The reader classes run here in the test's process (what Spark's driver and Python workers
call); test_spark_stream.py runs them under Spark.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

pytest.importorskip("pyarrow", reason="the Spark connector needs pyarrow (extra 'spark')")
pytest.importorskip("pyspark", reason="the Spark stream source needs pyspark (extra 'spark')")

from support import streamhelp  # noqa: E402

from ackmq.spark.amqp import ConsumerError  # noqa: E402
from ackmq.spark.lake import read_committed  # noqa: E402
from ackmq.spark.stream_source import (  # noqa: E402
    AckmqStreamBatchReader,
    AckmqStreamSourceReader,
    StreamRange,
)
from ackmq.spark.streamwire import DataLossError, first_offset, last_offset  # noqa: E402

stream_url = streamhelp.stream_url  # fixtures: ackmq and RabbitMQ, skipped without streams
read_protocol = streamhelp.read_protocol  # the read tasks over AMQP and the stream protocol


@pytest.fixture
def small(stream_url: str) -> Iterator[str]:
    """A stream keeping ~3,000 bytes in 1,000-byte segments (deleted afterwards)."""
    name = f"spark.loss.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    conn.channel().queue_declare(name, durable=True, arguments={
        "x-queue-type": "stream", "x-max-length-bytes": 3000,
        "x-stream-max-segment-size-bytes": 1000})
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    conn.channel().queue_delete(name)
    conn.close()


def body(i: int) -> bytes:
    return b"%05d" % i + b"x" * 95


def publish(url: str, name: str, a: int, b: int) -> None:
    streamhelp.publish(url, name, [body(i) for i in range(a, b)])


def _probe(url: str, name: str) -> tuple[int | None, int | None]:
    """(first, last) offsets; None when the stream holds no message (RabbitMQ's
    retention can leave only a segment without messages) or when RabbitMQ's reader
    fails while retention deletes a segment under it (541)."""
    try:
        return first_offset(url, name, 3.0), last_offset(url, name, 3.0)
    except ConsumerError:
        return None, None


def drop_past(url: str, name: str, offset: int, start: int) -> int:
    """Publish until retention removed every offset up to `offset`, then until the
    stream settles with messages in it (RabbitMQ applies retention asynchronously): the
    stream's first offset then."""
    deadline = time.monotonic() + 40
    n = start
    seen: tuple[int | None, int | None] = (None, None)
    while time.monotonic() < deadline:
        now = _probe(url, name)
        if now[0] is None or now[0] <= offset:
            publish(url, name, n, n + 40 if now[0] is not None else n + 2)
            n += 40 if now[0] is not None else 2
            seen = (None, None)
            continue
        if now == seen:
            return now[0]
        seen = now
        time.sleep(0.5)
    raise AssertionError(f"retention did not pass offset {offset}, or the stream did not "
                         "settle")


def options(url: str, name: str, **extra: str) -> dict[str, str]:
    return {"url": url, "stream": name, "minPartitions": "2", **extra}


def rows(reader: Any, part: StreamRange) -> list[tuple[int, bytes]]:
    out = []
    for batch in reader.read(part):
        d = batch.to_pydict()
        out += list(zip(d["stream_offset"], d["body"], strict=True))
    return out


def test_R4_task_fails_when_retention_removed_its_planned_range(
        stream_url: str, small: str, read_protocol: dict[str, str]) -> None:
    publish(stream_url, small, 0, 5)
    reader = AckmqStreamBatchReader(options(stream_url, small, **read_protocol))
    parts = reader.partitions()  # planned while everything is there
    assert parts[0].start == 0 and len(parts) == 2
    drop_past(stream_url, small, parts[-1].end, 5)
    for p in parts:
        with pytest.raises(DataLossError) as e:
            rows(reader, p)  # type: ignore[arg-type]
        assert e.value.start == p.start and e.value.end == p.end  # the whole range
        assert str(e.value).startswith(
            f"data loss on stream '{small}': offsets [{p.start}, {p.end}) of the range "
            f"[{p.start}, {p.end}) are no longer in the stream")
        assert "failOnDataLoss=false" in str(e.value)


def test_R4_task_goes_on_from_what_is_left_without_failOnDataLoss(
        stream_url: str, small: str, caplog: pytest.LogCaptureFixture,
        read_protocol: dict[str, str]) -> None:
    publish(stream_url, small, 0, 5)
    first = drop_past(stream_url, small, 2, 5)  # the head went, the tail is there
    last = last_offset(stream_url, small, 3.0)
    assert last is not None
    reader = AckmqStreamBatchReader(options(stream_url, small, failOnDataLoss="false",
                                            **read_protocol))
    with caplog.at_level(logging.WARNING, logger="ackmq.spark.stream"):
        got = rows(reader, StreamRange(0, last + 1))  # a range planned before the loss
    assert got and got[0][0] == first  # from the oldest message on
    assert [o for o, _b in got] == sorted(set(o for o, _b in got)) and got[-1][0] == last
    n0 = int(got[0][1][:5])
    assert [b for _o, b in got] == [body(i) for i in range(n0, n0 + len(got))]
    warned = [r.getMessage() for r in caplog.records if r.name == "ackmq.spark.stream"]
    assert len(warned) == 1 and warned[0].startswith(
        f"data loss on stream '{small}': offsets [0, {first}) of the range [0, {last + 1})")
    assert "going on from offset" in warned[0]
    # the same range, failing by default
    with pytest.raises(DataLossError):
        rows(AckmqStreamBatchReader(options(stream_url, small, **read_protocol)),
             StreamRange(0, last + 1))


def test_R4_planning_finds_a_start_older_than_the_stream(stream_url: str, small: str,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    publish(stream_url, small, 0, 5)
    first = drop_past(stream_url, small, 2, 5)
    last = last_offset(stream_url, small, 3.0)
    assert last is not None
    # a checkpoint's start (offset 1) the stream no longer holds
    src = AckmqStreamSourceReader(options(stream_url, small))
    with pytest.raises(DataLossError) as e:
        src.partitions({"offset": 1}, {"offset": last + 1})
    assert (e.value.start, e.value.end, e.value.first) == (1, first, first)
    # a numeric startingOffsets of a batch read, likewise
    with pytest.raises(DataLossError):
        AckmqStreamBatchReader(options(stream_url, small, startingOffsets="1")).partitions()
    # without failOnDataLoss the plan starts at the oldest message, with a warning
    src = AckmqStreamSourceReader(options(stream_url, small, failOnDataLoss="false"))
    with caplog.at_level(logging.WARNING, logger="ackmq.spark.stream"):
        parts = src.partitions({"offset": 1}, {"offset": last + 1})
    assert parts[0].start == first and parts[-1].end == last + 1  # type: ignore[attr-defined]
    assert any(r.getMessage().startswith(f"data loss on stream '{small}': offsets [1, {first})")
               for r in caplog.records)
    # a start the stream still holds plans as before, without a probe's verdict of loss
    parts = AckmqStreamSourceReader(options(stream_url, small)).partitions(
        {"offset": first}, {"offset": last + 1})
    assert parts[0].start == first  # type: ignore[attr-defined]


def test_R4_no_loss_reported_for_a_range_read_in_time(stream_url: str, small: str,
                                                      read_protocol: dict[str, str]) -> None:
    """Ranges starting anywhere in what is retained (on RabbitMQ also on the offsets its
    tracking chunks take, which no consumer is given) are read without a loss."""
    publish(stream_url, small, 0, 5)
    drop_past(stream_url, small, 2, 5)  # gaps on RabbitMQ, and a head that is gone
    first, last = first_offset(stream_url, small, 3.0), last_offset(stream_url, small, 3.0)
    assert first is not None and last is not None
    reader = AckmqStreamBatchReader(options(stream_url, small, **read_protocol))
    seen = rows(reader, StreamRange(first, last + 1))
    for start in range(first, last + 1):
        assert rows(reader, StreamRange(start, last + 1)) == [m for m in seen if m[0] >= start]


def test_R4_failOnDataLoss_must_be_a_boolean(stream_url: str, small: str) -> None:
    with pytest.raises(ValueError, match="failOnDataLoss must be true or false, got 'maybe'"):
        AckmqStreamBatchReader(options(stream_url, small, failOnDataLoss="maybe"))


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")
    from ackmq.spark.pipeline import spark_session

    s = spark_session("ackmq-stream-loss-tests")
    yield s
    s.stop()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_R4_spark_query_fails_or_goes_on_after_data_loss(stream_url: str, small: str,
                                                         spark: Any, tmp_path: Path) -> None:
    """Under Spark: a batch read and a streaming query whose start retention removed fail
    with the message (default), or land what is left with failOnDataLoss=false."""
    publish(stream_url, small, 0, 5)
    first = drop_past(stream_url, small, 2, 5)
    last = last_offset(stream_url, small, 3.0)
    assert last is not None

    def read(**opts: str) -> Any:
        r = spark.read.format("ackmq").option("url", stream_url).option("stream", small)
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(Exception, match=rf"data loss on stream '{small}': offsets \[1, {first}\)"):
        read(startingOffsets="1").collect()
    got = read(startingOffsets="1", failOnDataLoss="false").orderBy("stream_offset").collect()
    assert got[0].stream_offset == first and got[-1].stream_offset == last

    def land(**opts: str) -> Any:
        r = (spark.readStream.format("ackmq").option("url", stream_url).option("stream", small)
             .option("startingOffsets", "1"))
        for k, v in opts.items():
            r = r.option(k, v)
        name = "ok" if opts else "fail"
        return (r.load().writeStream.format("parquet").option("path", str(tmp_path / name))
                .option("checkpointLocation", str(tmp_path / f"chk-{name}"))
                .trigger(availableNow=True).start())

    q = land()
    with pytest.raises(Exception, match=rf"data loss on stream '{small}'"):
        q.awaitTermination(120)
    q = land(failOnDataLoss="false")
    q.awaitTermination(120)
    t = read_committed(tmp_path / "ok", ["stream_offset"])
    assert t is not None
    offs = sorted(t.column("stream_offset").to_pylist())
    assert offs[0] == first and offs[-1] == last


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
# ackmq only: two Spark drivers for the CLI's flag, which reaches the source as the option
# whose effect on RabbitMQ's retention the in-process tests above check on both brokers
@pytest.mark.parametrize("stream_url", ["ackmq"], indirect=True)
def test_R4_pipeline_land_fail_on_data_loss_flag(stream_url: str, small: str,
                                                 tmp_path: Path) -> None:
    """`pipeline land --stream` from a start retention removed: one line and exit 1;
    with --fail-on-data-loss false it lands what is left."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")
    publish(stream_url, small, 0, 5)
    first = drop_past(stream_url, small, 2, 5)

    def land(*extra: str) -> subprocess.CompletedProcess[str]:
        name = "ok" if extra else "fail"
        return subprocess.run(
            [sys.executable, "-m", "ackmq.spark", "pipeline", "land", "--url", stream_url,
             "--stream", small, "--starting-offsets", "1", "--available-now",
             "--to", str(tmp_path / name), "--checkpoint", str(tmp_path / f"chk-{name}"),
             *extra], capture_output=True, text=True, timeout=240)

    r = land()
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "pipeline land failed" in ln]
    assert len(lines) == 1 and f"data loss on stream '{small}': offsets [1, {first})" in lines[0]
    r = land("--fail-on-data-loss", "false")
    assert r.returncode == 0, r.stderr[-2000:]
    t = read_committed(tmp_path / "ok", ["stream_offset"])
    assert t is not None and min(t.column("stream_offset").to_pylist()) == first
