"""A small durable key -> value map as an append-only log (`<name>.log` in the data dir),
for state a front end keeps beside the queues: MQTT's retained messages and its QoS 2
packet identifiers. `put`/`delete` append a record (no fsync); `sync()` makes every
record so far durable (one fdatasync however many records: the caller syncs once before
it acknowledges). Opening reads the records back (a torn tail, from a crash mid-append,
is dropped: its change was never acknowledged) and rewrites the live set compactly, all
or nothing (`fileio.atomic_write`).

Record: 1 byte op (1 put, 2 delete), u32 key length, u32 value length, key, value,
u32 CRC32 of everything before it in the record."""

from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path

from . import fileio

_HEAD = struct.Struct(">BII")
_CRC = struct.Struct(">I")
PUT, DELETE = 1, 2


def _record(op: int, key: bytes, value: bytes) -> bytes:
    body = _HEAD.pack(op, len(key), len(value)) + key + value
    return body + _CRC.pack(zlib.crc32(body))


def read_records(data: bytes) -> dict[bytes, bytes]:
    """The live map from a log's bytes, up to the first torn or corrupt record."""
    live: dict[bytes, bytes] = {}
    pos, n = 0, len(data)
    while pos + _HEAD.size <= n:
        op, klen, vlen = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + klen + vlen
        if op not in (PUT, DELETE) or end + _CRC.size > n:
            break
        if _CRC.unpack_from(data, end)[0] != zlib.crc32(data[pos:end]):
            break
        key = data[pos + _HEAD.size:pos + _HEAD.size + klen]
        if op == PUT:
            live[key] = data[pos + _HEAD.size + klen:end]
        else:
            live.pop(key, None)
        pos = end + _CRC.size
    return live


class KVLog:
    """`kv = KVLog(dir, "mqtt-retained")`; `kv.items` is the live map after opening."""

    def __init__(self, data_dir: str | Path, name: str, fsync: bool = True) -> None:
        self.path = Path(data_dir) / f"{name}.log"
        self.do_fsync = fsync
        self.items: dict[bytes, bytes] = {}
        self.dirty = False
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        self.items = read_records(data)
        self.lock = threading.Lock()  # fsync_now (a thread) against a rewrite's fd swap
        self.fd = -1
        self.appended = 0  # records since the last rewrite
        self._rewrite()

    def _rewrite(self) -> None:
        """The live set alone, all or nothing; appends go on after it."""
        with self.lock:
            if self.fd >= 0:
                fileio.close(self.fd)
            fileio.atomic_write(self.path, b"".join(_record(PUT, k, v)
                                                    for k, v in self.items.items()), 0o600)
            self.fd = fileio.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.appended = 0
        self.dirty = False

    def _appended(self) -> None:
        self.dirty = True
        self.appended += 1
        if self.appended > 1000 + 4 * len(self.items):  # mostly superseded records
            self._rewrite()

    def put(self, key: bytes, value: bytes) -> None:
        self.items[key] = value
        fileio.write_all(self.fd, _record(PUT, key, value))
        self._appended()

    def delete(self, key: bytes) -> None:
        if self.items.pop(key, None) is not None:
            fileio.write_all(self.fd, _record(DELETE, key, b""))
            self._appended()

    def sync(self) -> None:
        if self.dirty:
            self.dirty = False
            self.fsync_now()

    def fsync_now(self) -> None:
        """fdatasync what was appended so far (from any thread: the caller cleared
        `dirty` on the thread that writes, before handing this to another)."""
        if self.do_fsync:
            with self.lock:
                fileio.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            self.sync()
            fileio.close(self.fd)
            self.fd = -1
