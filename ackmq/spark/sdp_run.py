"""`spark-pipelines`' own command-line program, as `ackmq pipeline run` starts it.

Spark's `SparkPipelines` launcher runs a Python file (normally
`pyspark/pipelines/cli.py`) in the Python that `PYSPARK_PYTHON` names; `ackmq pipeline
run` gives it this file, which runs that same `cli.main()` after three fixes to PySpark
4.3's Spark Connect client, so that a run can be scheduled as a run:

* **A completed run exits 0.** The client's command stream
  (`SparkConnectClient.execute_command_as_iterator`) raises `[UNKNOWN_RESPONSE]` on any
  response that is not a command result, and a Python data source's (empty)
  `__python_accumulator__` metrics arrive as such a response after `Run is COMPLETED`:
  every successful run exited 1. The stream here skips execution metrics and still
  rejects anything else (SPARK-59135, apache/spark#58435, makes the same change).
* **The local Connect server on a free port.** In local mode PySpark starts the server
  on `spark.connect.grpc.binding.port` (15002 unless set) but connects to
  `sc://localhost`, always 15002: a moved port hangs the client, and two runs on one
  machine meet on one server. `ackmq pipeline run` binds port 0 (or `--connect-port`);
  the client here asks the server which port it got.
* **Every setting reaches the local server** (`merge_init_conf`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any


def skip_metrics_in_command_streams() -> None:
    from pyspark.errors import PySparkValueError
    from pyspark.sql.connect.client.core import SparkConnectClient
    from pyspark.sql.metrics import ObservedMetrics, PlanMetrics

    def execute_command_as_iterator(self: Any, command: Any,
                                    observations: Any = None) -> Iterator[dict[str, Any]]:
        req = self._execute_plan_request_with_metadata()
        self._set_command_in_plan(req.plan, command)
        for response in self._execute_and_fetch_as_iterator(req, observations or {}):
            if isinstance(response, dict):
                yield response
            elif not isinstance(response, (PlanMetrics, ObservedMetrics)):
                raise PySparkValueError(errorClass="UNKNOWN_RESPONSE",
                                        messageParameters={"response": str(response)})

    SparkConnectClient.execute_command_as_iterator = execute_command_as_iterator  # type: ignore[method-assign]


def connect_to_the_local_server_port() -> None:
    from pyspark.sql.connect.client.core import DefaultChannelBuilder
    from pyspark.sql.session import SparkSession

    spark_default = DefaultChannelBuilder.default_port

    def default_port() -> int:
        session = SparkSession._instantiatedSession
        if "SPARK_LOCAL_REMOTE" in os.environ and session is not None:
            service = getattr(session._jvm, "org.apache.spark.sql.connect.service."
                                            "SparkConnectService$")
            return int(getattr(service, "MODULE$").localPort())
        return spark_default()

    DefaultChannelBuilder.default_port = staticmethod(default_port)  # type: ignore[method-assign]


def merge_init_conf() -> None:
    """Spark's launcher hands the run's settings to Python in chunks
    (`PYSPARK_REMOTE_INIT_CONF_0..LEN-1`); PySpark 4.3's `_start_connect_server` keeps
    only the last chunk (it assigns each chunk instead of merging it), so with a
    project's conf/ most settings - the Connect port, the warehouse, the Hive catalog -
    were lost at random. One merged chunk is read whole."""
    n = int(os.environ.get("PYSPARK_REMOTE_INIT_CONF_LEN", "0"))
    if n <= 1:
        return
    merged: dict[str, Any] = {}
    for i in range(n):
        merged.update(json.loads(os.environ.pop(f"PYSPARK_REMOTE_INIT_CONF_{i}")))
    os.environ["PYSPARK_REMOTE_INIT_CONF_0"] = json.dumps(merged)
    os.environ["PYSPARK_REMOTE_INIT_CONF_LEN"] = "1"


def main() -> None:
    merge_init_conf()
    skip_metrics_in_command_streams()
    connect_to_the_local_server_port()
    from pyspark.pipelines.cli import main as spark_pipelines

    spark_pipelines()


if __name__ == "__main__":
    main()
