"""The interface between the broker and durable storage.

The broker calls a `Store`; it never knows how bytes reach the disk. Message operations
are buffered and become durable together at the next `commit` (group commit: one fsync
for everything buffered by every channel and connection since the last one).
Definition operations (exchanges, queues, bindings) are rare and durable on return.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import threading

    from .index import QueueIndex


class StoreError(Exception):
    """Storage failed (disk full, unwritable, I/O error): publishes are nacked (P6)."""


class CorruptStore(Exception):
    """The data directory is damaged beyond a torn tail: the broker refuses to start."""


@dataclass(slots=True)
class ExchangeDef:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class QueueDef:
    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class BindingDef:
    source: str           # exchange name
    destination: str      # queue or exchange name
    destination_kind: str  # "queue" | "exchange"
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StoredMessage:
    """One persistent message as it sits in one durable queue."""

    seq: int
    exchange: str
    routing_key: str
    properties: bytes      # raw AMQP property flags + list (opaque to the store)
    body: bytes
    delivery_count: int = 0  # deliveries recorded with `delivered` (>0 => redelivered)
    location: int = -1     # the handle `add` returned: read_message / read_body take it


class RecoveredQueue:
    """The messages of one durable queue found by `open()`, without a Python object per
    message: a view of the store's per-queue index (two `array('Q')`, 16 bytes/message)
    plus a dict of delivery counts holding only messages delivered at least once.

    `len()` is the number of messages found at open. Iterating yields
    `(seq, location, delivery_count)` in seq order; `location` is `(qid << 64) | seq`,
    the handle `add` returns (valid across compaction: read the message with
    `Store.read_message`). Iteration reads the live index in chunks (under the store's
    lock), so it may run lazily while the store is in use: a message removed before its
    chunk is read is skipped, messages added after `open()` are never yielded.
    """

    __slots__ = ("qid", "_index", "_counts", "_lock", "_end", "_len")
    CHUNK = 4096

    def __init__(self, qid: int, index: QueueIndex, counts: dict[int, int],
                 lock: threading.Lock) -> None:
        self.qid = qid
        self._index = index
        self._counts = counts      # seq -> delivery count, only for counts > 0
        self._lock = lock
        self._end = index.seqs[-1] + 1 if len(index.seqs) else 0  # first seq after open
        self._len = len(index)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        top = self.qid << 64
        nxt = 0
        while True:
            with self._lock:  # the index arrays may be shrunk or replaced meanwhile
                idx = self._index
                start = bisect_left(idx.seqs, nxt, idx.head)
                stop = min(start + self.CHUNK, bisect_left(idx.seqs, self._end, start))
                seqs = idx.seqs[start:stop]
                locs = idx.locs[start:stop]
            if not seqs:
                return
            counts = self._counts
            for seq, loc in zip(seqs, locs, strict=True):
                if loc:  # 0: removed
                    yield seq, top | seq, counts.get(seq, 0)
            nxt = seqs[-1] + 1


@dataclass(slots=True)
class Recovered:
    epoch: int             # bumped durably on every open; broker seqs start at epoch<<40
    exchanges: list[ExchangeDef]
    queues: list[QueueDef]
    bindings: list[BindingDef]
    messages: dict[str, RecoveredQueue]  # every durable queue, even empty; seq order


class Store(Protocol):
    def open(self) -> Recovered:
        """Index everything (no message contents kept), drop a torn tail (logged), bump the
        epoch; CorruptStore if damaged."""

    def close(self) -> None:
        """Flush what is buffered, fsync, release files."""

    # -- definitions: durable when the call returns --------------------------------
    def save_exchange(self, d: ExchangeDef) -> None: ...
    def delete_exchange(self, name: str) -> None: ...
    def save_queue(self, d: QueueDef) -> None: ...
    def delete_queue(self, name: str) -> None:
        """Also forgets every message of the queue."""

    def save_binding(self, b: BindingDef) -> None: ...
    def delete_binding(self, b: BindingDef) -> None: ...

    # -- messages: buffered until commit -------------------------------------------
    def add(self, queue: str, seq: int, exchange: str, routing_key: str,
            properties: bytes, body: bytes) -> int:
        """Buffer a persistent message for a durable queue; returns its location handle."""

    def remove(self, queue: str, seq: int) -> None:
        """Buffer the removal (ack, drop, dead-letter). An add and a remove of the same
        message in one batch cancel out: nothing is written (P5 d)."""

    def delivered(self, queue: str, seq: int, delivery_count: int) -> None:
        """Buffer the fact that a message was handed to a consumer (redelivered after restart)."""

    def commit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Write everything buffered so far now (it survives `kill -9` from here on), then
        call `callback(None)` once it is fsynced (unless fsync is off) — or
        `callback(exc)` on failure — on the broker's thread. Batches committed while an
        fsync runs share the next fsync."""

    def read_body(self, location: int) -> bytes:
        """Read back a body the broker dropped from memory."""

    def read_message(self, location: int) -> StoredMessage:
        """Read back a whole message (recovery, deep queues kept as locations): one pread
        (served from the unwritten batch when not on disk yet), checksum verified."""

    @property
    def pending(self) -> bool:
        """True when add/remove/delivered calls are buffered and not yet committed."""
