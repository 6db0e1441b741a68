"""Spill files: where deep queues keep the messages they will not need for a while.

A queue holds its next few thousand ready messages as objects and everything behind
them here, as one record per message, so memory per queued message is the 8 bytes of a
location whatever the queue's depth (RabbitMQ's lazy queues, in spirit). Spill files
are a cache, not durable storage: never fsynced, wiped at start; persistent messages are
in the store as well.

Records are buffered and written once per loop turn (`flush`); a record still in the
buffer is read from it. Files are 64 MiB segments, each deleted once every record in it
has been released.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

from mypy_extensions import mypyc_attr

_LEN = struct.Struct(">I")
SEG_BITS = 40  # location = segment << 40 | offset
WINDOW = 256 * 1024  # bytes one get_many pread may span


@mypyc_attr(native_class=False)  # (mypyc cannot make a subclass of OSError native)
class SpillError(OSError):
    """A spill file could not be written or read back."""


class Spill:
    def __init__(self, directory: str | Path, segment_bytes: int = 64 << 20) -> None:
        self.dir = Path(directory)
        shutil.rmtree(self.dir, ignore_errors=True)  # a cache: nothing survives a restart
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._seg = 0
        self._wfd = -1
        self._woff = 0          # offset the next record will get in the current segment
        self._flushed = 0       # bytes of the current segment already written
        self._buf = bytearray()
        self._live: dict[int, int] = {}
        self._rfds: dict[int, int] = {}
        self.records = 0
        self._open_segment(0)

    def _path(self, seg: int) -> Path:
        return self.dir / f"{seg:08d}.spill"

    def _open_segment(self, seg: int) -> None:
        self._seg = seg
        self._wfd = os.open(self._path(seg), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._woff = self._flushed = 0
        self._live[seg] = 0

    def put(self, record: bytes) -> int:
        """Append a record; returns its location."""
        if self._woff >= self.segment_bytes:
            self.flush()
            os.close(self._wfd)
            old = self._seg
            self._open_segment(old + 1)
            if self._live.get(old) == 0:
                self._drop(old)
        loc = (self._seg << SEG_BITS) | self._woff
        self._buf += _LEN.pack(len(record))
        self._buf += record
        self._woff += 4 + len(record)
        self._live[self._seg] += 1
        self.records += 1
        if len(self._buf) >= 1 << 20:
            self.flush()
        return loc

    def flush(self) -> None:
        if not self._buf:
            return
        data = bytes(self._buf)
        pos = 0
        try:  # pwrite at an explicit offset: a failed flush can simply be retried
            while pos < len(data):
                n = os.pwrite(self._wfd, data[pos:], self._flushed)
                self._flushed += n
                pos += n
        except OSError as e:
            del self._buf[:pos]
            raise SpillError(f"cannot write spill file {self._path(self._seg)}: {e}") from e
        self._buf.clear()

    def get(self, loc: int) -> bytes:
        seg, off = loc >> SEG_BITS, loc & ((1 << SEG_BITS) - 1)
        if seg == self._seg and off >= self._flushed:
            start = off - self._flushed
            (n,) = _LEN.unpack_from(self._buf, start)
            return bytes(self._buf[start + 4:start + 4 + n])
        fd = self._rfds.get(seg)
        if fd is None:
            fd = self._rfds[seg] = os.open(self._path(seg), os.O_RDONLY)
        head = os.pread(fd, 4096, off)
        if len(head) < 4:
            raise SpillError(f"spill record missing at {self._path(seg)}:{off}")
        (n,) = _LEN.unpack_from(head)
        if n + 4 > len(head):
            head += os.pread(fd, n + 4 - len(head), off + len(head))
        return head[4:4 + n]

    def get_many(self, locs: list[int]) -> list[bytes]:
        """Read many records, each window of neighbours in one file with one pread.

        A queue's records are in ascending order but need not be adjacent: queues that
        spill at the same time (a fanout) interleave theirs. A window spans from the
        first record to the last one within WINDOW bytes of it, so interleaved records
        cost a share of one read each, not a read of their own."""
        out: list[bytes] = []
        i, n = 0, len(locs)
        mask = (1 << SEG_BITS) - 1
        while i < n:
            loc = locs[i]
            seg, off = loc >> SEG_BITS, loc & mask
            hot = seg == self._seg
            if hot and off >= self._flushed:
                out.append(self.get(loc))
                i += 1
                continue
            limit = min(off + WINDOW, self._flushed) if hot else off + WINDOW
            j = i + 1
            while j < n and locs[j] >> SEG_BITS == seg and off < locs[j] & mask < limit:
                j += 1
            fd = self._rfds.get(seg)
            if fd is None:
                fd = self._rfds[seg] = os.open(self._path(seg), os.O_RDONLY)
            chunk = os.pread(fd, (locs[j - 1] & mask) - off + 4096, off)
            while i < j:
                pos = (locs[i] & mask) - off
                if pos + 4 > len(chunk):
                    break
                (size,) = _LEN.unpack_from(chunk, pos)
                if pos + 4 + size > len(chunk):
                    if pos == 0:  # a record larger than the window's slack
                        out.append(self.get(locs[i]))
                        i += 1
                    break
                out.append(chunk[pos + 4:pos + 4 + size])
                i += 1
        return out

    def release(self, loc: int) -> None:
        seg = loc >> SEG_BITS
        left = self._live.get(seg, 0) - 1
        self._live[seg] = left
        self.records -= 1
        if left <= 0 and seg != self._seg:
            self._drop(seg)

    def _drop(self, seg: int) -> None:
        self._live.pop(seg, None)
        fd = self._rfds.pop(seg, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(self._path(seg))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        for fd in self._rfds.values():
            os.close(fd)
        self._rfds.clear()
        if self._wfd >= 0:
            os.close(self._wfd)
            self._wfd = -1
        shutil.rmtree(self.dir, ignore_errors=True)
