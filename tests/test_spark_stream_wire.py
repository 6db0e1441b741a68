"""R4, the AMQP side of the Spark stream source (no JVM): offset probes and range reads
against ackmq and RabbitMQ's streams, and what happens on a queue that is not a stream."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pika
import pytest

pytest.importorskip("pyarrow", reason="the Spark connector needs pyarrow (extra 'spark')")

from support import streamhelp  # noqa: E402
from support.streamhelp import publish  # noqa: E402

from ackmq.spark.amqp import ConsumerError  # noqa: E402
from ackmq.spark.streamwire import (  # noqa: E402
    first_offset,
    last_offset,
    offset_at,
    read_range,
)

stream_url = streamhelp.stream_url  # fixtures: ackmq and RabbitMQ, skipped without streams
stream = streamhelp.stream


def _offsets(url: str, name: str, start: int, end: int) -> list[tuple[int, bytes]]:
    return [(d.offset, d.body) for batch in read_range(url, name, start, end, prefetch=64,
                                                       rows=100) for d in batch]


def test_R4_probes_of_an_empty_stream(stream_url: str, stream: str) -> None:
    assert first_offset(stream_url, stream) is None
    assert last_offset(stream_url, stream) is None


def test_R4_first_last_and_ranges(stream_url: str, stream: str) -> None:
    publish(stream_url, stream, [b"%d" % i for i in range(1000)])
    first, last = first_offset(stream_url, stream), last_offset(stream_url, stream)
    assert first == 0 and last is not None and last >= 999
    everything = _offsets(stream_url, stream, 0, last + 1)
    assert [b for _, b in everything] == [b"%d" % i for i in range(1000)]
    offs = [o for o, _ in everything]
    assert offs == sorted(set(offs)) and offs[-1] == last
    # any split into ranges reads every message exactly once, in order
    cuts = [0, 1, 137, 500, 501, 999, last + 1]
    parts = [m for a, b in zip(cuts, cuts[1:], strict=False)
             for m in _offsets(stream_url, stream, a, b)]
    assert parts == everything
    # reading a range twice gives the same messages (R3); a range starting mid-chunk
    # holds no earlier offset
    assert _offsets(stream_url, stream, 250, 260) == _offsets(stream_url, stream, 250, 260)
    assert [o for o, _ in _offsets(stream_url, stream, 250, 260)] == \
        [o for o in offs if 250 <= o < 260]


def test_R4_offset_at_a_timestamp(stream_url: str, stream: str) -> None:
    publish(stream_url, stream, [b"old"])
    time.sleep(2.1)  # AMQP timestamps have seconds: leave a whole second between
    when = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=0.5)
    time.sleep(0.6)
    publish(stream_url, stream, [b"new-0", b"new-1"])
    at = offset_at(stream_url, stream, when)
    assert at is not None
    assert [b for _, b in _offsets(stream_url, stream, at, last_offset(stream_url, stream) + 1)
            ] == [b"new-0", b"new-1"]
    assert offset_at(stream_url, stream, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)) \
        is None


def test_R4_a_classic_queue_is_refused_and_keeps_its_messages(stream_url: str) -> None:
    name = f"spark.classic.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    try:
        publish(stream_url, name, [b"keep-me"])
        with pytest.raises(ConsumerError, match="x-stream-offset|not a stream"):
            list(read_range(stream_url, name, 0, 10))
        deadline = time.monotonic() + 10
        while ch.queue_declare(name, passive=True).method.message_count != 1 \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ch.queue_declare(name, passive=True).method.message_count == 1
    finally:
        ch.queue_delete(name)
        conn.close()


def test_R4_missing_stream_fails_with_404(stream_url: str) -> None:
    with pytest.raises(ConsumerError, match="404 NOT_FOUND - no queue 'spark.nosuch"):
        first_offset(stream_url, "spark.nosuch.stream")


def test_R4_cli_refuses_a_missing_stream_and_a_classic_queue(stream_url: str,
                                                             tmp_path) -> None:
    """`pipeline land --stream` checks before Spark starts: one line, exit 1; a classic
    queue keeps its message."""
    import subprocess
    import sys

    name = f"spark.classic.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(stream_url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    try:
        publish(stream_url, name, [b"keep-me"])
        for target, expect in (("spark.nosuch.stream", "404 NOT_FOUND - no queue"),
                               (name, "x-stream-offset")):
            p = subprocess.run(
                [sys.executable, "-m", "ackmq", "pipeline", "land", "--url", stream_url,
                 "--stream", target, "--to", str(tmp_path / "lake"),
                 "--checkpoint", str(tmp_path / "chk")],
                capture_output=True, text=True, timeout=60)
            lines = p.stderr.strip().splitlines()
            assert p.returncode == 1 and len(lines) == 1, p.stderr
            assert lines[0].startswith("ackmq pipeline land: ") and expect in lines[0], lines
        time.sleep(0.5)
        assert ch.queue_declare(name, passive=True).method.message_count == 1
    finally:
        ch.queue_delete(name)
        conn.close()
