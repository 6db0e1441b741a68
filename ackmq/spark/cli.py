"""`ackmq pipeline land|publish` and `ackmq demo` (wired into `ackmq.cli` by the lead)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ackmq.spark.source import DEFAULT_URL


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pipeline_command", required=True)
    land = sub.add_parser("land", help="land a queue or a stream into Parquet, exactly once")
    land.add_argument("--url", default=DEFAULT_URL)
    which = land.add_mutually_exclusive_group(required=True)
    which.add_argument("--queue", help="consume this queue (acked after each commit)")
    which.add_argument("--stream", help="read this stream queue by offsets (nothing acked)")
    land.add_argument("--starting-offsets", default="earliest",
                      help="--stream, new checkpoint: earliest (default), latest, an offset "
                           "or an ISO timestamp")
    land.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                      help="--stream: fail (default) or warn and go on when retention removed "
                           "offsets before they were read (Kafka's failOnDataLoss)")
    land.add_argument("--stream-protocol", choices=("stream", "amqp"), default=None,
                      help="--stream: how read tasks read their offsets: RabbitMQ's stream "
                           "protocol or AMQP 0-9-1 (default: the source's, stream)")
    land.add_argument("--stream-url", default=None,
                      help="--stream-protocol stream: rabbitmq-stream://user:pass@host:port"
                           "/vhost, or rabbitmq-stream+tls:// (default: --url's host, login "
                           "and vhost, port 5552; an amqps:// --url: +tls, port 5551, its "
                           "TLS options)")
    land.add_argument("--to", required=True, help="Parquet directory")
    land.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    land.add_argument("--max-per-trigger", type=int, default=None,
                      help="messages per micro-batch (default: what is available, at most "
                           "half the prefetch window and 256 MiB of bodies; a stream: all)")
    land.add_argument("--available-now", action="store_true",
                      help="land what is in the queue now, then stop")
    land.add_argument("--partitions", type=int, default=None,
                      help="read tasks per batch (default 2 for a queue, 4 for a stream)")
    land.add_argument("--mqtt", action="store_true",
                      help="--queue: add the columns topic and qos (what MQTT devices "
                           "published: docs/spark.md)")
    land.add_argument("--master", default=None,
                      help="Spark master (default local[2,4]: 2 cores, a task tried 4 times)")
    audit = sub.add_parser("audit", help="land the broker's lifecycle events (ackmq ctl "
                           "trace_on --lifecycle) into a table, exactly once")
    audit.add_argument("--url", default=DEFAULT_URL)
    audit.add_argument("--queue", default="ackmq.audit",
                       help="the durable queue bound to amq.rabbitmq.trace (declared)")
    audit.add_argument("--to", required=True, help="Parquet directory (the table)")
    audit.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    audit.add_argument("--max-per-trigger", type=int, default=10000)
    audit.add_argument("--available-now", action="store_true",
                       help="land the events queued now, then stop")
    audit.add_argument("--master", default=None)
    init = sub.add_parser("init", help="write a Spark Declarative Pipelines project that "
                          "lands queues and streams as streaming tables (spark-pipelines run)")
    init.add_argument("directory", help="the project directory (created)")
    init.add_argument("--url", default=DEFAULT_URL, help="broker ($ACKMQ_URL overrides at run)")
    init.add_argument("--queue", action="append", default=[], help="a queue (repeatable)")
    init.add_argument("--stream", action="append", default=[], help="a stream (repeatable)")
    init.add_argument("--storage", default=None,
                      help="checkpoints and staging (default: <directory>/storage; any URI "
                           "Spark and pyarrow.fs read: hdfs://, s3a:// ...)")
    init.add_argument("--max-per-trigger", type=int, default=None)
    init.add_argument("--sink-exchange", default=None,
                      help="also publish the first table's new rows to this exchange "
                           "(the ackmq sink as a flow target)")
    run = sub.add_parser("run", help="run a project `pipeline init` wrote (spark-pipelines run "
                         "in this Python): exit 0 when the run completed, non-zero when not")
    run.add_argument("directory", nargs="?", default=".", help="the project (default: .)")
    run.add_argument("--remote", default=None,
                     help="a Spark Connect server, sc://host:port (default: a local one)")
    run.add_argument("--connect-port", type=int, default=0,
                     help="the local Connect server's port (default: a free one)")
    run.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                     help="a Spark setting for this run (repeatable)")
    run.add_argument("--full-refresh-all", action="store_true",
                     help="reset every table and land again from the start")
    pub = sub.add_parser("publish", help="publish a Parquet table with publisher confirms")
    pub.add_argument("--from", dest="source", required=True)
    pub.add_argument("--url", default=DEFAULT_URL)
    pub.add_argument("--exchange", default="")
    pub.add_argument("--routing-key", default=None)
    pub.add_argument("--routing-key-column", default=None)
    pub.add_argument("--confirm-timeout", type=float, default=30.0)
    pub.add_argument("--write-id", default=None,
                     help="message ids are ID/0/<partition>/<row>; re-run a failed publish "
                          "with the ID it printed so rows keep their ids (default: random)")
    pub.add_argument("--master", default=None)


#: Spark's own ERROR log repeats every failed task's stack trace (Java and Python); the
#: command prints one line per failure instead. ACKMQ_SPARK_LOG_LEVEL=ERROR shows it.
_LOG_LEVEL = "ACKMQ_SPARK_LOG_LEVEL"
_ACKMQ_ERROR = re.compile(
    r"(?:ConsumerError|SinkPublishError|PipelineError|DataLossError): ([^\n]+)")
_PY_ERROR = re.compile(r"^((?!java\.|org\.|py4j\.)[\w.]*(?:Error|Exception): [^\n]+)$",
                       re.MULTILINE)


def explain(exc: BaseException) -> str:
    """One line for a failed job: ackmq's own error if the Spark exception carries one
    (it is buried in a Java and a Python stack trace), else the exception's first line."""
    text = str(exc)
    m = _ACKMQ_ERROR.search(text)
    if m:
        return m.group(1).strip()
    py = _PY_ERROR.findall(text)  # the Python error inside Spark's wrapper, if any
    if py:
        kinds = re.findall(r"\[([A-Z][A-Z_]+)\]", text.split("Traceback", 1)[0])
        return py[-1].strip()[:400] + (f" (Spark: {', '.join(kinds)})" if kinds else "")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return first[:400]


