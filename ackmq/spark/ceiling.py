"""Spark's own ceiling for the benchmark: a broker-free streaming source of ackmq's rows.

`spark.readStream.format("ackmq_ceiling")` yields `rows` rows of the queue source's
exact schema (1 KiB bodies by default) in batches of `batchRows`, two read tasks per
batch, from Arrow built once per Python worker: what Spark itself costs to land those
rows, with no broker and no AMQP behind them. `python -m ackmq.spark.bench` prints it
beside the real sources.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ackmq.spark.schema import ARROW_SCHEMA, PROPS_TYPE, SCHEMA_DDL, TIMESTAMP_TYPE

_CHUNK = 4096
_TEMPLATE: dict[int, pa.RecordBatch] = {}  # body size -> 4,096 rows, per Python worker


def template(body_size: int) -> pa.RecordBatch:
    """4,096 rows of the source's schema, built once per worker process."""
    b = _TEMPLATE.get(body_size)
    if b is None:
        n = _CHUNK
        now = pa.array([int(dt.datetime.now(dt.UTC).timestamp() * 1e6)] * n,
                       pa.int64()).cast(TIMESTAMP_TYPE)
        props = pa.array([None] * n, PROPS_TYPE)
        b = pa.RecordBatch.from_arrays([
            pa.array(range(n), pa.int64()), pa.array(range(n), pa.int64()),
            pa.array([b"x" * body_size] * n, pa.binary()),
            pa.array(["bench"] * n, pa.string()), pa.array([""] * n, pa.string()),
            pa.array([[]] * n, pa.map_(pa.string(), pa.string())), props,
            pa.array([None] * n, pa.string()), pa.array([False] * n, pa.bool_()),
            pa.array([0] * n, pa.int32()), now,
        ], schema=ARROW_SCHEMA)
        _TEMPLATE[body_size] = b
    return b


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end


class CeilingReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Any) -> None:
        self.rows = int(options.get("rows") or 200_000)
        self.batch = int(options.get("batchRows") or self.rows)
        self.body_size = int(options.get("bodySize") or 1024)
        self.tasks = int(options.get("numPartitions") or 2)

    def initialOffset(self) -> dict:
        return {"n": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.batch)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self.rows
        return {"n": min(self.rows, int(start["n"]) + cap)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        b, e = int(start["n"]), int(end["n"])
        if b >= e:
            return []
        step = math.ceil((e - b) / self.tasks)
        return [_Range(s, min(e, s + step)) for s in range(b, e, step)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        p: _Range = partition  # type: ignore[assignment]
        t = template(self.body_size)
        for s in range(p.start, p.end, _CHUNK):
            n = min(_CHUNK, p.end - s)
            chunk = t.slice(0, n)
            yield chunk.set_column(0, "offset", pa.array(range(s, s + n), pa.int64()))

    def commit(self, end: dict) -> None:
        pass


class CeilingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ackmq_ceiling"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return CeilingReader(self.options)
