"""S9: ackmq queues and streams as streaming tables of a Spark Declarative Pipelines project
written by `ackmq pipeline init`, run by Spark's own `spark-pipelines run`."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
pytest.importorskip("pyspark.pipelines", reason="needs PySpark >= 4.1 (Spark Declarative Pipelines)")
pytest.importorskip("yaml", reason="spark-pipelines needs pyyaml and the Spark Connect client "
                    "(pip install 'pyspark[pipelines]')")
pytest.importorskip("grpc", reason="spark-pipelines needs the Spark Connect client "
                    "(pip install 'pyspark[pipelines]')")

from support.seed import run_seed  # noqa: E402
from support.streamhelp import stream_support  # noqa: E402

from ackmq.spark.lake import read_committed  # noqa: E402
from ackmq.spark.pipeline import JAVA_OPTIONS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: the test's own Spark settings, after what `ackmq pipeline init` wrote
TEST_DEFAULTS = (
    "spark.python.authenticate.socketTimeout 120s\n"
    # Spark waits 10 s (fixed) for a data source's planner worker to connect back; at
    # load 18 three flows starting their workers at once missed it: one at a time, and
    # more than SDP's default 2 retries of a failed flow
    "spark.sql.pipelines.execution.maxConcurrentFlows 1\n"
    "spark.sql.pipelines.maxFlowRetryAttempts 8\n"
    "spark.ui.enabled false\n")


def scheduler_env() -> dict[str, str]:
    """What cron or a scheduler gives a command: no virtualenv on PATH or activated, no
    PYSPARK_PYTHON or SPARK_CONF_DIR. PYTHONPATH only picks this checkout's ackmq over
    the one installed in the virtualenv (an editable install of another checkout)."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8"}
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


def _init(project: Path, *args: str) -> str:
    """`ackmq pipeline init`; returns the command it says runs the project."""
    r = subprocess.run([sys.executable, "-m", "ackmq.spark", "pipeline", "init", str(project),
                        *args], check=True, capture_output=True, text=True)
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("run it: ")]
    conf = project / "conf" / "spark-defaults.conf"
    # the driver's JVM (the Spark Connect server) with the flags `pipeline land`'s driver
    # has: a C1-only JIT and serial GC start faster on a shared 2-core machine
    lines = [f"{ln} {JAVA_OPTIONS}" if ln.startswith("spark.driver.extraJavaOptions ") else ln
             for ln in conf.read_text().splitlines()]
    conf.write_text("\n".join(lines) + "\n" + TEST_DEFAULTS)
    return line.removeprefix("run it: ")


def _run(command: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """The command `pipeline init` printed, as a scheduler runs it, in its own process
    group (its CLI, Spark Connect server and Python workers)."""
    out = open(log, "ab")  # noqa: SIM115 - the child keeps it
    try:
        return subprocess.Popen(["sh", "-c", command + "".join(f" {a}" for a in args)],
                                cwd="/", stdout=out, stderr=subprocess.STDOUT,
                                env=scheduler_env(), start_new_session=True)
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
    seed = run_seed()
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
    args = ["--url", broker_url, "--max-per-trigger", "1000", "--sink-exchange", "amq.direct"]
    for q in queues:
        args += ["--queue", q]
    if has_streams:
        args += ["--stream", stream]
    command = _init(project, *args)
    log = tmp_path / "run.log"
    try:
        first = next(iter(queues)).replace(".", "_")
        commits = project / "storage" / "_checkpoints" / "spark_catalog" / "default" / first
        p = _run(command, log)
        deadline = time.monotonic() + 400
        while not list(commits.glob("*/*/commits/0")):
            assert p.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch committed:\n" + log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(rnd.uniform(0.0, 1.0))
        _kill(p)
        p = _run(command, log)
        rc = p.wait(600)
        text = log.read_text()
        assert "Run is COMPLETED" in text, text[-4000:]
        assert rc == 0, text[-4000:]
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


@contextlib.contextmanager
def _port_taken(port: int) -> Iterator[None]:
    """Something listens on `port` (when another process already does, that is as good)."""
    s = socket.socket()
    try:
        with contextlib.suppress(OSError):
            s.bind(("0.0.0.0", port))
            s.listen()
        yield
    finally:
        s.close()


def _publish(url: str, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


def _delete(url: str, *queues: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    for q in queues:
        conn.channel().queue_delete(q)
    conn.close()


@pytest.mark.timeout(600)
def test_S9_a_completed_run_exits_0_from_a_scheduler_with_port_15002_taken(
        broker_url: str, tmp_path: Path) -> None:
    """The command `ackmq pipeline init` prints, run as a scheduler would (no virtualenv
    on PATH or activated, no PYSPARK_PYTHON) while something listens on 15002 (Spark
    Connect's default port; another run on the machine): it lands the queue's 300
    messages and exits 0. On c35dcba the printed command was `cd DIR &&
    SPARK_CONF_DIR=$PWD/conf spark-pipelines run` (not found without the virtualenv;
    with it, Spark's Python was `python3` without PySpark), the local Connect server
    could only bind 15002 (BindException beside another run; a port moved in
    spark-defaults.conf hung the client, which connects to 15002), and a completed run
    exited 1 (UNKNOWN_RESPONSE ... __python_accumulator__)."""
    queue = f"sdp.sched.{uuid.uuid4().hex[:6]}"
    _publish(broker_url, queue, 300)
    project = tmp_path / "p"
    command = _init(project, "--url", broker_url, "--queue", queue)
    log = tmp_path / "run.log"
    try:
        with _port_taken(15002):
            p = _run(command, log)
            try:
                rc = p.wait(540)
            finally:
                _kill(p)
        text = log.read_text()
        assert "Run is COMPLETED" in text, text[-4000:]
        assert rc == 0, text[-4000:]
        bodies = _bodies(project / "spark-warehouse" / queue.replace(".", "_"))
        assert sorted(bodies) == list(range(300))
    finally:
        _delete(broker_url, queue)


@pytest.mark.timeout(600)
def test_S9_a_failed_run_exits_non_zero(broker_url: str, tmp_path: Path) -> None:
    """The other half of a run's exit status: a project whose queue does not exist (the
    flow fails with the broker's 404, no retry: `--conf` passed through the run script)
    exits non-zero, so a scheduler marks it failed."""
    queue = f"sdp.gone.{uuid.uuid4().hex[:6]}"
    project = tmp_path / "p"
    command = _init(project, "--url", broker_url, "--queue", queue)
    log = tmp_path / "run.log"
    p = _run(command, log, "--conf", "spark.sql.pipelines.maxFlowRetryAttempts=0")
    try:
        rc = p.wait(540)
    finally:
        _kill(p)
    text = log.read_text()
    assert rc != 0, text[-4000:]
    assert "Run is COMPLETED" not in text
    assert "NOT_FOUND" in text, text[-4000:]


def test_S9_pipeline_run_outside_a_project_says_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ackmq.spark", "pipeline", "run", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"ackmq pipeline run: no {tmp_path.resolve() / 'spark-pipeline.yml'} "
        "(`ackmq pipeline init DIR ...` writes a project)"]
