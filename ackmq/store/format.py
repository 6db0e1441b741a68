"""On-disk format of segment files: file header, frames, checksummed records.

A segment file is a 16-byte header followed by frames. One frame is what one `write()`
of a commit put down; it is the unit of atomicity: a frame whose header or payload fails
its crc is torn. Writes go on while an fdatasync runs, so after a power loss several
frames at the end of the newest segment may be missing or torn, in any order; a frame
may therefore start with a SYNCED record ("everything before offset O was fdatasynced
before this frame was written"), which tells a torn tail from real corruption. Recovery checks one crc per frame (a C
loop over all bytes); every record also carries its own crc32 so a single body can be
verified when read back alone (`read_body`).

    file header  : b"ACKMQSG1" | u32 segment id | u32 crc32(previous 12 bytes)
    frame header : u32 FRAME_MAGIC | u32 payload length | u32 crc32(payload)
                   | u32 crc32(previous 12 bytes)
    record       : u32 body length | u32 crc32(body) | body
    body         : u8 type | fields (little endian), see ADD / REMOVE / DELIVERED / DEF
                   / SYNCED / NOTE
"""

from __future__ import annotations

import logging
import mmap
import struct
from collections.abc import Iterator
from typing import Any, Final

from ackmq.broker.storage import CorruptStore
from ackmq.protocol.crc import crc32

log = logging.getLogger("ackmq.store")

FILE_MAGIC = b"ACKMQSG1"
FILE_HDR = struct.Struct("<8sII")
FRAME_MAGIC = 0xA5C40F01
FRAME_HDR = struct.Struct("<IIII")
REC_HDR = struct.Struct("<II")
_NO_REC_HDR: Final = bytes(REC_HDR.size)  # a record header's place, filled in once its crc is known
WRITE_FRAME_MAX = 16 << 20  # a frame is closed once its payload passes this (one record may exceed)

ADD: Final = 1
REMOVE: Final = 2
DELIVERED: Final = 3
DEF: Final = 4
SYNCED: Final = 5
NOTE: Final = 6
# NOTE: type, op (NOTE_PUT | NOTE_FORGET), then the key: a front end's mark written in the
# same frame as the messages of its batch (MQTT's QoS 2 packet ids: store/notes.py)
NOTE_HDR = struct.Struct("<BB")
NOTE_PUT, NOTE_FORGET = 1, 2
# type, qid, seq, delivery_count, len(exchange), len(routing_key), len(properties), len(body)
ADD_HDR = struct.Struct("<BIQIBBII")
REMOVE_REC = struct.Struct("<BIQ")
DELIVERED_REC = struct.Struct("<BIQI")
SYNCED_REC = struct.Struct("<BQ")  # type, offset in this segment known fdatasynced

_FRAME_MAGIC_BYTES = struct.pack("<I", FRAME_MAGIC)
# the write path's packers and sizes, bound once (Final: compiled code reads them as
# constants, where a module global is a dictionary look-up and a method a look-up more)
_REC_HDR_SIZE: Final = REC_HDR.size
_ADD_HDR_SIZE: Final = ADD_HDR.size
_FRAME_HDR_SIZE: Final = FRAME_HDR.size
_NO_FRAME_HDR: Final = bytes(FRAME_HDR.size)
_pack_add: Final = ADD_HDR.pack
_pack_rec: Final = REC_HDR.pack
_pack_rec_into: Final = REC_HDR.pack_into
_FRAME_HEAD = struct.Struct("<III")  # FRAME_HDR less its crc
_U32 = struct.Struct("<I")
_pack_frame_head: Final = _FRAME_HEAD.pack
_pack_frame_head_into: Final = _FRAME_HEAD.pack_into
_pack_u32: Final = _U32.pack
_pack_u32_into: Final = _U32.pack_into
_pack_remove: Final = REMOVE_REC.pack
_pack_delivered: Final = DELIVERED_REC.pack
_pack_synced: Final = SYNCED_REC.pack
_SYNCED_SIZE: Final = SYNCED_REC.size
_join: Final = b"".join
RELEASE_BYTES = 8 << 20  # recovery unmaps what it has scanned in steps of this much


def release(data: Any, start: int, stop: int) -> int:
    """Drop the pages of [start, stop) of a mapped segment from this process (they stay
    in the page cache): recovery's RSS stays ~RELEASE_BYTES + a frame instead of a whole
    64 MiB segment. Returns the new start (page aligned)."""
    stop -= stop % mmap.PAGESIZE
    if stop - start < RELEASE_BYTES or not isinstance(data, mmap.mmap):
        return start
    data.madvise(mmap.MADV_DONTNEED, start, stop - start)
    return stop


def file_header(seg_id: int) -> bytes:
    head = FILE_MAGIC + struct.pack("<I", seg_id)
    return head + struct.pack("<I", crc32(head))


