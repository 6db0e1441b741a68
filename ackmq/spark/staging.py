"""Staged micro-batches: the durable copy of a batch's messages, keyed by its offsets.

The driver-side reader writes a batch here *before* returning its end offset to Spark,
so the offset Spark logs always names a file that exists and is complete; a replayed
batch reads the same file, and executors (`read()`, another process) find it by name.
Next to each batch a small `.ids` file keeps its producers' message ids: the dedupe
window used when the broker sets no `x-ackmq-seq` (RabbitMQ).

Only the driver side reads the directory (executors get their rows inside the read
task, S7), so it must survive what the driver survives: keep it with the checkpoint. A
location with a scheme (`hdfs://`, `s3://`, `gs://`, `file://`, ...) is opened through
`pyarrow.fs` (`FsStagingDir`), a plain path through the local file system with fsync.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ackmq.store.fileio import fsync_dir

_NAME = re.compile(r"^b-(\d{20})-(\d{20})\.(arrow|ids)$")


@dataclass(frozen=True, slots=True)
class Staged:
    begin: int
    end: int


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
        fsync_dir(self.root)

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

    def exists(self, begin: int, end: int) -> bool:
        return self.path(begin, end).exists()

    def read(self, begin: int, end: int) -> pa.Table:
        return read_table(self.path(begin, end))

    def clear_status(self) -> None:
        try:
            os.unlink(self.root / self.STATUS)
        except FileNotFoundError:
            pass

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


class FsStagingDir(StagingDir):
    """The same directory on any `pyarrow.fs` file system, by URI (HDFS, S3, GCS, ...).
    A file is written under a temporary name and moved into place (atomic on HDFS and
    local disks; on object stores the object appears whole when its upload completes)."""

    def __init__(self, uri: str) -> None:
        import pyarrow.fs as pafs

        self.uri = uri.rstrip("/")
        # Hadoop's names for S3 (what a Spark checkpoint URI says) are pyarrow's s3://
        self.fs, base = pafs.FileSystem.from_uri(re.sub(r"^s3[an]://", "s3://", self.uri))
        self.base = base.rstrip("/")
        self.root = Path(self.base)  # for messages; never opened locally

    def _p(self, name: str) -> str:
        return f"{self.base}/{name}"

    def ensure(self) -> None:
        self.fs.create_dir(self.base, recursive=True)

    def path(self, begin: int, end: int, kind: str = "arrow") -> Path:
        return Path(self._p(f"b-{begin:020d}-{end:020d}.{kind}"))

    def _put(self, name: str, data: bytes) -> None:
        tmp = self._p(name + ".tmp")
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, self._p(name))

    def write(self, begin: int, end: int, table: pa.Table, ids: list[str]) -> None:
        self.ensure()
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=4096)
        self._put(self.path(begin, end).name, sink.getvalue().to_pybytes())
        if ids:
            self._put(self.path(begin, end, "ids").name, "\n".join(ids).encode())

    def batches(self, kind: str = "arrow") -> list[Staged]:
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except (OSError, FileNotFoundError):
            return []
        out = []
        for info in infos:
            m = _NAME.match(info.base_name)
            if m and m.group(3) == kind:
                out.append(Staged(int(m.group(1)), int(m.group(2))))
        return sorted(out, key=lambda s: (s.begin, s.end))

    def write_status(self, status: dict) -> None:
        self._put(self.STATUS, json.dumps(status).encode())

    def _get(self, name: str) -> bytes:
        with self.fs.open_input_stream(self._p(name)) as f:
            return f.read()

    def read_status(self) -> dict | None:
        try:
            return json.loads(self._get(self.STATUS))
        except (OSError, ValueError):
            return None

    def clear_status(self) -> None:
        try:
            self.fs.delete_file(self._p(self.STATUS))
        except (OSError, FileNotFoundError):
            pass

    def exists(self, begin: int, end: int) -> bool:
        import pyarrow.fs as pafs

        info = self.fs.get_file_info(str(self.path(begin, end)))
        return info.type == pafs.FileType.File

    def read(self, begin: int, end: int) -> pa.Table:
        with self.fs.open_input_file(str(self.path(begin, end))) as f:
            return ipc.open_file(f).read_all()

    def num_rows(self, begin: int, end: int) -> int:
        return self.read(begin, end).num_rows

    def remove(self, s: Staged, kind: str = "arrow") -> None:
        try:
            self.fs.delete_file(str(self.path(s.begin, s.end, kind)))
        except (OSError, FileNotFoundError):
            pass

    def ids(self, s: Staged) -> list[str]:
        try:
            text = self._get(self.path(s.begin, s.end, "ids").name).decode()
        except (OSError, FileNotFoundError):
            return []
        return text.split("\n") if text else []


def staging_at(location: str | os.PathLike[str]) -> StagingDir:
    """A local path or `file://` URI (fsynced writes), or any other pyarrow.fs URI
    (`hdfs://`, `s3://`, `gs://`, ...)."""
    text = os.fspath(location)
    if text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return StagingDir(unquote(urlparse(text).path))
    return FsStagingDir(text) if "://" in text else StagingDir(text)


def under(location: str, name: str) -> str:
    """`location`/`name` for a local path or a URI (pathlib would fold `s3://` to `s3:/`)."""
    return f"{location.rstrip('/')}/{name}" if "://" in location else os.path.join(location, name)


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
