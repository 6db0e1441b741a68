"""`ackmq pipeline init`: a Spark Declarative Pipelines project landing ackmq queues (S9).

The project is what `spark-pipelines init` writes, with ackmq's sources in it: a spec
(`spark-pipeline.yml`: name, storage, libraries) and one Python file declaring one
streaming table per queue or stream (`@dp.table` returning
`spark.readStream.format("ackmq")...`). Spark then owns checkpoints (under the spec's
`storage`), retries and table management; `spark-pipelines run` lands every table
exactly once, as `ackmq pipeline land` does for one queue. Each queue source stages
its batches under the same storage (`<storage>/ackmq-staging/<queue>`), so a restarted
run finds them next to its checkpoints.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SPEC = """\
# written by `ackmq pipeline init`; run it with ./run (`ackmq pipeline run DIR`)
name: {name}
storage: {storage}
libraries:
  - glob:
      include: transformations/**
"""

#: Spark's defaults for the run (static settings: the spec's `configuration` cannot set
#: them). A persistent catalog: with Spark's default in-memory one a run killed after it
#: created its tables cannot be restarted (the restart finds the tables' directories
#: but not the tables: LOCATION_ALREADY_EXISTS); a Hive metastore in the project
#: (embedded Derby) keeps them. Use a shared metastore on a cluster.
SPARK_DEFAULTS = """\
spark.sql.catalogImplementation hive
spark.sql.warehouse.dir {warehouse}
spark.hadoop.javax.jdo.option.ConnectionURL jdbc:derby:;databaseName={metastore};create=true
spark.driver.extraJavaOptions -Dderby.system.home={root}
"""

HEADER = '''\
"""ackmq queues and streams as streaming tables (written by `ackmq pipeline init`).

Run the project with its `run` script (`ackmq pipeline run DIR`: `spark-pipelines run`
in the Python ackmq is installed in); $ACKMQ_URL overrides the broker.
Each table holds every message of its source exactly once: a queue's messages are acked
after the batch holding them is committed; a stream is read by offsets.
"""

import os

from pyspark import pipelines as dp

import ackmq.spark

URL = os.environ.get("ACKMQ_URL", {url!r})
STORAGE = {storage!r}
MAX_PER_TRIGGER = {max_per_trigger!r}  # None: the source's default

ackmq.spark.register(spark)  # noqa: F821 - spark-pipelines defines `spark`


def _source(kind, name):
    r = spark.readStream.format("ackmq").option("url", URL).option(kind, name)  # noqa: F821
    if MAX_PER_TRIGGER:
        r = r.option("maxMessagesPerTrigger", MAX_PER_TRIGGER)
    if kind == "queue":  # staged batches live with the checkpoints
        r = r.option("stagingLocation", f"{{STORAGE}}/ackmq-staging/{{name}}")
    return r.load()
'''

TABLE = '''

@dp.table(name={table!r}, comment="ackmq {kind} {name}")
def {func}():
    return _source({kind!r}, {name!r})
'''

SINK = '''

# The sink as a flow target: every new row of {table!r} is published to exchange
# {exchange!r} (routing key: the row's routing_key), with publisher confirms.
dp.create_sink("{sink}", format="ackmq",
               options={{"url": URL, "exchange": {exchange!r}, "routingKeyColumn": "routing_key"}})


@dp.append_flow(target="{sink}")
def {func}_to_{sink}():
    return spark.readStream.table({table!r}).select("body", "routing_key", "headers")  # noqa: F821
'''


#: the project's `run`: `ackmq pipeline run` in the Python that wrote it (a scheduler's
#: command: no virtualenv to activate, no PATH to set)
RUN_SCRIPT = """\
#!/bin/sh
# written by `ackmq pipeline init`: `spark-pipelines run` of this project in the Python
# ackmq is installed in; exit 0 when the run completed. Options: --remote sc://host:port,
# --connect-port N, --conf KEY=VALUE, --full-refresh-all (ackmq pipeline run --help)
exec {python} -m ackmq.spark pipeline run "$(dirname "$0")" "$@"
"""


def table_name(source: str) -> str:
    """A table name for a queue or stream name (`orders.eu` -> `orders_eu`)."""
    name = re.sub(r"\W", "_", source).strip("_").lower() or "queue"
    return name if not name[0].isdigit() else f"q_{name}"


def write_project(directory: str | Path, *, url: str, queues: Sequence[str],
                  streams: Sequence[str] = (), storage: str | None = None,
                  name: str | None = None, max_per_trigger: int | None = None,
                  sink_exchange: str | None = None) -> list[Path]:
    """Write the spec and the Python definitions into `directory` (which must not hold a
    spec yet); returns the files written."""
    root = Path(directory).resolve()
    spec = root / "spark-pipeline.yml"
    if spec.exists():
        raise FileExistsError(f"{spec} exists: choose another directory")
    if not queues and not streams:
        raise ValueError("name at least one --queue or --stream")
    storage = storage or (root / "storage").as_uri()
    tables: dict[str, tuple[str, str]] = {}
    for kind, names in (("queue", queues), ("stream", streams)):
        for source in names:
            t = table_name(source)
            if t in tables:
                raise ValueError(f"{source!r} and {tables[t][1]!r} would both be table {t!r}")
            tables[t] = (kind, source)
    code = HEADER.format(url=url, storage=storage.rstrip("/"), max_per_trigger=max_per_trigger)
    for t, (kind, source) in tables.items():
        code += TABLE.format(table=t, kind=kind, name=source, func=t)
    if sink_exchange is not None:
        first = next(iter(tables))
        code += SINK.format(table=first, exchange=sink_exchange, sink="to_broker", func=first)
    (root / "transformations").mkdir(parents=True, exist_ok=True)
    (root / "conf").mkdir(exist_ok=True)
    spec.write_text(SPEC.format(name=table_name(name or root.name), storage=storage))
    py = root / "transformations" / "ackmq_sources.py"
    py.write_text(code)
    defaults = root / "conf" / "spark-defaults.conf"
    defaults.write_text(SPARK_DEFAULTS.format(warehouse=root / "spark-warehouse",
                                              metastore=root / "metastore_db", root=root))
    run = root / "run"
    run.write_text(RUN_SCRIPT.format(python=shlex.quote(sys.executable)))
    run.chmod(0o755)
    return [spec, py, defaults, run]


def run_project(directory: str | Path, *, remote: str | None = None, connect_port: int = 0,
                conf: Sequence[str] = (), full_refresh_all: bool = False) -> int:
    """`spark-pipelines run` of the project in `directory` with this interpreter as
    Spark's Python (PYSPARK_PYTHON), the project's conf/ as SPARK_CONF_DIR, and
    `ackmq.spark.sdp_run` (the CLI with PySpark 4.3's two fixes) as its program; local
    mode gets its own Connect server port (`connect_port`, 0: a free one). Returns the
    run's exit status: 0 when it completed."""
    import pyspark

    from ackmq.spark import sdp_run
    from ackmq.spark.pipeline import log

    root = Path(directory).resolve()
    spec = root / "spark-pipeline.yml"
    if not spec.is_file():
        log(f"ackmq pipeline run: no {spec} (`ackmq pipeline init DIR ...` writes a project)")
        return 1
    home = os.path.dirname(pyspark.__file__)
    env = dict(os.environ, SPARK_HOME=home)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if (root / "conf").is_dir():
        env.setdefault("SPARK_CONF_DIR", str(root / "conf"))
    cmd = [os.path.join(home, "bin", "spark-class"), "org.apache.spark.deploy.SparkPipelines",
           str(Path(sdp_run.__file__).resolve())]
    if remote:
        cmd += ["--remote", remote]
    else:
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cmd += ["--conf", f"spark.connect.grpc.binding.port={connect_port}"]
    for c in conf:
        cmd += ["--conf", c]
    cmd += ["run", "--spec", str(spec)] + (["--full-refresh-all"] if full_refresh_all else [])
    child = subprocess.Popen(cmd, cwd=root, env=env)
    # Ctrl-C reaches the run's own processes from the terminal; SIGTERM is passed on
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        rc = child.wait()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    return rc if rc >= 0 else 128 - rc
