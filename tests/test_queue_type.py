"""The queue-type seam (broker/queue_type.py), driven directly: the model with a real
store, no sockets. A queue is reached only through the `Queue` interface here, the way
the channel, the vhost and recovery reach it, so a second type can be checked the same
way by adding it to TYPES.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ackmq.broker import BrokerModel, NullScheduler
from ackmq.broker.consumer import Consumer
from ackmq.broker.queue import ClassicQueue
from ackmq.broker.queue_type import (
    ACK,
    INTERFACE,
    QUEUE_TYPES,
    REJECT,
    REQUEUE,
    Queue,
    missing_methods,
    queue_class,
)
from ackmq.store import open_store

PERSISTENT = b"\x10\x00\x02"  # property flags: delivery-mode present; mode 2
TYPES = ["classic", "quorum"]



class _Channel:
    """The two calls a queue makes on its consumer's channel."""

    def __init__(self) -> None:
        self.got: list[tuple[Consumer, object]] = []
        self.room = True

    def deliver(self, c: Consumer, entry: object) -> None:
        self.got.append((c, entry))
        c.unacked += 1

    def park(self, c: Consumer) -> None:
        pass

    def can_send(self) -> bool:
        return self.room

    def has_room(self) -> bool:
        return self.room


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerModel]:
    store = open_store(tmp_path / "data", fsync=False)
    b = BrokerModel(NullScheduler(), store=store)
    b.start()
    yield b
    b.close()


def declare(broker: BrokerModel, name: str, kind: str, **arguments: object) -> Queue:
    vh = broker.vhosts["/"]
    return vh.declare_queue(name, False, True, False, False,
                            {"x-queue-type": kind, **arguments}, None)


def publish(broker: BrokerModel, queue: str, body: bytes) -> None:
    from ackmq.broker.message import Message
    vh = broker.vhosts["/"]
    for q in vh.route(vh.exchange(""), Message("", queue, PERSISTENT, body)):
        assert q.publish(Message("", queue, PERSISTENT, body))


def test_registry_selects_by_x_queue_type() -> None:
    assert queue_class({}) is ClassicQueue
    assert queue_class({"x-queue-type": b"classic"}) is ClassicQueue
    assert QUEUE_TYPES["quorum"] is ClassicQueue
    assert all(issubclass(t, Queue) for t in QUEUE_TYPES.values())
    assert missing_methods(ClassicQueue) == []
    assert missing_methods(Queue) == list(INTERFACE)


@pytest.mark.parametrize("kind", TYPES)
def test_D1_D6_get_settle_through_the_interface(broker: BrokerModel, kind: str) -> None:
    dead = declare(broker, "dead", "classic")
    q = declare(broker, "q", kind, **{"x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": "dead"})
    for body in (b"a", b"b", b"c"):
        publish(broker, "q", body)
    assert (q.message_count, q.unacked_count, q.consumer_count) == (3, 0, 0)

    a, b, c = q.get(), q.get(), q.get()
    assert [e.message.body for e in (a, b, c)] == [b"a", b"b", b"c"]
    assert q.get() is None
    for e in (a, b, c):
        q.delivered(e, ack_required=True)
    assert (q.message_count, q.unacked_count) == (0, 3)

    assert q.settle(b, REQUEUE) is True       # the caller dispatches after its batch
    assert q.settle(a, ACK) is False
    assert q.settle(c, REJECT) is False       # dead-lettered (D6)
    assert (q.message_count, q.unacked_count) == (1, 0)
    again = q.get()
    assert again is b and again.redelivered and again.delivery_count == 1  # D9, D10
    q.delivered(again, ack_required=False)    # no-ack: settled at once (D3)
    assert (q.message_count, q.unacked_count) == (0, 0)
    got = dead.get()
    assert got is not None and got.message.body == b"c"
    assert got.message.headers["x-death"][0]["reason"] == "rejected"


@pytest.mark.parametrize("kind", TYPES)
def test_Q6_consumers_served_in_turn_with_room(broker: BrokerModel, kind: str) -> None:
    q = declare(broker, "rr", kind)
    ch = _Channel()
    c1 = Consumer("c1", ch, q, False, False, 2)
    c2 = Consumer("c2", ch, q, False, False, 2)
    q.add_consumer(c1)
    q.add_consumer(c2)
    for i in range(6):
        publish(broker, "rr", str(i).encode())
    # each takes two (its prefetch), in turn; two stay ready
    assert [(c.tag, e.message.body) for c, e in ch.got] == [
        ("c1", b"0"), ("c2", b"1"), ("c1", b"2"), ("c2", b"3")]
    assert q.message_count == 2
    for _c, e in ch.got:
        q.delivered(e, ack_required=True)
    c1.unacked -= 1
    assert q.settle(ch.got[0][1], ACK) is False
    q.activate(c1)
    assert ch.got[-1][0] is c1 and ch.got[-1][1].message.body == b"4"
    q.remove_consumer(c2)
    assert q.consumer_count == 1


@pytest.mark.parametrize("kind", TYPES)
def test_P9_recover_through_the_interface(tmp_path: Path, kind: str) -> None:
    """A queue type takes back what the store found: unsettled messages in order, the
    ones delivered before the restart redelivered."""
    data = tmp_path / "data"
    b = BrokerModel(NullScheduler(), store=open_store(data, fsync=False))
    b.start()
    q = declare(b, "durable", kind)
    for body in (b"1", b"2", b"3"):
        publish(b, "durable", body)
    first = q.get()
    q.delivered(first, ack_required=True)
    b.end_of_turn()
    b.close()  # the delivery was never settled: it comes back

    b2 = BrokerModel(NullScheduler(), store=open_store(data, fsync=False))
    b2.start()
    q2 = b2.vhosts["/"].queues["durable"]
    assert isinstance(q2, QUEUE_TYPES[kind]) and q2.message_count == 3
    got = [q2.get() for _ in range(3)]
    assert [(e.message.body, e.redelivered) for e in got] == [
        (b"1", True), (b"2", False), (b"3", False)]
    q2.purge()
    b2.close()
