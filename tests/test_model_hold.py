"""N3, in process: a held publish (MQTT QoS 2, broker/hold.py) reaches a durable queue's
consumers only once the commit that writes it is durable; a transient queue holds
nothing; what is published behind a held message waits behind it (order kept)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_model_readylist import OWNER

from ackmq.broker import BrokerModel, NullScheduler
from ackmq.broker.hold import Holding
from ackmq.broker.queue_type import QueueEntry
from ackmq.store.segments import SegmentStore

PERSISTENT = b"\x10\x00\x02"  # delivery_mode 2
TRANSIENT = b"\x00\x00"


class _Output:
    writable = True
    number = 1

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def deliver(self, consumer: Any, tag: int, entry: Any) -> None:
        self.bodies.append(entry.message.body)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


class _Model:
    def __init__(self, root: Path) -> None:
        self.store = SegmentStore(root, fsync=True, auto_compact=False, sync_thread=False)
        self.broker = b = BrokerModel(NullScheduler(), store=self.store)
        b.start()
        self.vh = vh = b.vhosts["/"]
        self.durable = vh.declare_queue("d", False, True, False, False, {}, None)
        self.transient = vh.declare_queue("t", False, False, False, False, {}, None)
        for q in (self.durable, self.transient):
            vh.bind("amq.topic", q, "k", {})
        self.pub = b.open_channel(vh, object(), _Output(), "guest")
        self.pub.confirm_select()
        self.turn()

    def consume(self, queue: str) -> _Output:
        out = _Output()
        ch = self.broker.open_channel(self.vh, object(), out, "guest")
        ch.basic_consume(queue, "c", True, False, {})
        ch.start_consumer("c")
        return out

    def publish(self, body: bytes, hold: bool = False, props: bytes = PERSISTENT) -> None:
        self.pub.basic_publish("amq.topic", "k", False, False, props, body, hold=hold)

    def turn(self) -> None:
        self.broker.end_of_turn()
        self.store.sync_round()
        self.broker.end_of_turn()

    def close(self) -> None:
        self.store.close()


def test_N3_held_publish_reaches_consumers_after_its_commit(tmp_path: Path) -> None:
    m = _Model(tmp_path)
    try:
        d, t = m.consume("d"), m.consume("t")
        m.publish(b"qos2", hold=True)
        assert t.bodies == [b"qos2"]  # a transient queue: nothing to wait for
        assert d.bodies == []
        assert m.durable.message_count == 1  # in the queue, not ready yet
        m.turn()
        assert d.bodies == [b"qos2"]
        m.publish(b"qos1")  # no hold: delivered at once, as before
        assert d.bodies == [b"qos2", b"qos1"]
    finally:
        m.close()


def test_N3_what_is_published_behind_a_held_message_waits_behind_it(tmp_path: Path) -> None:
    m = _Model(tmp_path)
    try:
        d = m.consume("d")
        m.publish(b"1", hold=True)
        m.publish(b"2")
        m.publish(b"3", props=TRANSIENT)
        assert d.bodies == []
        m.turn()
        assert d.bodies == [b"1", b"2", b"3"]
        m.publish(b"4")
        assert d.bodies == [b"1", b"2", b"3", b"4"]  # the hold ended with its commit
    finally:
        m.close()


def test_N3_held_messages_are_purged_and_counted(tmp_path: Path) -> None:
    m = _Model(tmp_path)
    try:
        m.publish(b"1", hold=True)
        m.publish(b"2")
        assert m.durable.message_count == 2
        assert m.durable.purge() == 2
        assert m.durable.message_count == 0
        d = m.consume("d")
        m.turn()
        assert d.bodies == []
    finally:
        m.close()


def test_N3_held_batches_go_in_order_whatever_order_their_commits_report() -> None:
    h = Holding()
    e = [QueueEntry(None, n, OWNER) for n in range(3)]
    first = h.start()
    h.add(e[0])
    second = h.start()
    h.add(e[1])
    h.add(e[2])
    assert len(h) == 3
    assert h.durable(second) == []  # the first batch still waits: order is kept
    assert h.durable(first) == e
    assert not h


def test_N3_a_lone_held_publish_keeps_the_inline_fdatasync(tmp_path: Path) -> None:
    """The release rides on the commit its confirm waits for and is no waiter of its
    own: a lone QoS 2 publisher's commits stay fdatasynced inline in the turn (counted
    as a waiter, each turn had two and the average soon passed INLINE_SYNC_AVG, sending
    every commit to the sync thread: a thread hop more per QoS 2 message)."""
    m = _Model(tmp_path)
    try:
        d = m.consume("d")
        before = m.store.stats.inline_syncs
        for i in range(10):
            m.publish(b"%d" % i, hold=True)
            m.turn()
            m.store.sync_round()  # the delivery's removal (no-ack), written at the turn's end
        assert m.store.stats.inline_syncs - before == 10
        assert len(d.bodies) == 10
    finally:
        m.close()
