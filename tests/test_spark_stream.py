"""R4: land a stream into Parquet, exactly once, through driver and executor kills.

`python -m ackmq.spark pipeline land --stream S --partitions 4` runs in its own process
group while a publisher keeps appending to the stream; the driver is SIGKILLed at:

* start-up: 0-0.3 s after the reader resolved its initial offset (fresh checkpoint);
* 0-3 s after its first progress line (mid-stream: offset log, read tasks, sink commit);
* 0-0.5 s after the restarted reader planned its first batch's partitions (the replay
  of the batch the previous kill left logged but uncommitted, when there is one);

then an `--available-now` run lands the rest while one of its read tasks SIGKILLs its own
Python worker (an executor task killed mid-batch; Spark retries it). The committed table
must hold every published message exactly once; every batch of the last run is read by
4 tasks; a replay from offset 0 into a second table (a query in the test's own Spark
session) equals the first.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

try:
    import pyspark  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("pyspark is not installed (pip install 'pyspark==4.3.0')", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

from support import streamhelp  # noqa: E402
from support.seed import run_seed  # noqa: E402
from test_spark_pipeline import Publisher  # noqa: E402

from ackmq.spark.lake import read_committed  # noqa: E402

stream_url = streamhelp.stream_url  # fixtures: ackmq and RabbitMQ, skipped without streams
stream = streamhelp.stream


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from ackmq.spark.pipeline import spark_session

    s = spark_session("ackmq-stream-tests")
    yield s
    s.stop()


class StreamDriver:
    """One `pipeline land --stream` run in its own process group."""

    def __init__(self, url: str, name: str, work: Path, *, lake: str = "lake",
                 chk: str = "chk", available_now: bool = False,
                 starting: str | None = None, env: dict[str, str] | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        cmd = [sys.executable, "-m", "ackmq.spark", "pipeline", "land", "--url", url,
               "--stream", name, "--to", str(work / lake), "--checkpoint", str(work / chk),
               "--max-per-trigger", "1000", "--partitions", "4", *extra]
        if available_now:
            cmd.append("--available-now")
        if starting is not None:
            cmd += ["--starting-offsets", starting]
        self.trace = work / "trace.log"
        self.trace_from = self.trace.stat().st_size if self.trace.exists() else 0
        # the broker's own stream port (the session ackmq's is a free one): the read
        # tasks' default protocol is then the stream protocol on both brokers
        env = dict(os.environ, ACKMQ_SPARK_TRACE=str(self.trace),
                   ACKMQ_STREAM_URL=streamhelp.stream_protocol_url(url), **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True, env=env)
        self.landed = threading.Event()
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("batch "):
                self.landed.set()

    def traces(self) -> list[list[str]]:
        """This run's trace lines (pid, call, args...)."""
        if not self.trace.exists():
            return []
        with open(self.trace) as f:
            f.seek(self.trace_from)
            return [ln.split() for ln in f]

    def traced(self, call: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for parts in self.traces():
                if parts[1:2] == [call] and (call != "partitions" or parts[2] != parts[3]):
                    return True
            time.sleep(0.05)
        return False

    def kill(self) -> None:
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


def _first_batch_or_idle(d: StreamDriver, pub: Publisher) -> bool:
    """The restarted reader planned a non-empty batch; or, when the publisher is done and
    everything may have landed already, it has polled for 20 s (then it is killed idle)."""
    deadline = time.monotonic() + 180
    idle_since: float | None = None
    while time.monotonic() < deadline:
        if d.traced("partitions", 0.5):
            return True
        if not pub.is_alive() and d.traced("latestOffset", 0.1):
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 20:
                return True
    return False


def _rows(table_dir: Path) -> list[tuple[int, bytes]]:
    t = read_committed(table_dir, ["stream_offset", "body"])
    assert t is not None, f"nothing committed in {table_dir}"
    return sorted(zip(t.column("stream_offset").to_pylist(), t.column("body").to_pylist(),
                      strict=True))


@pytest.mark.timeout(600)
def test_R4_stream_landing_exactly_once_through_driver_and_executor_kills(
        stream_url: str, stream: str, spark: Any, tmp_path: Path) -> None:
    seed = run_seed()
    rnd = random.Random(seed)
    n = 3000
    pub = Publisher(stream_url, stream, n, with_ids=False, rate=n / 30.0)
    pub.start()
    # publishing goes on through the first kills but ends after 45 s (at most 1.5 n):
    # a slow, loaded machine must not make the backlog grow without bound
    stopper = threading.Timer(45.0, pub.stop.set)
    stopper.start()
    try:
        for how in ("startup", "landed", "first-batch"):
            d = StreamDriver(stream_url, stream, tmp_path)
            if how == "first-batch":
                ok = _first_batch_or_idle(d, pub)
            else:
                ok = d.landed.wait(180) if how == "landed" else d.traced("initialOffset", 180)
            if not ok:
                d.kill()
                pytest.fail(f"driver never reached {how}:\n" + "".join(d.lines[-30:]))
            time.sleep(rnd.uniform(0.0, {"landed": 3.0, "startup": 0.3}.get(how, 0.5)))
            d.kill()
        pub.stop.set()
        pub.join(120)
        assert not pub.is_alive() and pub.error is None, pub.error
        # a tail the last run must read (on a slow machine the killed drivers may have
        # landed everything published before), so that its read task can be killed
        tail = Publisher(stream_url, stream, pub.confirmed + 400, with_ids=False,
                         rate=10_000.0, start=pub.confirmed)
        tail.stop.set()
        tail.run()
        assert tail.error is None, tail.error
        n = tail.confirmed
        killed = tmp_path / "killed-read-task"
        d = StreamDriver(stream_url, stream, tmp_path, available_now=True,
                         env={"ACKMQ_SPARK_KILL_READ_ONCE": str(killed)})
        rc = d.wait(180)
        assert rc == 0, "".join(d.lines[-40:])
        assert killed.exists(), "no read task was killed"
        rows = _rows(tmp_path / "lake")
        bodies = [int(b) for _, b in rows]
        dupes = len(bodies) - len(set(bodies))
        missing = set(range(n)) - set(bodies)
        assert dupes == 0, f"{dupes} messages landed twice (seed {seed})"
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:10]} (seed {seed})"
        assert len(bodies) == n
        # every non-empty batch of the last run was split into 4 read tasks
        traced = d.traces()
        batches = [(int(p[2]), int(p[3])) for p in traced
                   if p[1] == "partitions" and int(p[3]) - int(p[2]) >= 4]
        reads = {(int(p[2]), int(p[3])) for p in traced if p[1] == "read"}
        assert batches, "the last run read nothing"
        for b, e in batches:
            mine = sorted(r for r in reads if b <= r[0] and r[1] <= e)
            assert len(mine) == 4 and mine[0][0] == b and mine[-1][1] == e, (b, e, mine)
        # a replay from offset 0 into a second table equals the first (in this process's
        # Spark session: one JVM start less)
        q = (spark.readStream.format("ackmq").option("url", stream_url)
             .option("stream", stream).option("startingOffsets", "0")
             .option("minPartitions", 4).load()
             .writeStream.format("parquet").option("path", str(tmp_path / "lake2"))
             .option("checkpointLocation", str(tmp_path / "chk2"))
             .trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert not q.isActive, "the replay did not finish in 180 s"
        assert _rows(tmp_path / "lake2") == rows
    finally:
        stopper.cancel()
        pub.stop.set()


def _table(table_dir: Path) -> list[tuple[Any, ...]]:
    """Every column but received_at, by stream offset (headers sorted: a map's order is
    the broker's)."""
    t = read_committed(table_dir)
    assert t is not None, f"nothing committed in {table_dir}"
    cols = [c for c in t.column_names if c != "received_at"]
    rows = zip(*(t.column(c).to_pylist() for c in cols), strict=True)
    h = cols.index("headers")
    return sorted(tuple(sorted(v) if i == h and v else v for i, v in enumerate(r))
                  for r in rows)


@pytest.mark.timeout(400)
def test_R4_X2_landing_over_the_stream_protocol_exactly_once_through_a_killed_read_task(
        stream_url: str, stream: str, spark: Any, tmp_path: Path) -> None:
    """`pipeline land --stream --stream-protocol stream`: the read tasks read their ranges
    over RabbitMQ's stream protocol; one of them SIGKILLs its Python worker (Spark retries
    it). Every message lands once, each batch in 4 tasks, and the table equals, column
    for column, a replay of the stream over AMQP 0-9-1 (this process's Spark session)."""
    n = 2500
    streamhelp.publish(stream_url, stream, [b"%d" % i for i in range(n - 3)])
    streamhelp.publish(stream_url, stream, [b"%d" % i for i in range(n - 3, n)],
                       message_id="mid", app_id="app", priority=2, headers={"k": "v"})
    killed = tmp_path / "killed-read-task"
    surl = streamhelp.stream_protocol_url(stream_url)
    d = StreamDriver(stream_url, stream, tmp_path, available_now=True,
                     env={"ACKMQ_SPARK_KILL_READ_ONCE": str(killed)},
                     extra=("--stream-protocol", "stream", "--stream-url", surl))
    rc = d.wait(300)
    assert rc == 0, "".join(d.lines[-40:])
    assert killed.exists(), "no read task was killed"
    rows = _rows(tmp_path / "lake")
    assert sorted(int(b) for _, b in rows) == list(range(n))
    traced = d.traces()
    batches = [(int(p[2]), int(p[3])) for p in traced
               if p[1] == "partitions" and int(p[3]) - int(p[2]) >= 4]
    reads = {(int(p[2]), int(p[3])) for p in traced if p[1] == "read"}
    assert batches
    for b, e in batches:
        mine = sorted(r for r in reads if b <= r[0] and r[1] <= e)
        assert len(mine) == 4 and mine[0][0] == b and mine[-1][1] == e, (b, e, mine)
    q = (spark.readStream.format("ackmq").option("url", stream_url).option("stream", stream)
         .option("protocol", "amqp").option("minPartitions", 2).load()
         .writeStream.format("parquet").option("path", str(tmp_path / "lake2"))
         .option("checkpointLocation", str(tmp_path / "chk2"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert not q.isActive, "the AMQP replay did not finish in 180 s"
    over_stream, over_amqp = _table(tmp_path / "lake"), _table(tmp_path / "lake2")
    assert len(over_stream) == n and over_stream == over_amqp
    assert over_stream[-1][-1] is not None  # stream_offset


@pytest.mark.timeout(180)
def test_R4_batch_read_by_offsets_and_timestamp(stream_url: str, stream: str,
                                                spark: Any, tmp_path: Path) -> None:
    """spark.read: earliest..latest split into minPartitions tasks; an offset range; a
    start at an ISO timestamp; a streaming start at `latest` reads only what comes next."""
    import datetime as dt

    streamhelp.publish(stream_url, stream, [b"a%d" % i for i in range(500)])
    time.sleep(2.1)  # AMQP timestamps are whole seconds
    when = dt.datetime.now(dt.UTC).isoformat()
    time.sleep(1.1)
    streamhelp.publish(stream_url, stream, [b"b%d" % i for i in range(100)],
                       message_id="mid", headers={"k": "v"})

    def read(**opts: str) -> Any:
        r = spark.read.format("ackmq").option("url", stream_url).option("stream", stream)
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    df = read(minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    rows = df.orderBy("stream_offset").collect()
    assert [r.body for r in rows] == [b"a%d" % i for i in range(500)] + \
        [b"b%d" % i for i in range(100)]
    assert [r.offset for r in rows] == [r.stream_offset for r in rows]
    last = rows[-1]
    assert (last.message_id, last.headers, last.redelivered) == ("mid", {"k": "v"}, False)
    assert last.properties.delivery_mode == 2 and last.routing_key == stream
    part = read(startingOffsets=str(rows[10].stream_offset),
                endingOffsets=str(rows[20].stream_offset)).orderBy("stream_offset").collect()
    assert [r.body for r in part] == [b"a%d" % i for i in range(10, 20)]
    since = read(startingOffsets=when).orderBy("stream_offset").collect()
    assert [r.body for r in since] == [b"b%d" % i for i in range(100)]

    # readStream from `latest`: only messages appended after the query started
    q = (spark.readStream.format("ackmq").option("url", stream_url).option("stream", stream)
         .option("startingOffsets", "latest").load()
         .writeStream.format("parquet").option("path", str(tmp_path / "lake"))
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    try:
        deadline = time.monotonic() + 60
        while not q.recentProgress and time.monotonic() < deadline:
            time.sleep(0.2)  # the initial offset is resolved before the first batch
        streamhelp.publish(stream_url, stream, [b"c%d" % i for i in range(50)])
        while time.monotonic() < deadline:
            t = read_committed(tmp_path / "lake", ["body"])
            if t is not None and t.num_rows >= 50:
                break
            time.sleep(0.5)
    finally:
        q.stop()
    t = read_committed(tmp_path / "lake", ["body"])
    assert t is not None
    assert sorted(t.column("body").to_pylist()) == sorted(b"c%d" % i for i in range(50))


@pytest.mark.timeout(300)
def test_R4_X1_stream_protocol_reader_over_tls(spark: Any, tmp_path: Path) -> None:
    """An `amqps://` url: the read tasks read over the stream protocol's TLS listener
    (`rabbitmq-stream+tls://`, ackmq's --stream-tls-port) with the url's TLS options: its
    CA, its client certificate (the broker refuses clients without one, on both
    listeners) and the server name checked. streamUrl names only the +tls port and takes
    the url's options; with `protocol` unset the driver picks the stream protocol (it
    answers over TLS), and a Spark batch read with protocol=stream (no fallback) gives
    every message. Before, amqps:// fell back to AMQP ("no TLS yet")."""
    import trustme
    from support.tlshelp import cert_broker, port_in_log, server_files

    from ackmq.protocol.stream import constants as K
    from ackmq.spark.stream_source import _StreamOptions
    from ackmq.spark.streamproto import StreamPeer

    ca = trustme.CA()
    certs = tmp_path / "certs"
    certs.mkdir()
    files = server_files(ca, certs)
    me = ca.issue_cert("guest", common_name="guest")
    me.cert_chain_pems[0].write_to_path(str(certs / "me.pem"))
    me.private_key_pem.write_to_path(str(certs / "me.key"))
    b = cert_broker(tmp_path, files, "--tls-port", "0", "--stream-tls-port", "0",
                    "--tls-verify-peer", "--tls-fail-if-no-peer-cert")
    try:
        import re

        aport = port_in_log(b, re.compile(r"amqps://\S+?:(\d+)"), "amqps:// URL")
        sport = port_in_log(b, re.compile(r"rabbitmq-stream\+tls://\S+?:(\d+)"),
                            "rabbitmq-stream+tls:// URL")
        url = (f"amqps://guest:guest@localhost:{aport}/?cacertfile={files['ca']}"
               f"&certfile={certs / 'me.pem'}&keyfile={certs / 'me.key'}")
        surl = f"rabbitmq-stream+tls://guest:guest@localhost:{sport}/"
        name = "tls-events"
        o = _StreamOptions({"url": url, "stream": name, "streamUrl": surl})
        peer = StreamPeer(o.stream_url)  # the url's CA and client certificate
        try:
            peer.call(K.CREATE, stream=name, arguments={})
        finally:
            peer.close()
        n = 300
        streamhelp.publish(url, name, [b"t%d" % i for i in range(n)], message_id="m")
        assert o.read_protocol() == "stream"
        rows = (spark.read.format("ackmq").option("url", url).option("stream", name)
                .option("streamUrl", surl).option("protocol", "stream")
                .option("minPartitions", "2").load().orderBy("stream_offset").collect())
        assert [r.body for r in rows] == [b"t%d" % i for i in range(n)]
        assert {r.message_id for r in rows} == {"m"}
        assert "Traceback" not in "".join(b.log)
    finally:
        b.stop()