def run_pipeline(args: argparse.Namespace) -> int:
    """Run `land`/`publish`; a failure prints one line (what failed, what to fix), exit 1."""
    import os

    from ackmq.client import ClientError
    from ackmq.spark.pipeline import PipelineError, check_broker, land, log, publish, spark_session

    cmd = args.pipeline_command
    if cmd == "init":
        return run_init(args)
    if cmd == "run":
        from ackmq.spark.sdp import run_project

        return run_project(args.directory, remote=args.remote, connect_port=args.connect_port,
                           conf=args.conf, full_refresh_all=args.full_refresh_all)
    write_id = getattr(args, "write_id", None) or uuid.uuid4().hex
    again = f"; re-run with --write-id {write_id} to give rows the same message ids"
    try:
        if cmd == "audit":
            from ackmq.spark.audit import prepare

            check_broker(args.url)
            prepare(args.url, args.queue)
        elif cmd == "land":
            if args.mqtt and args.stream is not None:
                raise ValueError("--mqtt is for --queue (a stream's rows have no MQTT columns)")
            check_broker(args.url, queue=args.queue, stream=args.stream)
            if args.stream is not None:
                from ackmq.spark.stream_source import parse_position

                parse_position(args.starting_offsets, "--starting-offsets")
        else:
            check_broker(args.url, exchange=args.exchange)
    except (PipelineError, ValueError, ClientError) as exc:
        log(f"ackmq pipeline {cmd}: {exc}")
        return 1
    stop = StopRequest() if cmd in ("land", "audit") else None
    spark = spark_session(f"ackmq-{cmd}", args.master,
                          log_level=os.environ.get(_LOG_LEVEL, "OFF"))
    try:
        if cmd in ("land", "audit"):
            assert stop is not None
            stop.install()  # again: SparkContext put in its own (cancel jobs, raise)
            if cmd == "land":
                parts = args.partitions or (4 if args.stream is not None else 2)
                s = land(spark, url=args.url, queue=args.queue, to=args.to,
                         checkpoint=args.checkpoint, max_per_trigger=args.max_per_trigger,
                         available_now=args.available_now, num_partitions=parts,
                         progress=log, stream=args.stream,
                         starting_offsets=args.starting_offsets,
                         fail_on_data_loss=args.fail_on_data_loss == "true", stop=stop.event,
                         mqtt=args.mqtt, stream_protocol=args.stream_protocol,
                         stream_url=args.stream_url)
            else:
                from ackmq.spark.audit import events

                s = land(spark, url=args.url, queue=args.queue, to=args.to,
                         checkpoint=args.checkpoint, max_per_trigger=args.max_per_trigger,
                         available_now=args.available_now, progress=log, transform=events,
                         stop=stop.event)
            what = "messages" if cmd == "land" else "events"
            landed = f"landed {s.rows} {what} in {s.batches} batches, {s.seconds:.1f}s"
            if s.stopped:
                log(f"ackmq pipeline {cmd}: stopped by {stop.name} between batches; {landed}; "
                    "the next run goes on from the checkpoint")
                return 128 + stop.signum
            log(landed)
        else:
            n = publish(spark, source=args.source, url=args.url, exchange=args.exchange,
                        routing_key=args.routing_key,
                        routing_key_column=args.routing_key_column,
                        confirm_timeout=args.confirm_timeout, write_id=write_id)
            log(f"published {n} rows, all confirmed (write id {write_id})")
        return 0
    except Exception as exc:  # noqa: BLE001 - one line instead of Spark's stack traces
        log(f"ackmq pipeline {cmd} failed: {explain(exc)}"
            + (again if cmd == "publish" else "")
            + f" [Spark's log: {_LOG_LEVEL}=ERROR]")
        return 1
    finally:
        spark.stop()


