"""Landing throughput into Parquet: the `ackmq` Spark source vs a naive pika+pyarrow consumer.

    python -m ackmq.spark.bench --messages 50000 [--ackmq-url URL] [--rabbitmq-url URL]

For each source broker a durable queue is filled with persistent 1 KiB messages, then
landed twice: by Spark (local[2], Trigger.AvailableNow, ack after commit, exactly once)
and by a naive consumer that acks each message as it appends it to an in-memory buffer
and writes a Parquet file every `--file-rows` rows (fast, and it loses the buffer on a
crash: the messages are acked before they are on disk). With no --ackmq-url an
`ackmq serve` subprocess is started.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pyarrow as pa
import pyarrow.parquet as pq

from ackmq.spark.amqp import ConfirmingPublisher
from ackmq.spark.lake import read_committed


def fill(url: str, queue: str, n: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue, durable=True)
    conn.close()
    pub = ConfirmingPublisher(url, window=2000)
    body = b"x" * size
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(n):
        pub.publish("", queue, body, props)
    pub.flush()
    pub.close()


def naive(url: str, queue: str, n: int, out: Path, file_rows: int) -> float:
    """Ack-as-you-append consumer; returns messages/s."""
    out.mkdir(parents=True, exist_ok=True)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    bodies: list[bytes] = []
    keys: list[str] = []
    got, files = 0, 0
    t0 = time.monotonic()
    for m, _props, body in ch.consume(queue, inactivity_timeout=5):
        if m is None:
            break
        bodies.append(body)
        keys.append(m.routing_key)
        ch.basic_ack(m.delivery_tag)  # acked before it is on disk: a crash loses it
        got += 1
        if len(bodies) >= file_rows or got == n:
            pq.write_table(pa.table({"body": bodies, "routing_key": keys}),
                           out / f"part-{files:05d}.parquet")
            files += 1
            bodies, keys = [], []
        if got == n:
            break
    dt = time.monotonic() - t0
    ch.cancel()
    conn.close()
    return got / dt


def spark_land(spark: object, url: str, queue: str, n: int, work: Path, per_trigger: int
               ) -> tuple[float, float, int]:
    """Returns (msgs/s over the whole query, msgs/s after the first batch, rows landed)."""
    from ackmq.spark.pipeline import land

    firsts: list[float] = []
    s = land(spark, url=url, queue=queue, to=str(work / "lake"), checkpoint=str(work / "chk"),
             max_per_trigger=per_trigger, available_now=True,
             progress=lambda _line: firsts.append(time.monotonic()))
    t = read_committed(work / "lake", ["offset"])
    rows = 0 if t is None else t.num_rows
    steady = (n - per_trigger) / (firsts[-1] - firsts[0]) if len(firsts) > 1 else 0.0
    return rows / s.seconds, steady, rows


@contextlib.contextmanager
def ackmq_broker(url: str | None, work: Path) -> Iterator[str]:
    if url:
        yield url
        return
    # a process of its own, as RabbitMQ is: no GIL shared with the consumers measured
    proc = subprocess.Popen([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                             "--data-dir", str(work / "broker")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"listening on (amqp://\S+)", line)
            if m:
                threading.Thread(target=proc.stdout.read, daemon=True).start()
                yield m.group(1)
                return
        raise RuntimeError("ackmq serve did not start")
    finally:
        proc.terminate()
        proc.wait(15)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ackmq.spark.bench")
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--max-per-trigger", type=int, default=10000)
    ap.add_argument("--file-rows", type=int, default=10000)
    ap.add_argument("--ackmq-url", default=None)
    ap.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--no-rabbitmq", action="store_true")
    a = ap.parse_args(argv)
    from ackmq.spark.pipeline import spark_session

    work = Path(tempfile.mkdtemp(prefix="ackmq-spark-bench-"))
    results: list[tuple[str, str, float, str]] = []
    spark = spark_session("ackmq-spark-bench")
    try:
        with ackmq_broker(a.ackmq_url, work) as ackmq_url:
            brokers = [("ackmq", ackmq_url)]
            if not a.no_rabbitmq:
                brokers.append(("rabbitmq", a.rabbitmq_url))
            for name, url in brokers:
                q = f"bench.spark.{name}"
                fill(url, q, a.messages, a.body_size)
                total, steady, rows = spark_land(spark, url, q, a.messages, work / name,
                                                 a.max_per_trigger)
                results.append((name, "spark ackmq source", total,
                                f"{rows} rows, steady {steady:,.0f} msg/s after batch 1"))
                fill(url, q, a.messages, a.body_size)
                rate = naive(url, q, a.messages, work / f"{name}-naive", a.file_rows)
                results.append((name, "naive pika+pyarrow", rate, "acks before fsync: lossy"))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.messages} persistent messages of {a.body_size} B, local[2], "
          f"maxMessagesPerTrigger={a.max_per_trigger}")
    print(f"{'source':10} {'consumer':22} {'msg/s':>10}  notes")
    for name, how, rate, note in results:
        print(f"{name:10} {how:22} {rate:10,.0f}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
