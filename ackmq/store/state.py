"""The state every part of `SegmentStore` shares, and the small types it is made of.

The store is one object split by concern (pending.py, writer.py, recovery.py, reads.py,
compact_api.py, notes.py, composed in segments.py); this base holds the fields they
share and says which lock guards which. Compiled with pending.py and writer.py
(docs/storage.md, "Code layout").
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mypy_extensions import mypyc_attr

from ackmq.broker.stats import BATCH_BUCKETS, LATENCY_BUCKETS, Histogram
from ackmq.broker.storage import StoreError

from .defs import DefsLog
from .index import QueueIndex

Callback = Callable[[BaseException | None], None]
Key = tuple[int, int]  # (qid, seq)
MASK64 = (1 << 64) - 1


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
    lazy_writes: int = 0      # write() calls: batches no one waits on (acks, deliveries)
    lazy_syncs: int = 0       # fdatasyncs for those alone, LAZY_SYNC_S after the first
    preallocated: int = 0     # bytes fallocated ahead of the data
    compactions: int = 0
    segments_deleted: int = 0
    bytes_copied: int = 0     # live records rewritten by compaction
    # /metrics (broker/stats.py): seconds per fdatasync, records made durable by each
    fsync_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    fsync_records: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))


@dataclass(slots=True, eq=False)
class PendingAdd:
    """A message's add record, buffered until the writer takes it (eq=False: compared,
    like any record the store tracks, by identity)."""

    qid: int
    seq: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    count: int = field(default=0, init=False)  # the highest delivery count seen

    # (an __init__ of its own: mypyc compiles it; the one dataclass writes is interpreted)
    def __init__(self, qid: int, seq: int, exchange: str, routing_key: str,
                 properties: bytes, body: bytes) -> None:
        self.qid, self.seq, self.exchange, self.routing_key = qid, seq, exchange, routing_key
        self.properties, self.body, self.count = properties, body, 0


class WriteBatch:
    """What the broker buffered between two commits. Immutable once handed to the writer."""

    __slots__ = ("adds", "removes", "delivered", "notes", "callbacks", "nbytes")

    def __init__(self) -> None:
        self.nbytes = 0                        # rough size of the records it will write
        self.adds: dict[Key, PendingAdd] = {}
        self.removes: dict[Key, int] = {}     # key -> position at removal time
        self.delivered: dict[Key, int] = {}   # key -> highest delivery count
        self.notes: list[tuple[int, bytes]] = []  # (NOTE_PUT | NOTE_FORGET, key), in order
        self.callbacks: list[Callback] = []

    def __bool__(self) -> bool:
        return bool(self.adds or self.removes or self.delivered or self.notes)


@dataclass
class SegInfo:
    """Per-segment accounting, used to pick what to compact (estimates, not truth)."""

    size: int = 0
    adds: int = 0        # ADD records in the file
    add_bytes: int = 0
    live: int = 0        # of those, still live in the index

    def live_bytes(self) -> float:
        return self.live * (self.add_bytes / self.adds) if self.adds else 0.0


@mypyc_attr(allow_interpreted_subclasses=True)
class StoreState:
    """The fields of a `SegmentStore` (see segments.py for the threads and locks).

    Compiled (mypyc) with the write path (pending.py, writer.py) — the lone confirm's
    store work; the other parts (recovery, reads, compaction) are interpreted subclasses."""

    def _forget_read_ahead(self) -> None:  # ReadsMixin's
        raise NotImplementedError

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
        # keys are bytes, looked up by memoryview slices (they hash and compare alike)
        self._interned: dict[bytes | memoryview, str] = {}  # exchange names, routing keys
        self._interned_props: dict[bytes | memoryview, bytes] = {}  # property blobs
        self._pending = WriteBatch()
        # written batches waiting for an fsync: (write generation, callbacks, failure)
        self._syncq: deque[tuple[int, list[Callback], StoreError | None]] = deque()
        # batches handed to the sync thread whose callbacks have not run yet (an inline
        # sync is allowed only at 0: callbacks must run in commit order)
        self._in_thread = 0
        # the sync thread waits with no timeout (nothing written is unsynced): a lazy
        # write (write()) then wakes it, once, to start its LAZY_SYNC_S timer
        self._sync_idle = False
        self._wlock = threading.Lock()      # one write at a time: _wfd, _woff, _wstate
        self._sync_lock = threading.Lock()  # held around an fdatasync; rollover takes it
        # (fd, writes so far, segment, its length): one tuple, read whole by the sync thread
        self._wstate = (-1, 0, 0, 0)
        self._synced = 0            # writes known durable (a generation of _wstate)
        self._synced_at = (0, 0)    # (segment, offset) known fdatasynced up to
        self._records_synced = 0    # stats.records_written at the last fdatasync
        # called after an inline commit's write, before its fdatasync (set_before_sync)
        self._before_sync: Callable[[], None] | None = None
        self._claimed = 0           # the offset the last SYNCED record of the segment claimed
        self._unwritten: dict[Key, PendingAdd] = {}          # adds not yet on disk
        self._unwritten_removes: dict[Key, int] = {}   # removes not yet on disk -> old pos
        self._failed: dict[Key, PendingAdd] = {}             # adds whose commit failed
        # live notes -> the segment of their NOTE_PUT record (-1: not written yet)
        self._notes: dict[bytes, int] = {}
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
