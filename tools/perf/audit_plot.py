"""docs/spark.md's "Lifecycle table" figures, from a real run:
`python -m tools.perf.audit_plot [--messages 600] [--out docs/audit-latency.png]`.

Starts an `ackmq serve` of its own, turns lifecycle tracing on (`ackmq ctl trace_on
--lifecycle`), binds the audit queue, then drives three queues with confirmed
publishes: `orders` (a consumer that acks at once), `slow` (one that takes ~5 ms per
message) and `retry` (one that nacks every first delivery back to the queue). It lands
the events with `ackmq pipeline audit`'s own call (pipeline.land with audit.events,
available-now), prints the docs' two queries' answers and plots publish→ack latency
per queue (a CDF) from the table. Latencies on a busy machine are what they are: the
plot shows the table and the query, not a performance claim.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import threading
import time
from pathlib import Path

import pika

from ackmq.cli import main as ackmq_main
from ackmq.spark.audit import P99_PUBLISH_TO_ACK, WHERE_IS, events, events_view, prepare
from ackmq.spark.pipeline import land, spark_session
from tools.harness.ownbroker import OwnBroker

QUEUES = ("orders", "slow", "retry")


def _consume(url: str, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    done = 0
    for m, _p, _b in ch.consume(queue, inactivity_timeout=30):
        if m is None:
            break
        if queue == "slow":
            time.sleep(0.005)
        if queue == "retry" and not m.redelivered:
            ch.basic_nack(m.delivery_tag, requeue=True)
            continue
        ch.basic_ack(m.delivery_tag)
        done += 1
        if done == n:
            break
    conn.close()


def traffic(url: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for q in QUEUES:
        ch.queue_declare(q, durable=True)
    consumers = [threading.Thread(target=_consume, args=(url, q, n)) for q in QUEUES]
    for t in consumers:
        t.start()
    ch.confirm_delivery()
    for i in range(n):
        for q in QUEUES:
            ch.basic_publish("", q, b"x" * 100, pika.BasicProperties(
                message_id=f"{q}-{i}", delivery_mode=2))
    for t in consumers:
        t.join()
    conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=600, help="per queue")
    p.add_argument("--out", default="docs/audit-latency.png")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ackmq-audit-"))
    broker = OwnBroker(["--no-stomp"], work_dir=work)
    url = broker.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ackmq_main(["ctl", "--data-dir", str(broker.data_dir), "trace_on",
                        "--lifecycle"])
        prepare(url)
        traffic(url, a.messages)
        spark = spark_session("ackmq-audit-plot")
        try:
            table = str(work / "events")
            s = land(spark, url=url, queue="ackmq.audit", to=table,
                     checkpoint=str(work / "chk"), available_now=True, transform=events,
                     max_per_trigger=50000)
            print(f"landed {s.rows} events in {s.batches} batches")
            events_view(spark, table)
            print(WHERE_IS.format(message_id="retry-7"))
            spark.sql(WHERE_IS.format(message_id="retry-7")).show(truncate=False)
            print(P99_PUBLISH_TO_ACK)
            spark.sql(P99_PUBLISH_TO_ACK).show(truncate=False)
            lat = spark.sql("""SELECT a.queue, (a.time_us - p.time_us) / 1000.0 AS ms
                FROM events p JOIN events a ON a.id = p.id
                WHERE p.event = 'publish' AND a.event = 'ack'""").collect()
        finally:
            spark.stop()
    finally:
        broker.stop()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for q in QUEUES:
        xs = sorted(r.ms for r in lat if r.queue == q)
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=q)
    ax.set_xscale("log")
    ax.set_xlabel("publish → ack (ms, broker clock, from the lifecycle table)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("ackmq pipeline audit: publish→ack per queue")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
