"""Recovery (`open()`'s scan): every segment read in order, every frame verified, ADD /
REMOVE / DELIVERED applied to the index only (16 bytes per message, no body kept); the
torn tail of the newest segment cut, anything else damaged refused with file and offset.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

from ackmq.broker.storage import CorruptStore

from . import fileio
from .format import (
    ADD,
    DELIVERED,
    DELIVERED_REC,
    FRAME_HDR,
    NOTE,
    NOTE_PUT,
    REC_HDR,
    REMOVE,
    REMOVE_REC,
    SYNCED,
    all_zero,
    log,
    release,
    valid_length,
)
from .index import DEAD
from .state import SegInfo, seg_name
from .writer import WriterMixin


class RecoveryMixin(WriterMixin):
    def _load_segment(self, s: int, newest: bool) -> None:
        path = self.dir / seg_name(s)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            # mmap, not read(): no 64 MiB heap buffer per segment (peak RSS of recovery)
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            end = valid_length(data, str(path), s, newest)
            zeros = end < size and all_zero(data, end, size)
            if end > 16:
                release(data, 0, end)  # all checked: parsing faults the pages in again
                self._segs[s] = info = SegInfo(size=end)
                self._paths[s] = path
                self._parse_segment(data, s, end, path, info)
        finally:
            if isinstance(data, mmap.mmap):
                try:
                    data.close()
                except BufferError:  # a traceback still holds a view: let GC unmap it
                    pass
        if end < size:
            if zeros:
                log.info("%s: cut %d bytes of preallocated space after offset %d",
                         path, size - end, end)
            else:
                log.warning("%s: dropped torn tail at offset %d (%d bytes not acknowledged)",
                            path, end, size - end)
            fd = fileio.open(path, os.O_WRONLY)
            try:
                fileio.ftruncate(fd, end)
                fileio.fsync(fd)
            finally:
                fileio.close(fd)
        if end <= 16:  # nothing in it (crashed right after creating it)
            fileio.unlink(path)
            fileio.fsync_dir(self.dir)

    def _parse_segment(self, data: Any, s: int, end: int, path: Path, info: SegInfo) -> None:
        """Apply the records of [16, end) (validated) to the index and the delivery counts.

        Only the ADD header is unpacked: nothing of a message is kept but its 16-byte
        index entry (and its count when > 0), so memory does not grow with bodies.
        ADDs of a queue come in seq order (broker seqs only grow; compaction copies in
        file order), so an ADD is an array append and a REMOVE a C bisect.
        """
        base = s << 32
        segs = self._segs
        index = self._index
        counts = self._counts
        unpack_head = DELIVERED_REC.unpack_from  # u8 type | u32 qid | u64 seq | u32 count
        unpack_rec = REC_HDR.unpack_from
        unpack_frame = FRAME_HDR.unpack_from
        unpack_remove = REMOVE_REC.unpack_from
        unpack_deliv = DELIVERED_REC.unpack_from
        adds = add_bytes = live = released = 0
        frame = 16
        while frame < end:  # offsets straight into `data`: validated above
            released = release(data, released, frame)
            fstart = frame
            off = frame + FRAME_HDR.size
            fend = frame = off + unpack_frame(data, frame)[1]
            while off < fend:
                size, _ = unpack_rec(data, off)
                b = off + 8
                kind = data[b]
                if kind == ADD:
                    _, qid, seq, count = unpack_head(data, b)  # ADD_HDR's first fields
                    adds += 1
                    add_bytes += size + 8
                    q = index.get(qid)
                    if q is not None:
                        live += 1
                        seqs = q.seqs
                        if not seqs or seq > seqs[-1]:  # the usual case: an append
                            seqs.append(seq)
                            q.locs.append(base | off)
                            q.live += 1
                        else:
                            old = q.get(seq)
                            q.insert(seq, base | off)
                            if old != DEAD:  # a second copy of the same message
                                segs[old >> 32].live -= 1
                        if count:
                            c = counts[qid]
                            if count > c.get(seq, 0):
                                c[seq] = count
                elif kind == REMOVE:
                    _, qid, seq = unpack_remove(data, b)
                    q = index.get(qid)
                    if q is not None:
                        old = q.pop(seq)
                        if old != DEAD:
                            segs[old >> 32].live -= 1
                            counts[qid].pop(seq, None)
                elif kind == DELIVERED:
                    _, qid, seq, count = unpack_deliv(data, b)
                    q = index.get(qid)
                    if q is not None and count > counts[qid].get(seq, 0) and q.get(seq) != DEAD:
                        counts[qid][seq] = count
                elif kind == SYNCED:
                    pass  # only recovery's torn-vs-corrupt check reads it
                elif kind == NOTE:
                    key = bytes(data[b + 2:b + size])
                    if data[b + 1] == NOTE_PUT:
                        self._notes[key] = s
                    else:
                        self._notes.pop(key, None)
                else:
                    raise CorruptStore(f"{path}: unknown record type {kind} at offset {off}")
                off = b + size
            if off != fend:
                raise CorruptStore(f"{path}: record framing does not match frame at {fstart}")
        info.adds = adds
        info.add_bytes = add_bytes
        info.live += live
