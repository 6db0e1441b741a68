"""Read a Spark file-sink table without Spark: only the files its `_spark_metadata` log committed.

A killed driver leaves Parquet files of uncommitted batches in the directory; Spark's
readers ignore them because the metadata log does not name them, and so must we
(tests, benchmark, demo checks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq


def committed_files(table_dir: str | os.PathLike[str]) -> list[str]:
    meta = Path(table_dir) / "_spark_metadata"
    if not meta.is_dir():
        return []
    live: dict[str, bool] = {}
    for name in os.listdir(meta):
        if name.startswith(".") or name.endswith(".tmp"):
            continue
        with open(meta / name) as f:
            for line in f.read().splitlines()[1:]:  # first line is the version "v1"
                if not line.strip():
                    continue
                e = json.loads(line)
                path = unquote(urlparse(e["path"]).path)
                live[path] = e.get("action", "add") != "delete" and live.get(path, True)
    return sorted(p for p, ok in live.items() if ok)


def read_committed(table_dir: str | os.PathLike[str], columns: list[str] | None = None
                   ) -> pa.Table | None:
    files = committed_files(table_dir)
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files],
                            promote_options="permissive")
