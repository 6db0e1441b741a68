"""S7: where a queue source's staged batches live, and what its read tasks carry.

Driven by hand the way Spark drives the reader (no JVM): a read task is pickled as Spark
pickles it for an executor, and read after the staging directory is gone.
"""

from __future__ import annotations

import pickle
import shutil
import uuid

import pika
import pytest

pytestmark = [pytest.mark.spark]
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")

from test_spark_reader import drain, next_batch, publish, queue_state, rows  # noqa: E402

from ackmq.spark.source import AckmqStreamReader  # noqa: E402


@pytest.fixture
def queue(broker_url: str):
    name = f"spark.staging.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_delete(name)
    conn.close()


def _reader(url: str, queue: str, staging: str) -> AckmqStreamReader:
    return AckmqStreamReader({"url": url, "queue": queue, "stagingLocation": staging,
                              "maxMessagesPerTrigger": "300", "numPartitions": "3"})


def test_S7_read_tasks_carry_their_rows_not_a_path(broker_url, queue, tmp_path):
    """Before S7 a read task held the staged file's path, which an executor on another
    host cannot open (FileNotFoundError once the directory is not there)."""
    publish(broker_url, queue, range(300))
    staging = tmp_path / "staging"
    r = _reader(broker_url, queue, str(staging))
    try:
        start = r.initialOffset()
        end = next_batch(r, start, 300)
        tasks = [pickle.dumps(p) for p in r.partitions(start, end)]
        assert tasks  # one per 1,000 rows at most: one here
        shutil.rmtree(staging)  # the executor's host has no such directory
        got = [int(b) for t in tasks for rb in r.read(pickle.loads(t))
               for b in rb.column("body").to_pylist()]
        assert got == list(range(300))
    finally:
        r.stop()


@pytest.mark.parametrize("kind", ["path", "uri"])
def test_S7_a_restarted_driver_replays_the_batch_from_the_staging_location(
        broker_url, queue, tmp_path, kind):
    """Reader A stages and Spark logs a batch, then A dies; reader B (a restarted driver)
    replays it from the staged copy, found by a local path or through pyarrow.fs by URI
    (`file://` here; `hdfs://`, `s3://`, `gs://` take the same code)."""
    publish(broker_url, queue, range(500))
    where = tmp_path / "chk" / "ackmq-staging"
    location = where.as_uri() if kind == "uri" else str(where)
    a = _reader(broker_url, queue, location)
    start = a.initialOffset()
    logged = next_batch(a, start, 300)
    assert sorted(p.name for p in where.iterdir() if p.suffix == ".arrow") == \
        [f"b-{0:020d}-{300:020d}.arrow"]  # staged where the location says
    assert a._consumer is not None
    a._consumer._stop.set()  # crash: the connection goes away without an ack
    a._consumer._thread.join(5)
    b = _reader(broker_url, queue, location)
    try:
        landed = rows(b, start, logged)  # Spark replays the logged batch
        assert landed == list(range(300))
        drain(b, logged, landed, 300, 500)  # the next batches ack the first
        assert sorted(landed) == list(range(500))
        assert not [p for p in where.iterdir() if p.suffix == ".arrow"]  # settled, removed
    finally:
        b.stop()
    assert queue_state(broker_url, queue) == (0, 0)


def test_S7_staging_through_pyarrow_fs(tmp_path):
    """The pyarrow.fs implementation (HDFS, S3, GCS by URI), here on the local file
    system by URI: write, list, read back, ids, status, remove."""
    import pyarrow as pa

    from ackmq.spark.staging import FsStagingDir, Staged

    d = FsStagingDir((tmp_path / "st").as_uri())
    table = pa.table({"body": [b"a", b"b", b"c"]})
    d.write(0, 3, table, ["m-1", "m-2"])
    d.write(3, 4, table.slice(0, 1), [])
    assert d.batches() == [Staged(0, 3), Staged(3, 4)]
    assert d.batches("ids") == [Staged(0, 3)]
    assert d.exists(0, 3) and not d.exists(4, 5)
    assert d.read(0, 3).equals(table) and d.num_rows(3, 4) == 1
    assert d.ids(Staged(0, 3)) == ["m-1", "m-2"] and d.ids(Staged(3, 4)) == []
    d.write_status({"unacked": 4})
    assert d.read_status() == {"unacked": 4}
    d.clear_status()
    assert d.read_status() is None
    d.remove(Staged(0, 3))
    assert d.batches() == [Staged(3, 4)]
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == [
        f"b-{0:020d}-{3:020d}.ids", f"b-{3:020d}-{4:020d}.arrow"]  # no .tmp left behind
