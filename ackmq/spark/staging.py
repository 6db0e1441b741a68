"""Staged micro-batches: the durable copy of a batch's messages, keyed by its offsets.

The driver-side reader writes a batch here *before* returning its end offset to Spark,
so the offset Spark logs always names a file that exists and is complete; a replayed
batch reads the same file, and executors (`read()`, another process) find it by name.
Next to each batch a small `.ids` file keeps its producers' message ids: the dedupe
window used when the broker sets no `x-ackmq-seq` (RabbitMQ).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

_NAME = re.compile(r"^b-(\d{20})-(\d{20})\.(arrow|ids)$")


@dataclass(frozen=True, slots=True)
class Staged:
    begin: int
    end: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class StagingDir:
    """A directory of `b-<begin>-<end>.arrow` files (offsets are message counts)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, begin: int, end: int, kind: str = "arrow") -> Path:
        return self.root / f"b-{begin:020d}-{end:020d}.{kind}"

    def write(self, begin: int, end: int, table: pa.Table, ids: list[str]) -> None:
        """Write batch [begin, end) durably: data, ids, then the directory entry."""
        self.ensure()
        path = self.path(begin, end)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:  # straight to the file: no 10 MB copy in between
            with ipc.new_file(pa.PythonFile(f, mode="w"), table.schema) as w:
                w.write_table(table, max_chunksize=4096)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if ids:  # no ids (ackmq: the seq dedupes): no file, one fsync less per batch
            _write_atomic(self.path(begin, end, "ids"), "\n".join(ids).encode())
        _fsync_dir(self.root)

    def batches(self, kind: str = "arrow") -> list[Staged]:
        if not self.root.is_dir():
            return []
        out = []
        for name in os.listdir(self.root):
            m = _NAME.match(name)
            if m and m.group(3) == kind:
                out.append(Staged(int(m.group(1)), int(m.group(2))))
        return sorted(out, key=lambda s: (s.begin, s.end))

    STATUS = "reader-status.json"

    def write_status(self, status: dict) -> None:
        """What the reader holds, for the progress line (`pipeline land`); not durable."""
        tmp = self.root / (self.STATUS + ".tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, self.root / self.STATUS)

    def read_status(self) -> dict | None:
        try:
            return json.loads((self.root / self.STATUS).read_text())
        except (OSError, ValueError):
            return None

    def num_rows(self, begin: int, end: int) -> int:
        with pa.memory_map(str(self.path(begin, end))) as src:
            return ipc.open_file(src).read_all().num_rows

    def remove(self, s: Staged, kind: str = "arrow") -> None:
        try:
            os.unlink(self.path(s.begin, s.end, kind))
        except FileNotFoundError:
            pass

    def ids(self, s: Staged) -> list[str]:
        try:
            text = self.path(s.begin, s.end, "ids").read_text()
        except FileNotFoundError:
            return []
        return text.split("\n") if text else []


def read_table(path: str | os.PathLike[str]) -> pa.Table:
    """A staged batch, read back on the driver side (a replay after a restart)."""
    with pa.memory_map(str(path)) as src:
        return ipc.open_file(src).read_all()


def to_ipc(table: pa.Table) -> bytes:
    """Rows as one Arrow IPC stream: what a read task carries to its executor (S7)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=4096)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of `to_ipc`'s bytes, without copying them (executor side)."""
    return list(ipc.open_stream(pa.py_buffer(data)))
