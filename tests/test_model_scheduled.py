"""L5, in process: a deleted destination's scheduled jobs are gone for good when the
delete returns — a kill -9 right after it (before the turn's commit) must not bring
them back at the restart (CI saw one come back: tests/test_scheduled_bounds.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ackmq.broker import BrokerModel, NullScheduler, scheduled
from ackmq.broker.message import Message
from ackmq.protocol.amqp.properties import properties_with_headers
from ackmq.store.segments import SegmentStore

PERSISTENT = b"\x10\x00\x02"  # delivery_mode 2
REPEATING = {"AMQ_SCHEDULED_DELAY": 60_000, "AMQ_SCHEDULED_PERIOD": 1000,
             "AMQ_SCHEDULED_REPEAT": 100}


def _open(root: Path) -> tuple[SegmentStore, BrokerModel]:
    store = SegmentStore(root, fsync=True, auto_compact=False, sync_thread=False)
    b = BrokerModel(NullScheduler(), store=store)
    b.start()
    return store, b


def _turn(store: SegmentStore, b: BrokerModel) -> None:
    b.end_of_turn()
    store.sync_round()
    b.end_of_turn()


def test_L5_a_deleted_queues_schedules_are_durably_gone_when_the_delete_returns(
        tmp_path: Path) -> None:
    store, b = _open(tmp_path / "data")
    vh = b.vhosts["/"]
    q = vh.declare_queue("sched.q", False, True, False, False, {}, None)
    props = properties_with_headers(PERSISTENT, REPEATING)
    scheduled.store_of(vh).publish(Message("", "sched.q", props, b"tick"))
    _turn(store, b)
    assert len(scheduled.store_of(vh).jobs()) == 1
    vh.delete_queue(q)
    # kill -9 here: no end_of_turn, no close; only what reached the files counts
    shutil.copytree(tmp_path / "data", tmp_path / "after")
    store.close()
    store2, b2 = _open(tmp_path / "after")
    try:
        vh2 = b2.vhosts["/"]
        assert "sched.q" not in vh2.queues
        t = scheduled.existing(vh2)
        assert t is None or t.jobs() == []
    finally:
        store2.close()
