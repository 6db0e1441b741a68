"""A stream's tracking (the stream protocol's X3/X4): the last publishing id of each named
publisher (deduplication) and each named consumer's stored offset, durable, in a small
append-only file beside the stream's segments (`tracking`):

    record : u32 payload length | u32 crc32(payload) | payload (format.REC_HDR)
    payload: u8 kind | u16 len(reference) | reference (UTF-8) | u64 value | u64 covered

`covered` is the stream's next offset once the turn's records are written: the records
the value counts are all below it. `set` changes the map at once (deduplication decides
on it) and buffers the entry; the stream store's commit writes the buffered entries
after the turn's records and fdatasyncs them after the records, before the publishes
are confirmed.

For a publisher the file is a snapshot, not the truth: its (reference, publishing id)
also travels in the log, in the trailer of the last record of the publish it covers
(streamlog.py), written and fdatasynced with those records, all or nothing. Loading
returns the snapshot's point (the highest `covered` it accepts: every trailer below it
is counted in the file) and `recovered` takes the trailers the log holds from there on,
so a power cut that keeps a publish's records and loses this file's entry for them
(synced after the records) cannot let a resend of them in again. Stored offsets live
here only (no record goes with a StoreOffset; one lost with the power was never
answered).

Loading ignores every entry whose `covered` is past the recovered log's end (a power
cut that kept the entry but not the records), so a publisher's sequence never counts a
message that is not there (a resend is taken, not dropped as a duplicate). Loading
replays the file up to its first damaged record (a torn tail) and rewrites it compacted
when it holds many superseded records. A file written before the trailers existed reads
the same (its logs hold no trailer).
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
_TAIL = struct.Struct(">QQ")  # value, covered


def _record(kind: int, ref: str, value: int, covered: int) -> bytes:
    r = ref.encode("utf-8", "surrogateescape")
    payload = _ENTRY.pack(kind, len(r)) + r + _TAIL.pack(value, covered)
    return REC_HDR.pack(len(payload), zlib.crc32(payload)) + payload


class Tracking:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[tuple[int, str], int] = {}
        self._covered: dict[tuple[int, str], int] = {}
        self._pending: dict[tuple[int, str], int] = {}
        self._records = 0
        self.point = 0  # the highest `covered` in the file: its snapshot's point
        self.fd = -1

    def load(self, log_end: int) -> int:
        """Replay the file; entries covering records past `log_end` (the recovered log's
        next offset) are ignored. The snapshot's point: the log's publisher trailers
        below it are all counted here (0 without a file)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        pos = since = 0
        mv = memoryview(data)
        ignored = 0
        while pos + REC_HDR.size <= len(data):
            n, crc = REC_HDR.unpack_from(data, pos)
            stop = pos + REC_HDR.size + n
            if stop > len(data) or n < _ENTRY.size + _TAIL.size or zlib.crc32(
                    mv[pos + REC_HDR.size:stop]) != crc:
                break
            kind, rlen = _ENTRY.unpack_from(data, pos + REC_HDR.size)
            p = pos + REC_HDR.size + _ENTRY.size
            ref = bytes(mv[p:p + rlen]).decode("utf-8", "surrogateescape")
            value, covered = _TAIL.unpack_from(data, p + rlen)
            if covered <= log_end:
                self.values[(kind, ref)] = value
                self._covered[(kind, ref)] = covered
                since = max(since, covered)
            else:
                ignored += 1
            self._records += 1
            pos = stop
        if pos != len(data):
            log.warning("stream tracking %s: torn tail cut at byte %d", self.path, pos)
        if ignored:
            log.warning("stream tracking %s: %d entries past the log's end (offset %d) "
                        "ignored", self.path, ignored, log_end)
        if pos != len(data) or ignored or self._records > 2 * len(self.values) + 64:
            self.compact()
        self.point = since
        return since

    def recovered(self, found: dict[str, tuple[int, int]], since: int, log_end: int) -> None:
        """The publisher trailers of the log (reference -> (offset, publishing id) of its
        last one) from `since` (`load`'s point) on: newer than the file, they win, and
        go into it with the next write."""
        for ref, (offset, value) in found.items():
            if since <= offset < log_end:
                key = (PUBLISHER, ref)
                self.values[key] = self._pending[key] = value
                self._covered[key] = log_end

    def compact(self) -> None:
        """Rewrite the file with one record per entry (tmp, fsync, rename, dir fsync)."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(_record(k, r, v, self._covered.get((k, r), 0))
                             for (k, r), v in self.values.items()))
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

    def write_pending(self, covered: int) -> None:
        """Append the buffered entries, each covering the log up to `covered` (its next
        offset now, its records written); not synced (the store's commit syncs it)."""
        pending, self._pending = self._pending, {}
        for key in pending:
            self._covered[key] = covered
        self.point = max(self.point, covered)
        self._records += len(pending)
        data = b"".join(_record(k, r, v, covered) for (k, r), v in pending.items())
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        done = 0
        while done < len(data):
            done += os.write(self.fd, data[done:])

    def snapshot(self, log_end: int) -> None:
        """Every publisher's entry to be written again, covering the log up to `log_end`
        (its records all written and synced: a clean close), if the file's point is
        below it: the next open then has no trailer to read."""
        if self.point < log_end:
            for key, value in self.values.items():
                if key[0] == PUBLISHER:
                    self._pending[key] = value

    def drop_pending(self) -> None:
        self._pending = {}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