def encode_add(out: bytearray, qid: int, seq: int, count: int, exchange: bytes,
               routing_key: bytes, properties: bytes, body: bytes) -> None:
    """Append one ADD record; the body is copied once (into `out`), and the record's crc
    taken over it there in one call (its header is written in place after)."""
    start = len(out)
    size = _ADD_HDR_SIZE + len(exchange) + len(routing_key) + len(properties) + len(body)
    head = _pack_add(ADD, qid, seq, count, len(exchange), len(routing_key),
                     len(properties), len(body))  # raises before `out` is touched
    out += _NO_REC_HDR
    out += head
    out += exchange
    out += routing_key
    out += properties
    out += body
    with memoryview(out) as mv:
        crc = crc32(mv[start + _REC_HDR_SIZE:])
    _pack_rec_into(out, start, size, crc)


# a lone ADD (the confirm-each message: one record, perhaps a SYNCED before it) is framed
# by `lone_add_frame` with a third of the calls of the general path; past this size the
# general path's single copy of the body wins over the lone one's three
LONE_ADD_MAX: Final = 16 << 10


def lone_add_frame(synced: int, qid: int, seq: int, count: int, exchange: bytes,
                   routing_key: bytes, properties: bytes, body: bytes) -> tuple[bytes, int]:
    """One frame holding a SYNCED record (`synced` >= 0: its offset) and one ADD, the
    same bytes as FrameWriter with encode_synced and encode_add; returns the frame and
    the ADD record's offset in it."""
    rec = _join((_pack_add(ADD, qid, seq, count, len(exchange), len(routing_key),
                           len(properties), len(body)),
                 exchange, routing_key, properties, body))
    add_rec = _pack_rec(len(rec), crc32(rec))
    if synced >= 0:
        sb = _pack_synced(SYNCED, synced)
        payload = _join((_pack_rec(_SYNCED_SIZE, crc32(sb)), sb, add_rec, rec))
        at = _FRAME_HDR_SIZE + _REC_HDR_SIZE + _SYNCED_SIZE
    else:
        payload = add_rec + rec
        at = _FRAME_HDR_SIZE
    head = _pack_frame_head(FRAME_MAGIC, len(payload), crc32(payload))
    return _join((head, _pack_u32(crc32(head)), payload)), at


def encode_small(out: bytearray, body: bytes) -> None:
    out += _pack_rec(len(body), crc32(body))
    out += body


def encode_remove(out: bytearray, qid: int, seq: int) -> None:
    encode_small(out, _pack_remove(REMOVE, qid, seq))


def encode_delivered(out: bytearray, qid: int, seq: int, count: int) -> None:
    encode_small(out, _pack_delivered(DELIVERED, qid, seq, count))


def encode_synced(out: bytearray, offset: int) -> None:
    encode_small(out, _pack_synced(SYNCED, offset))


def encode_note(out: bytearray, op: int, key: bytes) -> None:
    encode_small(out, NOTE_HDR.pack(NOTE, op) + key)


class FrameWriter:
    """Builds one write's worth of frames in a bytearray, closing a frame past WRITE_FRAME_MAX."""

    __slots__ = ("out", "_start", "records", "one_frame")

    def __init__(self, one_frame: bool = False) -> None:
        self.out = bytearray()
        self._start = -1
        self.records = 0
        self.one_frame = one_frame  # all or nothing: a batch holding notes (NOTE above)

    def begin_record(self) -> int:
        """Call before encoding a record; returns the record's offset within `out`."""
        if self._start < 0 or (not self.one_frame
                               and len(self.out) - self._start > WRITE_FRAME_MAX):
            self._close()
            self._start = len(self.out)
            self.out += _NO_FRAME_HDR
        self.records += 1
        return len(self.out)

    def _close(self) -> None:
        start = self._start
        if start >= 0:
            out = self.out
            payload = start + _FRAME_HDR_SIZE
            with memoryview(out) as mv:
                _pack_frame_head_into(out, start, FRAME_MAGIC, len(out) - payload,
                                      crc32(mv[payload:]))
                _pack_u32_into(out, start + 12, crc32(mv[start:start + 12]))

    def finish(self) -> bytearray:
        self._close()
        self._start = -1
        return self.out


def _frame_at(data: memoryview, off: int) -> tuple[int, str | None]:
    """Check the frame at `off`; returns (end offset, None) or (off, reason it is bad)."""
    end = len(data)
    if off + FRAME_HDR.size > end:
        return off, "truncated frame header"
    magic, length, pcrc, crc = FRAME_HDR.unpack_from(data, off)
    if magic != FRAME_MAGIC or crc32(data[off:off + 12]) != crc:
        return off, "bad frame header"
    pos = off + FRAME_HDR.size
    stop = pos + length
    if stop > end:
        return off, "truncated frame"
    if crc32(data[pos:stop]) != pcrc:
        return off, "frame checksum mismatch"
    return stop, None


