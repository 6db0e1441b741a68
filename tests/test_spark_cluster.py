"""S6-S8: the connector on a Spark standalone cluster whose workers share no /tmp.

The cluster (tests/support/sparkcluster.py) is a master and two one-core workers from
PySpark's own `spark-class`, each worker in a private /tmp (mount namespace): a file the
driver writes under its temp dir does not exist for the executors, as on other hosts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")

from support.sparkcluster import SparkCluster, spark_cluster  # noqa: E402, F401
from support.streamhelp import stream_support  # noqa: E402

from ackmq.spark.lake import read_committed  # noqa: E402

SUPPORT = Path(__file__).parent / "support"


@pytest.fixture
def work(spark_cluster: SparkCluster) -> Iterator[Path]:
    """A directory every process of the cluster sees (not under /tmp)."""
    d = spark_cluster.shared / uuid.uuid4().hex[:8]
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _declare(url: str, name: str, stream: bool = False) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    args = {"x-queue-type": "stream"} if stream else None
    conn.channel().queue_declare(name, durable=True, arguments=args)
    conn.close()


def _delete(url: str, *names: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for name in names:
        ch.queue_delete(name)
    conn.close()


def _bodies(table_dir: Path) -> list[int]:
    table = read_committed(table_dir, ["body"])
    return [] if table is None else [int(b) for b in table.column("body").to_pylist()]


@pytest.mark.timeout(600)
def test_S6_S7_source_stream_source_and_sink_used_directly_on_a_cluster(
        broker_url: str, spark_cluster: SparkCluster, work: Path) -> None:
    """`spark.readStream.format("ackmq")` with default options, as the docs show it, on
    the cluster: the sink publishes 3,000 rows to a queue and to a stream, the queue
    source and the stream source land them exactly once.

    Fails on the code before S7 (commit 78f9668): the queue source staged each batch
    under the driver's temp dir (`/tmp/ackmq-spark/<key>/b-...arrow`) and its read tasks
    opened that path on the executors: `FileNotFoundError: [Errno 2] Failed to open local
    file '/tmp/ackmq-spark/027dec4ecf8f2559/b-00000000000000000000-00000000000000001000.arrow'`
    (every retry of the task, then the query stops). Now the rows travel in the read task.
    """
    why = stream_support(broker_url)
    if why is not None:
        pytest.skip(f"the broker has no stream queues: {why}")
    queue, stream, n = f"cluster.q.{uuid.uuid4().hex[:6]}", f"cluster.s.{uuid.uuid4().hex[:6]}", 3000
    _declare(broker_url, queue)
    _declare(broker_url, stream, stream=True)
    try:
        r = subprocess.run([sys.executable, str(SUPPORT / "cluster_direct.py"), broker_url,
                            spark_cluster.url, str(work), queue, stream, str(n)],
                           env=spark_cluster.env, capture_output=True, text=True, timeout=540)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        assert lines, f"driver printed no result (rc {r.returncode}):\n{r.stderr[-3000:]}"
        out = json.loads(lines[-1])
        assert "error" not in out, out["error"]
        for kind in ("queue", "stream"):
            bodies = _bodies(work / f"lake-{kind}")
            assert sorted(bodies) == list(range(n)), f"{kind}: {len(bodies)} rows, " \
                f"{len(bodies) - len(set(bodies))} twice, {n - len(set(bodies))} missing"
    finally:
        _delete(broker_url, queue, stream)
