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
PROPERTY_NAMES = [n for n, _ in PROPERTY_FIELDS]
# the PropertiesView attribute of each property column (`type` is message_type there)
_VIEW_ATTRS = ["message_type" if n == "type" else n for n in PROPERTY_NAMES]
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
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def seq_of(d: Delivery) -> int | None:
    """The broker's `x-ackmq-seq`, or None (RabbitMQ, or a header we cannot read)."""
    h = d.message.view.headers
    return _int(h.get(SEQ_HEADER)) if h else None


def delivery_count_of(d: Delivery) -> int | None:
    """Broker-kept count when sent; else 0 for a first delivery, unknown otherwise."""
    h = d.message.view.headers
    if h and DELIVERY_COUNT_HEADER in h:
        return _int(h[DELIVERY_COUNT_HEADER])
    return None if d.message.redelivered else 0


def _ts(v: Any) -> _dt.datetime | None:
    """The timestamp property (a UTC datetime; one out of range is left null)."""
    return v if isinstance(v, _dt.datetime) else None


def to_arrow(deliveries: list[Delivery], first_offset: int) -> pa.Table:
    """Rows for a staged batch; offsets first_offset, first_offset+1, ...

    Column by column, reading each message's raw properties once (PropertiesView):
    the per-row Python work is what bounds the landing rate."""
    msgs = [d.message for d in deliveries]
    views = [m.view for m in msgs]
    headers = [v.headers for v in views]
    n = len(msgs)
    # the broker's own headers have their columns: `headers` is what the publisher set
    seqs: list[int | None] = []
    counts: list[int | None] = []
    user_headers: list[list[tuple[str, str | None]]] = []
    for m, h in zip(msgs, headers, strict=True):
        if not h:
            seqs.append(None)
            counts.append(None if m.redelivered else 0)
            user_headers.append([])
            continue
        seqs.append(_int(h.get(SEQ_HEADER)))
        if DELIVERY_COUNT_HEADER in h:
            counts.append(_int(h[DELIVERY_COUNT_HEADER]))
        else:
            counts.append(None if m.redelivered else 0)
        user_headers.append([(str(k), _text(v)) for k, v in h.items()
                             if k not in BROKER_HEADERS])
    props = pa.StructArray.from_arrays([
        pa.array([getattr(v, attr) for v in views], _ARROW_TYPES[kind])
        if kind != "timestamp" else pa.array([_ts(v.timestamp) for v in views], _TS)
        for attr, (_, kind) in zip(_VIEW_ATTRS, PROPERTY_FIELDS, strict=True)
    ], fields=list(PROPS_TYPE))
    message_ids = props.field(PROPERTY_NAMES.index("message_id"))
    received = [_dt.datetime.fromtimestamp(d.received_at, tz=_dt.UTC) for d in deliveries]
    return pa.Table.from_arrays([
        pa.array(range(first_offset, first_offset + n), pa.int64()),
        pa.array(seqs, pa.int64()),
        pa.array([m.body for m in msgs], pa.binary()),
        pa.array([m.routing_key for m in msgs], pa.string()),
        pa.array([m.exchange for m in msgs], pa.string()),
        pa.array(user_headers, pa.map_(pa.string(), pa.string())),
        props,
        message_ids,
        pa.array([m.redelivered for m in msgs], pa.bool_()),
        pa.array(counts, pa.int32()),
        pa.array(received, _TS),
    ], schema=ARROW_SCHEMA)
