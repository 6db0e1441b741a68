"""Reads: a message read back by its location handle (`(qid << 64) | seq`), valid while
the message lives even when compaction moves it; the record's crc, queue and seq are
checked; a 128 KiB read-ahead serves reads in seq order (= file order), cut at the
active segment's data end (beyond it the file holds preallocated zeros until a later
write)."""

from __future__ import annotations

import os
from typing import Any

from ackmq.broker.storage import CorruptStore, StoredMessage, StoreError
from ackmq.protocol.crc import crc32

from . import fileio
from .format import ADD, ADD_HDR, REC_HDR
from .index import DEAD, PENDING
from .state import MASK64, Key
from .writer import WriterMixin

READ_AHEAD = 128 << 10   # read_body buffer (sequential reads of paged bodies)


class ReadsMixin(WriterMixin):
    def read_body(self, location: int) -> bytes:
        key = (location >> 64, location & MASK64)
        with self._lock:
            op = self._unwritten.get(key) or self._failed.get(key)
            if op is not None:
                return op.body
            rec, (_, _, _, _, el, rl, pl, bl) = self._pread_add(self._position(location), key)
            start = ADD_HDR.size + el + rl + pl
            return bytes(rec[start:start + bl])

    def read_queued(self, queue: str, seq: int) -> StoredMessage:
        """The message `seq` of durable queue `queue` (its location is the queue's id and
        the seq: the broker need not keep it)."""
        qid = self._qids.get(queue)
        if qid is None:
            raise StoreError(f"no durable queue {queue!r} in the store")
        return self.read_message((qid << 64) | seq)

    def read_message(self, location: int) -> StoredMessage:
        """The whole message behind `location`; `delivery_count` is the highest the store
        knows of: the ADD record's or the one recovered by `open()` (counts recorded with
        `delivered` since then are the broker's own)."""
        qid, seq = key = (location >> 64, location & MASK64)
        with self._lock:
            op = self._unwritten.get(key) or self._failed.get(key)
            if op is not None:
                return StoredMessage(seq, op.exchange, op.routing_key, op.properties, op.body,
                                     op.count, location)
            rec, (_, _, _, count, el, rl, pl, bl) = self._pread_add(self._position(location),
                                                                    key)
            counts = self._counts.get(qid)
            if counts:
                count = max(count, counts.get(seq, 0))
            p = ADD_HDR.size
            interned = self._interned  # memoryview slices hash and compare like bytes
            raw = rec[p:p + el]
            exchange = interned.get(raw)
            if exchange is None:
                exchange = self._intern(raw, True)
            p += el
            raw = rec[p:p + rl]
            routing_key = interned.get(raw)
            if routing_key is None:
                routing_key = self._intern(raw, True)
            p += rl
            raw = rec[p:p + pl]
            properties = self._interned_props.get(raw)
            if properties is None:
                properties = self._intern(raw, False)
            p += pl
            return StoredMessage(seq, exchange, routing_key, properties, bytes(rec[p:p + bl]),
                                 count, location)

    def _intern(self, raw: memoryview, text: bool) -> Any:
        """One object per distinct exchange name / routing key / property blob (they
        repeat across millions of messages); bounded so unique keys cannot grow it."""
        b = bytes(raw)
        d: dict[bytes | memoryview, Any] = self._interned if text else self._interned_props
        v = b.decode() if text else b
        if len(d) < 4096:
            d[b] = v
        return v

    def _position(self, location: int) -> int:
        """Disk position of a written message (call under the lock)."""
        idx = self._index.get(location >> 64)
        loc = idx.get(location & MASK64) if idx is not None else DEAD
        if loc == DEAD or loc == PENDING:
            raise StoreError(f"no stored message for location {location:#x}")
        return loc

    def _pread_add(self, loc: int, key: Key) -> tuple[memoryview, tuple[int, ...]]:
        """Read and verify one ADD record; returns it and its unpacked ADD header.

        Reads READ_AHEAD bytes at a time and serves the following records from that
        buffer: the broker reads messages back in seq order (recovery, deep queues),
        which is file order."""
        seg, off = loc >> 32, loc & 0xFFFFFFFF
        ra_seg, ra_off, ra = self._ra
        rel = off - ra_off
        if seg != ra_seg or rel < 0 or rel + 8 > len(ra):
            fd = self._rfds.get(seg)
            if fd is None:
                fd = self._rfds[seg] = fileio.open(self._paths[seg], os.O_RDONLY)
            ra = os.pread(fd, READ_AHEAD, off)
            if seg == self._active:  # past the data end: zeros now, records later
                ra = ra[:self._segs[seg].size - off]
            self._ra = (seg, off, ra)
            rel = 0
        size, crc = REC_HDR.unpack_from(ra, rel) if len(ra) >= rel + 8 else (0, 0)
        if rel + 8 + size > len(ra):  # bigger than what is buffered: read it alone
            fd = self._rfds[seg]
            ra = os.pread(fd, size + 8, off)
            rel = 0
        rec = memoryview(ra)[rel + 8:rel + 8 + size]
        if size < ADD_HDR.size or len(rec) != size or crc32(rec) != crc:
            raise CorruptStore(f"{self._paths[seg]}: bad record at offset {off}")
        head = ADD_HDR.unpack_from(rec)
        if head[0] != ADD or (head[1], head[2]) != key:
            raise CorruptStore(f"{self._paths[seg]}: offset {off} holds another record")
        return rec, head

    def _forget_read_ahead(self) -> None:
        """Call under the lock whenever bytes at known offsets may change (compaction
        replaces segment K, a failed write is truncated and rewritten)."""
        self._ra = (0, 0, b"")
