"""S5: with no maxMessagesPerTrigger a queue source's batch is what is available, bounded
by half the prefetch window and by maxBytesPerTrigger (no JVM: driven by hand)."""

from __future__ import annotations

import time
import uuid

import pika
import pytest

pytestmark = [pytest.mark.spark]
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")

from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402
from test_spark_reader import publish, queue_state, rows  # noqa: E402

from ackmq.spark.source import MAX_PREFETCH, AckmqStreamReader  # noqa: E402


@pytest.fixture
def queue(broker_url: str):
    name = f"spark.sizing.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_delete(name)
    conn.close()


def _batches(r: AckmqStreamReader, n: int, first: int = 0) -> list[int]:
    """Run batches with the reader's default limit until bodies first..first+n-1 landed;
    returns the batch sizes."""
    start, sizes, landed = r.initialOffset(), [], []
    deadline = time.monotonic() + 30
    while len(landed) < n and time.monotonic() < deadline:
        end = r.latestOffset(start, r.getDefaultReadLimit())
        if end == start:
            time.sleep(0.2)
            continue
        got = rows(r, start, end)
        sizes.append(len(got))
        landed += got
        start = end
    assert sorted(landed) == list(range(first, first + n))
    assert r.latestOffset(start, r.getDefaultReadLimit()) == start  # acks the last batch
    return sizes


def test_S5_default_batch_is_what_is_buffered_up_to_half_the_window(broker_url, queue):
    publish(broker_url, queue, range(3000))
    r = AckmqStreamReader({"url": broker_url, "queue": queue, "prefetch": "2000"})
    assert isinstance(r.getDefaultReadLimit(), ReadAllAvailable)
    assert AckmqStreamReader({"queue": queue}).prefetch == MAX_PREFETCH
    try:
        r._ensure()
        deadline = time.monotonic() + 20
        while r._consumer is not None and r._consumer.buffered() < 2000:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sizes = _batches(r, 3000)
        assert sizes[0] == 1000 and max(sizes) == 1000  # half the window, not 10,000
    finally:
        r.stop()
    assert queue_state(broker_url, queue) == (0, 0)


def test_S5_max_bytes_per_trigger_bounds_a_batch(broker_url, queue):
    publish(broker_url, queue, range(1000, 1600))  # bodies of 4 bytes
    r = AckmqStreamReader({"url": broker_url, "queue": queue, "maxBytesPerTrigger": "400"})
    try:
        sizes = _batches(r, 600, 1000)
        assert max(sizes) == 100 and len(sizes) >= 6  # 400 bytes: 100 bodies of 4 bytes
    finally:
        r.stop()



def test_S5_available_now_first_batch_is_not_what_arrived_first(broker_url, queue):
    """AvailableNow with default sizing: the first batch is the window's half, not the
    few deliveries that had arrived when Spark first asked (a small batch costs a
    whole micro-batch's overhead)."""
    publish(broker_url, queue, range(3000))
    r = AckmqStreamReader({"url": broker_url, "queue": queue, "prefetch": "2000"})
    try:
        r.prepareForTriggerAvailableNow()
        start = r.initialOffset()
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert end["n"] == 1000
    finally:
        r.stop()
