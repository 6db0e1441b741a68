"""L5, in process: a deleted destination's scheduled jobs are gone for good when the
delete returns — a kill -9 right after it (before the turn's commit) must not bring
them back at the restart (CI saw one come back: tests/test_scheduled_bounds.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.modelstore import open_model, turn

from ackmq.broker import scheduled
from ackmq.broker.message import Message
from ackmq.protocol.amqp.properties import properties_with_headers

PERSISTENT = b"\x10\x00\x02"  # delivery_mode 2
REPEATING = {"AMQ_SCHEDULED_DELAY": 60_000, "AMQ_SCHEDULED_PERIOD": 1000,
             "AMQ_SCHEDULED_REPEAT": 100}


def test_L5_a_deleted_queues_schedules_are_durably_gone_when_the_delete_returns(
        tmp_path: Path) -> None:
    b, store = open_model(tmp_path / "data")
    vh = b.vhosts["/"]
    q = vh.declare_queue("sched.q", False, True, False, False, {}, None)
    props = properties_with_headers(PERSISTENT, REPEATING)
    scheduled.store_of(vh).publish(Message("", "sched.q", props, b"tick"))
    turn(b, store)
    assert len(scheduled.store_of(vh).jobs()) == 1
    vh.delete_queue(q)
    # kill -9 here: no end_of_turn, no close; only what reached the files counts
    shutil.copytree(tmp_path / "data", tmp_path / "after")
    store.close()
    b2, store2 = open_model(tmp_path / "after")
    try:
        vh2 = b2.vhosts["/"]
        assert "sched.q" not in vh2.queues
        t = scheduled.existing(vh2)
        assert t is None or t.jobs() == []
    finally:
        store2.close()
