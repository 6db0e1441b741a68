"""ackmq on Spark: a Structured Streaming source and a sink for AMQP queues (SPEC S1–S5).

    import ackmq.spark
    ackmq.spark.register(spark)
    spark.readStream.format("ackmq").option("url", url).option("queue", "orders").load()

Importing this package does not import PySpark; `register` does.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make format `ackmq` available in this Spark session (Python Data Source API)."""
    from ackmq.spark.source import AckmqDataSource

    spark.dataSource.register(AckmqDataSource)


__all__ = ["register"]
