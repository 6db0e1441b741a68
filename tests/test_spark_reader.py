"""The stream reader's protocol, driven by hand the way Spark drives it (no JVM needed).

Spark calls latestOffset -> (logs the offset) -> partitions -> read (executors) ->
commits the sink -> latestOffset(next start) ...; these tests make the same calls,
and "crash" a reader by closing its connection without acking.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark]
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")

from conftest import rabbitmq_url  # noqa: E402
from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: E402

from ackmq.spark.amqp import ConsumerError, QueueConsumer  # noqa: E402
from ackmq.spark.pipeline import held_by_reader, queue_backlog  # noqa: E402
from ackmq.spark.source import AckmqStreamReader  # noqa: E402


@pytest.fixture
def queue(broker_url: str):
    name = f"spark.reader.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_delete(name)
    conn.close()


def publish(url: str, queue: str, bodies: range, with_ids: bool = False) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in bodies:
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(
            delivery_mode=2, message_id=f"m-{i}" if with_ids else None))
    conn.close()


def queue_state(url: str, queue: str) -> tuple[int, int]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = conn.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


def reader(url: str, queue: str, staging: Path, max_per_trigger: int = 100) -> AckmqStreamReader:
    return AckmqStreamReader({"url": url, "queue": queue, "stagingLocation": str(staging),
                              "maxMessagesPerTrigger": str(max_per_trigger)})


def next_batch(r: AckmqStreamReader, start: dict, want: int, timeout: float = 10.0) -> dict:
    """latestOffset until it admits something (deliveries arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        end = r.latestOffset(start, ReadMaxRows(want))
        if end != start or time.monotonic() > deadline:
            return end
        time.sleep(0.05)


def rows(r: AckmqStreamReader, start: dict, end: dict) -> list[int]:
    """What Spark's executors would read for the batch (start, end]."""
    out: list[int] = []
    for p in r.partitions(start, end):
        for rb in r.read(p):
            out.extend(int(b) for b in rb.column("body").to_pylist())
    return out


def drain(r: AckmqStreamReader, start: dict, landed: list[int], limit: int,
          expect: int) -> dict:
    """Run batches until `expect` rows have landed (30 s at most), then let the reader
    ack the last one, as Spark's next latestOffset call does."""
    deadline = time.monotonic() + 30
    while len(landed) < expect and time.monotonic() < deadline:
        end = next_batch(r, start, limit, timeout=1.0)
        if end == start:
            continue
        batch = rows(r, start, end)
        assert 0 < len(batch) <= limit  # S5: the cap holds
        landed.extend(batch)
        start = end
    assert r.latestOffset(start, ReadMaxRows(limit)) == start  # nothing more, acks the last
    return start


def test_S5_batches_are_capped_and_prefetch_bounds_the_buffer(broker_url, queue, tmp_path):
    publish(broker_url, queue, range(1000))
    r = reader(broker_url, queue, tmp_path, max_per_trigger=150)
    try:
        start = r.initialOffset()
        landed: list[int] = []
        for _ in range(3):
            end = next_batch(r, start, 150)
            assert r._consumer is not None and r._consumer.buffered() <= r.prefetch
            landed.extend(rows(r, start, end))
            start = end
        assert len(landed) == 450
        start = drain(r, start, landed, 150, 1000)
        assert sorted(landed) == list(range(1000))
        assert queue_state(broker_url, queue) == (0, 1)  # all acked, consumer still there
    finally:
        r.stop()


def test_S1_idle_stream_acks_the_last_batch(broker_url, queue, tmp_path):
    publish(broker_url, queue, range(10))
    r = reader(broker_url, queue, tmp_path)
    try:
        start = r.initialOffset()
        end = next_batch(r, start, 100)
        assert rows(r, start, end) == list(range(10))
        assert r.latestOffset(end, ReadMaxRows(100)) == end  # idle: Spark never commits
    finally:
        r.stop()
    assert queue_state(broker_url, queue) == (0, 0)  # still acked: nothing came back


@pytest.fixture(params=["ackmq", "rabbitmq"])
def either_url(request: pytest.FixtureRequest) -> str:
    """ackmq, then the reference RabbitMQ (skipped when it is not running)."""
    return request.getfixturevalue("broker_url") if request.param == "ackmq" else rabbitmq_url()


def test_S1_available_now_budget_is_the_whole_queue_at_the_start(either_url, tmp_path):
    """Trigger.AvailableNow lands what the queue holds when the query starts. A count read
    after basic.consume is off by the deliveries on their way to the reader: RabbitMQ
    answers the passive declare ahead of them (1 start in 3 was off, by up to 400 with
    3,000 messages and prefetch 800), and a run ended with the queue's tail left behind."""
    url, queue, n = either_url, f"spark.budget.{uuid.uuid4().hex[:8]}", 3000
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(queue, durable=True)
    publish(url, queue, range(n))
    for i in range(10):
        r = reader(url, queue, tmp_path / f"s{i}", max_per_trigger=400)
        try:
            r.prepareForTriggerAvailableNow()
            assert r._remaining == n, f"start {i}"
        finally:
            r.stop()
        deadline = time.monotonic() + 10
        while queue_state(url, queue) != (n, 0) and time.monotonic() < deadline:
            time.sleep(0.05)  # the broker requeues what the stopped reader held
    conn.channel().queue_delete(queue)
    conn.close()


def test_S1_unlogged_batch_is_given_back_in_the_same_process(broker_url, queue, tmp_path):
    publish(broker_url, queue, range(30))
    r = reader(broker_url, queue, tmp_path)
    try:
        start = r.initialOffset()
        lost = next_batch(r, start, 10)  # Spark did not log this one (e.g. query stopping)
        end = r.latestOffset(start, ReadMaxRows(100))
        assert rows(r, start, end)[:10] == list(range(10))
        assert lost != end
    finally:
        r.stop()


@pytest.mark.parametrize("crash_after", ["staged", "committed"])
def test_S2_restart_after_crash_lands_nothing_twice(broker_url, queue, tmp_path, is_rabbitmq,
                                                    crash_after):
    """Reader A dies holding a logged batch (committed or not) and an unlogged one."""
    publish(broker_url, queue, range(500), with_ids=is_rabbitmq)  # RabbitMQ needs the ids
    landed: list[int] = []
    a = reader(broker_url, queue, tmp_path, max_per_trigger=100)
    start = a.initialOffset()
    logged = next_batch(a, start, 100)
    if crash_after == "committed":
        landed.extend(rows(a, start, logged))  # the sink committed batch 0 ...
    a.latestOffset(logged, ReadMaxRows(100)) if crash_after == "committed" else None
    # ... A acked batch 0 (committed case) and staged batch 1, which Spark never logged.
    assert a._consumer is not None
    a._consumer._stop.set()  # crash: the connection goes away without further acks
    a._consumer._thread.join(5)
    b = reader(broker_url, queue, tmp_path, max_per_trigger=100)
    try:
        if crash_after == "staged":
            landed.extend(rows(b, start, logged))  # Spark replays the logged batch 0
        drain(b, logged, landed, 100, 500)
        assert sorted(landed) == list(range(500))
        assert queue_state(broker_url, queue)[0] == 0
    finally:
        b.stop()
    assert queue_state(broker_url, queue) == (0, 0)


def test_S2_broker_sigkill_mid_stream_lands_nothing_twice(tmp_path):
    """The broker (ackmq) is SIGKILLed while the reader holds staged, unacked batches."""
    from conftest import BrokerProcess

    broker = BrokerProcess(tmp_path / "data")
    url = broker.start()
    try:
        q = "spark.broker-kill"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare(q, durable=True)
        conn.close()
        publish(url, q, range(300))
        r = reader(url, q, tmp_path / "staging", max_per_trigger=100)
        try:
            start = r.initialOffset()
            landed: list[int] = []
            end0 = next_batch(r, start, 100)
            landed.extend(rows(r, start, end0))      # batch 0 committed by the sink
            end1 = next_batch(r, end0, 100)           # batch 0 acked, batch 1 logged
            broker.kill()
            broker = BrokerProcess(tmp_path / "data", port=broker.port)
            broker.start()
            landed.extend(rows(r, end0, end1))        # batch 1 runs from its staged file
            drain(r, end1, landed, 100, 300)
            assert sorted(landed) == list(range(300))
        finally:
            r.stop()
        assert queue_state(url, q) == (0, 0)
    finally:
        broker.stop()


def test_S5_progress_counts_what_the_reader_holds_not_only_the_ready_messages(
        broker_url, queue, tmp_path):
    """The progress line's backlog: ready in the broker + held by the reader (its prefetch,
    2 x maxMessagesPerTrigger, delivered and unacked) minus what is in committed batches."""
    publish(broker_url, queue, range(1000))
    r = reader(broker_url, queue, tmp_path, max_per_trigger=100)  # prefetch 200

    def to_land(committed: int) -> tuple[int | None, int | None]:
        deadline = time.monotonic() + 5  # until the prefetch window has refilled
        while r._consumer is not None and r._consumer.unacked() < 200:
            assert time.monotonic() < deadline, r._consumer.unacked()
            time.sleep(0.02)
        time.sleep(0.3)  # the reader rewrites its status within 0.1 s of a change
        return queue_backlog(broker_url, queue), held_by_reader(str(tmp_path), committed)

    try:
        start = r.initialOffset()
        end1 = next_batch(r, start, 100)
        assert to_land(0) == (800, 200)      # batch 1 staged, not committed: all 1000 to land
        rows(r, start, end1)
        assert to_land(100) == (800, 100)    # batch 1 committed (not acked yet): 900
        end2 = next_batch(r, end1, 100)      # acks batch 1, stages batch 2
        assert to_land(100) == (700, 200)
        rows(r, end1, end2)
        assert to_land(200) == (700, 100)    # 800 still to land; the old line said 700
    finally:
        r.stop()


def test_consumer_fails_fast_on_permanent_errors(broker_url, queue):
    bad_login = broker_url.replace("guest:guest@", "guest:wrong@")
    for url, q, expect in [(broker_url, "no.such.queue", "404 NOT_FOUND"),
                           (bad_login, queue, "403 ACCESS_REFUSED")]:
        c = QueueConsumer(url, q, 10, connect_timeout=60)
        t0 = time.monotonic()
        with pytest.raises(ConsumerError, match=expect) as err:
            c.start()
        assert time.monotonic() - t0 < 5, "retried a permanent error"
        assert "guest:" not in str(err.value)  # no credentials in messages


def test_consumer_keeps_retrying_while_the_broker_is_down(tmp_path):
    """Connection refused is transient: start() waits for the broker to come back."""
    from conftest import BrokerProcess

    broker = BrokerProcess(tmp_path / "data")
    url = broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare("back", durable=True)
    conn.close()
    broker.stop()
    c = QueueConsumer(url, "back", 10, connect_timeout=30)
    started: list[BaseException | None] = []

    def start() -> None:
        try:
            c.start()
            started.append(None)
        except BaseException as exc:  # noqa: BLE001
            started.append(exc)

    t = threading.Thread(target=start, daemon=True)
    t.start()
    try:
        time.sleep(1.5)
        assert not started, started  # still retrying, not failed
        broker = BrokerProcess(tmp_path / "data", port=broker.port)
        broker.start()
        t.join(20)
        assert started == [None]
    finally:
        c.close()
        broker.stop()


@pytest.mark.parametrize("case", ["land-no-queue", "publish-no-exchange", "land-bad-login"])
def test_cli_prints_one_line_and_exits_nonzero_on_a_permanent_error(broker_url, tmp_path, case):
    """`ackmq pipeline` checks the queue/exchange before starting Spark: one line saying
    what failed and what to fix, exit 1, no traceback, within seconds."""
    base = [sys.executable, "-m", "ackmq", "pipeline"]
    land = ["land", "--to", str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "chk")]
    cmd, expect = {
        "land-no-queue": (base + land + ["--url", broker_url, "--queue", "no.such.queue"],
                          "404 NOT_FOUND - no queue 'no.such.queue'"),
        "publish-no-exchange": (base + ["publish", "--from", str(tmp_path / "t.parquet"),
                                        "--url", broker_url, "--exchange", "no.such.exchange"],
                                "404 NOT_FOUND - no exchange 'no.such.exchange'"),
        "land-bad-login": (base + land + ["--queue", "q", "--url",
                                          broker_url.replace("guest:guest@", "guest:wrong@")],
                           "403 ACCESS_REFUSED"),
    }[case]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"ackmq pipeline {cmd[4]}: ")
    assert time.monotonic() - t0 < 30
