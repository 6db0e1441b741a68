"""The DataFrame shape of a message, in Spark and in Arrow (the staging format)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pyarrow as pa

from ackmq.protocol.amqp.constants import DELIVERY_COUNT_HEADER, SEQ_HEADER
from ackmq.protocol.amqp.properties import read_into, read_plan
from ackmq.protocol.amqp.property_names import RABBIT_TO_PAMQP
from ackmq.spark.amqp import Delivery

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

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "timestamp": TIMESTAMP_TYPE}
PROPS_TYPE = pa.struct([(n, ARROW_TYPES[t]) for n, t in PROPERTY_FIELDS])
PROPERTY_NAMES = [n for n, _ in PROPERTY_FIELDS]
MESSAGE_ID = PROPERTY_NAMES.index("message_id")
_TIMESTAMP = PROPERTY_NAMES.index("timestamp")
ARROW_SCHEMA = pa.schema([
    ("offset", pa.int64()), ("seq", pa.int64()), ("body", pa.binary()),
    ("routing_key", pa.string()), ("exchange", pa.string()),
    ("headers", pa.map_(pa.string(), pa.string())), ("properties", PROPS_TYPE),
    ("message_id", pa.string()), ("redelivered", pa.bool_()),
    ("delivery_count", pa.int32()), ("received_at", TIMESTAMP_TYPE),
])


def as_text(v: Any) -> str | None:
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


def prepare_row(m: Any) -> tuple[tuple[Any, ...], int | None, int | None,
                                 list[tuple[str, str | None]]]:
    """What staging needs of a message: (the 12 property columns, seq, delivery count,
    the publisher's headers). The consumer thread computes it as messages arrive."""
    props, h = properties_columns(m.raw_properties)
    if not h:
        return props, None, (None if m.redelivered else 0), []
    seq = _int(h.get(SEQ_HEADER))
    if DELIVERY_COUNT_HEADER in h:
        count = _int(h[DELIVERY_COUNT_HEADER])
    else:
        count = None if m.redelivered else 0
    # the broker's own headers have their columns: `headers` is what the publisher set
    if len(h) == 2 and SEQ_HEADER in h and DELIVERY_COUNT_HEADER in h:
        user: list[tuple[str, str | None]] = []
    else:
        user = [(str(k), as_text(v)) for k, v in h.items() if k not in BROKER_HEADERS]
    return props, seq, count, user


def row_of(d: Delivery) -> tuple[Any, ...]:
    row = d.row
    if row is None:
        row = d.row = prepare_row(d.message)
    return row


def seq_of(d: Delivery) -> int | None:
    """The broker's `x-ackmq-seq`, or None (RabbitMQ, or a header we cannot read)."""
    return row_of(d)[1]


def message_id_of(d: Delivery) -> str | None:
    return row_of(d)[0][MESSAGE_ID]


def delivery_count_of(d: Delivery) -> int | None:
    """Broker-kept count when sent; else 0 for a first delivery, unknown otherwise."""
    return row_of(d)[2]


def _ts(v: Any) -> _dt.datetime | None:
    """The timestamp property (a UTC datetime; one out of range is left null)."""
    return v if isinstance(v, _dt.datetime) else None


# the 12 columns, then the headers, by pamqp's names (RabbitMQ's `type` is `message_type`)
_PLAN = read_plan(tuple(RABBIT_TO_PAMQP[n] for n in PROPERTY_NAMES) + ("headers",))
_NO_PROPS = (None,) * len(PROPERTY_FIELDS)
_N = len(PROPERTY_FIELDS)


def properties_columns(raw: bytes) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    """(the 12 property columns, headers) from raw content-header properties, in one
    pass. Why not PropertiesView: its per-field lookups cost more than the whole row."""
    if len(raw) < 2 or not (raw[0] or raw[1]):
        return _NO_PROPS, None
    out = read_into(raw, _PLAN, [None] * (_N + 1))
    ts = out[_TIMESTAMP]
    if ts is not None and not isinstance(ts, _dt.datetime):
        out[_TIMESTAMP] = None  # a timestamp out of datetime's range: left null
    return tuple(out[:_N]), out[_N]


def to_arrow(deliveries: list[Delivery], first_offset: int) -> pa.Table:
    """Rows for a staged batch; offsets first_offset, first_offset+1, ...

    Column by column from each delivery's prepared row (decoded once, by the consumer
    thread): the per-row Python work is what bounds the landing rate."""
    msgs = [d.message for d in deliveries]
    n = len(msgs)
    rows = [row_of(d) for d in deliveries]
    props, seqs, counts, user_headers = (list(c) for c in zip(*rows, strict=True)) \
        if rows else ([], [], [], [])
    columns = list(zip(*props, strict=True)) if props else [() for _ in PROPERTY_FIELDS]
    props_arr = pa.StructArray.from_arrays(
        [pa.array(list(col), ARROW_TYPES[kind])
         for col, (_, kind) in zip(columns, PROPERTY_FIELDS, strict=True)],
        fields=list(PROPS_TYPE))
    received = pa.array([int(d.received_at * 1e6) for d in deliveries], pa.int64()).cast(TIMESTAMP_TYPE)
    return pa.Table.from_arrays([
        pa.array(range(first_offset, first_offset + n), pa.int64()),
        pa.array(seqs, pa.int64()),
        pa.array([m.body for m in msgs], pa.binary()),
        pa.array([m.routing_key for m in msgs], pa.string()),
        pa.array([m.exchange for m in msgs], pa.string()),
        pa.array(user_headers, pa.map_(pa.string(), pa.string())),
        props_arr,
        props_arr.field(MESSAGE_ID),
        pa.array([m.redelivered for m in msgs], pa.bool_()),
        pa.array(counts, pa.int32()),
        received,
    ], schema=ARROW_SCHEMA)
