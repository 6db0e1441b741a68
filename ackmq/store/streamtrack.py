"""A stream's tracking (the stream protocol's X3/X4): the last publishing id of each named
publisher (deduplication) and each named consumer's stored offset, durable, in a small
append-only file beside the stream's segments (`tracking`):

    record : u32 payload length | u32 crc32(payload) | payload (format.REC_HDR)
    payload: u8 kind | u16 len(reference) | reference (UTF-8) | u64 value

`set` changes the map at once (deduplication decides on it) and buffers the record;
`encode_pending` hands the buffered records to the stream store's commit, which writes
them only after the stream's own records are fdatasynced (so a publisher's sequence is
never durable before the messages it counts) and fdatasyncs them before the publishes
are confirmed. Loading replays the file up to its first damaged record (a torn tail)
and rewrites it compacted when it holds many superseded records.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

from ackmq.store.format import REC_HDR

log = logging.getLogger("ackmq.stream")

PUBLISHER = 0  # kind: a named publisher's last publishing id
OFFSET = 1     # kind: a named consumer's stored offset
_ENTRY = struct.Struct(">BH")
_U64 = struct.Struct(">Q")


def _record(kind: int, ref: str, value: int) -> bytes:
    r = ref.encode("utf-8", "surrogateescape")
    payload = _ENTRY.pack(kind, len(r)) + r + _U64.pack(value)
    return REC_HDR.pack(len(payload), zlib.crc32(payload)) + payload


class Tracking:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[tuple[int, str], int] = {}
        self._pending: dict[tuple[int, str], int] = {}
        self._records = 0
        self._load()
        self.fd = -1

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        pos = 0
        mv = memoryview(data)
        while pos + REC_HDR.size <= len(data):
            n, crc = REC_HDR.unpack_from(data, pos)
            stop = pos + REC_HDR.size + n
            if stop > len(data) or n < _ENTRY.size + 8 or zlib.crc32(
                    mv[pos + REC_HDR.size:stop]) != crc:
                break
            kind, rlen = _ENTRY.unpack_from(data, pos + REC_HDR.size)
            p = pos + REC_HDR.size + _ENTRY.size
            ref = bytes(mv[p:p + rlen]).decode("utf-8", "surrogateescape")
            self.values[(kind, ref)] = int(_U64.unpack_from(data, p + rlen)[0])
            self._records += 1
            pos = stop
        if pos != len(data):
            log.warning("stream tracking %s: torn tail cut at byte %d", self.path, pos)
        if pos != len(data) or self._records > 2 * len(self.values) + 64:
            self.compact()

    def compact(self) -> None:
        """Rewrite the file with one record per entry (tmp, fsync, rename, dir fsync)."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(_record(k, r, v) for (k, r), v in self.values.items()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._records = len(self.values)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def get(self, kind: int, ref: str) -> int | None:
        return self.values.get((kind, ref))

    def set(self, kind: int, ref: str, value: int) -> None:
        self.values[(kind, ref)] = value
        self._pending[(kind, ref)] = value

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def take_pending(self) -> bytes:
        """The buffered records, encoded (the caller writes them with `write`)."""
        pending, self._pending = self._pending, {}
        self._records += len(pending)
        return b"".join(_record(k, r, v) for (k, r), v in pending.items())

    def write(self, data: bytes, sync: bool) -> None:
        """Append `data` (from take_pending) and fdatasync it when `sync`."""
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        done = 0
        while done < len(data):
            done += os.write(self.fd, data[done:])
        if sync:
            os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
