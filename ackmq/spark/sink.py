"""Sink `ackmq`: each write task publishes its rows with publisher confirms (S3).

A task returns only when every row it published is confirmed; a nack, a return (with
`mandatory`) or a confirm timeout raises, the task fails and Spark retries it. A retry
publishes the same rows again with the same deterministic `message_id`
(`<query>/<batch>/<partition>/<row>`), so consumers (and the `ackmq` source) can drop
the copies; against ackmq the id also goes in `x-deduplication-header` (option
`idempotent`), so a target queue declared with `x-message-deduplication: true` (or a
dedup exchange) keeps one copy: table -> queue exactly once (docs/dedup.md). The driver-side `commit` has nothing left to do and is idempotent, because
Spark may call it twice for one batch after a failure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ackmq.spark.amqp import ConfirmingPublisher
from ackmq.spark.source import DEFAULT_URL, bool_option


@dataclass
class PublishedCommit(WriterCommitMessage):
    partition: int
    published: int
    confirmed: int
    seconds: float


# the `properties` struct's fields -> ackmq.client's property names
_PROP_FIELDS = {"content_type": "content_type", "content_encoding": "content_encoding",
                "priority": "priority", "correlation_id": "correlation_id",
                "reply_to": "reply_to", "expiration": "expiration", "type": "message_type",
                "user_id": "user_id", "app_id": "app_id"}


class _Publishing:
    """Shared by batch and streaming writers: options and the per-task publish loop."""

    def __init__(self, options: Any, schema: Any) -> None:
        import os

        self.url = options.get("url") or os.environ.get("ACKMQ_URL", DEFAULT_URL)
        self.exchange = options.get("exchange") or ""
        self.routing_key = options.get("routingKey") or options.get("routing_key") or ""
        names = set(schema.fieldNames())
        self.rk_column = options.get("routingKeyColumn") or (
            "routing_key" if "routing_key" in names and not self.routing_key else None)
        self.body_column = options.get("bodyColumn") or "body"
        if self.body_column not in names:
            raise ValueError(f"the ackmq sink needs a {self.body_column!r} column")
        self.has_headers = "headers" in names
        self.has_props = "properties" in names
        self.persistent = bool_option(options.get("persistent"), True)
        self.mandatory = bool_option(options.get("mandatory"), False)
        self.confirm_timeout = float(options.get("confirmTimeout") or 30.0)
        self.window = int(options.get("confirmWindow") or 1000)
        # message ids also in x-deduplication-header (default: when the broker is ackmq)
        idem = options.get("idempotent")
        self.idempotent = None if idem is None else bool_option(idem, True)
        self.write_id = options.get("writeId") or uuid.uuid4().hex  # fixed on the driver

    def publish_partition(self, rows: Iterator[Any], batch: str) -> PublishedCommit:
        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx else 0
        query = (ctx.getLocalProperty("sql.streaming.queryId") if ctx else None) or self.write_id
        t0 = time.monotonic()
        pub = ConfirmingPublisher(self.url, window=self.window,
                                  confirm_timeout=self.confirm_timeout, mandatory=self.mandatory,
                                  idempotent=self.idempotent)
        try:
            for i, row in enumerate(rows):
                body = row[self.body_column]
                if isinstance(body, str):
                    body = body.encode()
                elif body is not None:
                    body = bytes(body)
                rk = row[self.rk_column] if self.rk_column else self.routing_key
                kw: dict[str, Any] = {}
                if self.has_props and row["properties"] is not None:
                    p = row["properties"].asDict()
                    kw = {_PROP_FIELDS[k]: p[k] for k in _PROP_FIELDS if p.get(k) is not None}
                    ts = p.get("timestamp")
                    if ts is not None:
                        kw["timestamp"] = int(ts.timestamp())
                headers = dict(row["headers"]) if self.has_headers and row["headers"] else None
                pub.publish(self.exchange, rk or "", body or b"", headers=headers,
                            persistent=self.persistent,
                            message_id=f"{query}/{batch}/{part}/{i}", **kw)
            pub.flush()
        finally:
            pub.close()
        return PublishedCommit(part, pub.published, pub.confirmed, time.monotonic() - t0)


class AckmqBatchWriter(_Publishing, DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.publish_partition(iterator, "0")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        return None  # confirmed messages cannot be recalled; their ids make copies harmless


class AckmqStreamWriter(_Publishing, DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        batch = (ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or "0"
        return self.publish_partition(iterator, batch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None  # every row was confirmed inside its task; a second call is harmless

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None
