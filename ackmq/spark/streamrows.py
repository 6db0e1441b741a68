"""The DataFrame shape of a stream read: the queue source's columns plus `stream_offset`.

`offset` is the stream offset too (unique and increasing, like the queue source's
admission order), so tables landed from a queue and from a stream line up; `seq` and
`delivery_count` are null (a stream read is not a delivery that can be redelivered),
`redelivered` is false.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ackmq.spark.schema import (
    ARROW_SCHEMA,
    ARROW_TYPES,
    MESSAGE_ID,
    PROPERTY_FIELDS,
    PROPS_TYPE,
    SCHEMA_DDL,
    TIMESTAMP_TYPE,
    as_text,
)
from ackmq.spark.streamwire import Delivered

STREAM_SCHEMA_DDL = SCHEMA_DDL + ", stream_offset bigint"
STREAM_ARROW_SCHEMA = ARROW_SCHEMA.append(pa.field("stream_offset", pa.int64()))


def _user_headers(h: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(str(k), as_text(v)) for k, v in h.items()] if h else []


def stream_batch(items: Sequence[Delivered]) -> pa.RecordBatch:
    """One record batch of deliveries (executor side, column by column)."""
    n = len(items)
    offsets = pa.array([d.offset for d in items], pa.int64())
    columns = list(zip(*(d.props for d in items), strict=True)) if n else \
        [() for _ in PROPERTY_FIELDS]
    props = pa.StructArray.from_arrays(
        [pa.array(list(col), ARROW_TYPES[kind])
         for col, (_, kind) in zip(columns, PROPERTY_FIELDS, strict=True)],
        fields=list(PROPS_TYPE))
    methods = [d.method for d in items]
    now = pa.array([int(time.time() * 1e6)] * n, pa.int64()).cast(TIMESTAMP_TYPE)
    return pa.RecordBatch.from_arrays([
        offsets,
        pa.nulls(n, pa.int64()),
        pa.array([d.body for d in items], pa.binary()),
        pa.array([m.routing_key for m in methods], pa.string()),
        pa.array([m.exchange for m in methods], pa.string()),
        pa.array([_user_headers(d.headers) for d in items],
                 pa.map_(pa.string(), pa.string())),
        props,
        props.field(MESSAGE_ID),
        pa.array([False] * n, pa.bool_()),
        pa.nulls(n, pa.int32()),
        now,
        offsets,
    ], schema=STREAM_ARROW_SCHEMA)
