"""Landing throughput into Parquet, beside Spark's own ceiling on the same machine.

    python -m ackmq.spark.bench [--messages 200000] [--rounds 1] [--ackmq-url URL]
                                [--rabbitmq-url URL | --no-rabbitmq] [--naive]
    python -m ackmq.spark.bench backlog --messages 1000000 --max-per-trigger 20000   # S5
    python -m ackmq.spark.bench streams --messages 50000 [--partitions 4]           # R4

The default run (S5) prints `uptime`, then lands a backlog of `--messages` persistent
1 KiB messages into Parquet (local[2,4], Trigger.AvailableNow, every source option at
its default) from: ackmq's queue (queue source), ackmq's stream (stream source), and
RabbitMQ's queue and stream; beside Spark's own ceiling: the same rows from a
broker-free Python source (ackmq/spark/ceiling.py) at the batch size ackmq's queue
source chose and in one batch, and the JVM alone writing rows of the same size
(`spark.range` in SQL, no Python). For each: rows/s over the run and after batch 1,
batches, CPU per message of the JVM, the Python processes and the broker. `--naive`
adds a consumer that acks before writing (lossy: a bound, not a competitor). With no
--ackmq-url an `ackmq serve` subprocess is started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ackmq.client import AckMode
from ackmq.spark.amqp import ConfirmingPublisher, open_connection
from ackmq.spark.lake import read_committed
from ackmq.spark.streamproto import stream_url_for

# Full-size batches landed before the measured runs. With a warm-up of 2 batches of
# 1,000 rows, whichever broker ran first paid the JIT of the 10,000-row path: its driver
# tree used 2.0-2.5 s more CPU per 100,000 messages (JVM +1.4-1.9 s, Python workers
# +0.5-0.6 s), and swapping the order swapped the winner (after batch 1, ackmq first:
# 14,334 vs 11,687 msg/s; RabbitMQ first: 9,380 vs 13,539).
WARMUP_BATCHES = 3


def fill(url: str, queue: str, n: int, size: int,
         arguments: dict[str, object] | None = None) -> None:
    _recreate(url, queue, arguments)
    pub = ConfirmingPublisher(url, window=2000)
    body = b"x" * size
    for _ in range(n):
        pub.publish("", queue, body)
    pub.flush()
    pub.close()


def _recreate(url: str, queue: str, arguments: dict[str, object] | None = None) -> None:
    """An empty durable `queue`: deleted (if there) and declared again. (ackmq.client
    has no queue.delete: a bench-only raw RPC on the session's channel.)"""
    from pamqp import commands as C

    from ackmq.protocol.amqp import build_method

    with open_connection(url) as conn:
        s = conn.session()
        chan = s.chan
        assert chan is not None
        fut = chan.rpc(build_method(C.Queue.Delete, queue=queue), (C.Queue.DeleteOk,))
        fut.result(30)
        conn.declare_queue(queue, durable=True, arguments=arguments)


STREAM: dict[str, object] = {"x-queue-type": "stream"}


def naive(url: str, queue: str, n: int, out: Path, file_rows: int) -> float:
    """Ack-as-you-append consumer (ackmq.client, AUTO: acked before receive() returns,
    prefetch 1000); returns messages/s."""
    out.mkdir(parents=True, exist_ok=True)
    with open_connection(url, queue_prefetch=1000) as conn:
        c = conn.session(AckMode.AUTO).consumer(queue)
        bodies: list[bytes] = []
        keys: list[str] = []
        got, files = 0, 0
        t0 = time.monotonic()
        while got < n:
            m = c.receive(timeout=5)
            if m is None:
                break
            bodies.append(m.body)  # acked before it is on disk: a crash loses it
            keys.append(m.routing_key)
            got += 1
            if len(bodies) >= file_rows or got == n:
                pq.write_table(pa.table({"body": bodies, "routing_key": keys}),
                               out / f"part-{files:05d}.parquet")
                files += 1
                bodies, keys = [], []
        dt = time.monotonic() - t0
        c.close()
    return got / dt


# the stream protocol's URL of each `ackmq serve` the bench started (by its AMQP URL);
# --ackmq-stream-url for a broker of one's own; RabbitMQ's: its AMQP host, port 5552
STREAM_URLS: dict[str, str] = {}


def spark_land(spark: object, url: str, queue: str, n: int, work: Path, per_trigger: int,
               *, stream: bool = False, partitions: int = 2,
               protocol: str | None = None) -> tuple[float, float, int]:
    """Returns (msgs/s over the whole query, msgs/s after the first batch, rows landed).
    With `stream` the queue is read as a stream (offset ranges, `partitions` tasks, read
    over `protocol`: the source's option, its default when None)."""
    from ackmq.spark.pipeline import land

    s = land(spark, url=url, to=str(work / "lake"), checkpoint=str(work / "chk"),
             max_per_trigger=per_trigger, available_now=True, num_partitions=partitions,
             stream=queue if stream else None, queue=None if stream else queue,
             stream_protocol=protocol, stream_url=STREAM_URLS.get(url))
    t = read_committed(work / "lake", ["offset"])
    rows = 0 if t is None else t.num_rows
    # after batch 1, by Spark's own batch timestamps (not by when the progress was polled)
    ends = s.ends
    steady = (sum(r for _, r in ends[1:]) / (ends[-1][0] - ends[0][0])
              if len(ends) > 1 and ends[-1][0] > ends[0][0] else 0.0)
    return rows / s.seconds, steady, rows


@contextlib.contextmanager
def ackmq_broker(url: str | None, work: Path) -> Iterator[str]:
    if url:
        yield url
        return
    # a process of its own, as RabbitMQ is: no GIL shared with the consumers measured
    proc = subprocess.Popen([sys.executable, "-m", "ackmq", "serve", "--port", "0", "--no-stomp",
                             "--http-port", "0", "--stream-port", "0", "--no-mqtt",
                             "--data-dir", str(work / "broker")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"listening on (amqp://\S+)", line)
            if m:
                threading.Thread(target=proc.stdout.read, daemon=True).start()
                ms = re.search(r"rabbitmq-stream://\S+:(\d+)", line)
                if ms:
                    STREAM_URLS[m.group(1)] = stream_url_for(m.group(1), int(ms.group(1)))
                yield m.group(1)
                return
        raise RuntimeError("ackmq serve did not start")
    finally:
        proc.terminate()
        proc.wait(15)


def backlog(url: str, n: int, size: int, per_trigger: int, work: Path) -> None:
    """S5: drain an n-message backlog with `pipeline land --available-now` in a subprocess,
    sampling the resident memory of the whole driver tree (JVM + Python workers)."""
    import psutil

    q = "bench.spark.backlog"
    t0 = time.monotonic()
    fill(url, q, n, size)
    print(f"filled {n} messages of {size} B in {time.monotonic() - t0:.0f}s", flush=True)
    cmd = [sys.executable, "-m", "ackmq.spark", "pipeline", "land", "--url", url, "--queue", q,
           "--to", str(work / "lake"), "--checkpoint", str(work / "chk"),
           "--max-per-trigger", str(per_trigger), "--available-now"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    landed, biggest, samples = 0, 0, []
    top = psutil.Process(proc.pid)

    def tree_rss() -> int:
        total = 0
        for p in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    t0 = time.monotonic()
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.match(r"batch \d+: (\d+) rows.*landed (\d+)", line)
        if m:
            biggest = max(biggest, int(m.group(1)))
            landed = int(m.group(2))
            samples.append((landed, tree_rss()))
    rc = proc.wait()
    dt = time.monotonic() - t0
    print(f"land exited {rc}: {landed} rows in {dt:.0f}s ({landed / dt:,.0f} msg/s), "
          f"largest batch {biggest} (cap {per_trigger})")
    for frac in (0.1, 0.25, 0.5, 0.75, 1.0):
        if samples:
            at, rss = samples[min(len(samples) - 1, int(frac * (len(samples) - 1)))]
            print(f"  after {at:>9} rows: driver tree RSS {rss / 2**20:,.0f} MiB")


def _cpu_by_kind(broker_url: str) -> dict[str, float]:
    """CPU seconds so far of this driver's tree (the JVM, Python processes) and of the
    broker (RabbitMQ's beam.smp, or the `ackmq serve` on the URL's port)."""
    import psutil

    out = {"jvm": 0.0, "python": 0.0, "broker": 0.0}
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            kind = "jvm" if "java" in p.name() else "python"
            if "serve" in " ".join(p.cmdline()):
                kind = "broker"
            out[kind] += t.user + t.system
    if ":5672" in broker_url or broker_url.rstrip("/").endswith("127.0.0.1"):
        for p in psutil.process_iter(["name"]):
            if p.info["name"] == "beam.smp":
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    out["broker"] += t.user + t.system
    return out


def streams(a: argparse.Namespace) -> None:
    """R4: Spark landing from a stream (ackmq's, when it has streams, and RabbitMQ's) vs
    the classic-queue path, same session, same sizes, after batch 1."""
    from ackmq.spark.amqp import ConsumerError
    from ackmq.spark.pipeline import spark_session
    from ackmq.spark.streamwire import first_offset

    work = Path(tempfile.mkdtemp(prefix="ackmq-spark-streams-"))
    spark = spark_session("ackmq-spark-bench-streams")
    master = spark.sparkContext.master
    results: list[tuple[str, float, float, int, int]] = []
    try:
        with ackmq_broker(a.ackmq_url, work) as ackmq_url:
            if a.ackmq_stream_url:
                STREAM_URLS[ackmq_url] = a.ackmq_stream_url
            protocols = [p.strip() for p in a.protocols.split(",") if p.strip()]
            cases = [("ackmq classic queue (queue source)", ackmq_url, False, None),
                     *[(f"ackmq stream over {p}", ackmq_url, True, p) for p in protocols],
                     *[(f"RabbitMQ stream over {p}", a.rabbitmq_url, True, p)
                       for p in protocols],
                     ("RabbitMQ classic queue (queue source)", a.rabbitmq_url, False, None)]
            if a.no_queues:
                cases = [c for c in cases if c[2]]
            runnable = []
            for name, url, is_stream, protocol in cases:
                if is_stream:
                    try:
                        fill(url, "bench.spark.r4.probe", 1, 10, STREAM)
                        first_offset(url, "bench.spark.r4.probe")
                    except Exception as exc:  # noqa: BLE001 - reported, case skipped
                        print(f"skipped {name}: {str(exc)[:160]}", flush=True)
                        continue
                runnable.append((name, url, is_stream, protocol))
            warm = WARMUP_BATCHES * a.max_per_trigger  # every read path, not reported
            warmups = {(c[2], c[3]): c for c in runnable}
            for w, (_name, url, is_stream, protocol) in enumerate(warmups.values()):
                fill(url, f"bench.spark.r4.warmup.{w}", warm, a.body_size,
                     STREAM if is_stream else None)
                spark_land(spark, url, f"bench.spark.r4.warmup.{w}", warm,
                           work / f"warm-{w}", a.max_per_trigger, stream=is_stream,
                           partitions=a.partitions, protocol=protocol)
            filled: dict[tuple[str, bool, int], str] = {}
            for r in range(a.rounds):
                for i, (name, url, is_stream, protocol) in enumerate(runnable):
                    # the protocols of one broker read the very same stream
                    q = filled.get((url, is_stream, r)) or f"bench.spark.r4.{i}"
                    if (url, is_stream, r) not in filled:
                        fill(url, q, a.messages, a.body_size, STREAM if is_stream else None)
                        filled[(url, is_stream, r)] = q
                    cpu0 = _cpu_by_kind(url)
                    total, steady, rows = spark_land(
                        spark, url, q, a.messages, work / f"{i}-{r}", a.max_per_trigger,
                        stream=is_stream, partitions=a.partitions if is_stream else 2,
                        protocol=protocol)
                    cpu1 = _cpu_by_kind(url)
                    per = {k: (cpu1[k] - cpu0[k]) / max(rows, 1) * 1e6 for k in cpu0}
                    results.append((name, total, steady, rows, r))
                    load = os.getloadavg()[0]
                    print(f"{name}: {rows} rows, {total:,.0f} msg/s whole run, "
                          f"{steady:,.0f} after batch 1; CPU per message: JVM "
                          f"{per['jvm']:.0f} us, Python {per['python']:.0f} us, broker "
                          f"{per['broker']:.0f} us; load average {load:.1f}", flush=True)
    except ConsumerError as exc:
        print(f"failed: {exc}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.messages} persistent messages of {a.body_size} B, {master}, "
          f"maxMessagesPerTrigger={a.max_per_trigger}, stream read tasks per batch "
          f"{a.partitions}")
    print(f"{'source':40} {'whole run':>10} {'after batch 1':>14}")
    base = {r: s for n, _, s, _, r in results if n.startswith("ackmq classic")}
    for name, total, steady, rows, r in results:
        ratio = f"  {steady / base[r]:.2f}x this round's ackmq classic queue" \
            if base.get(r) else ""
        print(f"{name:40} {total:10,.0f} {steady:14,.0f}{ratio}  ({rows} rows)")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def _query_rates(q: object, seconds: float, rows: int) -> tuple[float, float, int]:
    """(rows/s over the run, rows/s after batch 1 by Spark's batch timestamps, batches)."""
    from ackmq.spark.pipeline import batch_end

    ps = [p for p in q.recentProgress if int(p.numInputRows)]  # type: ignore[attr-defined]
    ends = [(batch_end(p), int(p.numInputRows)) for p in ps]
    steady = (sum(r for _, r in ends[1:]) / (ends[-1][0] - ends[0][0])
              if len(ends) > 1 and ends[-1][0] > ends[0][0] else 0.0)
    return rows / seconds, steady, len(ends)


def ceiling_land(spark: object, rows: int, batch: int, body_size: int,
                 work: Path) -> tuple[float, float, int]:
    """Spark's ceiling: the broker-free Python source, `batch` rows per micro-batch."""
    from ackmq.spark.ceiling import CeilingSource

    spark.dataSource.register(CeilingSource)  # type: ignore[attr-defined]
    df = (spark.readStream.format("ackmq_ceiling")  # type: ignore[attr-defined]
          .option("rows", rows).option("batchRows", batch).option("bodySize", body_size).load())
    t0 = time.monotonic()
    q = (df.writeStream.format("parquet").option("path", str(work / "lake"))
         .option("checkpointLocation", str(work / "chk")).trigger(availableNow=True).start())
    q.awaitTermination()
    return _query_rates(q, time.monotonic() - t0, rows)


def jvm_land(spark: object, rows: int, body_size: int, work: Path) -> float:
    """The JVM alone: rows of the same size generated in SQL, written to Parquet."""
    df = spark.range(rows, numPartitions=2).selectExpr(  # type: ignore[attr-defined]
        "id as offset", "id as seq", f"cast(repeat('x', {body_size}) as binary) as body",
        "'bench' as routing_key", "'' as exchange", "cast(null as string) as message_id",
        "false as redelivered", "0 as delivery_count", "current_timestamp() as received_at")
    t0 = time.monotonic()
    df.write.mode("overwrite").parquet(str(work / "jvm"))
    return rows / (time.monotonic() - t0)


def ceiling(a: argparse.Namespace) -> int:
    """The default run: ackmq and RabbitMQ landings beside Spark's ceiling (S5)."""
    from ackmq.spark.pipeline import land, spark_session

    print(f"uptime: {_uptime()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="ackmq-spark-bench-"))
    spark = spark_session("ackmq-spark-bench")
    master = spark.sparkContext.master
    out: list[tuple[str, float, float, int, str]] = []

    def report(name: str, total: float, steady: float, batches: int, note: str = "") -> None:
        out.append((name, total, steady, batches, note))
        print(f"{name}: {total:,.0f} rows/s whole run, {steady:,.0f} after batch 1, "
              f"{batches} batches {note}; load {os.getloadavg()[0]:.1f}", flush=True)

    def source(name: str, url: str, queue: str, is_stream: bool, tag: str) -> int:
        fill(url, queue, a.messages, a.body_size, STREAM if is_stream else None)
        cpu0, t0 = _cpu_by_kind(url), time.monotonic()
        s = land(spark, url=url, to=str(work / tag / "lake"), checkpoint=str(work / tag / "chk"),
                 available_now=True, num_partitions=4 if is_stream else 2,
                 stream=queue if is_stream else None, queue=None if is_stream else queue,
                 stream_url=STREAM_URLS.get(url))
        dt, cpu1 = time.monotonic() - t0, _cpu_by_kind(url)
        t = read_committed(work / tag / "lake", ["offset"])
        rows = 0 if t is None else t.num_rows
        per = {k: (cpu1[k] - cpu0[k]) / max(rows, 1) * 1e6 for k in cpu0}
        steady = (sum(r for _, r in s.ends[1:]) / (s.ends[-1][0] - s.ends[0][0])
                  if len(s.ends) > 1 and s.ends[-1][0] > s.ends[0][0] else 0.0)
        biggest = max((r for _, r in s.ends), default=0)
        report(name, rows / dt, steady, s.batches,
               f"(largest {biggest}, {rows} rows; CPU/msg JVM {per['jvm']:.0f} us, "
               f"Python {per['python']:.0f} us, broker {per['broker']:.0f} us)")
        return biggest

    try:
        with ackmq_broker(a.ackmq_url, work) as ackmq_url:
            # warm-up, not reported: Python workers, JIT of the Arrow -> Parquet path
            fill(ackmq_url, "bench.spark.warmup", min(a.messages, 30000), a.body_size)
            land(spark, url=ackmq_url, queue="bench.spark.warmup", to=str(work / "w" / "lake"),
                 checkpoint=str(work / "w" / "chk"), available_now=True)
            ceiling_land(spark, min(a.messages, 30000), 10000, a.body_size, work / "wc")
            for r in range(a.rounds):
                tag = f"r{r}"
                batch = source("ackmq queue", ackmq_url, "bench.spark.q", False, f"{tag}aq")
                try:
                    source("ackmq stream", ackmq_url, "bench.spark.s", True, f"{tag}as")
                except Exception as exc:  # noqa: BLE001 - a broker without streams
                    print(f"ackmq stream: skipped ({str(exc)[:160]})", flush=True)
                if not a.no_rabbitmq:
                    source("RabbitMQ queue", a.rabbitmq_url, "bench.spark.q", False, f"{tag}rq")
                    source("RabbitMQ stream", a.rabbitmq_url, "bench.spark.s", True, f"{tag}rs")
                total, steady, n = ceiling_land(spark, a.messages, max(batch, 1), a.body_size,
                                                work / f"{tag}c1")
                report(f"ceiling: Python source, batches of {batch}", total, steady, n)
                total, steady, n = ceiling_land(spark, a.messages, a.messages, a.body_size,
                                                work / f"{tag}c2")
                report("ceiling: Python source, one batch", total, steady, n)
                report("ceiling: JVM alone (no Python)",
                       jvm_land(spark, a.messages, a.body_size, work / f"{tag}j"), 0.0, 1)
                if a.naive:
                    fill(ackmq_url, "bench.spark.n", a.messages, a.body_size)
                    report("naive ackmq.client + pyarrow (acks first)",
                           naive(ackmq_url, "bench.spark.n", a.messages, work / f"{tag}n",
                                 a.file_rows), 0.0, 0)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.messages} persistent messages of {a.body_size} B, {master}, source "
          f"defaults; uptime: {_uptime()}")
    print(f"{'landing':44} {'rows/s':>9} {'after b1':>9} {'batches':>8}")
    for name, total, steady, batches, _ in out:
        print(f"{name:44} {total:9,.0f} {steady:9,.0f} {batches:8}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["streams"]:
        sp = argparse.ArgumentParser(prog="python -m ackmq.spark.bench streams")
        sp.add_argument("--messages", type=int, default=50000)
        sp.add_argument("--body-size", type=int, default=1024)
        sp.add_argument("--max-per-trigger", type=int, default=10000)
        sp.add_argument("--partitions", type=int, default=4)
        sp.add_argument("--rounds", type=int, default=1)
        sp.add_argument("--ackmq-url", default=None)
        sp.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
        sp.add_argument("--ackmq-stream-url", default=None,
                        help="with --ackmq-url: its stream protocol's rabbitmq-stream:// URL")
        sp.add_argument("--protocols", default="stream,amqp",
                        help="the stream source's read protocols to measure, in this order")
        sp.add_argument("--no-queues", action="store_true",
                        help="only the stream landings (no classic-queue cases)")
        streams(sp.parse_args(argv[1:]))
        return 0
    if argv[:1] == ["backlog"]:
        bp = argparse.ArgumentParser(prog="python -m ackmq.spark.bench backlog")
        bp.add_argument("--messages", type=int, default=1_000_000)
        bp.add_argument("--body-size", type=int, default=100)
        bp.add_argument("--max-per-trigger", type=int, default=20000)
        bp.add_argument("--ackmq-url", default=None)
        b = bp.parse_args(argv[1:])
        work = Path(tempfile.mkdtemp(prefix="ackmq-spark-backlog-"))
        try:
            with ackmq_broker(b.ackmq_url, work) as url:
                backlog(url, b.messages, b.body_size, b.max_per_trigger, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if argv[:1] != ["naive"]:
        cp = argparse.ArgumentParser(prog="python -m ackmq.spark.bench")
        cp.add_argument("--messages", type=int, default=200_000)
        cp.add_argument("--body-size", type=int, default=1024)
        cp.add_argument("--rounds", type=int, default=1)
        cp.add_argument("--file-rows", type=int, default=10000)
        cp.add_argument("--ackmq-url", default=None)
        cp.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
        cp.add_argument("--no-rabbitmq", action="store_true")
        cp.add_argument("--naive", action="store_true",
                        help="also land with a consumer that acks before writing (lossy)")
        return ceiling(cp.parse_args(argv))
    argv = argv[1:]
    ap = argparse.ArgumentParser(prog="python -m ackmq.spark.bench naive")
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--max-per-trigger", type=int, default=10000)
    ap.add_argument("--file-rows", type=int, default=10000)
    ap.add_argument("--ackmq-url", default=None)
    ap.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="land from each broker this many times, the first broker of each "
                         "round alternating (the later one lands on a warmer JVM); with "
                         "more than one, the medians are printed too")
    a = ap.parse_args(argv)
    from ackmq.spark.pipeline import spark_session

    work = Path(tempfile.mkdtemp(prefix="ackmq-spark-bench-"))
    results: list[tuple[str, str, float, str]] = []
    steadies: dict[str, list[float]] = {}
    spark = spark_session("ackmq-spark-bench")
    master = spark.sparkContext.master
    try:
        with ackmq_broker(a.ackmq_url, work) as ackmq_url:
            brokers = [("ackmq", ackmq_url)]
            if not a.no_rabbitmq:
                brokers.append(("rabbitmq", a.rabbitmq_url))
            # Warm-up, not reported: the session's first query pays for starting Spark's
            # Python workers, and the first full-size batches for the JVM's JIT of the
            # Arrow -> Parquet path; either would be charged to whichever broker is first.
            # So it lands WARMUP_BATCHES batches of the measured size.
            warm = WARMUP_BATCHES * a.max_per_trigger
            fill(ackmq_url, "bench.spark.warmup", warm, a.body_size)
            spark_land(spark, ackmq_url, "bench.spark.warmup", warm, work / "warmup",
                       a.max_per_trigger)
            for r in range(a.rounds):
                for name, url in (brokers if r % 2 == 0 else brokers[::-1]):
                    q = f"bench.spark.{name}"
                    tag = f"round {r + 1}: " if a.rounds > 1 else ""
                    fill(url, q, a.messages, a.body_size)
                    total, steady, rows = spark_land(spark, url, q, a.messages,
                                                     work / f"{name}-{r}", a.max_per_trigger)
                    results.append((name, "spark ackmq source", total, f"{tag}{rows} rows, "
                                    f"steady {steady:,.0f} msg/s after batch 1"))
                    steadies.setdefault(name, []).append(steady)
                    fill(url, q, a.messages, a.body_size)
                    rate = naive(url, q, a.messages, work / f"{name}-naive-{r}", a.file_rows)
                    results.append((name, "naive client+pyarrow", rate,
                                    f"{tag}acks before fsync: lossy"))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.messages} persistent messages of {a.body_size} B, {master}, "
          f"maxMessagesPerTrigger={a.max_per_trigger}")
    print(f"{'source':10} {'consumer':22} {'msg/s':>10}  notes")
    for name, how, rate, note in results:
        print(f"{name:10} {how:22} {rate:10,.0f}  {note}")
    if a.rounds > 1:
        for name, xs in steadies.items():
            print(f"{name:10} {'median after batch 1':22} {statistics.median(xs):10,.0f}  "
                  f"of {len(xs)} rounds: " + ", ".join(f"{x:,.0f}" for x in xs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
