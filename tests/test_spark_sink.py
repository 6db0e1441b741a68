"""S3: the `ackmq` sink publishes with confirms; a nack or a confirm timeout fails the task."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")

from conftest import BrokerProcess  # noqa: E402

from ackmq.spark.amqp import ConfirmingPublisher  # noqa: E402
from ackmq.spark.amqp import SinkPublishError as PublishError  # noqa: E402
from ackmq.spark.cli import explain  # noqa: E402

needs_java = pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                                reason="Spark needs Java (no java on PATH, no JAVA_HOME)")


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")
    from ackmq.spark.pipeline import spark_session

    s = spark_session("ackmq-sink-tests")
    s.conf.set("spark.sql.shuffle.partitions", "2")
    yield s
    s.stop()


def declare(url: str, **args: object) -> str:
    name = f"spark.sink.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare(name, durable=True, arguments=args or None)
    conn.close()
    return name


def get_all(url: str, queue: str) -> list[tuple[bytes, pika.BasicProperties]]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    out = []
    while True:
        m, props, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        out.append((body, props))
    ch.queue_delete(queue)
    conn.close()
    return out


def test_S3_publisher_confirm_timeout_raises(tmp_path: Path) -> None:
    """Confirms that do not come within confirm_timeout fail the flush. A broker under a
    disk alarm (its free-space limit above any disk) reads no publish, so none is
    confirmed, however fast the broker (a timeout of 0 against a served broker raced
    its confirms, and lost once the store's write path was compiled)."""
    broker = BrokerProcess(tmp_path / "data", "--no-stomp", "--disk-free-limit", "100000GB")
    pub = ConfirmingPublisher(broker.start(), confirm_timeout=0.5)
    try:
        for _ in range(10):
            pub.publish("", "q", b"x")  # read, it would be confirmed (unroutable)
        with pytest.raises(PublishError, match="10 publishes unconfirmed after 0.5s"):
            pub.flush()
    finally:
        broker.stop()  # first: a blocked connection's close would wait for its close-ok
        pub.close()


@needs_java
def test_S3_batch_write_confirms_every_row_with_deterministic_ids(spark, broker_url: str) -> None:
    q = declare(broker_url)
    df = spark.createDataFrame([(str(i).encode(), q, {"n": str(i)}) for i in range(300)],
                               "body binary, routing_key string, headers map<string,string>"
                               ).repartition(2)
    df.write.format("ackmq").mode("append").option("url", broker_url) \
        .option("writeId", "job7").save()
    got = get_all(broker_url, q)
    assert sorted(int(b) for b, _ in got) == list(range(300))
    ids = [p.message_id for _, p in got]
    assert len(set(ids)) == 300 and all(i.startswith("job7/0/") for i in ids)
    assert all(p.delivery_mode == 2 and p.headers["n"] == b.decode() for b, p in got)


@needs_java
def test_S3_nack_fails_the_write(spark, broker_url: str) -> None:
    q = declare(broker_url, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    df = spark.createDataFrame([(str(i).encode(),) for i in range(50)], "body binary")
    with pytest.raises(Exception, match="nacked"):
        df.coalesce(1).write.format("ackmq").mode("append").option("url", broker_url) \
            .option("routingKey", q).save()
    get_all(broker_url, q)


@needs_java
def test_S3_stream_write_ids_name_query_batch_partition_row(spark, broker_url: str,
                                                            tmp_path) -> None:
    """Queue -> Spark -> queue: ids carry the streaming query id and the batch id."""
    src, dst = declare(broker_url), declare(broker_url)
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(40):
        ch.basic_publish("", src, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    df = (spark.readStream.format("ackmq").option("url", broker_url).option("queue", src)
          .option("stagingLocation", str(tmp_path / "staging")).load())
    q = (df.select("body").writeStream.format("ackmq").option("url", broker_url)
         .option("routingKey", dst).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    got = get_all(broker_url, dst)
    get_all(broker_url, src)
    assert sorted(int(b) for b, _ in got) == list(range(40))
    for _, p in got:
        query, batch, part, row = p.message_id.split("/")
        assert query == q.id and batch.isdigit() and part.isdigit() and row.isdigit()


def test_S3_publisher_fails_at_once_when_the_broker_closes_the_channel(broker_url: str) -> None:
    """Publishing to a missing exchange: the broker closes the channel with 404; the
    publisher reports that reply at once instead of waiting out the confirm timeout."""
    pub = ConfirmingPublisher(broker_url, confirm_timeout=30.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(PublishError, match=r"404 NOT_FOUND - no exchange 'no\.such\.exchange'"):
            for _ in range(100):
                pub.publish("no.such.exchange", "rk", b"x", persistent=False)
            pub.flush()
    finally:
        pub.close()
    assert time.monotonic() - t0 < 5


class GatedProxy:
    """A TCP proxy to the broker that runs `before(k)` before it forwards its k-th client
    connection (k = 1, 2, ...): a write task opens one connection per attempt, so the
    test can change the broker's state between two attempts of the same task."""

    def __init__(self, url: str, before: Callable[[int], None]) -> None:
        p = pika.URLParameters(url)
        self.target = (p.host, p.port)
        self.before = before
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.url = url.replace(f"{p.host}:{p.port}", f"127.0.0.1:{port}")
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.before(self.connections)
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


class Drainer(threading.Thread):
    """Consumes `queue` (auto-ack) into `got` until stopped."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.got: list[tuple[str, bytes]] = []
        self.consuming = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        ch.basic_consume(self.queue, lambda _c, _m, p, b: self.got.append((p.message_id, b)),
                         auto_ack=True)
        self.consuming.set()
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.05)
        conn.close()


@needs_java
def test_S3_nacked_task_is_retried_and_every_row_lands_once_per_message_id(
        spark, broker_url: str) -> None:
    """A write task's first attempt is nacked for real (x-max-length 60, reject-publish,
    100 rows); before its retry connects, a consumer starts draining the queue, so the
    retry is confirmed. The job succeeds. Guarantee: every row is in the queue at least
    once and exactly once per message_id; the failed attempt's confirmed rows (the first
    60) are there twice, with the same ids, for consumers to drop."""
    q = declare(broker_url, **{"x-max-length": 60, "x-overflow": "reject-publish"})
    drainer = Drainer(broker_url, q)

    def before(k: int) -> None:
        if k == 2:  # the retry: make room first
            drainer.start()
            assert drainer.consuming.wait(10)

    proxy = GatedProxy(broker_url, before)
    try:
        df = spark.createDataFrame([(str(i).encode(),) for i in range(100)], "body binary")
        df.coalesce(1).write.format("ackmq").mode("append").option("url", proxy.url) \
            .option("routingKey", q).option("writeId", "retry1") \
            .option("confirmWindow", 10).save()
        assert proxy.connections == 2  # one failed attempt, one retry
        deadline = time.monotonic() + 10
        while len(drainer.got) < 160 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # nothing more may come
    finally:
        drainer.stop.set()
        proxy.close()
    drainer.join(5)
    got = drainer.got
    by_id: dict[str, set[bytes]] = {}
    for mid, body in got:
        by_id.setdefault(mid, set()).add(body)
    assert sorted(by_id) == sorted(f"retry1/0/0/{i}" for i in range(100))
    assert all(bodies == {mid.rsplit("/", 1)[1].encode()} for mid, bodies in by_id.items())
    assert len(got) == 160  # 60 confirmed by the failed attempt + 100 by the retry
    get_all(broker_url, q)


@needs_java
def test_S3_write_to_a_missing_exchange_fails_fast_with_the_brokers_404(
        spark, broker_url: str) -> None:
    df = spark.createDataFrame([(b"x",)] * 20, "body binary").coalesce(1)
    t0 = time.monotonic()
    with pytest.raises(Exception) as err:
        df.write.format("ackmq").mode("append").option("url", broker_url) \
            .option("exchange", "no.such.exchange").save()
    assert time.monotonic() - t0 < 20  # 4 attempts, none waits for the 30 s confirm timeout
    line = explain(err.value)
    assert "404 NOT_FOUND - no exchange 'no.such.exchange'" in line, line


@needs_java
def test_S3_publish_rerun_with_the_same_write_id_reuses_message_ids(
        spark, broker_url: str, tmp_path) -> None:
    from ackmq.spark.pipeline import publish

    src = str(tmp_path / "t.parquet")
    spark.createDataFrame([(str(i).encode(),) for i in range(50)], "body binary") \
        .repartition(2).write.parquet(src)
    q = declare(broker_url)
    for _ in range(2):
        assert publish(spark, source=src, url=broker_url, routing_key=q, write_id="w-9") == 50
    got = get_all(broker_url, q)
    ids: dict[str, list[bytes]] = {}
    for body, p in got:
        ids.setdefault(p.message_id, []).append(body)
    assert len(got) == 100 and len(ids) == 50  # each id twice, with the same body
    assert all(len(b) == 2 and b[0] == b[1] and i.startswith("w-9/0/") for i, b in ids.items())


@needs_java
def test_land_on_a_missing_queue_fails_fast_with_one_line(spark, broker_url: str,
                                                          tmp_path) -> None:
    """The source fails at once on 404 (no 60 s of retries); `explain` (what the CLI
    prints) turns Spark's exception into the one line."""
    from ackmq.spark.pipeline import land

    t0 = time.monotonic()
    with pytest.raises(Exception) as err:
        land(spark, url=broker_url, queue="no.such.queue", to=str(tmp_path / "lake"),
             checkpoint=str(tmp_path / "chk"), available_now=True)
    assert time.monotonic() - t0 < 30
    line = explain(err.value)
    assert line.startswith("cannot consume from queue 'no.such.queue'"), line
    assert "404 NOT_FOUND" in line and "\n" not in line


@needs_java
def test_S3_sink_cut_mid_batch_and_retried_lands_each_row_once_in_a_dedup_queue(
        spark, broker_url: str) -> None:
    """Table -> queue exactly once (issue 23): the write task's connection is cut in the
    middle of its batch (a proxy drops the link after ~60 KB, half a frame in flight);
    Spark retries the task, which publishes every row again with the same message ids,
    now also in x-deduplication-header; the queue (x-message-deduplication) keeps one copy
    of each. The same into a plain queue keeps the copies (the contrast)."""
    from support.cutproxy import CutProxy

    n = 1000
    df = spark.createDataFrame([(str(i).encode().ljust(100),) for i in range(n)],
                               "body binary").coalesce(1)
    p = pika.URLParameters(broker_url)
    counts = {}
    for dedup in (True, False):
        q = declare(broker_url, **({"x-message-deduplication": True} if dedup else {}))
        proxy = CutProxy((p.host, p.port))
        proxy.cut_after = 60_000
        url = broker_url.replace(f"{p.host}:{p.port}", f"127.0.0.1:{proxy.port}")
        try:
            df.write.format("ackmq").mode("append").option("url", url) \
                .option("routingKey", q).option("writeId", f"cut-{dedup}") \
                .option("confirmWindow", 200).save()
        finally:
            proxy.close()
        assert proxy.cuts >= 1 and proxy.connections >= 2  # cut, then a retry
        got = get_all(broker_url, q)
        ids = [props.message_id for _body, props in got]
        assert set(ids) == {f"cut-{dedup}/0/0/{i}" for i in range(n)}
        assert all(int(body) == int(props.message_id.rsplit("/", 1)[1])
                   for body, props in got)
        counts[dedup] = len(got)
    assert counts[True] == n        # each row once
    assert counts[False] > n        # the rows confirmed before the cut, twice
