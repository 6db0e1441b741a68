"""ackmq on Spark: a Structured Streaming source and a sink for AMQP queues (SPEC S1–S5).

    import ackmq.spark
    ackmq.spark.register(spark)
    spark.readStream.format("ackmq").option("url", url).option("queue", "orders").load()

Importing this package does not import PySpark; `register` does.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def register(spark: Any) -> None:
    """Make format `ackmq` available in this Spark session (Python Data Source API).

    Spark runs the source in Python workers started with `$PYSPARK_PYTHON`, else
    `python3` from PATH, which need not have ackmq (a virtualenv not activated). In a
    local session with neither $PYSPARK_PYTHON nor `spark.pyspark.python` set, the
    source's workers run on this interpreter, which has it. On a cluster the executors'
    Python is Spark's setting (docs/spark-cluster.md)."""
    from ackmq.spark.source import AckmqDataSource

    sc = _local_context_without_python(spark)
    if sc is None:
        spark.dataSource.register(AckmqDataSource)
        return
    default, sc.pythonExec = sc.pythonExec, sys.executable
    try:
        spark.dataSource.register(AckmqDataSource)  # its workers' Python is taken here
    finally:
        sc.pythonExec = default


def _local_context_without_python(spark: Any) -> Any:
    """The session's SparkContext when it runs local[...] and nobody chose Spark's
    Python; None otherwise (Spark Connect sessions have no SparkContext here)."""
    if os.environ.get("PYSPARK_PYTHON"):
        return None
    try:
        sc = spark.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext
        return None
    conf = sc.getConf()
    if not str(conf.get("spark.master", "")).startswith("local"):
        return None
    if conf.get("spark.pyspark.python") or not hasattr(sc, "pythonExec"):
        return None
    return sc


__all__ = ["register"]
