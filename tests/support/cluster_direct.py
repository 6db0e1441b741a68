"""The connector used directly, as docs/spark.md shows it, on a Spark cluster (S6/S7).

`python cluster_direct.py URL MASTER WORK QUEUE STREAM N`: one driver, three jobs:
the sink publishes N rows to QUEUE and N to STREAM (executors publish), then the queue
source and the stream source land them (Trigger.AvailableNow, default options: no
stagingLocation) into WORK/lake-queue and WORK/lake-stream. Prints one JSON line.
Run by tests/test_spark_cluster.py with the cluster's defaults (SparkCluster.driver_env:
as --confs, or SPARK_CONF_DIR); exit 1 with the error's first lines when a job fails.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession


def main() -> int:
    url, master, work, queue, stream, n = sys.argv[1:7]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.appName("ackmq-cluster-direct").master(master)
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import ackmq.spark

    ackmq.spark.register(spark)
    out: dict[str, object] = {}
    try:
        rows = spark.range(int(n)).selectExpr("cast(cast(id as string) as binary) as body")
        for target in (queue, stream):
            (rows.repartition(2).write.format("ackmq").mode("append").option("url", url)
             .option("exchange", "").option("routingKey", target).save())
        out["published"] = int(n)
        for kind, name in (("queue", queue), ("stream", stream)):
            df = (spark.readStream.format("ackmq").option("url", url).option(kind, name)
                  .option("maxMessagesPerTrigger", 1000).load())
            q = (df.writeStream.format("parquet").option("path", f"{work}/lake-{kind}")
                 .option("checkpointLocation", f"{work}/chk-{kind}")
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            out[kind] = spark.read.parquet(f"{work}/lake-{kind}").count()
    except Exception as exc:  # noqa: BLE001 - the test prints it
        from ackmq.spark.cli import explain

        print(exc, file=sys.stderr)
        out["error"] = explain(exc)
    finally:
        spark.stop()
    print(json.dumps(out), flush=True)
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
