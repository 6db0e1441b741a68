"""The DataFrame shape of a message, in Spark and in Arrow (the staging format)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pyarrow as pa

from ackmq.spark.amqp import Delivery

SEQ_HEADER = "x-ackmq-seq"
DELIVERY_COUNT_HEADER = "x-delivery-count"
BROKER_HEADERS = (SEQ_HEADER, DELIVERY_COUNT_HEADER)  # asked for by amqp.DELIVERY_HEADERS

PROPERTY_FIELDS: list[tuple[str, str]] = [
    ("content_type", "string"), ("content_encoding", "string"), ("delivery_mode", "int"),
    ("priority", "int"), ("correlation_id", "string"), ("reply_to", "string"),
    ("expiration", "string"), ("message_id", "string"), ("timestamp", "timestamp"),
    ("type", "string"), ("user_id", "string"), ("app_id", "string"),
]

# `offset` orders rows as the pipeline admitted them (every broker); `seq` is the
# broker's per-queue sequence number (ackmq only, null on RabbitMQ).
SCHEMA_DDL = (
    "offset bigint, seq bigint, body binary, routing_key string, exchange string, "
    "headers map<string,string>, properties struct<"
    + ", ".join(f"{n}: {t}" for n, t in PROPERTY_FIELDS)
    + ">, message_id string, redelivered boolean, delivery_count int, received_at timestamp"
)

_TS = pa.timestamp("us", tz="UTC")
_ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "timestamp": _TS}
PROPS_TYPE = pa.struct([(n, _ARROW_TYPES[t]) for n, t in PROPERTY_FIELDS])
ARROW_SCHEMA = pa.schema([
    ("offset", pa.int64()), ("seq", pa.int64()), ("body", pa.binary()),
    ("routing_key", pa.string()), ("exchange", pa.string()),
    ("headers", pa.map_(pa.string(), pa.string())), ("properties", PROPS_TYPE),
    ("message_id", pa.string()), ("redelivered", pa.bool_()),
    ("delivery_count", pa.int32()), ("received_at", _TS),
])


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def seq_of(d: Delivery) -> int | None:
    """The broker's `x-ackmq-seq`, or None (RabbitMQ, or a header we cannot read)."""
    h = d.props.headers
    if not h or SEQ_HEADER not in h:
        return None
    try:
        return int(h[SEQ_HEADER])
    except (TypeError, ValueError):
        return None


def delivery_count_of(d: Delivery) -> int | None:
    """Broker-kept count when sent; else 0 for a first delivery, unknown otherwise."""
    h = d.props.headers
    if h and DELIVERY_COUNT_HEADER in h:
        try:
            return int(h[DELIVERY_COUNT_HEADER])
        except (TypeError, ValueError):
            return None
    return None if d.redelivered else 0


def _ts(v: Any) -> _dt.datetime | None:
    if v is None:
        return None
    return _dt.datetime.fromtimestamp(int(v), tz=_dt.UTC)


def to_arrow(deliveries: list[Delivery], first_offset: int) -> pa.Table:
    """Rows for a staged batch; offsets first_offset, first_offset+1, ..."""
    cols: dict[str, list[Any]] = {f.name: [] for f in ARROW_SCHEMA}
    for i, d in enumerate(deliveries):
        p = d.props
        headers = p.headers or {}
        cols["offset"].append(first_offset + i)
        cols["seq"].append(seq_of(d))
        cols["body"].append(d.body)
        cols["routing_key"].append(d.routing_key)
        cols["exchange"].append(d.exchange)
        # the broker's own headers have their columns: `headers` is what the publisher set
        cols["headers"].append([(str(k), _text(v)) for k, v in headers.items()
                                if k not in BROKER_HEADERS])
        cols["properties"].append({
            "content_type": p.content_type, "content_encoding": p.content_encoding,
            "delivery_mode": p.delivery_mode, "priority": p.priority,
            "correlation_id": p.correlation_id, "reply_to": p.reply_to,
            "expiration": p.expiration, "message_id": p.message_id,
            "timestamp": _ts(p.timestamp), "type": p.type, "user_id": p.user_id,
            "app_id": p.app_id,
        })
        cols["message_id"].append(p.message_id)
        cols["redelivered"].append(d.redelivered)
        cols["delivery_count"].append(delivery_count_of(d))
        cols["received_at"].append(_dt.datetime.fromtimestamp(d.received_at, tz=_dt.UTC))
    return pa.table(cols, schema=ARROW_SCHEMA)
