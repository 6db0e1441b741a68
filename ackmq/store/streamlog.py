"""A stream's log (R1-R3): append-only segment files of checksummed records, one
directory per stream, beside the main segment store. Reading from any offset is a seek:
a sparse in-memory index (every STRIDE-th record: file position and timestamp) finds the
record, so a stream of any length costs ~1 byte of broker memory per 8 messages.

Records are written by `flush` (buffered since the last one: a group write per turn)
and made durable by `sync` (fdatasync of the segments written since). Retention drops
whole segments, oldest first, when a segment is rolled: by total bytes
(`x-max-length-bytes`) and by age of a segment's newest record (`x-max-age`).

    segment file : b"ACKMQST1" | u64 first offset | record*
    index file   : a closed segment's sparse index (written when it is rolled), checked
                   against the segment's size; the newest segment is rescanned at start.
                   Magic ACKMQSI1: no record of the segment has a trailer; ACKMQSI2:
                   some may
    record       : u32 payload length | u32 crc32(payload) | payload (format.REC_HDR)
    payload      : u64 offset | i64 timestamp ms | u8 len(exchange) | u8 len(routing key)
                   | u32 len(properties) | u32 len(body) | the four byte strings
                   | trailer (the rest of the payload length, usually empty)
    trailer      : u16 len(reference) | reference (UTF-8) | u64 publishing id
                   | u32 records (of the publish, this one the first)

A trailer is the stream protocol's deduplication kept with the records it covers, as
RabbitMQ keeps a publisher's sequence in its chunk (X3): a named publisher's last
publishing id, on the first record of its publish (a Publish frame's records), inside
that record's checksum, with the number of records the publish wrote. A publish is
never split between segments, and opening a log cuts a publish whose records are not
all there (a torn write: never synced, so never confirmed) with its trailer, so a power
cut keeps a publish's records and its id, or neither. Readers go by the four lengths
and never see a trailer; the tracking file (streamtrack.py) is a snapshot of the
trailers, and opening a log takes those written after the snapshot's point
(`_rebuild_tracking`).
"""

from __future__ import annotations

import bisect
import builtins
import hashlib
import logging
import os
import shutil
import struct
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, cast

from ackmq.broker.storage import StreamLogLike
from ackmq.protocol.crc import crc32
from ackmq.store.format import REC_HDR
from ackmq.store.streamtrack import PUBLISHER, Tracking

log = logging.getLogger("ackmq.stream")

SEG_MAGIC = b"ACKMQST1"
SEG_HDR = struct.Struct("<8sQ")
REC = struct.Struct("<QqBBII")
IDX_MAGIC = b"ACKMQSI1"
IDX_MAGIC_TRAILERS = b"ACKMQSI2"  # the same layout; records of the segment may have trailers
IDX_HDR = struct.Struct("<8sQQQqQ")  # magic, first offset, count, segment size, last ts, n
STRIDE = 64                       # one index entry per this many records
# RabbitMQ's default is 500 MB; ackmq's is smaller: a restart rescans the newest segment
DEFAULT_SEGMENT_BYTES = 64 << 20
READ_CHUNK = 256 << 10
READ_AHEAD = 1 << 20  # asked of the kernel (posix_fadvise) past each batch read
TRAILER_REF = struct.Struct("<H")
TRAILER_TAIL = struct.Struct("<QI")  # publishing id, records


# a record as `read` returns it: a plain tuple (no per-record class instance), indexed
# by these names
StreamRecord = tuple[int, int, str, str, bytes, bytes]
OFFSET: Final = 0
TIMESTAMP: Final = 1
EXCHANGE: Final = 2
ROUTING_KEY: Final = 3
PROPERTIES: Final = 4
BODY: Final = 5


_names: dict[bytes, str] = {}  # exchange and routing-key texts, decoded once


def _name(b: bytes) -> str:
    s = _names.get(b)
    if s is None:
        if len(_names) > 4096:
            _names.clear()
        s = _names[b] = b.decode("utf-8", "surrogateescape")
    return s


def _decode(data: bytes, p: int) -> StreamRecord:
    """The record whose payload starts at data[p]."""
    off, ts, lx, lk, lp, lb = REC.unpack_from(data, p)
    p += REC.size
    x = _name(data[p:p + lx]) if lx else ""  # mostly the default exchange
    p += lx
    k = _name(data[p:p + lk])
    p += lk
    return off, ts, x, k, data[p:p + lp], data[p + lp:p + lp + lb]


