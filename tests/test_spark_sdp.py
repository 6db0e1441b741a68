"""S9: ackmq queues and streams as streaming tables of a Spark Declarative Pipelines project
written by `ackmq pipeline init`, run by Spark's own `spark-pipelines run`."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
pytest.importorskip("pyspark.pipelines", reason="needs PySpark >= 4.1 (Spark Declarative Pipelines)")
pytest.importorskip("yaml", reason="spark-pipelines needs pyyaml and the Spark Connect client "
                    "(pip install 'pyspark[pipelines]')")
pytest.importorskip("grpc", reason="spark-pipelines needs the Spark Connect client "
                    "(pip install 'pyspark[pipelines]')")

from support.streamhelp import stream_support  # noqa: E402

from ackmq.spark.lake import read_committed  # noqa: E402

SPARK_PIPELINES = Path(sys.executable).with_name("spark-pipelines")


def _run(project: Path, log: Path) -> subprocess.Popen[bytes]:
    """`spark-pipelines run` in the project, Spark's defaults from the test's conf dir."""
    conf = project / "conf"  # as `ackmq pipeline init` wrote it, plus the lines below
    written = (conf / "spark-defaults.conf").read_text()
    (conf / "spark-defaults.conf").write_text(
        written.split("# the test's\n")[0] + "# the test's\n"
        "spark.python.authenticate.socketTimeout 120s\n"
        # Spark waits 10 s (fixed) for a data source's planner worker to connect back; at
        # load 18 three flows starting their workers at once missed it: one at a time,
        # and more than SDP's default 2 retries of a failed flow
        "spark.sql.pipelines.execution.maxConcurrentFlows 1\n"
        "spark.sql.pipelines.maxFlowRetryAttempts 8\n"
        "spark.ui.enabled false\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_CONF_DIR=str(conf))
    out = open(log, "ab")  # noqa: SIM115 - the child keeps it
    try:
        return subprocess.Popen([str(SPARK_PIPELINES), "run"], cwd=project, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    finally:
        out.close()


def _kill(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)


def _bodies(table: Path) -> list[int]:
    t = read_committed(table, ["body"])
    return [] if t is None else [int(b) for b in t.column("body").to_pylist()]


def _drain(url: str, queue: str, at_least: int, timeout: float = 60.0) -> list[int]:
    """Consume the queue's bodies (ints) until `at_least` came and 2 s pass with none."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    got: list[int] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        ch.basic_consume(queue, lambda c, m, p, b: got.append(int(b)), auto_ack=True)
        deadline, quiet = time.monotonic() + timeout, time.monotonic() + 2.0
        while time.monotonic() < deadline:
            n = len(got)
            conn.process_data_events(time_limit=0.5)
            if len(got) != n:
                quiet = time.monotonic() + 2.0
            elif len(got) >= at_least and time.monotonic() > quiet:
                break
    finally:
        conn.close()
    return got


def _queue_state(url: str, queue: str) -> tuple[int, int]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = conn.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


@pytest.mark.timeout(900)
def test_S9_spark_pipelines_run_lands_queues_and_a_stream_exactly_once_across_a_kill(
        broker_url: str, tmp_path: Path) -> None:
    """`ackmq pipeline init` for two queues and a stream (4,000 + 1,000 + 2,000 messages,
    1,000 per micro-batch); `spark-pipelines run` is SIGKILLed (its whole process group:
    CLI, Spark Connect server, Python workers) 0-1 s after the first batch of the first
    queue's table is committed, then run again: every table holds every message of its
    source once, and the queues are empty with nothing unacked; the sink flow
    (`--sink-exchange amq.direct`) republished every row of the first table at least
    once (the sink is at-least-once: a killed flow may publish a batch again). Found by it: with Spark's
    default in-memory catalog the restart failed (LOCATION_ALREADY_EXISTS: the tables'
    directories outlive the catalog); the project now keeps a Hive metastore
    (conf/spark-defaults.conf)."""
    if not SPARK_PIPELINES.exists():
        pytest.skip(f"no {SPARK_PIPELINES}")
    seed = int(os.environ.get("ACKMQ_TEST_SEED", time.time()))
    rnd = random.Random(seed)
    tag = uuid.uuid4().hex[:6]
    queues = {f"sdp.orders.{tag}": 4000, f"sdp.refunds.{tag}": 1000}
    has_streams = stream_support(broker_url) is None
    stream = f"sdp.events.{tag}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    ch = conn.channel()
    ch.confirm_delivery()
    for q, n in queues.items():
        ch.queue_declare(q, durable=True)
        for i in range(n):
            ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    copy = f"sdp.copy.{tag}"  # the sink flow republishes the first table to amq.direct
    ch.queue_declare(copy, durable=True)
    ch.queue_bind(copy, "amq.direct", routing_key=next(iter(queues)))
    if has_streams:
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        for i in range(2000):
            ch.basic_publish("", stream, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    project = tmp_path / "landing"
    cmd = [sys.executable, "-m", "ackmq.spark", "pipeline", "init", str(project),
           "--url", broker_url, "--max-per-trigger", "1000", "--sink-exchange", "amq.direct"]
    for q in queues:
        cmd += ["--queue", q]
    if has_streams:
        cmd += ["--stream", stream]
    subprocess.run(cmd, check=True, capture_output=True)
    log = tmp_path / "run.log"
    try:
        first = next(iter(queues)).replace(".", "_")
        commits = project / "storage" / "_checkpoints" / "spark_catalog" / "default" / first
        p = _run(project, log)
        deadline = time.monotonic() + 400
        while not list(commits.glob("*/*/commits/0")):
            assert p.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch committed:\n" + log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(rnd.uniform(0.0, 1.0))
        _kill(p)
        p = _run(project, log)
        p.wait(600)
        text = log.read_text()
        # PySpark 4.3.0's CLI then fails on the Python data source's metrics it does not
        # expect (UNKNOWN_RESPONSE ... __python_accumulator__): the run itself completed
        assert "Run is COMPLETED" in text, text[-4000:]
        wh = project / "spark-warehouse"
        for q, n in queues.items():
            bodies = _bodies(wh / q.replace(".", "_"))
            assert sorted(bodies) == list(range(n)), (
                f"{q}: {len(bodies)} rows, {len(bodies) - len(set(bodies))} twice, "
                f"{n - len(set(bodies))} missing (seed {seed})")
            assert _queue_state(broker_url, q) == (0, 0)
        if has_streams:
            assert sorted(_bodies(wh / stream.replace(".", "_"))) == list(range(2000))
        copied = _drain(broker_url, copy, 4000)
        assert set(copied) == set(range(4000)), f"the sink flow published {len(copied)} " \
            f"messages, {len(set(range(4000)) - set(copied))} bodies missing (seed {seed})"
    finally:
        with contextlib.suppress(Exception):
            _kill(p)
        conn = pika.BlockingConnection(pika.URLParameters(broker_url))
        for q in [*queues, stream, copy]:
            conn.channel().queue_delete(q)
        conn.close()
        if os.environ.get("ACKMQ_KEEP_SDP"):
            shutil.copytree(project, Path("/var/tmp") / f"sdp-{tag}")
