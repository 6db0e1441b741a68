"""The broker model over a real SegmentStore, driven by hand (no loop, no sync thread):
for in-process tests of what a power cut or a kill -9 leaves on disk."""

from __future__ import annotations

from pathlib import Path

from ackmq.broker import BrokerModel, NullScheduler
from ackmq.store.segments import SegmentStore


def open_model(root: Path) -> tuple[BrokerModel, SegmentStore]:
    store = SegmentStore(root, fsync=True, auto_compact=False, sync_thread=False)
    broker = BrokerModel(NullScheduler(), store=store)
    broker.start()
    return broker, store


def turn(broker: BrokerModel, store: SegmentStore) -> None:
    """The end of a loop turn: the group commit, its fdatasync, the confirms."""
    broker.end_of_turn()
    store.sync_round()
    broker.end_of_turn()