def trailer(ref: str, publishing_id: int, records: int) -> bytes:
    """A publish's trailer: its named publisher's last publishing id (X3)."""
    r = ref.encode("utf-8", "surrogateescape")
    return TRAILER_REF.pack(len(r)) + r + TRAILER_TAIL.pack(publishing_id, records)


def read_trailer(data: builtins.bytes, p: int, stop: int) -> tuple[str, int, int] | None:
    """(reference, publishing id, records) of the trailer in data[p:stop] (a record's
    bytes past its body), None if it is not one."""
    if p + TRAILER_REF.size > stop:
        return None
    n = TRAILER_REF.unpack_from(data, p)[0]
    q = p + TRAILER_REF.size + n
    if q + TRAILER_TAIL.size != stop:
        return None
    pubid, records = TRAILER_TAIL.unpack_from(data, q)
    return bytes(data[p + TRAILER_REF.size:q]).decode("utf-8", "surrogateescape"), pubid, records


class _Segment:
    __slots__ = ("first", "path", "size", "count", "positions", "stamps", "last_ts", "fd",
                 "trailers")

    def __init__(self, first: int, path: Path) -> None:
        self.first = first
        self.path = path
        self.size = SEG_HDR.size
        self.count = 0
        self.positions = array("Q")  # file position of record first + i*STRIDE
        self.stamps = array("q")     # its timestamp
        self.last_ts = 0
        self.fd = -1                 # read descriptor, opened on first read
        self.trailers = False        # some record may carry a trailer

    def note(self, pos: int, ts: int) -> None:
        if self.count % STRIDE == 0:
            self.positions.append(pos)
            self.stamps.append(ts)
        self.count += 1
        self.last_ts = ts


