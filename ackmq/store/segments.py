"""`SegmentStore`: the embedded durable store (append-only checksummed segment log).

Threads and ownership:
- the broker thread calls add/remove/delivered (memory only: pending batch, index, under
  `_lock`) and commit, which `write()`s the batch at once: what a turn acked or delivered
  is in the OS before the turn's replies reach the socket, so `kill -9` loses none of it;
- ONE sync thread runs one fdatasync for everything written since the last one (group
  commit: writes go on while it syncs) and then hands the callbacks to the broker thread,
  in commit order;
- a commit someone waits for, while the sync thread has nothing in hand (a lone
  confirm-each publisher), is synced on the broker thread instead: its callback runs
  before commit() returns, so the confirm leaves in the same loop turn, without the two
  thread wake-ups (there and back) that cost as much as the fdatasync itself;
- a compactor thread rewrites old segments (see compact.py).

Why a log and not SQLite: see docs/storage.md (measured).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import threading
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ackmq.broker.storage import (
    BindingDef,
    CorruptStore,
    ExchangeDef,
    QueueDef,
    Recovered,
    StoredMessage,
    StoreError,
)

from . import fileio
from .compact import compactor_main, finish_interrupted
from .defs import DefsLog, _enc, binding_key
from .format import (
    ADD,
    ADD_HDR,
    DELIVERED,
    DELIVERED_REC,
    FRAME_HDR,
    REC_HDR,
    REMOVE,
    REMOVE_REC,
    SYNCED,
    FrameWriter,
    all_zero,
    encode_add,
    encode_delivered,
    encode_remove,
    encode_synced,
    file_header,
    release,
    valid_length,
)
from .index import DEAD, PENDING, QueueIndex
from .recovered import RecoveredQueue

log = logging.getLogger("ackmq.store")

Callback = Callable[[BaseException | None], None]
Key = tuple[int, int]  # (qid, seq)
MASK64 = (1 << 64) - 1
READ_AHEAD = 128 << 10   # read_body buffer (sequential reads of paged bodies)
# The active segment is extended (fallocate) this far ahead of its data: a commit then
# writes into space the file already has, so its fdatasync flushes the data without a
# journal commit for a new file size (measured on ext4: 99-125 µs instead of 159-164 µs
# for a 120-byte append). Cut back to the data at rollover and close; a crash leaves
# zeros past the last frame, which recovery drops as it drops a torn tail.
PREALLOC_CHUNK = 4 << 20


def seg_name(seg: int) -> str:
    return f"{seg:08d}.seg"


@dataclass
class StoreStats:
    """Counters for tests and benchmarks (read them, do not write them)."""

    commits: int = 0          # commit() calls
    writes: int = 0           # write() calls of the writer (one per group)
    fsyncs: int = 0           # fdatasync calls for message data
    bytes_written: int = 0
    records_written: int = 0
    cancelled: int = 0        # add+remove pairs that never reached the disk (P5 d)
    failed_commits: int = 0   # callbacks that got a StoreError
    inline_syncs: int = 0     # commits synced on the caller's thread (commit(inline=True))
    preallocated: int = 0     # bytes fallocated ahead of the data
    compactions: int = 0
    segments_deleted: int = 0
    bytes_copied: int = 0     # live records rewritten by compaction


class _Add:
    __slots__ = ("qid", "seq", "exchange", "routing_key", "properties", "body", "count")

    def __init__(self, qid: int, seq: int, exchange: str, routing_key: str,
                 properties: bytes, body: bytes) -> None:
        self.qid = qid
        self.seq = seq
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.count = 0


class _Batch:
    """What the broker buffered between two commits. Immutable once handed to the writer."""

    __slots__ = ("adds", "removes", "delivered", "callbacks", "nbytes")

    def __init__(self) -> None:
        self.nbytes = 0                        # rough size of the records it will write
        self.adds: dict[Key, _Add] = {}
        self.removes: dict[Key, int] = {}     # key -> position at removal time
        self.delivered: dict[Key, int] = {}   # key -> highest delivery count
        self.callbacks: list[Callback] = []

    def __bool__(self) -> bool:
        return bool(self.adds or self.removes or self.delivered)


@dataclass
class SegInfo:
    """Per-segment accounting, used to pick what to compact (estimates, not truth)."""

    size: int = 0
    adds: int = 0        # ADD records in the file
    add_bytes: int = 0
    live: int = 0        # of those, still live in the index

    def live_bytes(self) -> float:
        return self.live * (self.add_bytes / self.adds) if self.adds else 0.0


class SegmentStore:
    """The `Store` of ackmq: see docs/storage.md for the design and the figures."""

    def __init__(self, data_dir: str | Path, *, fsync: bool = True,
                 call_soon_threadsafe: Callable[..., Any] | None = None,
                 segment_bytes: int = 64 << 20, compact_interval: float = 5.0,
                 auto_compact: bool = True, sync_thread: bool = True) -> None:
        self.dir = Path(data_dir)
        self.fsync = fsync
        # False: no sync thread; whoever drives the store calls sync_round() (the crash
        # simulator: one thread, so a seed replays the same interleaving every time)
        self.sync_thread = sync_thread
        self.stats = StoreStats()
        self.segment_bytes = segment_bytes
        self.compact_interval = compact_interval
        self.auto_compact = auto_compact  # False: only explicit compact.maybe_compact (tests)
        self._call = call_soon_threadsafe
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._defs: DefsLog | None = None
        self._qids: dict[str, int] = {}
        self._index: dict[int, QueueIndex] = {}
        # qid -> {seq: delivery count} as recovered, only counts > 0 (RecoveredQueue)
        self._counts: dict[int, dict[int, int]] = {}
        self._interned: dict[bytes, str] = {}  # exchange names and routing keys (read_message)
        self._interned_props: dict[bytes, bytes] = {}  # property blobs
        self._pending = _Batch()
        # written batches waiting for an fsync: (write generation, callbacks, failure)
        self._syncq: deque[tuple[int, list[Callback], StoreError | None]] = deque()
        # batches handed to the sync thread whose callbacks have not run yet (an inline
        # sync is allowed only at 0: callbacks must run in commit order)
        self._in_thread = 0
        self._wlock = threading.Lock()      # one write at a time: _wfd, _woff, _wstate
        self._sync_lock = threading.Lock()  # held around an fdatasync; rollover takes it
        # (fd, writes so far, segment, its length): one tuple, read whole by the sync thread
        self._wstate = (-1, 0, 0, 0)
        self._synced = 0            # writes known durable (a generation of _wstate)
        self._synced_at = (0, 0)    # (segment, offset) known fdatasynced up to
        self._claimed = 0           # the offset the last SYNCED record of the segment claimed
        self._unwritten: dict[Key, _Add] = {}          # adds not yet on disk
        self._unwritten_removes: dict[Key, int] = {}   # removes not yet on disk -> old pos
        self._failed: dict[Key, _Add] = {}             # adds whose commit failed
        self._segs: dict[int, SegInfo] = {}
        self._rfds: dict[int, int] = {}
        self._ra: tuple[int, int, bytes] = (0, 0, b"")  # read-ahead: segment, offset, bytes
        self._paths: dict[int, Path] = {}
        self._active = 0
        self._wfd = -1
        self._woff = 0
        self._alloc_end = 0   # the active segment's file size (preallocated up to here)
        self._prealloc = True  # False once the filesystem refuses fallocate
        self._broken: StoreError | None = None
        self._closing = False
        self._closed = True
        self._lockfd = -1
        self._syncer: threading.Thread | None = None
        self._compactor: threading.Thread | None = None
        self._compact_wake = threading.Event()

    # -- open / recovery ---------------------------------------------------------------
    def open(self) -> Recovered:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lockfd = fileio.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fileio.close(self._lockfd)
            raise StoreError(f"{self.dir} is in use by another process") from e
        try:
            # the data dir's own entry: a fresh dir lost at power loss loses everything
            fileio.fsync_dir(self.dir.resolve().parent)
            return self._open_locked()
        except OSError as e:
            fileio.close(self._lockfd)
            raise StoreError(f"cannot open the store in {self.dir}: {e}") from e
        except BaseException:
            fileio.close(self._lockfd)
            raise

    def _open_locked(self) -> Recovered:

        finish_interrupted(self.dir)
        seg_ids = sorted(int(p.name.split(".")[0]) for p in self.dir.glob("*.seg"))
        if seg_ids and not (self.dir / DefsLog.NAME).exists():
            raise CorruptStore(f"{self.dir}: {DefsLog.NAME} is missing but segments exist")
        self._defs = DefsLog(self.dir)
        state = self._defs.load_and_bump()
        names = {qid: name for name, (qid, _) in state.queues.items()}
        self._qids = {name: qid for qid, name in names.items()}
        self._index = {qid: QueueIndex() for qid in names}
        self._counts = {qid: {} for qid in names}
        for s in seg_ids:
            self._load_segment(s, s == seg_ids[-1])
        out = {names[qid]: RecoveredQueue(qid, self._index[qid], self._counts[qid], self._lock)
               for qid in names}
        self._active = (seg_ids[-1] if seg_ids else 0) + 1
        self._new_segment(self._active)
        self._closed = False
        if self.fsync and self.sync_thread:
            self._syncer = threading.Thread(target=self._sync_main, name="ackmq-store-sync",
                                            daemon=True)
            self._syncer.start()
        if self.auto_compact:

            self._compactor = threading.Thread(target=compactor_main, args=(self,),
                                               name="ackmq-store-compactor", daemon=True)
            self._compactor.start()
        return Recovered(epoch=state.epoch, exchanges=list(state.exchanges.values()),
                         queues=[d for _, d in state.queues.values()],
                         bindings=list(state.bindings.values()), messages=out)

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
                else:
                    raise CorruptStore(f"{path}: unknown record type {kind} at offset {off}")
                off = b + size
            if off != fend:
                raise CorruptStore(f"{path}: record framing does not match frame at {fstart}")
        info.adds = adds
        info.add_bytes = add_bytes
        info.live += live

    def _new_segment(self, s: int) -> None:
        path = self.dir / seg_name(s)
        head = file_header(s)
        # synced with its directory entry in every mode: a segment that may vanish at a
        # power cut would make the fdatasyncs of its frames worthless (and, --no-fsync,
        # leave a hole before newer segments); OSError (disk full): the caller goes on
        # appending to the current segment
        fd = fileio.create_durably(path, head)  # written with pwrite at _woff
        if self._wfd >= 0:
            fileio.close(self._wfd)
        self._wfd, self._woff = fd, len(head)
        self._alloc_end = len(head)
        self._wstate = (fd, self._wstate[1], s, self._woff)
        self._claimed = 0
        with self._lock:
            self._active = s
            self._segs[s] = SegInfo(size=len(head))
            self._paths[s] = path

    # -- definitions ---------------------------------------------------------------------
    def _defs_op(self, op: dict[str, Any]) -> None:
        if self._closed or self._defs is None:
            raise StoreError("store is closed")
        try:
            self._defs.append(op)
        except OSError as e:
            raise StoreError(f"cannot write {self._defs.path}: {e}") from e

    def save_exchange(self, d: ExchangeDef) -> None:
        if self._defs is not None and self._defs.state.exchanges.get(d.name) == d:
            return  # redeclared as it is: no journal record, no fsync
        self._defs_op({"op": "exchange", "def": _enc(asdict(d))})

    def delete_exchange(self, name: str) -> None:
        self._defs_op({"op": "del_exchange", "name": name})

    def save_queue(self, d: QueueDef) -> None:
        assert self._defs is not None
        qid = self._qids.get(d.name)
        if qid is not None and self._defs.state.queues.get(d.name) == (qid, d):
            return  # redeclared as it is
        if qid is None:
            qid = self._defs.state.next_qid
        self._defs_op({"op": "queue", "qid": qid, "def": _enc(asdict(d))})
        with self._lock:
            if d.name not in self._qids:
                self._qids[d.name] = qid
                self._index[qid] = QueueIndex()
                self._counts[qid] = {}

    def delete_queue(self, name: str) -> None:
        self._defs_op({"op": "del_queue", "name": name})
        with self._lock:
            qid = self._qids.pop(name, None)
            if qid is None:
                return
            idx = self._index.pop(qid, None)
            self._counts.pop(qid, None)
            if idx is not None:
                for _, loc in idx.items():
                    if loc != PENDING:
                        info = self._segs.get(loc >> 32)
                        if info is not None:
                            info.live -= 1
            p = self._pending
            for d in (p.adds, p.removes, p.delivered, self._unwritten,
                      self._unwritten_removes, self._failed):
                for k in [k for k in d if k[0] == qid]:
                    del d[k]

    def save_binding(self, b: BindingDef) -> None:
        if self._defs is not None and binding_key(b) in self._defs.state.bindings:
            return
        self._defs_op({"op": "binding", "def": _enc(asdict(b))})

    def delete_binding(self, b: BindingDef) -> None:
        self._defs_op({"op": "del_binding", "def": _enc(asdict(b))})

    # -- messages (broker thread: memory only) ---------------------------------------------
    def add(self, queue: str, seq: int, exchange: str, routing_key: str,
            properties: bytes, body: bytes) -> int:
        qid = self._qids.get(queue)
        if qid is None:
            raise StoreError(f"queue {queue!r} is not a saved durable queue")
        key = (qid, seq)
        op = _Add(qid, seq, exchange, routing_key, properties, body)
        with self._lock:
            if self._closed:
                raise StoreError("store is closed")
            p = self._pending
            p.adds[key] = op
            p.nbytes += len(body) + len(properties) + 64
            self._unwritten[key] = op
            self._index[qid].insert(seq, PENDING)
        return (qid << 64) | seq

    def remove(self, queue: str, seq: int) -> None:
        qid = self._qids.get(queue)
        if qid is None:
            return
        key = (qid, seq)
        with self._lock:
            p = self._pending
            if p.adds.pop(key, None) is not None:  # P5 d: never written at all
                del self._unwritten[key]
                self._index[qid].pop(seq)
                self.stats.cancelled += 1
                return
            p.delivered.pop(key, None)
            if self._failed.pop(key, None) is not None:
                return
            loc = self._index[qid].pop(seq)
            if loc == DEAD:
                return
            counts = self._counts.get(qid)
            if counts:
                counts.pop(seq, None)
            p.removes[key] = loc
            p.nbytes += 24
            self._unwritten_removes[key] = loc
            if loc != PENDING:
                info = self._segs.get(loc >> 32)
                if info is not None:
                    info.live -= 1

    def delivered(self, queue: str, seq: int, delivery_count: int) -> None:
        qid = self._qids.get(queue)
        if qid is None:
            return
        key = (qid, seq)
        with self._lock:
            p = self._pending
            op = p.adds.get(key)
            if op is not None:
                if delivery_count > op.count:
                    op.count = delivery_count
            elif key not in p.removes and delivery_count > p.delivered.get(key, 0):
                p.delivered[key] = delivery_count

    def commit(self, callback: Callback, inline: bool = False) -> None:
        """Write what is buffered now (one `write()`), then let the sync thread report it
        durable with the next fdatasync, which it shares with every write made meanwhile.

        `inline=True` (someone waits, and the batch is small): when the sync thread has
        nothing in hand, fdatasync here and call `callback` before returning."""
        with self._lock:
            if self._closed or self._closing:
                raise StoreError("store is closed")
            self.stats.commits += 1
            b = self._pending
            self._pending = _Batch()
        b.callbacks.append(callback)
        self._commit_batch(b, inline)

    def _commit_batch(self, b: _Batch, inline: bool = False) -> None:
        with self._wlock:
            try:
                err = self._write_batch(b)
            except Exception as e:  # a bug: fail loudly but keep the broker up
                log.exception("store write failed")
                err = self._broken = StoreError(f"store write failed: {e!r}")
            if err is not None:
                self.stats.failed_commits += len(b.callbacks)
            if not self.fsync:
                self._dispatch(b.callbacks, err)
                return
            with self._cond:  # in write order: the sync thread reports them in that order
                if inline and self._in_thread == 0 and not self._closing:
                    inline_gen = self._wstate[1]
                else:
                    inline_gen = -1
                    self._in_thread += 1
                    self._syncq.append((self._wstate[1], b.callbacks, err))
                    self._cond.notify()
            if inline_gen >= 0:
                if err is None:
                    err = self._sync_to(inline_gen)
                    if err is not None:
                        self.stats.failed_commits += len(b.callbacks)
                self.stats.inline_syncs += 1
        if inline_gen >= 0:
            self._run_callbacks(b.callbacks, err)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

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
        d = self._interned if text else self._interned_props
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
            self._ra = (seg, off, ra)
            rel = 0
        size, crc = REC_HDR.unpack_from(ra, rel) if len(ra) >= rel + 8 else (0, 0)
        if rel + 8 + size > len(ra):  # bigger than what is buffered: read it alone
            fd = self._rfds[seg]
            ra = os.pread(fd, size + 8, off)
            rel = 0
        rec = memoryview(ra)[rel + 8:rel + 8 + size]
        if size < ADD_HDR.size or len(rec) != size or zlib.crc32(rec) != crc:
            raise CorruptStore(f"{self._paths[seg]}: bad record at offset {off}")
        head = ADD_HDR.unpack_from(rec)
        if head[0] != ADD or (head[1], head[2]) != key:
            raise CorruptStore(f"{self._paths[seg]}: offset {off} holds another record")
        return rec, head

    def _forget_read_ahead(self) -> None:
        """Call under the lock whenever bytes at known offsets may change (compaction
        replaces segment K, a failed write is truncated and rewritten)."""
        self._ra = (0, 0, b"")

    # -- writer thread -----------------------------------------------------------------------
    def _dispatch(self, callbacks: list[Callback], exc: BaseException | None) -> None:
        for cb in callbacks:
            try:
                if self._call is not None:
                    self._call(cb, exc)
                else:
                    cb(exc)
            except Exception:  # a broken callback must not kill the writer
                log.exception("store commit callback failed")

    def _sync_to(self, need: int) -> StoreError | None:
        """fdatasync the active segment unless write generation `need` is durable already
        (a rollover or another sync may have covered it); None when it is durable."""
        if need <= self._synced:
            return None
        with self._sync_lock:
            if self._broken is not None:
                return self._broken
            if need > self._synced:
                fd, gen, seg, end = self._wstate  # gen >= need: all in fd
                try:
                    fileio.fdatasync(fd)
                except OSError as e:
                    return self._fsync_failed(e)
                self.stats.fsyncs += 1
                self._synced = gen
                self._synced_at = (seg, end)
        return None

    def _sync_main(self) -> None:
        """fdatasync what was written, then report it; everything written while one
        fdatasync runs shares the next (group commit with no timer)."""
        while True:
            with self._cond:
                while not self._syncq and not self._closing:
                    self._cond.wait()
                if not self._syncq:
                    return
            self.sync_round()

    def sync_round(self) -> None:
        """One round of the sync thread: fdatasync everything written so far, then hand
        the callbacks of every batch it covered to the broker. Called by the thread, or,
        with sync_thread=False, by whoever drives the store (the crash simulator)."""
        with self._cond:
            entries = list(self._syncq)
            self._syncq.clear()
        if not entries:
            return
        need = max((gen for gen, _, exc in entries if exc is None), default=0)
        err = self._sync_to(need)
        done: list[tuple[list[Callback], BaseException | None]] = []
        for gen, callbacks, exc in entries:
            if exc is None and gen > self._synced:
                exc = err or StoreError("store closed before the write was synced")
                self.stats.failed_commits += len(callbacks)
            done.append((callbacks, exc))
        # one hand-over for all of them (one wake-up of the broker's loop)
        if self._call is not None:
            try:
                self._call(self._report, done)
            except Exception:  # the loop is closed: nobody is left to tell
                log.exception("store commit callbacks not delivered")
        else:
            self._report(done)

    @staticmethod
    def _run_callbacks(callbacks: list[Callback], exc: BaseException | None) -> None:
        for cb in callbacks:
            try:
                cb(exc)
            except Exception:  # a broken callback must not break the commit or the writer
                log.exception("store commit callback failed")

    def _report(self, done: list[tuple[list[Callback], BaseException | None]]) -> None:
        """Run synced batches' callbacks, in commit order (on the broker's thread)."""
        try:
            for callbacks, exc in done:
                self._run_callbacks(callbacks, exc)
        finally:
            with self._cond:
                self._in_thread -= len(done)

    def _fsync_failed(self, e: OSError) -> StoreError:
        """After a failed fdatasync the page cache can't be trusted: disable the store."""
        self._broken = StoreError(f"fdatasync failed, store disabled: {e}")
        log.error("%s", self._broken)
        return self._broken

    def _rollover(self) -> None:
        """Start the next segment (under `_wlock`). The old one is fsynced first, so only
        the newest segment can ever have a torn tail (recovery relies on it)."""
        with self._sync_lock:  # the sync thread is not inside an fdatasync of the old fd
            fd, gen, _, _ = self._wstate
            try:
                self._cut_prealloc()
            except OSError as e:  # an older segment must end with its last frame
                self._broken = StoreError(f"cannot cut {self._paths[self._active]} to its "
                                          f"data, store disabled: {e}")
                log.error("%s", self._broken)
                return
            # in every mode, --no-fsync too (once per segment): only the newest segment
            # may then have a torn tail, so a power cut never leaves damage that
            # recovery must refuse (a hole in an older segment)
            try:
                fileio.fsync(fd)  # fsync, not fdatasync: the file's new (smaller) size too
            except OSError as e:
                self._fsync_failed(e)
                return
            if self.fsync:  # the counter is of fsyncs for message data
                self.stats.fsyncs += 1
            self._synced = gen
            try:
                self._new_segment(self._active + 1)  # closes the old fd
                self._compact_wake.set()
            except OSError as e:
                log.warning("cannot start a new segment (%s); appending to the current one", e)

    def _write_batch(self, b: _Batch) -> StoreError | None:
        """Serialize and `write()` one batch (under `_wlock`); no fsync here."""
        if self._broken is not None:
            self._fail_batch(b)
            return self._broken
        if not b:
            return None  # nothing to write: reported once what came before is synced
        if self._woff >= self.segment_bytes:
            self._rollover()
            if self._broken is not None:
                self._fail_batch(b)
                return self._broken
        fw = FrameWriter()
        out = fw.out
        base = self._woff
        synced_seg, synced = self._synced_at
        if synced_seg == self._active and synced > self._claimed:  # tells torn from corrupt
            fw.begin_record()
            encode_synced(out, synced)
            self._claimed = synced
        placed: list[tuple[_Add, int]] = []
        for op in b.adds.values():
            placed.append((op, base + fw.begin_record()))
            encode_add(out, op.qid, op.seq, op.count, op.exchange.encode(),
                       op.routing_key.encode(), op.properties, op.body)
        for (qid, seq), count in b.delivered.items():
            fw.begin_record()
            encode_delivered(out, qid, seq, count)
        for qid, seq in b.removes:
            fw.begin_record()
            encode_remove(out, qid, seq)
        data = fw.finish()
        if base + len(data) > self._alloc_end and self._prealloc:
            self._preallocate(base + len(data))
        try:
            view = memoryview(data)
            done = 0
            while done < len(data):
                done += fileio.pwrite(self._wfd, view[done:], base + done)
        except OSError as e:
            self._undo_write(base)
            self._fail_batch(b)
            if self._broken is not None:
                return self._broken
            what = "disk full" if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else "I/O error"
            return StoreError(f"write to {self._paths[self._active]} failed ({what}): {e}")
        self.stats.writes += 1
        self.stats.bytes_written += len(data)
        self.stats.records_written += fw.records
        seg = self._active
        shift = seg << 32
        with self._lock:
            info = self._segs[seg]
            info.size = base + len(data)
            self._woff = info.size
            for op, off in placed:
                key = (op.qid, op.seq)
                self._unwritten.pop(key, None)
                info.adds += 1
                idx = self._index.get(op.qid)
                if idx is not None and idx.replace(op.seq, PENDING, shift | off):
                    info.live += 1
            info.add_bytes += sum(REC_HDR.size + ADD_HDR.size + len(op.body) + len(op.properties)
                                  + len(op.exchange) + len(op.routing_key) for op, _ in placed)
            for key in b.removes:
                self._unwritten_removes.pop(key, None)
        self._wstate = (self._wfd, self._wstate[1] + 1, seg, self._woff)
        return None

    def _preallocate(self, need: int) -> None:
        """Extend the active segment's file to cover `need` bytes and PREALLOC_CHUNK more
        (not past segment_bytes); a refusal only means commits append as before."""
        end = max(need, min(self._alloc_end + PREALLOC_CHUNK, self.segment_bytes))
        try:
            fileio.posix_fallocate(self._wfd, self._alloc_end, end - self._alloc_end)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EINTR):
                self._prealloc = False  # not supported here: do not ask again
                log.info("%s: no preallocation (%s)", self.dir, e)
            return
        self._alloc_end = end
        self.stats.preallocated += end - need

    def _cut_prealloc(self) -> None:
        """Cut the active segment's file back to its last frame (rollover, close)."""
        if self._alloc_end > self._woff:
            fileio.ftruncate(self._wfd, self._woff)
            self._alloc_end = self._woff

    def _undo_write(self, base: int) -> None:
        """Cut a partial write off so later frames follow valid data (else: broken)."""
        with self._lock:
            self._forget_read_ahead()
        try:
            self._alloc_end = base
            fileio.ftruncate(self._wfd, base)
            if self.fsync:
                fileio.fdatasync(self._wfd)
        except OSError as e:
            self._broken = StoreError(f"cannot truncate after a failed write, store disabled: {e}")

    def _fail_batch(self, b: _Batch) -> None:
        """Nothing of the batch is durable: its adds are not stored (kept readable until
        removed); its removes and delivery counts go back into the next batch."""
        with self._lock:
            p = self._pending
            for key, op in b.adds.items():
                if self._unwritten.pop(key, None) is not None:
                    idx = self._index.get(op.qid)
                    if idx is not None and idx.pop(op.seq) != DEAD:
                        self._failed[key] = op
            for key, loc in b.removes.items():
                if key not in p.adds:
                    p.removes[key] = loc
            for key, count in b.delivered.items():
                if key not in p.adds and key not in p.removes:
                    p.delivered[key] = max(count, p.delivered.get(key, 0))

    # -- close ------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed or self._closing:
                return
            b, self._pending = self._pending, _Batch()
        self._commit_batch(b)  # what is still buffered, then the sync thread's last fsync
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._syncer is not None:
            self._syncer.join()
        elif self.fsync:
            self.sync_round()
        self._compact_wake.set()
        if self._compactor is not None:
            self._compactor.join()
        with self._lock:
            self._closed = True
            for fd in self._rfds.values():
                fileio.close(fd)
            self._rfds.clear()
        if self._wfd >= 0:
            try:
                if self._alloc_end > self._woff and self._broken is None:
                    self._cut_prealloc()  # a clean stop leaves no zeros past the data
                    if self.fsync:
                        fileio.fsync(self._wfd)
            except OSError as e:  # recovery drops them instead
                log.warning("%s: could not cut the preallocated tail: %s", self.dir, e)
            fileio.close(self._wfd)
            self._wfd = -1
        if self._defs is not None:
            self._defs.close()
        if self._lockfd >= 0:
            fileio.close(self._lockfd)
            self._lockfd = -1

    # -- the compaction API (compact.py sees the store only through these) -------------
    def wait_compaction(self) -> bool:
        """Block until the next compaction round is due; False once the store closes."""
        self._compact_wake.wait(self.compact_interval)
        self._compact_wake.clear()
        return not self._closing

    def closed_segments(self) -> list[tuple[int, int, int]]:
        """(segment, size, estimated live bytes) of every segment no longer written to."""
        with self._lock:
            closed = sorted(s for s in self._segs if s < self._active)
            return [(s, self._segs[s].size, self._segs[s].live_bytes()) for s in closed]

    def segment_path(self, s: int) -> Path:
        with self._lock:
            return self._paths[s]

    def live_adds(self, cands: list[tuple[int, int, int, int, int]]
                  ) -> list[tuple[int, int, int, int, int]]:
        """The ADD records among `cands` (qid, seq, position, ...) still needed on disk:
        live in the index, or removed by a REMOVE not written yet."""
        with self._lock:
            return [c for c in cands if self._is_live(c[0], c[1], c[2])]

    def _is_live(self, qid: int, seq: int, pos: int) -> bool:
        idx = self._index.get(qid)
        if idx is not None and idx.get(seq) == pos and pos != DEAD:
            return True
        return self._unwritten_removes.get((qid, seq)) == pos

    def replace_prefix(self, prefix: list[int],
                       new: tuple[int, Path, int, list[tuple[int, int, int, int]], int] | None
                       ) -> None:
        """Switch the index to the compacted file `new` (k, path, size, moved (qid, seq,
        old position, new position), bytes copied), if any, then delete the prefix."""
        with self._lock:
            self._forget_read_ahead()
            if new is not None:
                k, path, size, moved, copied = new
                info = SegInfo(size=size, adds=len(moved), add_bytes=copied)
                for qid, seq, old, pos in moved:
                    idx = self._index.get(qid)
                    if idx is not None and idx.replace(seq, old, pos):
                        info.live += 1
                    elif self._unwritten_removes.get((qid, seq)) == old:
                        self._unwritten_removes[(qid, seq)] = pos
            for s in prefix:
                fd = self._rfds.pop(s, None)
                if fd is not None:
                    fileio.close(fd)
                self._segs.pop(s, None)
                self._paths.pop(s, None)
            if new is not None:
                self._segs[k] = info
                self._paths[k] = path
        for s in prefix:  # oldest first: a crash part way leaves a consistent shorter log
            fileio.unlink(self.dir / seg_name(s), missing_ok=True)
        fileio.fsync_dir(self.dir)
        if new is not None:
            with self._lock:
                fileio.replace(new[1], self.dir / seg_name(new[0]))
                self._paths[new[0]] = self.dir / seg_name(new[0])
            fileio.fsync_dir(self.dir)

    def index_bytes(self) -> int:
        """Memory held by the per-message index (arrays), for the bytes/message figure."""
        with self._lock:
            return sum(i.nbytes() for i in self._index.values())