def _synced_claim(data: memoryview, frame: int) -> int:
    """The offset a valid frame's leading SYNCED record claims was fdatasynced, or 0."""
    rec = frame + FRAME_HDR.size
    size = REC_HDR.unpack_from(data, rec)[0] if rec + REC_HDR.size <= len(data) else 0
    if size != SYNCED_REC.size or data[rec + REC_HDR.size] != SYNCED:
        return 0
    return SYNCED_REC.unpack_from(data, rec + REC_HDR.size)[1]


def _synced_past(data: memoryview, off: int) -> int:
    """A valid frame after `off` that says `off` was already fdatasynced, or -1."""
    pos = off
    while (pos := _valid_frame_after(data, pos)) >= 0:
        if _synced_claim(data, pos) > off:
            return pos
    return -1


def _valid_frame_after(data: memoryview, off: int) -> int:
    """Offset of a complete valid frame starting after `off`, or -1 (decides torn vs corrupt)."""
    raw = data.obj if hasattr(data.obj, "find") else bytes(data)
    pos = off + 1
    while True:
        pos = raw.find(_FRAME_MAGIC_BYTES, pos)
        if pos < 0:
            return -1
        if _frame_at(data, pos)[1] is None:
            return pos
        pos += 1


def check_file_header(data: Any, path: str, seg_id: int) -> None:
    magic, sid, crc = FILE_HDR.unpack_from(data, 0)
    if magic != FILE_MAGIC or crc32(data[:12]) != crc:
        raise CorruptStore(f"{path}: bad file header at offset 0")
    if sid != seg_id:
        raise CorruptStore(f"{path}: header says segment {sid}, file name says {seg_id}")


def valid_length(data: Any, path: str, seg_id: int, newest: bool,
                 each_synced: bool = False) -> int:
    """Length of the valid prefix of a segment file.

    In the newest file a bad frame is a torn tail — the returned length excludes it and
    everything after it (the caller truncates and logs) — unless a later valid frame
    says the bad one had been fdatasynced: then it is corruption. `each_synced` (defs.log:
    every append is fdatasynced before the next is written, so only the last frame can
    be torn): any valid frame after a bad one makes it corruption. Older files were
    fdatasynced whole before the next one was started: anything bad in them, and
    anything else bad, raises CorruptStore naming the file and offset.
    """
    if len(data) < FILE_HDR.size or (newest and data[:FILE_HDR.size] == bytes(FILE_HDR.size)):
        if newest:  # created just before the crash; its header never reached the disk
            return 0
        raise CorruptStore(f"{path}: truncated file header at offset 0")
    check_file_header(data, path, seg_id)
    mv = memoryview(data)
    off = FILE_HDR.size
    released = 0
    while off < len(data):
        nxt, why = _frame_at(mv, off)
        if why is None:
            off = nxt
            released = release(data, released, off)
            continue
        if newest:
            later = _valid_frame_after(mv, off) if each_synced else _synced_past(mv, off)
            if later < 0:
                return off  # never reported durable: written while an fsync ran, or torn
            where = (f"; a valid frame follows at offset {later}" if each_synced
                     else f"; the frame at offset {later} says it had been fdatasynced")
        else:
            later = _valid_frame_after(mv, off)
            where = f"; a valid frame follows at offset {later}" if later >= 0 else ""
        raise CorruptStore(f"{path}: corrupt data at offset {off} ({why}){where}")
    return off


def all_zero(data: Any, start: int, stop: int) -> bool:
    """True when data[start:stop] is all zero bytes: preallocated space never written."""
    step = 1 << 20
    zero = bytes(min(step, max(0, stop - start)))
    for off in range(start, stop, step):
        n = min(step, stop - off)
        if data[off:off + n] != zero[:n]:
            return False
    return True


def iter_records(data: bytes, start: int, stop: int) -> Iterator[tuple[int, memoryview]]:
    """Yield (record offset, record body) for the already validated range [start, stop)."""
    mv = memoryview(data)
    off = start
    hsize = FRAME_HDR.size
    rsize = REC_HDR.size
    unpack_frame = FRAME_HDR.unpack_from
    unpack_rec = REC_HDR.unpack_from
    while off < stop:
        length = unpack_frame(data, off)[1]
        pos = off + hsize
        fend = pos + length
        while pos < fend:
            size, _ = unpack_rec(data, pos)
            yield pos, mv[pos + rsize:pos + rsize + size]
            pos += rsize + size
        if pos != fend:
            raise CorruptStore(f"record framing does not match the frame at offset {off}")
        off = fend
