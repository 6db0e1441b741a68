"""`ackmq pipeline audit`: the lifecycle table (SPEC S10).

A broker traced with `ackmq ctl trace_on --lifecycle` writes one message per event to
`amq.rabbitmq.trace` (broker/trace.py). The audit binds a durable queue (default
`ackmq.audit`) to that exchange and lands it with `ackmq pipeline land`'s own path
(pipeline.land: staged batches, acked after Spark's commit, deduplicated by
`x-ackmq-seq`: exactly once), projecting each message's headers into columns on the way
(`events`), so "where is message X" and "p99 publish→ack per queue" are one query each
(`WHERE_IS`, `P99_PUBLISH_TO_ACK`; docs/spark.md, "Lifecycle table").

One row per event:

    event         publish, route, confirm, deliver, ack, nack, reject, deadletter,
                  expire, drop
    name          the exchange (publish, route, confirm) or queue the event is about
    id            x-ackmq-id: the broker's identity of the message (its dead-lettered
                  copy keeps it); message_id: the publisher's message-id property
    time_us, at   when (broker clock, µs since the epoch; and as a timestamp)
    vhost, queue, exchange, seq (the message's seq in `queue`), routing_keys,
    routed_queues, redelivered, delivery_count, requeue, reason, ack (confirm),
    fsync_us (the commit's fsync), latency_us (publish to confirm)
    landed_seq    the audit queue's own x-ackmq-seq of the event (unique)
"""

from __future__ import annotations

import asyncio
from typing import Any

AUDIT_QUEUE = "ackmq.audit"
TRACE_EXCHANGE = "amq.rabbitmq.trace"

# the table registered as `events` (events_view): the two questions of the issue
WHERE_IS = """SELECT at, event, name, queue, reason, redelivered, requeue
FROM events WHERE message_id = '{message_id}' ORDER BY time_us, landed_seq"""
P99_PUBLISH_TO_ACK = """SELECT a.queue, count(*) AS acked,
  percentile_approx(a.time_us - p.time_us, 0.5) / 1000.0 AS p50_ms,
  percentile_approx(a.time_us - p.time_us, 0.99) / 1000.0 AS p99_ms
FROM events p JOIN events a ON a.id = p.id
WHERE p.event = 'publish' AND a.event = 'ack'
GROUP BY a.queue ORDER BY a.queue"""


def prepare(url: str, queue: str = AUDIT_QUEUE, keys: tuple[str, ...] = ("#",)) -> None:
    """Declare the durable audit queue and bind it to the trace exchange (idempotent)."""
    from pamqp import commands as C

    from ackmq.client.lowlevel import open_connection

    async def run() -> None:
        conn = await open_connection(url, connection_name="ackmq pipeline audit")
        try:
            ch = await conn.channel()
            await ch.declare_queue(queue, durable=True)
            for key in keys:
                await ch.call(C.Queue.Bind(queue=queue, exchange=TRACE_EXCHANGE,
                                           routing_key=key))
        finally:
            await conn.close()

    asyncio.run(run())


def events(df: Any) -> Any:
    """The landed message rows (pipeline's schema) as lifecycle rows (see the module)."""
    from pyspark.sql import functions as F

    h = F.col("headers")
    kind = F.regexp_extract(F.col("routing_key"), r"^([^.]*)\.", 1)
    name = F.regexp_extract(F.col("routing_key"), r"^[^.]*\.(.*)$", 1)
    time_us = h["x-ackmq-time-us"].cast("bigint")

    def names(col: Any) -> Any:  # "['a', 'b']" (a header array as landed) -> array
        bare = F.regexp_replace(col, r"^\[|\]$", "")
        return F.when(col.isNull(), None).when(bare == "", F.array()).otherwise(
            F.split(F.regexp_replace(bare, r"'", ""), ", "))

    def flag(col: Any) -> Any:
        return F.when(col.isNull(), None).otherwise(col.isin("True", "1"))

    return df.select(
        F.coalesce(h["event"], kind).alias("event"),
        name.alias("name"),
        h["x-ackmq-id"].alias("id"),
        h["message_id"].alias("message_id"),
        time_us.alias("time_us"),
        F.timestamp_micros(time_us).alias("at"),
        h["vhost"].alias("vhost"),
        F.coalesce(h["queue"], F.when(kind == "deliver", name)).alias("queue"),
        h["exchange_name"].alias("exchange"),
        h["seq"].cast("bigint").alias("seq"),
        names(h["routing_keys"]).alias("routing_keys"),
        names(h["routed_queues"]).alias("routed_queues"),
        flag(h["redelivered"]).alias("redelivered"),
        h["delivery_count"].cast("int").alias("delivery_count"),
        flag(h["requeue"]).alias("requeue"),
        h["reason"].alias("reason"),
        flag(h["ack"]).alias("ack"),
        h["fsync_us"].cast("bigint").alias("fsync_us"),
        h["latency_us"].cast("bigint").alias("latency_us"),
        F.col("seq").alias("landed_seq"),
    )


def events_view(spark: Any, table: str) -> Any:
    """The landed table at `table` as the temporary view `events` (for WHERE_IS etc.)."""
    df = spark.read.parquet(table)
    df.createOrReplaceTempView("events")
    return df
