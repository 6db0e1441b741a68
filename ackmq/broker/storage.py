"""The interface between the broker and durable storage, on the broker's side (the layer
that calls it): the `Store` protocol, the definitions it keeps and its errors. `store/`
implements it; the broker never imports `store/`, it is handed a `Store`.

The broker calls a `Store`; it never knows how bytes reach the disk. Message operations
are buffered and become durable together at the next `commit` (group commit: one fsync
for everything buffered by every channel and connection since the last one).
Definition operations (exchanges, queues, bindings) are rare and durable on return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol


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


class QueuedMessages(Iterable[tuple[int, int, int]], Sized, Protocol):
    """One durable queue's messages found at open: `len()` of them, iterated as
    `(seq, location, delivery_count)` in seq order, with no Python object per message
    kept. `location` is the store's opaque handle (`read_message`); the broker keeps
    only seqs and reads a queue's tail back with `read_queued`."""


@dataclass(slots=True)
class Recovered:
    epoch: int             # bumped durably on every open; broker seqs start at epoch<<40
    exchanges: list[ExchangeDef]
    queues: list[QueueDef]
    bindings: list[BindingDef]
    messages: dict[str, QueuedMessages]  # every durable queue, even empty


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

    def commit(self, callback: Callable[[BaseException | None], None],
               inline: bool = False) -> None:
        """Write everything buffered so far now (it survives `kill -9` from here on), then
        call `callback(None)` once it is fsynced (unless fsync is off) — or
        `callback(exc)` on failure — on the broker's thread. Batches committed while an
        fsync runs share the next fsync. `inline`: the caller would rather wait for the
        fsync here than a turn later (few waiters); the store may then sync before
        returning and call `callback` from within this call."""

    def set_before_sync(self, before_sync: Callable[[], None]) -> None:
        """`before_sync()` is called when a commit has been written and is about to be
        fdatasynced inline, on the caller's thread: the broker sends its connections'
        output then, so a delivery does not wait for an fsync only confirms need."""

    def write(self) -> StoreError | None:
        """Write everything buffered so far now (it survives `kill -9` from here on) with no
        one waiting for its fsync: acks, delivery counts, moves no client waits on. The
        next commit's fsync covers it, or the store's own within a short time (P8); a
        power cut before then redelivers what it acked. Returns the write's failure."""

    def sync_now(self) -> None:
        """Write and fdatasync everything buffered before returning (StoreError if it
        cannot): for the rare act whose reply must not outrun its removals (a deleted
        queue's scheduled jobs), where waiting for the turn's commit would let a kill -9
        right after the reply bring them back."""

    def note(self, key: bytes) -> None:
        """Buffer a front end's key, written in the same frame as the messages buffered
        with it: durable with them, or lost with them (MQTT's QoS 2 ids)."""

    def forget(self, key: bytes) -> None:
        """Buffer the removal of a note (durable with the next commit)."""

    def notes(self) -> list[bytes]:
        """The live notes (after `open`: those recovered)."""

    def read_body(self, location: int) -> bytes:
        """Read back a body the broker dropped from memory."""

    def read_message(self, location: int) -> StoredMessage:
        """Read back a whole message by the handle `add` returned: one pread (served from
        the unwritten batch when not on disk yet), checksum verified."""

    def read_queued(self, queue: str, seq: int) -> StoredMessage:
        """Read back a recovered message by its queue and seq (a restarted queue keeps
        only the seqs of its tail)."""

    @property
    def pending(self) -> bool:
        """True when add/remove/delivered calls are buffered and not yet committed."""


# one record of a stream as a stream log returns it: (offset, timestamp in ms since the
# epoch, exchange, routing key, raw properties, body)
StreamRecord = tuple[int, int, str, str, bytes, bytes]


class StreamLogLike(Protocol):
    """One stream's append-only log (store/streamlog.py): offsets from 0, never reused."""

    @property
    def first_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def last_chunk(self) -> int:
        """Where `last` starts: the first offset of the newest batch written together."""
    def append(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> int:
        """Buffer a record; written and fsynced by the StreamStorage's next commit."""

    def append_many(self, exchange: str, routing_key: str,
                    records: Sequence[tuple[bytes, bytes]]) -> int:
        """Buffer (properties, body) records published together; the first's offset."""

    def read(self, offset: int, limit: int) -> list[StreamRecord]: ...
    def read_spans(self, offset: int, limit: int, max_bytes: int = ...
                   ) -> list[tuple[bytes, list[int]]]:
        """`read`'s records as the log's bytes: (bytes read at once, where each record's
        payload starts in them) per stretch (a chunk built without a tuple per record)."""
    def offset_for_timestamp(self, ts_ms: int) -> int: ...
    def retain(self, segment_bytes: int, max_bytes: int | None,
               max_age_ms: int | None) -> None:
        """New retention settings (a policy changed), applied as segments roll."""

    def tracked(self, kind: int, ref: str) -> int | None:
        """A named publisher's last publishing id (kind 0) or a named consumer's stored
        offset (kind 1): the stream protocol's tracking (X3, X4)."""

    def track(self, kind: int, ref: str, value: int) -> None:
        """Set it; durable with the next commit, after the records appended before it."""

    def track_publish(self, first: int, ref: str, value: int) -> None:
        """A named publisher's last publishing id, kept with its publish's records (from
        offset `first` to the newest, still buffered): synced with them, all or none."""

    def tracked_all(self) -> list[tuple[int, str, int]]:
        """Every (kind, reference, value) tracked (rabbitmq-streams list_stream_tracking)."""


class StreamStorage(Protocol):
    """Where stream queues keep their logs (store/streamlog.StreamStore): the broker
    commits it once per turn beside the main Store and confirms a turn's publishes once
    both are fdatasynced (P5c)."""

    def open(self, vhost: str, name: str, fresh: bool, segment_bytes: int,
             max_bytes: int | None, max_age_ms: int | None) -> StreamLogLike: ...
    def appended(self, vhost: str, name: str, log: StreamLogLike) -> None: ...
    @property
    def pending(self) -> bool: ...
    def commit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Write what was appended now; `callback` once it is fdatasynced (broker thread)."""

    def remove(self, vhost: str, name: str) -> None: ...
    def close(self) -> None: ...
