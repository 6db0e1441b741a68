"""Durable storage for ackmq: an append-only, checksummed segment log with group commit.

`open_store(data_dir)` returns a `Store` (the protocol in ackmq/broker/storage.py); call `.open()` to recover.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ackmq.broker.storage import (
    BindingDef,
    CorruptStore,
    ExchangeDef,
    QueueDef,
    Recovered,
    Store,
    StoredMessage,
    StoreError,
)

from .recovered import RecoveredQueue
from .segments import SegmentStore, StoreStats

__all__ = [
    "BindingDef", "CorruptStore", "ExchangeDef", "QueueDef", "Recovered", "RecoveredQueue",
    "SegmentStore", "Store", "StoreError", "StoreStats", "StoredMessage", "open_store",
]


def open_store(data_dir: str | Path, *, fsync: bool = True,
               call_soon_threadsafe: Callable[..., Any] | None = None,
               **options: Any) -> SegmentStore:
    """Create the store for `data_dir` (not opened yet: call `.open()` to recover).

    With `call_soon_threadsafe` None, commit callbacks run on the writer thread (tests);
    the server passes `loop.call_soon_threadsafe`. `options`: segment_bytes,
    compact_interval, auto_compact (see SegmentStore).
    """
    return SegmentStore(data_dir, fsync=fsync, call_soon_threadsafe=call_soon_threadsafe,
                        **options)
