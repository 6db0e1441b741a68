"""The DataFrame shape of a message, in Spark and in Arrow (the staging format)."""

from __future__ import annotations

import datetime as _dt
import struct
from typing import Any

import pyarrow as pa

from ackmq.protocol.amqp.constants import DELIVERY_COUNT_HEADER, SEQ_HEADER
from ackmq.protocol.amqp.properties import read_table
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


_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
# (flag, column index in PROPERTY_FIELDS or -1 for headers, kind): AMQP's property order
_WIRE = [(0x8000, 0, "s"), (0x4000, 1, "s"), (0x2000, -1, "t"), (0x1000, 2, "o"),
         (0x0800, 3, "o"), (0x0400, 4, "s"), (0x0200, 5, "s"), (0x0100, 6, "s"),
         (0x0080, 7, "s"), (0x0040, 8, "ts"), (0x0020, 9, "s"), (0x0010, 10, "s"),
         (0x0008, 11, "s"), (0x0004, -2, "s")]
_NO_PROPS = (None,) * len(PROPERTY_FIELDS)
_DM2 = 0x1000  # delivery-mode only


def properties_columns(raw: bytes) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    """(the 12 property columns, headers) from raw content-header properties, in one
    pass. Why not PropertiesView: its per-field lookups cost more than the whole row."""
    flags = _U16.unpack_from(raw, 0)[0] if len(raw) >= 2 else 0
    if flags == 0:
        return _NO_PROPS, None
    pos = 2
    out: list[Any] = [None] * len(PROPERTY_FIELDS)
    headers = None
    for flag, col, kind in _WIRE:
        if not flags & flag:
            continue
        if kind == "s":
            end = pos + 1 + raw[pos]
            if col >= 0:
                out[col] = bytes(raw[pos + 1:end]).decode("utf-8", "surrogateescape")
            pos = end
        elif kind == "o":
            out[col] = raw[pos]
            pos += 1
        elif kind == "t":
            headers, pos = read_table(raw, pos, lenient=True)
        else:
            stamp = _U64.unpack_from(raw, pos)[0]
            pos += 8
            try:
                out[col] = _dt.datetime.fromtimestamp(stamp, tz=_dt.UTC)
            except (ValueError, OverflowError, OSError):
                out[col] = None  # out of range: left null
    return tuple(out), headers


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
