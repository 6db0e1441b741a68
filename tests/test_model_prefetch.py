"""In-process tests of prefetch accounting (SPEC Q1–Q6) in the model (broker/channel.py,
broker/consumer.py): a BrokerModel with no store and no sockets, a channel whose output
records deliveries. The wire behaviour stays covered by tests/test_qos.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackmq.broker.broker import BrokerModel, NullScheduler

PROPS = b"\x00\x00"  # no properties


class Output:
    """A `ChannelOutput` that records deliveries: (consumer tag, delivery tag)."""

    writable = True
    number = 1

    def __init__(self) -> None:
        self.delivered: list[tuple[str, int]] = []

    def deliver(self, consumer, delivery_tag, entry) -> None:
        self.delivered.append((consumer.tag, delivery_tag))

    def unroutable(self, message) -> None:
        pass

    def confirm(self, ack, delivery_tag, multiple) -> None:
        pass

    def consumer_cancelled(self, consumer_tag) -> None:
        pass

    def close(self, code, text) -> None:
        raise AssertionError(f"channel closed: {code} {text}")


class World:
    def __init__(self, queues=("q",)) -> None:
        self.broker = BrokerModel(NullScheduler())
        self.broker.start()
        self.vhost = self.broker.vhost("/")
        self.out = Output()
        self.ch = self.broker.open_channel(self.vhost, "conn", self.out)
        for q in queues:
            self.vhost.declare_queue(q, False, False, False, False, {}, "conn")

    def consume(self, tag: str, queue: str = "q", no_ack: bool = False) -> None:
        self.ch.basic_consume(queue, tag, no_ack, False, {})
        self.ch.start_consumer(tag)

    def publish(self, n: int, queue: str = "q") -> None:
        for i in range(n):
            self.ch.basic_publish("", queue, False, False, PROPS, b"m%d" % i)
        self.broker.end_of_turn()

    def per_consumer(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tag, _ in self.out.delivered:
            out[tag] = out.get(tag, 0) + 1
        return out

    def unacked(self, tag: str) -> int:
        return self.ch.consumers[tag].unacked


def test_q1_zero_prefetch_means_no_cap():
    w = World()
    w.consume("c")
    w.publish(50)
    assert len(w.out.delivered) == 50


def test_q1_q2_cap_per_consumer_and_ack_frees_room():
    w = World()
    w.ch.basic_qos(0, 3, False)
    w.consume("c")
    w.publish(10)
    assert [t for _, t in w.out.delivered] == [1, 2, 3]
    w.ch.basic_ack(2, False)
    assert [t for _, t in w.out.delivered] == [1, 2, 3, 4]
    assert w.unacked("c") == 3


def test_q2_one_multiple_ack_frees_many():
    w = World()
    w.ch.basic_qos(0, 3, False)
    w.consume("c")
    w.publish(10)
    w.ch.basic_ack(3, True)
    assert len(w.out.delivered) == 6
    assert w.unacked("c") == 3 and w.ch.global_unacked == 3


def test_q2_nack_and_reject_free_room_too():
    w = World()
    w.ch.basic_qos(0, 2, False)
    w.consume("c")
    w.publish(5)
    w.ch.basic_nack(1, False, False)
    assert len(w.out.delivered) == 3
    w.ch.basic_reject(2, False)
    assert len(w.out.delivered) == 4
    w.ch.basic_nack(4, True, True)  # 3, 4 back to the queue; 3 and 4 come again
    assert w.unacked("c") == 2
    assert len(w.out.delivered) == 6


def test_q3_global_false_applies_to_consumers_created_afterwards():
    w = World(queues=("a", "b"))
    w.consume("before", "a")
    w.ch.basic_qos(0, 2, False)
    w.consume("after", "b")
    w.publish(5, "a")
    w.publish(5, "b")
    assert w.per_consumer() == {"before": 5, "after": 2}


def test_q3_global_true_is_shared_by_the_channel_consumers():
    w = World(queues=("a", "b"))
    w.ch.basic_qos(0, 3, True)
    w.consume("ca", "a")
    w.consume("cb", "b")
    w.publish(5, "a")
    w.publish(5, "b")
    assert len(w.out.delivered) == 3
    assert w.ch.global_unacked == 3
    tag = w.out.delivered[0][1]
    w.ch.basic_ack(tag, False)
    assert len(w.out.delivered) == 4


def test_q3_both_caps_apply_at_once():
    w = World()
    w.ch.basic_qos(0, 2, False)  # each consumer: 2
    w.ch.basic_qos(0, 3, True)   # the channel: 3
    w.consume("c1")
    w.consume("c2")
    w.publish(10)
    per = w.per_consumer()
    assert sum(per.values()) == 3 and max(per.values()) == 2


def test_q4_lowering_prefetch_in_flight_is_not_an_error():
    w = World()
    w.ch.basic_qos(0, 5, True)
    w.consume("c")
    w.publish(10)
    assert len(w.out.delivered) == 5
    w.ch.basic_qos(0, 2, True)
    w.ch.basic_ack(1, False)  # 4 unacked > 2: nothing new
    assert len(w.out.delivered) == 5
    w.ch.basic_ack(3, True)   # 2 unacked: at the cap, still nothing
    assert len(w.out.delivered) == 5
    w.ch.basic_ack(4, False)  # 1 unacked: room for one
    assert len(w.out.delivered) == 6


def test_q5_basic_get_ignores_prefetch():
    w = World()
    w.ch.basic_qos(0, 1, True)
    w.publish(3)
    got = [w.ch.basic_get("q", False) for _ in range(3)]
    assert all(g is not None for g in got)
    assert len(w.ch.unacked) == 3


def test_q5_no_ack_consumers_ignore_prefetch():
    w = World()
    w.ch.basic_qos(0, 1, False)
    w.ch.basic_qos(0, 1, True)
    w.consume("c", no_ack=True)
    w.publish(10)
    assert len(w.out.delivered) == 10
    assert w.ch.global_unacked == 0


def test_q6_round_robin_among_consumers_with_room():
    w = World()
    w.ch.basic_qos(0, 1, False)
    w.consume("c1")
    w.ch.basic_qos(0, 0, False)
    w.consume("c2")
    w.publish(5)
    # c1 is full after one; the rest go to c2, which has room
    assert w.per_consumer() == {"c1": 1, "c2": 4}


@settings(max_examples=150, deadline=None)
@given(per=st.integers(0, 4), glob=st.integers(0, 6), consumers=st.integers(1, 3),
       acks=st.lists(st.tuples(st.integers(0, 20), st.booleans(),
                               st.sampled_from(["ack", "nack", "reject", "requeue"])),
                     max_size=25))
def test_q1_q2_q3_caps_hold_and_credit_is_returned(per, glob, consumers, acks):
    """Whatever the acks, nacks and rejects: no consumer above its cap, the channel
    never above its global cap, counters equal the unacked deliveries, and the queue
    keeps delivering while there is room and messages."""
    w = World()
    w.ch.basic_qos(0, per, False)
    w.ch.basic_qos(0, glob, True)
    tags = [f"c{i}" for i in range(consumers)]
    for t in tags:
        w.consume(t)
    w.publish(30)
    queue = w.vhost.queue("q", "conn")

    def check() -> None:
        unacked = w.ch.unacked
        assert w.ch.global_unacked == len(unacked)
        if glob:
            assert len(unacked) <= glob
        for t in tags:
            c = w.ch.consumers[t]
            assert c.unacked == sum(1 for d in unacked.values() if d.consumer is c)
            if per:
                assert c.unacked <= per
        # no starvation: ready messages and room means something was delivered
        room = (not glob or len(unacked) < glob) and any(
            not per or w.ch.consumers[t].unacked < per for t in tags)
        if room:
            assert queue.message_count == 0

    check()
    for pick, multiple, action in acks:
        if not w.ch.unacked:
            break
        tag = list(w.ch.unacked)[pick % len(w.ch.unacked)]
        if action == "ack":
            w.ch.basic_ack(tag, multiple)
        elif action == "nack":
            w.ch.basic_nack(tag, multiple, False)
        elif action == "reject":
            w.ch.basic_reject(tag, False)
        else:
            w.ch.basic_nack(tag, multiple, True)
        check()
