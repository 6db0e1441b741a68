"""S1/S2/S4: land a queue into Parquet while the Spark driver is SIGKILLed again and again.

The driver is `python -m ackmq.spark pipeline land` in its own process group; it is
killed, restarted on the same checkpoint, while a publisher keeps publishing. At the end
the committed table must hold every message exactly once and the queue must be empty
with nothing unacked. Kill points, in order:

* start-up, on a fresh checkpoint: 0-0.3 s after the reader's first `latestOffset`
  (it has connected and holds its prefetch unacked; it is staging the first batch or
  Spark is logging its offset or starting to run it);
* after it has landed something: a random moment 0-3 s after its first progress line
  (mid-stream: staging, offset log, executors reading, sink commit, acks);
* first batch: as soon as the restarted reader asks for the partitions of its first
  batch (+0-0.5 s) - the replay of the batch the previous kill left logged but
  uncommitted, when there is one;
* then after-landed again for the remaining kills.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("pyspark is not installed (pip install 'pyspark==4.3.0')", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

from support.seed import run_seed  # noqa: E402

from ackmq.spark.amqp import ConfirmingPublisher, safe_url  # noqa: E402
from ackmq.spark.lake import read_committed  # noqa: E402

RABBITMQ_URL = os.environ.get("ACKMQ_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
KILLS = int(os.environ.get("ACKMQ_SPARK_KILLS", "0"))  # 0: the defaults below (3 and 2)


@pytest.fixture
def rabbitmq_url() -> str:
    try:
        pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)).close()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no RabbitMQ at {safe_url(RABBITMQ_URL)} ({exc!r}); "
                    "set ACKMQ_RABBITMQ_URL")
    return RABBITMQ_URL


class Publisher(threading.Thread):
    """Publishes bodies b"0", b"1", ... at a steady pace, confirming every chunk, until
    `stop` is set and at least `at_least` are confirmed: every driver run of the kill
    phase sees new messages, however slowly Spark starts on a loaded machine."""

    def __init__(self, url: str, queue: str, at_least: int, *, with_ids: bool,
                 rate: float, start: int = 0) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.at_least = url, queue, at_least
        self.with_ids, self.rate = with_ids, rate
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.confirmed = start  # bodies b"<start>", b"<start + 1>", ...

    def run(self) -> None:
        try:
            pub = ConfirmingPublisher(self.url)
            chunk = 50
            while self.confirmed < self.at_least or not self.stop.is_set():
                start = self.confirmed
                for i in range(start, start + chunk):
                    pub.publish("", self.queue, str(i).encode(),
                                message_id=f"m-{i}" if self.with_ids else None)
                pub.flush()
                self.confirmed = start + chunk
                time.sleep(chunk / self.rate)
            pub.close()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc


class Driver:
    """One `pipeline land` run, its own process group so nothing of it outlives the test."""

    def __init__(self, url: str, queue: str, work: Path, *, available_now: bool,
                 max_per_trigger: int = 400, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "ackmq.spark", "pipeline", "land", "--url", url,
               "--queue", queue, "--to", str(work / "lake"), "--checkpoint", str(work / "chk"),
               "--max-per-trigger", str(max_per_trigger)]
        if available_now:
            cmd.append("--available-now")
        self.trace = work / "trace.log"
        self.trace_from = self.trace.stat().st_size if self.trace.exists() else 0
        env = dict(os.environ, ACKMQ_SPARK_TRACE=str(self.trace), **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True, env=env)
        self.landed = threading.Event()
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)  # ends at EOF
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("batch "):
                self.landed.set()

    def traced(self, call: str, timeout: float) -> bool:
        """Wait until this run's reader traces `call` ("partitions": of a non-empty batch)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.trace.exists():
                with open(self.trace) as f:
                    f.seek(self.trace_from)
                    for line in f:
                        parts = line.split()
                        if parts[1:2] == [call] and (call != "partitions" or parts[2] != parts[3]):
                            return True
            time.sleep(0.05)
        return False

    def kill(self) -> None:
        """SIGKILL the driver only; then reap whatever of its group is left."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reap()

    def _reap(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own JVM/workers, if they linger
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._reap()


def _queue_state(url: str, queue: str) -> tuple[int, int]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ok = conn.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


def land_through_kills(url: str, work: Path, *, n: int, kills: int, with_ids: bool,
                       seed: int, startup: bool = False) -> None:
    rnd = random.Random(seed)
    queue = f"spark.kill.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    pub = Publisher(url, queue, n, with_ids=with_ids, rate=n / 40.0)
    pub.start()  # publishes throughout the kill phase, never less than n
    try:
        plan = (["startup"] if startup else []) + [
            "first-batch" if i == 1 else "landed" for i in range(kills)]
        for how in plan:
            d = Driver(url, queue, work, available_now=False)
            ok = (d.landed.wait(180) if how == "landed" else
                  d.traced("latestOffset" if how == "startup" else "partitions", 180))
            if not ok:
                d.kill()
                trace = (work / "trace.log")
                tail = trace.read_text().splitlines()[-20:] if trace.exists() else []
                pytest.fail(f"driver never reached {how}:\n" + "".join(d.lines[-30:])
                            + "\nreader trace:\n" + "\n".join(tail))
            time.sleep(rnd.uniform(0.0, {"landed": 3.0, "startup": 0.3}.get(how, 0.5)))
            d.kill()
        pub.stop.set()
        pub.join(120)
        assert not pub.is_alive(), "the publisher did not finish"
        assert pub.error is None, pub.error
        assert pub.confirmed >= n
        n = pub.confirmed  # everything published, all of it confirmed
        d = Driver(url, queue, work, available_now=True)  # lands what the queue holds
        rc = d.wait(240)
        assert rc == 0, "".join(d.lines[-40:])
        table = read_committed(work / "lake", ["body"])
        assert table is not None
        bodies = [int(b) for b in table.column("body").to_pylist()]
        dupes = len(bodies) - len(set(bodies))
        missing = set(range(n)) - set(bodies)
        assert dupes == 0, f"{dupes} messages landed twice (seed {seed})"
        assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:10]} (seed {seed})"
        deadline = time.monotonic() + 15  # the broker notices the driver's exit shortly
        while _queue_state(url, queue) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _queue_state(url, queue) == (0, 0)  # empty, and nothing left unacked
    finally:
        pub.stop.set()
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_delete(queue)
        conn.close()


@pytest.mark.timeout(600)
def test_S1_S2_driver_sigkill_lands_every_message_once_without_producer_ids(
        broker_url: str, tmp_path: Path) -> None:
    """Against ackmq: dedupe by x-ackmq-seq, producers set no message_id. The first kill
    comes at the first offset of the fresh checkpoint: that was a known hole (1 run in 5;
    a kill inside Spark's first offset-log write left offsets/ with only a temporary file
    and Spark refused the restart; `pipeline land` now clears that — the deterministic
    case is the test below); then the kills at a batch's read tasks and after landings."""
    seed = run_seed()
    land_through_kills(broker_url, tmp_path, n=4000, kills=KILLS or 3, with_ids=False,
                       seed=seed, startup=True)


