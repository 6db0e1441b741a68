"""Osiris chunks, as Deliver carries them (osiris_log.erl's chunk format): a 48-byte
header, then the entries. The header:

    u8 magic<<4 | version (0x50)   u8 chunk type (0 user)   u16 num entries
    u32 num records                i64 timestamp (ms)       u64 epoch
    u64 chunk first offset         u32 crc32 of the data    u32 data length
    u32 trailer length             u8 bloom filter size     u24 reserved

An entry is a simple one (`0:1 size:31 | data`, one record) or a sub-entry batch
(`1:1 compression:3 reserved:4 | u16 records | u32 uncompressed length | u32 length |
data`). ackmq writes simple entries only: its log keeps one record per message, so a
chunk is `len(messages)` entries and records.

Deliver version 2 (RabbitMQ 3.13+, for a client that offered it in
ExchangeCommandVersions) puts a u64 committed chunk id between the subscription id and
the chunk: the first offset of the newest chunk the stream has committed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ackmq.protocol.crc import crc32
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream.frames import BadFrame, Reader, subentries

HEADER = struct.Struct(">BBHIqQQIIIB3x")
_DELIVER_HDR = struct.Struct(">IHHB")  # frame size, key, version, subscription id
_DELIVER2_HDR = struct.Struct(">IHHBQ")  # ... and the committed chunk id (version 2)
_SIZE = struct.Struct(">I")
assert HEADER.size == 48


def deliver(subscription_id: int, first_offset: int, timestamp_ms: int,
            messages: Sequence[bytes], epoch: int = 1, committed: int | None = None
            ) -> bytes:
    """A Deliver frame of one chunk holding `messages`, the first at `first_offset`:
    version 1, or version 2 with `committed` (the committed chunk id)."""
    parts: list[bytes] = []
    pack = _SIZE.pack
    for m in messages:
        parts.append(pack(len(m)))
        parts.append(m)
    return deliver_parts(subscription_id, first_offset, timestamp_ms, parts, len(messages),
                         epoch, committed)


def deliver_parts(subscription_id: int, first_offset: int, timestamp_ms: int,
                  parts: Sequence[bytes | memoryview], count: int, epoch: int = 1,
                  committed: int | None = None) -> bytes:
    """A Deliver frame of one chunk of `count` messages given as `parts`: per message
    its u32 size, head and body (`size_prefix`, `record_parts`), joined once here.
    Version 1, or with `committed` version 2 (the committed chunk id before the chunk)."""
    head, data = deliver_pieces(subscription_id, first_offset, timestamp_ms, parts, count,
                                epoch, committed)
    return head + data


def deliver_pieces(subscription_id: int, first_offset: int, timestamp_ms: int,
                   parts: Sequence[bytes | memoryview], count: int, epoch: int = 1,
                   committed: int | None = None) -> tuple[bytes, bytes]:
    """`deliver_parts`' frame as (the Deliver's and the chunk's headers, the chunk's
    data): written one after the other (the transport's writelines), the data is not
    copied once more behind its header."""
    data = b"".join(parts)
    header = HEADER.pack(K.CHUNK_MAGIC_VERSION, K.CHUNK_USER, count, count, timestamp_ms,
                         epoch, first_offset, crc32(data), len(data), 0, 0)
    size = 4 + 1 + HEADER.size + len(data)
    if committed is None:
        return _DELIVER_HDR.pack(size, K.DELIVER, 1, subscription_id) + header, data
    return _DELIVER2_HDR.pack(size + 8, K.DELIVER, 2, subscription_id, committed) + header, \
        data


size_prefix = _SIZE.pack  # a simple entry's header: its size


def read_chunk(chunk: bytes | memoryview, max_inflated: int = 1 << 26
               ) -> tuple[int, int, list[bytes]]:
    """(first offset, timestamp, messages) of a chunk (simple entries, sub-entry batches
    uncompressed or gzip, inflating to at most `max_inflated` bytes each): what a client
    does with a Deliver (the Spark source's stream-protocol reader, tests, tools). The
    i-th message's offset is first + i."""
    (_magic, _type, entries, _records, ts, _epoch, first, crc, length, _trailer,
     _bloom) = HEADER.unpack_from(chunk, 0)
    data = chunk[HEADER.size:HEADER.size + length]
    if len(data) != length or crc32(data) != crc:
        raise BadFrame("chunk data does not match its length or crc")
    r = Reader(data)
    out: list[bytes] = []
    for _ in range(entries):
        head = data[r.pos]
        if head & K.SUBENTRY_FLAG:
            r.pos += 1
            n = r.u16()
            r.u32()
            size = r.u32()
            p = r.need(size)
            out += subentries((head << 16) | n, data[p:p + size], max_inflated)
        else:
            s = r.u32()
            p = r.need(s)
            out.append(bytes(data[p:p + s]))
    return first, ts, out
