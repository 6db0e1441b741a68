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


def test_L2_a_fired_messages_move_is_committed_not_left_to_the_lazy_sync(
        tmp_path: Path) -> None:
    """A due persistent message's move (the timer store's REMOVE, the queue's ADD) is a
    commit the store syncs at once, not a lazily synced write as an ack's turn is: a
    power cut after its copy was delivered must not fire it again (L2: never twice)."""
    import time

    b, store = open_model(tmp_path / "data")
    vh = b.vhosts["/"]
    vh.declare_queue("due.q", False, True, False, False, {}, None)
    props = properties_with_headers(PERSISTENT, {"AMQ_SCHEDULED_DELAY": 1})
    scheduled.store_of(vh).publish(Message("", "due.q", props, b"once"))
    turn(b, store)
    commits, lazy = store.stats.commits, store.stats.lazy_writes
    time.sleep(0.01)
    assert b.timers.run() >= 1  # the job is due: it fires
    assert vh.queues["due.q"].message_count == 1
    b.end_of_turn()
    assert store.stats.commits == commits + 1 and store.stats.lazy_writes == lazy
    store.close()