class StopRequest:
    """SIGINT (Ctrl-C) and SIGTERM ask a landing to stop between batches: no exception
    in the middle of a Spark call (which printed py4j's tracebacks), one line, exit
    128 + the signal. A second signal stops at once, as Python would."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0
        self.install()

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def _handle(self, signum: int, frame: Any) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.signum = signum
        self.event.set()


def run_init(args: argparse.Namespace) -> int:
    from ackmq.spark.pipeline import log
    from ackmq.spark.sdp import write_project

    try:
        files = write_project(args.directory, url=args.url, queues=args.queue,
                              streams=args.stream, storage=args.storage,
                              max_per_trigger=args.max_per_trigger,
                              sink_exchange=args.sink_exchange)
    except (OSError, ValueError) as exc:
        log(f"ackmq pipeline init: {exc}")
        return 1
    for f in files:
        log(f"wrote {f}")
    log(f"run it: {Path(args.directory).resolve() / 'run'}")
    return 0


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--max-per-trigger", type=int, default=5000)
    parser.add_argument("--url", default=None,
                        help="use this broker instead of an embedded ackmq")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")


@contextlib.contextmanager
def _broker(url: str | None, data_dir: Path) -> Iterator[str]:
    if url:
        yield url
        return
    import ackmq

    embedded = getattr(ackmq, "EmbeddedBroker", None)
    if embedded is None:
        raise SystemExit("ackmq.EmbeddedBroker is not available; pass --url")
    with embedded(port=0, data_dir=str(data_dir)) as b:
        yield b.url


def _publish_orders(url: str, queue: str, n: int, done: dict[str, Any]) -> None:
    """Asynchronous confirms; the message has no message_id: ackmq needs none (S2)."""
    from ackmq.spark.amqp import ConfirmingPublisher

    t0 = time.monotonic()
    pub = ConfirmingPublisher(url, window=2000)
    try:
        for i in range(n):
            body = json.dumps({"order": i, "amount": i % 97}).encode()
            pub.publish("", queue, body, content_type="application/json")
        pub.flush()
        done["confirmed"] = pub.confirmed
    except BaseException as exc:  # noqa: BLE001 - reported by the demo
        done["error"] = exc
    finally:
        pub.close()
        done["seconds"] = time.monotonic() - t0


def run_demo(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from ackmq.spark.amqp import open_connection
    from ackmq.spark.pipeline import land, log, queue_backlog, spark_session

    work = Path(args.dir or tempfile.mkdtemp(prefix="ackmq-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    queue = "orders"
    with _broker(args.url, work / "broker") as url:
        log(f"broker: {url}")
        with open_connection(url) as conn:
            conn.declare_queue(queue, durable=True)
        done: dict[str, Any] = {}
        pub = threading.Thread(target=_publish_orders, args=(url, queue, args.messages, done))
        pub.start()
        spark = spark_session("ackmq-demo")
        try:
            lake, chk = str(work / "lake" / queue), str(work / "chk")
            s = land(spark, url=url, queue=queue, to=lake, checkpoint=chk,
                     max_per_trigger=args.max_per_trigger, progress=log,
                     stop_when=lambda st: st.rows >= args.messages and not pub.is_alive())
            pub.join()
            if "error" in done:
                log(f"publisher failed: {done['error']}")
                return 1
            log(f"published {done['confirmed']} messages, all confirmed, "
                f"{done['confirmed'] / done['seconds']:,.0f} msg/s")
            log(f"landed {s.rows} rows in {s.batches} batches, {s.seconds:.1f}s")
            t = spark.read.parquet(lake)
            orders = t.select(F.get_json_object(F.col("body").cast("string"), "$.order")
                              .alias("order"))
            rows, distinct = t.count(), orders.distinct().count()
            backlog = queue_backlog(url, queue)
            ok = rows == distinct == args.messages and backlog == 0
            log(f"table {lake}: {rows} rows, {distinct} distinct orders, queue backlog "
                f"{backlog}: {'every message exactly once' if ok else 'MISMATCH'}")
            return 0 if ok else 1
        finally:
            spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ackmq.spark")
    sub = parser.add_subparsers(dest="command", required=True)
    add_pipeline_arguments(sub.add_parser("pipeline"))
    add_demo_arguments(sub.add_parser("demo"))
    args = parser.parse_args(argv)
    return run_pipeline(args) if args.command == "pipeline" else run_demo(args)