class StreamLog:
    """One stream's records on disk. Offsets start at 0 and never repeat."""

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 max_bytes: int | None = None, max_age_ms: int | None = None) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes or DEFAULT_SEGMENT_BYTES  # 0: the default
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self.segments: list[_Segment] = []
        self._firsts: list[int] = []
        self._buf = bytearray()
        self._pending: list[int] = []  # positions in _buf of unwritten records, in order
        self._pending_ts: list[int] = []  # and their timestamps
        self._pending_first = 0         # offset of the first unwritten record
        self._wfd = -1
        self._dirty = False
        self._last_ts = 0
        self._last_chunk = 0
        self._damaged: set[int] = set()  # offsets whose record failed its checksum
        self._last_trailer = -1  # the offset of the newest record given a trailer
        self._frames: list[tuple[int, int]] = []  # buffered publishes with one: [first, end)
        self._found: dict[str, tuple[int, int]] = {}  # trailers read by recovery's scans
        self._indexed: list[_Segment] = []  # segments recovered from their index file
        self.dir.mkdir(parents=True, exist_ok=True)
        # the stream protocol's publisher sequences and stored offsets (streamtrack.py)
        self.tracking = Tracking(self.dir / "tracking")
        self._recover()
        self._rebuild_tracking(self.tracking.load(self.next_offset))

    # -- offsets --------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        return self.segments[0].first if self.segments else self._pending_first

    @property
    def next_offset(self) -> int:
        return self._pending_first + len(self._pending)

    @property
    def last_chunk(self) -> int:
        """The first offset of the newest batch written together (one turn's appends):
        where RabbitMQ's `last` starts (osiris' last chunk)."""
        if self._pending and self._pending_first == self.first_offset:
            return self._pending_first  # nothing written yet
        return max(self._last_chunk, self.first_offset)

    @property
    def pending(self) -> bool:
        return bool(self._pending) or self._dirty

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments) + len(self._buf)

    # -- recovery -------------------------------------------------------------------
    def _recover(self) -> None:
        paths = sorted(self.dir.glob("*.seg"))
        for i, path in enumerate(paths):
            newest = i == len(paths) - 1
            seg = None if newest else self._load_index(path)
            if seg is not None:
                self._indexed.append(seg)
            else:
                seg = self._scan(path, newest)
                if seg is not None and not newest:
                    self._write_index(seg)
            if seg is None:
                continue
            if self.segments and seg.first != self.segments[-1].first + self.segments[-1].count:
                log.warning("stream %s: segment %s does not follow its predecessor; later "
                            "segments ignored", self.dir.name, path.name)
                break
            self.segments.append(seg)
            self._firsts.append(seg.first)
        if self.segments:
            last = self.segments[-1]
            self._pending_first = last.first + last.count
            self._last_chunk = max(self._pending_first - 1, 0)  # batches are not recorded
            self._last_ts = last.last_ts
            self._last_trailer = last.first if last.trailers else -1  # (what `_roll` asks)
            self._open_writer(last)

    def _rebuild_tracking(self, since: int) -> None:
        """Give the tracking the publisher trailers of the records from `since` (the
        tracking file's snapshot point) on: the scanned segments' were read by `_scan`,
        a closed segment past it that may hold some is read for them here (after a
        crash: a commit's snapshot covers its own records, and a clean close snapshots
        the whole log)."""
        for seg in self._indexed:
            if seg.trailers and seg.first + seg.count > since:
                self._segment_trailers(seg, since)
        self.tracking.recovered(self._found, since, self.next_offset)
        self._found, self._indexed = {}, []

    def _found_trailer(self, offset: int, ref: str, pubid: int) -> tuple[int, int] | None:
        """Note a trailer read by recovery; what it replaced."""
        found = self._found
        prev = found.get(ref)
        if prev is None or prev[0] <= offset:
            found[ref] = (offset, pubid)
        return prev

    def _segment_trailers(self, seg: _Segment, since: int) -> None:
        """The trailers of a closed segment's records at `since` or later (its publishes
        are whole: it was synced before the next segment was written)."""
        rel = max(since - seg.first, 0)
        base = seg.positions[rel // STRIDE] if seg.positions else SEG_HDR.size
        with open(seg.path, "rb") as f:
            f.seek(base)
            data = f.read(seg.size - base)  # from the indexed record before `since`
        pos = 0
        mv = memoryview(data)
        while pos + REC_HDR.size <= len(data):
            n, crc = REC_HDR.unpack_from(data, pos)
            p, stop = pos + REC_HDR.size, pos + REC_HDR.size + n
            if stop > len(data) or n < REC.size:
                return
            off, _ts, lx, lk, lp, lb = REC.unpack_from(data, p)
            end = p + REC.size + lx + lk + lp + lb
            if stop > end and off >= since and crc32(mv[p:stop]) == crc:
                t = read_trailer(data, end, stop)
                if t is not None:
                    self._found_trailer(off, t[0], t[1])
            pos = stop

    # -- index files: a closed segment's sparse index, so a restart reads only the newest
    def _write_index(self, seg: _Segment) -> None:
        magic = IDX_MAGIC_TRAILERS if seg.trailers else IDX_MAGIC
        body = IDX_HDR.pack(magic, seg.first, seg.count, seg.size, seg.last_ts,
                            len(seg.positions)) + seg.positions.tobytes() + seg.stamps.tobytes()
        tmp = seg.path.with_suffix(".idx.tmp")
        with open(tmp, "wb") as f:
            f.write(body + struct.pack("<I", crc32(body)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, seg.path.with_suffix(".idx"))

    def _load_index(self, path: Path) -> _Segment | None:
        """A closed segment from its index file, if that is whole and matches the file."""
        try:
            data = path.with_suffix(".idx").read_bytes()
            size = path.stat().st_size
        except OSError:
            return None
        if len(data) < IDX_HDR.size + 4 or \
                crc32(data[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
            return None
        magic, first, count, seg_size, last_ts, n = IDX_HDR.unpack_from(data, 0)
        if magic not in (IDX_MAGIC, IDX_MAGIC_TRAILERS) or seg_size != size or len(data) != IDX_HDR.size + 16 * n + 4:
            return None
        seg = _Segment(first, path)
        seg.count, seg.size, seg.last_ts = count, seg_size, last_ts
        seg.trailers = magic == IDX_MAGIC_TRAILERS
        seg.positions.frombytes(data[IDX_HDR.size:IDX_HDR.size + 8 * n])
        seg.stamps.frombytes(data[IDX_HDR.size + 8 * n:IDX_HDR.size + 16 * n])
        return seg

    def _scan(self, path: Path, newest: bool) -> _Segment | None:
        data = path.read_bytes()
        if len(data) < SEG_HDR.size or data[:8] != SEG_MAGIC:
            log.warning("stream %s: %s has no valid header; dropped", self.dir.name, path.name)
            path.unlink()
            return None
        first = SEG_HDR.unpack_from(data, 0)[1]
        seg = _Segment(first, path)
        pos, end = SEG_HDR.size, len(data)
        mv = memoryview(data)
        # the newest publish with a trailer: its record's position, offset, records,
        # the timestamp before it, its reference, the trailer it replaced
        last: tuple[int, int, int, int, str, tuple[int, int] | None] | None = None
        while pos + REC_HDR.size <= end:
            n, crc = REC_HDR.unpack_from(data, pos)
            stop = pos + REC_HDR.size + n
            if stop > end or n < REC.size or crc32(mv[pos + REC_HDR.size:stop]) != crc:
                break
            off, ts, lx, lk, lp, lb = REC.unpack_from(data, pos + REC_HDR.size)
            if off != first + seg.count:
                break
            body_end = pos + REC_HDR.size + REC.size + lx + lk + lp + lb
            if stop > body_end:  # a trailer: a named publisher's sequence (X3)
                t = read_trailer(data, body_end, stop)
                if t is not None:
                    last = (pos, off, t[2], seg.last_ts, t[0],
                            self._found_trailer(off, t[0], t[1]))
                    seg.trailers = True
            seg.note(pos, ts)
            pos = stop
        if last is not None and last[1] + last[2] > first + seg.count:
            # a publish cut short (a torn write, never synced nor confirmed): its records
            # go with its trailer, so its resend is taken whole
            pos, off, _n, seg.last_ts, ref, prev = last
            log.warning("stream %s: a publish cut short at offset %d in %s (%d records "
                        "dropped)", self.dir.name, off, path.name, first + seg.count - off)
            seg.count = off - first
            del seg.positions[(seg.count + STRIDE - 1) // STRIDE:]
            del seg.stamps[(seg.count + STRIDE - 1) // STRIDE:]
            if prev is None:
                del self._found[ref]
            else:
                self._found[ref] = prev
        if pos != end:
            what = "torn tail" if newest else "damaged record"
            log.warning("stream %s: %s in %s at %d (%d bytes dropped)", self.dir.name, what,
                        path.name, pos, end - pos)
            with open(path, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())
        seg.size = pos
        return seg

    # -- append ---------------------------------------------------------------------
    def _timestamp(self) -> int:
        """Now in ms, never before the last record's (a clock stepped back)."""
        ts = max(int(time.time() * 1000), self._last_ts)
        self._last_ts = ts
        return ts

    def append(self, exchange: str, routing_key: str, properties: builtins.bytes,
               body: builtins.bytes) -> int:  # (`bytes` in this class is the property)
        """Buffer one record; it is on disk after `flush`, durable after `sync`."""
        offset = self._pending_first + len(self._pending)
        ts = self._timestamp()
        x = exchange.encode("utf-8", "surrogateescape")
        k = routing_key.encode("utf-8", "surrogateescape")
        payload = b"".join((REC.pack(offset, ts, len(x), len(k), len(properties), len(body)),
                            x, k, properties, body))
        buf = self._buf
        self._pending.append(len(buf))
        self._pending_ts.append(ts)
        buf += REC_HDR.pack(len(payload), crc32(payload))
        buf += payload
        return offset

    def append_many(self, exchange: str, routing_key: str,
                    records: Sequence[tuple[builtins.bytes, builtins.bytes]]) -> int:
        """Buffer several records of one publish (a stream-protocol Publish frame) with
        one timestamp, joined once and added to the buffer at once (a `+=` a record
        grew the buffer by reallocations that copied it; the checksum runs over the
        record's head and body apart). The first one's offset."""
        first = offset = self._pending_first + len(self._pending)
        ts = self._timestamp()
        x = exchange.encode("utf-8", "surrogateescape")
        k = routing_key.encode("utf-8", "surrogateescape")
        lx, lk, xk = len(x), len(k), x + k
        buf, starts = self._buf, self._pending
        pos = len(buf)
        add = starts.append
        pack, hdr, hsize = REC.pack, REC_HDR.pack, REC_HDR.size
        head_size = REC.size + lx + lk
        parts: list[builtins.bytes] = []
        last: builtins.bytes | None = None
        tail = b""  # exchange, routing key and the last properties
        for properties, body in records:
            if properties is not last:
                last, tail = properties, xk + properties
            lp, lb = len(properties), len(body)
            head = pack(offset, ts, lx, lk, lp, lb) + tail
            n = head_size + lp + lb
            parts += (hdr(n, crc32(body, crc32(head))), head, body)
            add(pos)
            pos += hsize + n
            offset += 1
        if buf:
            buf += b"".join(parts)
        else:  # the turn's first: the buffer is the join (one copy)
            self._buf = bytearray().join(parts)
        self._pending_ts.extend([ts] * (offset - first))
        return first

    def flush(self) -> None:
        """Write the buffered records (rolling segments past the size limit)."""
        if not self._pending:
            return
        buf, starts, stamps, first = self._buf, self._pending, self._pending_ts, \
            self._pending_first
        self._buf, self._pending, self._pending_ts = bytearray(), [], []
        frames, self._frames = self._frames, []
        self._pending_first = first + len(starts)
        self._last_chunk = first
        n, i = len(starts), 0
        try:
            while i < n:
                i = self._write_some(buf, starts, stamps, first, i, frames)
        except OSError:
            # what is not written is dropped (its publishes are nacked, P6); its offsets
            # go to the next appends
            self._pending_first = first + i
            raise

    def _write_some(self, buf: bytearray, starts: list[int], stamps: list[int], first: int,
                    i: int, frames: list[tuple[int, int]]) -> int:
        """Write records i.. that fit in the current segment (rolling first if it is
        full), never part of a publish with a trailer (`frames`); returns the index of
        the first record not written. A failed write is cut off the file again and
        leaves the segment's index and size as they were."""
        n, total = len(starts), len(buf)
        seg = self.segments[-1] if self.segments else None
        if seg is None or (seg.count and seg.size >= self.segment_bytes):
            seg = self._roll(first + i)
        # the records that fit in this segment (at least one)
        room = self.segment_bytes - seg.size
        j = i + 1
        while j < n and (starts[j + 1] if j + 1 < n else total) - starts[i] <= room:
            j += 1
        if j < n and frames:  # a publish with a trailer goes into one segment whole
            for f_first, f_end in frames:
                if f_first < first + j < f_end:
                    j = f_end - first
        end = starts[j] if j < n else total
        base = seg.size - starts[i]
        positions, seg_stamps, count = seg.positions, seg.stamps, seg.count
        indexed = len(positions)
        for r in range(i, j):
            if count % STRIDE == 0:
                positions.append(starts[r] + base)
                seg_stamps.append(stamps[r])
            count += 1
        data = memoryview(buf)[starts[i]:end]
        try:
            done = 0
            while done < len(data):
                done += os.write(self._wfd, data[done:])
        except OSError:
            del positions[indexed:]
            del seg_stamps[indexed:]
            try:
                os.ftruncate(self._wfd, seg.size)
            except OSError:
                pass  # recovery cuts a torn tail anyway
            raise
        seg.count = count
        seg.last_ts = stamps[j - 1]
        seg.size += end - starts[i]
        self._dirty = True
        return j

    def sync(self) -> None:
        if self._dirty and self._wfd >= 0:
            os.fdatasync(self._wfd)
        self._dirty = False

    def _roll(self, first: int) -> _Segment:
        if self._wfd >= 0:
            if self._dirty:
                os.fdatasync(self._wfd)
            os.close(self._wfd)
            self._wfd = -1
            closed = self.segments[-1]
            closed.trailers = closed.trailers or self._last_trailer >= closed.first
            self._write_index(closed)
        path = self.dir / f"{first:020d}.seg"
        seg = _Segment(first, path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.write(fd, SEG_HDR.pack(SEG_MAGIC, first))
        os.fdatasync(fd)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._wfd = fd
        self.segments.append(seg)
        self._firsts.append(first)
        self._retain()
        return seg

    def _open_writer(self, seg: _Segment) -> None:
        self._wfd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)

    # -- retention ------------------------------------------------------------------
    def _retain(self) -> None:
        """Drop whole old segments (never the one being written) beyond the limits."""
        segs = self.segments
        if self.max_bytes is not None:
            total = sum(s.size for s in segs)
            while len(segs) > 1 and total > self.max_bytes:
                total -= segs[0].size
                self._drop_oldest()
        if self.max_age_ms is not None:
            horizon = int(time.time() * 1000) - self.max_age_ms
            while len(segs) > 1 and segs[0].last_ts < horizon:
                self._drop_oldest()

    def retain(self, segment_bytes: int, max_bytes: int | None,
               max_age_ms: int | None) -> None:
        self.segment_bytes = segment_bytes or DEFAULT_SEGMENT_BYTES
        self.max_bytes, self.max_age_ms = max_bytes, max_age_ms

    def _drop_oldest(self) -> None:
        seg = self.segments.pop(0)
        self._firsts.pop(0)
        if seg.fd >= 0:
            os.close(seg.fd)
        seg.path.unlink(missing_ok=True)
        seg.path.with_suffix(".idx").unlink(missing_ok=True)

    # -- read -----------------------------------------------------------------------
    def offset_for_timestamp(self, ts_ms: int) -> int:
        """The first offset appended at or after `ts_ms` (next_offset if none)."""
        for seg in self.segments:
            if seg.last_ts < ts_ms:
                continue
            i = max(bisect.bisect_left(seg.stamps, ts_ms) - 1, 0)
            off = seg.first + i * STRIDE
            while True:
                recs = self.read(off, STRIDE + 1)
                for r in recs:
                    if r[TIMESTAMP] >= ts_ms:
                        return r[OFFSET]
                if not recs:
                    break
                off = recs[-1][OFFSET] + 1
        for i, ts in enumerate(self._pending_ts):
            if ts >= ts_ms:
                return self._pending_first + i
        return self.next_offset

    def read(self, offset: int, limit: int, max_bytes: int = 4 << 20) -> list[StreamRecord]:
        """Up to `limit` records from `offset` on (fewer at the end of the stream, none
        past it); `offset` below the first retained one starts at the first."""
        return [_decode(data, p) for data, ps in self.read_spans(offset, limit, max_bytes)
                for p in ps]

    def read_spans(self, offset: int, limit: int, max_bytes: int = 4 << 20
                   ) -> list[tuple[builtins.bytes, list[int]]]:
        """`read`'s records as the log's bytes, checksums checked: per stretch read at
        once, (its bytes, where each record's payload starts in them), in offset order,
        so a reader that sends them on (a stream-protocol chunk) makes no object per
        record."""
        offset = max(offset, self.first_offset)
        spans: list[tuple[builtins.bytes, list[int]]] = []
        got = 0
        if offset < self._pending_first:
            i = bisect.bisect_right(self._firsts, offset) - 1
            got = self._read_segment(self.segments[i], offset, limit, max_bytes, spans)
        if got < limit and offset + got >= self._pending_first:
            start = offset + got - self._pending_first
            buf, starts = self._buf, self._pending
            stop = min(len(starts), start + limit - got)
            if start < stop:
                end = starts[stop] if stop < len(starts) else len(buf)
                data = bytes(buf[starts[start]:end])  # one copy: records decode from bytes
                base = starts[start] - REC_HDR.size
                spans.append((data, [starts[k] - base for k in range(start, stop)]))
        return spans

    def _read_segment(self, seg: _Segment, offset: int, limit: int, max_bytes: int,
                      spans: list[tuple[builtins.bytes, list[int]]]) -> int:
        """Records of `seg` from `offset` into `spans`; how many."""
        if seg.fd < 0:
            seg.fd = os.open(seg.path, os.O_RDONLY)
        rel = offset - seg.first
        pos = seg.positions[rel // STRIDE]
        skip = rel % STRIDE  # records before `offset` since the indexed one
        left = limit  # records still wanted
        size = 0
        hsize, unpack = REC_HDR.size, REC_HDR.unpack_from
        while left and pos < seg.size and size < max_bytes:
            data = os.pread(seg.fd, min(READ_CHUNK, seg.size - pos), pos)
            end = len(data)
            p = 0
            while skip and p + hsize <= end:  # the records before `offset`: unchecked
                stop = p + hsize + unpack(data, p)[0]
                if stop > end:
                    break
                p = stop
                skip -= 1
            if skip:
                if p == 0:  # one record larger than the read: past it
                    p = hsize + unpack(data, 0)[0]
                    skip -= 1
                pos += p
                continue
            view = memoryview(data)
            ps: list[int] = []
            add = ps.append
            while p + hsize <= end:
                n, crc = unpack(data, p)
                q = p + hsize
                stop = q + n
                if stop > end:
                    if p == 0:  # one record larger than the read: read it whole
                        data = os.pread(seg.fd, stop, pos)
                        view = memoryview(data)
                        end = len(data)
                        continue
                    break
                if crc32(view[q:stop]) != crc:
                    bad = seg.first + rel + (limit - left)
                    if bad not in self._damaged:  # logged once, not on every read
                        self._damaged.add(bad)
                        log.error("stream %s: record %d in %s fails its checksum; "
                                  "readers stop there", self.dir.name, bad, seg.path.name)
                    if ps:
                        spans.append((data, ps))
                    return limit - left
                add(q)
                p = stop
                size += n
                left -= 1
                if not left or size >= max_bytes:
                    break
            if ps:
                spans.append((data, ps))
            pos += p
        if pos < seg.size or seg is self.segments[-1]:
            # the kernel reads the next stretch meanwhile: the next pread is a copy
            os.posix_fadvise(seg.fd, pos, READ_AHEAD, os.POSIX_FADV_WILLNEED)
        return limit - left

    # -- tracking (the stream protocol's deduplication and offsets) -------------------
    def tracked(self, kind: int, ref: str) -> int | None:
        return self.tracking.get(kind, ref)

    def track(self, kind: int, ref: str, value: int) -> None:
        """Written by the next commit, after the records appended before it (X3, X4)."""
        self.tracking.set(kind, ref, value)

    def track_publish(self, first: int, ref: str, value: int) -> None:
        """A named publisher's publish, the records from offset `first` to the newest
        (buffered): its sequence `value` goes into the trailer of the first (written and
        synced with them, all or nothing) and into the tracking file's snapshot."""
        self.tracking.set(PUBLISHER, ref, value)
        i = first - self._pending_first
        starts, buf, end = self._pending, self._buf, self.next_offset
        if i < 0 or i >= len(starts):
            return  # no record of it buffered (the tracking file alone has it)
        t = trailer(ref, value, end - first)
        start = starts[i]
        stop = starts[i + 1] if i + 1 < len(starts) else len(buf)
        n, crc = REC_HDR.unpack_from(buf, start)
        REC_HDR.pack_into(buf, start, n + len(t), crc32(t, crc))
        buf[stop:stop] = t
        if i + 1 < len(starts):
            starts[i + 1:] = [p + len(t) for p in starts[i + 1:]]
        self._frames.append((first, end))
        self._last_trailer = first

    def tracked_all(self) -> list[tuple[int, str, int]]:
        return sorted((k, r, v) for (k, r), v in self.tracking.values.items())

    # -- life cycle -----------------------------------------------------------------
    def close(self) -> None:
        self.flush()
        self.sync()
        self.tracking.snapshot(self.next_offset)  # (the next open reads no trailer)
        if self.tracking.pending:
            self.tracking.write_pending(self.next_offset)
            if self.tracking.fd >= 0:
                os.fdatasync(self.tracking.fd)
        self.tracking.close()
        for seg in self.segments:
            if seg.fd >= 0:
                os.close(seg.fd)
                seg.fd = -1
        if self._wfd >= 0:
            os.close(self._wfd)
            self._wfd = -1

    def destroy(self) -> None:
        self._buf, self._pending, self._pending_ts, self._frames = bytearray(), [], [], []
        self._dirty = False
        self.tracking.drop_pending()
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class StreamStore:
    """Every stream's log under `<data dir>/streams`, one directory per stream (named by
    a hash of vhost and queue name; the name itself in NAME). `commit` writes every log
    appended to since the last one (on the caller's thread: it then survives kill -9) and
    fdatasyncs them on a sync thread, calling back on the broker's thread through
    `call_soon_threadsafe` — commits queued while a sync runs share the next one, as
    the main store's group commit. The broker commits it each turn beside the main
    store and confirms a publish once both are done (P5c)."""

    def __init__(self, root: str | Path, fsync: bool = True,
                 call_soon_threadsafe: Callable[..., Any] | None = None) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.logs: dict[tuple[str, str], StreamLog] = {}
        self._dirty: dict[tuple[str, str], StreamLog] = {}
        self._call = call_soon_threadsafe
        self._jobs: list[tuple[list[int], Callable[[BaseException | None], None]]] = []
        self._cond = threading.Condition()
        self._syncer: threading.Thread | None = None
        self._closing = False

    def _dir(self, vhost: str, name: str) -> Path:
        key = hashlib.sha1(f"{vhost}\x00{name}".encode("utf-8", "surrogateescape")).hexdigest()
        return self.root / key

    def open(self, vhost: str, name: str, fresh: bool, segment_bytes: int,
             max_bytes: int | None, max_age_ms: int | None) -> StreamLog:
        """The stream's log; `fresh` (a new declaration): whatever a stream of that name
        left behind is removed first."""
        d = self._dir(vhost, name)
        if fresh and d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)
        (d / "NAME").write_text(f"{vhost}\n{name}\n", encoding="utf-8", errors="surrogateescape")
        lg = StreamLog(d, segment_bytes, max_bytes, max_age_ms)
        self.logs[(vhost, name)] = lg
        return lg

    def appended(self, vhost: str, name: str, log: StreamLogLike) -> None:
        self._dirty[(vhost, name)] = cast(StreamLog, log)  # one this store opened

    @property
    def pending(self) -> bool:
        return bool(self._dirty)

    def commit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Write every log appended to now; `callback(None)` once fdatasynced (or
        `callback(exc)`), on the broker's thread. A log's tracking entries (publisher
        sequences, stored offsets) are written after its records (which carry their
        publishers' sequences in trailers), each naming the offset it covers, and
        fdatasynced after them (streamtrack.py)."""
        dirty, self._dirty = self._dirty, {}
        fds: list[int] = []
        after: list[int] = []  # tracking files: synced once the records are
        try:
            for lg in dirty.values():
                lg.flush()
                if self.fsync and lg._dirty and lg._wfd >= 0:
                    fds.append(os.dup(lg._wfd))  # the sync thread owns (and closes) these
                lg._dirty = False
                t = lg.tracking
                if t.pending:  # after the records: a kill -9 between the two leaves
                    t.write_pending(lg.next_offset)  # trailers that opening reads
                    if self.fsync:
                        after.append(os.dup(t.fd))
        except OSError as e:
            for fd in fds + after:
                os.close(fd)
            callback(e)
            return
        fds += after
        if not fds:
            callback(None)
            return
        if self._call is None:  # no broker loop (tests, tools): sync here
            callback(self._sync(fds))
            return
        with self._cond:
            if self._syncer is None:
                self._syncer = threading.Thread(target=self._run, name="ackmq-stream-sync",
                                                daemon=True)
                self._syncer.start()
            self._jobs.append((fds, callback))
            self._cond.notify()

    @staticmethod
    def _sync(fds: list[int]) -> BaseException | None:
        """fdatasync in order (records before the tracking that counts them); after a
        failure the rest is not synced (nothing is confirmed)."""
        err: BaseException | None = None
        for fd in fds:
            try:
                if err is None:
                    os.fdatasync(fd)
            except OSError as e:
                err = e
            finally:
                os.close(fd)
        return err

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                if not self._jobs:
                    return
                jobs, self._jobs = self._jobs, []
            # every job's records first, then every job's tracking files
            data = [fd for fds, _cb in jobs for fd in fds]
            err = self._sync(data)
            for _fds, cb in jobs:
                assert self._call is not None
                self._call(cb, err)

    def remove(self, vhost: str, name: str) -> None:
        lg = self.logs.pop((vhost, name), None)
        self._dirty.pop((vhost, name), None)
        if lg is not None:
            lg.destroy()
        else:
            shutil.rmtree(self._dir(vhost, name), ignore_errors=True)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._syncer is not None:
            self._syncer.join(30)
        for lg in self.logs.values():
            try:
                lg.close()
            except OSError as e:
                log.warning("closing stream log %s: %s", lg.dir, e)
        self.logs.clear()