@pytest.mark.timeout(600)
def test_S1_restart_after_a_kill_in_the_first_offset_log_write(broker_url: str,
                                                               tmp_path: Path) -> None:
    """What the driver kill at the first offset of a fresh checkpoint can leave, made
    deterministic: Spark's first offset-log write interrupted (only its temporary file
    `offsets/.0.<uuid>.tmp` and the checksum's), the reader's batch 0 staged and never
    logged, its messages unacked. Spark alone refuses that checkpoint
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY); `pipeline land` must start again and
    land every message exactly once."""
    queue = f"spark.kill.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    pub = ConfirmingPublisher(broker_url)
    for i in range(500):
        pub.publish("", queue, str(i).encode())
    pub.flush()
    pub.close()
    chk = tmp_path / "chk"
    (chk / "offsets").mkdir(parents=True)
    tmp = f".0.{uuid.uuid4()}.tmp"
    (chk / "offsets" / tmp).write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1')
    (chk / "offsets" / f".{tmp}.crc").write_bytes(b"crc\0")
    (chk / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    try:
        d = Driver(broker_url, queue, tmp_path, available_now=True)
        rc = d.wait(240)
        assert rc == 0, "".join(d.lines[-40:])
        table = read_committed(tmp_path / "lake", ["body"])
        assert table is not None
        assert sorted(int(b) for b in table.column("body").to_pylist()) == list(range(500))
        deadline = time.monotonic() + 15
        while _queue_state(broker_url, queue) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _queue_state(broker_url, queue) == (0, 0)
    finally:
        conn = pika.BlockingConnection(pika.URLParameters(broker_url))
        conn.channel().queue_delete(queue)
        conn.close()


@pytest.mark.rabbitmq
@pytest.mark.timeout(600)
def test_S4_rabbitmq_driver_sigkill_exactly_once_with_message_ids(
        rabbitmq_url: str, tmp_path: Path) -> None:
    """Against RabbitMQ (no x-ackmq-seq): exactly-once because producers set message_id."""
    seed = run_seed()
    land_through_kills(rabbitmq_url, tmp_path, n=3000, kills=KILLS or 2, with_ids=True, seed=seed)


def _publish_range(url: str, queue: str, bodies: range) -> None:
    pub = ConfirmingPublisher(url)
    for i in bodies:
        pub.publish("", queue, str(i).encode())
    pub.flush()
    pub.close()


def _table_rows(lake: Path) -> list[int]:
    table = read_committed(lake, ["body"]) if lake.exists() else None
    return [] if table is None else [int(b) for b in table.column("body").to_pylist()]


BATCH_LINE = re.compile(r"^batch (\d+): (\d+) rows, .*; landed (\d+) in (\d+) batches")


@pytest.mark.timeout(600)
def test_S2_landed_count_adds_up_over_many_small_batches_and_idle_stretches(
        broker_url: str, tmp_path: Path) -> None:
    """`pipeline land --max-per-trigger 50` while three rounds of 400 messages arrive with
    idle stretches between them, longer than Spark's `noDataProgressEventInterval` (200 ms
    in the run's Spark conf, 10 s by default), so the progress the command polls
    holds idle events between the batches. Every batch is printed once, the rows printed
    add up to the table's and the last `landed N` is the table's row count (1,200). On
    c35dcba the batch after each idle stretch was never counted (the idle event carries
    the next batch's id, which the old poll took as seen) and a batch finishing between
    the poll's two reads of the progress was skipped: `landed 188022` for 198,044 rows."""
    queue = f"spark.count.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    # the run's Spark conf, as `--conf` (not a SPARK_CONF_DIR, whose directory at the head
    # of the class path would make the driver's JVM refuse the suite's class-data archive)
    lake, rounds, per_round = tmp_path / "lake", 3, 400
    d = Driver(broker_url, queue, tmp_path, available_now=False, max_per_trigger=50,
               env={"PYSPARK_SUBMIT_ARGS": "--conf spark.sql.streaming."
                    "noDataProgressEventInterval=200ms pyspark-shell"})
    try:
        for r in range(rounds):
            _publish_range(broker_url, queue, range(r * per_round, (r + 1) * per_round))
            deadline = time.monotonic() + 240
            while len(_table_rows(lake)) < (r + 1) * per_round:
                assert d.proc.poll() is None, "".join(d.lines[-30:])
                assert time.monotonic() < deadline, "".join(d.lines[-30:])
                time.sleep(0.5)
            time.sleep(1.5)  # idle: the query reports idle progress events
        n = rounds * per_round
        deadline = time.monotonic() + 10  # the command polls its progress once a second
        while time.monotonic() < deadline and not any(
                (m := BATCH_LINE.match(ln)) and int(m.group(3)) >= n for ln in list(d.lines)):
            time.sleep(0.2)
    finally:
        d.kill()
        conn = pika.BlockingConnection(pika.URLParameters(broker_url))
        conn.channel().queue_delete(queue)
        conn.close()
    bodies = _table_rows(lake)
    assert sorted(bodies) == list(range(n))
    printed = [m for ln in d.lines if (m := BATCH_LINE.match(ln))]
    ids = [int(m.group(1)) for m in printed]
    assert len(ids) == len(set(ids)), f"a batch printed twice: {ids}"
    assert int(printed[-1].group(3)) == len(bodies) == n, \
        f"printed landed {printed[-1].group(3)} for a table of {len(bodies)} rows:\n" \
        + "".join(d.lines)
    assert sum(int(m.group(2)) for m in printed) == n, "".join(d.lines)
    assert len(printed) >= n // 50  # batches of at most 50: every one printed


@pytest.mark.timeout(600)
def test_S2_sigint_and_sigterm_stop_a_landing_between_batches_with_one_line(
        broker_url: str, tmp_path: Path) -> None:
    """A backlog of 3,000 landed 100 per batch: Ctrl-C (SIGINT to the command's process
    group, as a terminal sends it) 0-1 s after the first batch, then a second run stopped
    by SIGTERM to its pid (`kill`, a service manager): each exits 128 + the signal (130,
    143) within the grace of one batch, printing one line after its progress lines - no
    traceback - whose landed count is the table's; an `--available-now` run lands the
    rest: every message once, the queue empty. On c35dcba Ctrl-C exited 130 with about
    100 lines of py4j tracebacks, and SIGTERM killed the driver (-15) with no line."""
    rnd = random.Random(seed := run_seed())
    queue = f"spark.stop.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    n = 3000
    _publish_range(broker_url, queue, range(n))
    try:
        for sig, to_group in ((signal.SIGINT, True), (signal.SIGTERM, False)):
            had = len(_table_rows(tmp_path / "lake"))
            d = Driver(broker_url, queue, tmp_path, available_now=False, max_per_trigger=100)
            try:
                assert d.landed.wait(240), "".join(d.lines[-30:])
                time.sleep(rnd.uniform(0.0, 1.0))
                before = len(d.lines)
                (os.killpg if to_group else os.kill)(d.proc.pid, sig)
                rc = d.proc.wait(120)
            finally:
                d.kill()
            d.reader.join(30)  # the reader thread has the last lines (EOF: group reaped)
            after = [ln for ln in d.lines[before:] if not BATCH_LINE.match(ln)]
            assert rc == 128 + sig, f"rc {rc} (seed {seed}):\n" + "".join(d.lines[-40:])
            assert len(after) == 1, f"{len(after)} lines after {sig.name}:\n" + "".join(after)
            m = re.match(rf"ackmq pipeline land: stopped by {sig.name} between batches; "
                         r"landed (\d+) messages", after[0])
            assert m, after[0]
            # what this run committed (a batch in the sink and not yet in Spark's commit
            # log when the query stopped is not counted: the next run commits it)
            assert int(m.group(1)) <= len(_table_rows(tmp_path / "lake")) - had
        d = Driver(broker_url, queue, tmp_path, available_now=True)
        assert d.wait(240) == 0, "".join(d.lines[-40:])
        bodies = _table_rows(tmp_path / "lake")
        assert len(bodies) == len(set(bodies)), f"{len(bodies) - len(set(bodies))} twice"
        assert sorted(bodies) == list(range(n))
        deadline = time.monotonic() + 15
        while _queue_state(broker_url, queue) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _queue_state(broker_url, queue) == (0, 0)
    finally:
        conn = pika.BlockingConnection(pika.URLParameters(broker_url))
        conn.channel().queue_delete(queue)
        conn.close()


PLAIN_SCRIPT = '''\
import sys
from pyspark.sql import SparkSession
import ackmq.spark

url, queue, lake, chk = sys.argv[1:5]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
ackmq.spark.register(spark)
df = (spark.readStream.format("ackmq").option("url", url).option("queue", queue)
      .option("stagingLocation", chk + "/ackmq-staging").load())
q = (df.writeStream.format("parquet").option("path", lake).option("checkpointLocation", chk)
     .trigger(availableNow=True).start())
q.awaitTermination()
spark.stop()
'''


@pytest.mark.timeout(600)
def test_S1_a_plain_pyspark_script_lands_a_queue_without_the_cli_or_an_activated_venv(
        broker_url: str, tmp_path: Path) -> None:
    """A user's own script (the docs' example: `register(spark)`, `format("ackmq")`,
    no `ackmq` command) run by the virtualenv's Python without activating it or setting
    PYSPARK_PYTHON: Spark's Python workers (`python3` from PATH otherwise, without ackmq
    and pyarrow) run the source on that Python, and the 500 messages land. On c35dcba
    only the `ackmq` commands set PYSPARK_PYTHON: `ModuleNotFoundError` in the workers."""
    queue = f"spark.plain.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    _publish_range(broker_url, queue, range(500))
    script = tmp_path / "my_landing.py"
    script.write_text(PLAIN_SCRIPT)
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1]),  # this checkout's ackmq
           "SPARK_LOCAL_IP": "127.0.0.1"}
    if os.environ.get("ACKMQ_SPARK_JAVA_OPTIONS"):
        # the suite's class-data archive and JIT/GC flags (support/sparkjvm.py), which the
        # script's own `SparkSession.builder` does not read: through the `java` launcher's
        # own variable, so its driver starts as fast as the others (~20 s less)
        env["JDK_JAVA_OPTIONS"] = os.environ["ACKMQ_SPARK_JAVA_OPTIONS"]
    try:
        r = subprocess.run([sys.executable, str(script), broker_url, queue,
                            str(tmp_path / "lake"), str(tmp_path / "chk")],
                           env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert sorted(_table_rows(tmp_path / "lake")) == list(range(500))
    finally:
        conn = pika.BlockingConnection(pika.URLParameters(broker_url))
        conn.channel().queue_delete(queue)
        conn.close()
