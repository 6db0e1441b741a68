"""The interface between the broker and durable storage.

The broker calls a `Store`; it never knows how bytes reach the disk. Message operations
are buffered and become durable together at the next `commit` (group commit: one fsync
for everything buffered by every channel and connection since the last one).
Definition operations (exchanges, queues, bindings) are rare and durable on return.
"""

from __future__ import annotations

from collections.abc import Callable
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
    body: bytes | None     # None when the store pages bodies (read with read_body)
    delivery_count: int = 0  # deliveries recorded with `delivered` (>0 => redelivered)
    location: int = -1     # store-private handle for read_body


@dataclass(slots=True)
class Recovered:
    epoch: int             # bumped durably on every open; broker seqs start at epoch<<40
    exchanges: list[ExchangeDef]
    queues: list[QueueDef]
    bindings: list[BindingDef]
    messages: dict[str, list[StoredMessage]]  # queue name -> messages in seq order


class Store(Protocol):
    def open(self) -> Recovered:
        """Load everything, drop a torn tail (logged), bump the epoch; CorruptStore if damaged."""

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
        """Make everything buffered so far durable (written + fsynced unless fsync is off),
        then call `callback(None)` — or `callback(exc)` on failure — on the broker's
        thread. Batches committed while an fsync runs share the next fsync."""

    def read_body(self, location: int) -> bytes:
        """Read back a body the broker dropped from memory."""

    @property
    def pending(self) -> bool:
        """True when add/remove/delivered calls are buffered and not yet committed."""
