"""ackmq.client redelivery policy and dead-letter queue (SPEC J6, J7)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from ackmq.client import AckMode, Message, RedeliveryPolicy, connect

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]

NO_DELAY = RedeliveryPolicy(initial_redelivery_delay=0, redelivery_delay=0)


def wait_until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def dlq_setup(witness: Witness, q: str) -> str:
    """q dead-letters into q.dlq through the default exchange."""
    dlq = q + ".dlq"
    witness.declare(dlq)
    witness.declare(q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    return dlq


def test_J6_a_listener_that_raises_causes_redelivery(url: str, q: str,
                                                    witness: Witness) -> None:
    witness.declare(q)
    seen: list[tuple[bytes, bool, int]] = []

    def listener(m: Message) -> None:
        seen.append((m.body, m.redelivered, m.delivery_count))
        if len(seen) == 1:
            raise RuntimeError("first attempt fails")

    with connect(url, redelivery_policy=NO_DELAY) as conn:
        conn.session(AckMode.AUTO).consumer(q, listener=listener)
        witness.publish(q, b"job")
        wait_until(lambda: len(seen) == 2)
        time.sleep(0.2)
        assert seen == [(b"job", False, 1), (b"job", True, 2)]
    witness.wait_ready(q, 0)


@pytest.mark.parametrize("mode", [AckMode.AUTO, AckMode.CLIENT, AckMode.INDIVIDUAL,
                                  AckMode.DUPS_OK])
def test_J6_poison_goes_to_the_dead_letter_queue_with_its_cause(
        url: str, q: str, witness: Witness, mode: AckMode) -> None:
    dlq = dlq_setup(witness, q)
    calls: list[int] = []

    def listener(m: Message) -> None:
        calls.append(m.delivery_count)
        raise ValueError("cannot parse order 7")

    policy = RedeliveryPolicy(maximum_redeliveries=2, initial_redelivery_delay=0,
                              redelivery_delay=0)
    with connect(url, redelivery_policy=policy) as conn:
        conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq})
        conn.session(mode).consumer(q, listener=listener)
        witness.publish(q, b"poison", headers={"k": "v"}, message_id="m-7")
        witness.wait_ready(dlq, 1)
        time.sleep(0.3)
        assert calls == [1, 2, 3]  # delivered once, redelivered twice, then poisoned
    witness.wait_ready(q, 0)       # never redelivered again
    [(_, props, body)] = witness.drain(dlq)
    assert body == b"poison"
    assert props.message_id == "m-7"
    assert props.headers["k"] == "v"  # the publisher's headers are kept
    assert props.headers["x-ackmq-dlq-cause"] == "ValueError('cannot parse order 7')"
    assert props.headers["x-ackmq-dlq-queue"] == q


def test_J6_without_a_dead_letter_exchange_poison_goes_to_ackmq_DLQ(
        url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.declare("ackmq.DLQ")
    mid = uuid.uuid4().hex
    policy = RedeliveryPolicy(maximum_redeliveries=0)

    def listener(m: Message) -> None:
        raise KeyError("nope")

    with connect(url, redelivery_policy=policy) as conn:
        conn.session().consumer(q, listener=listener)
        witness.publish(q, b"x", message_id=mid)

        def arrived() -> bool:
            return any(p.message_id == mid for _, p, _ in witness.drain("ackmq.DLQ", 0.1)
                       if not found.append(p))  # type: ignore[func-returns-value]

        found: list = []
        wait_until(lambda: any(p.message_id == mid for p in found) or arrived())
    mine = [p for p in found if p.message_id == mid]
    assert mine[0].headers["x-ackmq-dlq-cause"] == "KeyError('nope')"
    witness.wait_ready(q, 0)


def test_J6_destination_option_names_the_dead_letter_exchange(url: str, q: str,
                                                             witness: Witness) -> None:
    witness.declare(q)
    dlq = q + ".mine"
    witness.declare(dlq)
    policy = RedeliveryPolicy(maximum_redeliveries=0)

    def listener(m: Message) -> None:
        raise RuntimeError("x")

    with connect(url, redelivery_policy=policy) as conn:
        conn.session().consumer(
            f"{q}?consumer.deadLetterExchange=&consumer.deadLetterRoutingKey={dlq}",
            listener=listener)
        witness.publish(q, b"p")
        witness.wait_ready(dlq, 1)
    witness.wait_ready(q, 0)


def test_J6_redelivery_delay_does_not_block_other_messages(url: str, q: str,
                                                          witness: Witness) -> None:
    witness.declare(q)
    log: list[tuple[bytes, float]] = []
    failed_at: list[float] = []

    def listener(m: Message) -> None:
        log.append((m.body, time.monotonic()))
        if m.body == b"A" and not m.redelivered:
            failed_at.append(time.monotonic())
            raise RuntimeError("later")

    policy = RedeliveryPolicy(initial_redelivery_delay=600, redelivery_delay=600)
    with connect(url, redelivery_policy=policy) as conn:
        conn.session(AckMode.AUTO).consumer(q, listener=listener)
        witness.publish(q, b"A", b"B", b"C")
        wait_until(lambda: len(log) == 4)
    bodies = [b for b, _ in log]
    assert bodies == [b"A", b"B", b"C", b"A"]  # B and C were not held up by A's delay
    b_done = log[2][1]
    assert b_done - failed_at[0] < 0.4
    assert log[3][1] - failed_at[0] >= 0.55


def test_J6_policy_delays_follow_activemq() -> None:
    p = RedeliveryPolicy(initial_redelivery_delay=100, redelivery_delay=200)
    assert [p.delay_for(n) for n in (0, 1, 2, 3)] == [0.0, 0.1, 0.2, 0.2]
    e = RedeliveryPolicy(initial_redelivery_delay=100, redelivery_delay=100,
                         use_exponential_back_off=True,
                         back_off_multiplier=2, maximum_redelivery_delay=500)
    assert [e.delay_for(n) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert RedeliveryPolicy().maximum_redeliveries == 6
    assert not RedeliveryPolicy(maximum_redeliveries=-1).exceeded(10 ** 6)


def test_J6_rollback_counts_as_a_redelivery(url: str, q: str, witness: Witness) -> None:
    dlq = dlq_setup(witness, q)
    witness.publish(q, b"t")
    policy = RedeliveryPolicy(maximum_redeliveries=1, initial_redelivery_delay=0)
    with connect(url, redelivery_policy=policy) as conn:
        conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq})
        t = conn.session(transacted=True)
        c = t.consumer(q)
        assert c.receive(timeout=2).delivery_count == 1
        t.rollback()
        assert c.receive(timeout=2).delivery_count == 2
        t.rollback()  # past maximumRedeliveries: poisoned, not redelivered
        assert c.receive(timeout=0.3) is None
    [(_, props, _)] = witness.drain(dlq)
    assert "rollback()" in props.headers["x-ackmq-dlq-cause"]


def test_J6_the_count_survives_a_consumer_crash_on_ackmq(ackmq_url: str, q: str) -> None:
    """ackmq keeps x-delivery-count: a crash loop ends in the DLQ (ActiveMQ's
    pre-dispatch check), however many consumer processes died on the message."""
    from support.clienthelp import Witness
    witness = Witness(ackmq_url)
    try:
        dlq = dlq_setup(witness, q)
        witness.publish(q, b"crashes the consumer")
        for expected in (1, 2, 3):
            conn = connect(ackmq_url, redelivery_policy=RedeliveryPolicy(
                maximum_redeliveries=3, initial_redelivery_delay=0))
            m = conn.session(AckMode.CLIENT).consumer(q).receive(timeout=2)
            assert m.delivery_count == expected
            conn.abort()  # the consumer "crashes" while processing
        policy = RedeliveryPolicy(maximum_redeliveries=2, initial_redelivery_delay=0)
        with connect(ackmq_url, redelivery_policy=policy) as conn:
            conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": dlq})
            # the 4th delivery has 3 redeliveries > 2: poisoned before the application
            assert conn.session().consumer(q).receive(timeout=0.5) is None
        [(_, props, _)] = witness.drain(dlq)
        assert "redelivery count 3" in props.headers["x-ackmq-dlq-cause"]
    finally:
        witness.close()


def test_J6_on_rabbitmq_classic_queues_the_count_restarts_after_a_crash(
        url: str, q: str, witness: Witness) -> None:
    """RabbitMQ's classic queues keep no count: after a crash the client only knows
    `redelivered` (count >= 1). Documented in docs/client.md; on ackmq the count grows."""
    witness.declare(q)
    witness.publish(q, b"m")
    counts = []
    for _ in range(3):
        conn = connect(url, redelivery_policy=NO_DELAY)
        counts.append(conn.session(AckMode.CLIENT).consumer(q).receive(timeout=2)
                      .delivery_count)
        ackmq = conn.is_ackmq
        conn.abort()
    assert counts == ([1, 2, 3] if ackmq else [1, 2, 2])


def test_J7_acknowledgement_kinds_as_the_broker_sees_them(url: str, q: str,
                                                         witness: Witness) -> None:
    """delivered (CLIENT window extension), standard, individual, redeliver, poison."""
    dlq = dlq_setup(witness, q)
    witness.publish(q, *[str(i).encode() for i in range(12)])
    policy = RedeliveryPolicy(maximum_redeliveries=0)
    done = threading.Event()
    with connect(url, redelivery_policy=policy) as conn:
        conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq})
        # delivered: prefetch 4, CLIENT mode may hold 6 before acknowledging
        c = conn.session(AckMode.CLIENT).consumer(q + "?consumer.prefetchSize=4")
        held = [c.receive(timeout=2) for _ in range(6)]
        assert c.receive(timeout=0.2) is None
        witness.wait_ready(q, 6)
        # standard: acknowledge() settles all 6
        held[-1].acknowledge()
        c.close()
        # individual: one of two
        si = conn.session(AckMode.INDIVIDUAL)
        ci = si.consumer(q + "?consumer.prefetchSize=2")
        a, b = ci.receive(timeout=2), ci.receive(timeout=2)
        b.acknowledge()
        si.close()  # a goes back (the session's unacked deliveries do)
        witness.wait_ready(q, 5)
        assert a is not None
        # redeliver and poison: a listener that raises, maximumRedeliveries 0
        conn.session().consumer(q, listener=lambda m: (_ for _ in ()).throw(
            RuntimeError("poison")) if m.body == a.body else done.set())
        witness.wait_ready(dlq, 1)
    assert [body for _, _, body in witness.drain(dlq)] == [a.body]


def test_J6_in_a_transacted_session_only_the_failing_message_counts(
        url: str, q: str, witness: Witness) -> None:
    """A listener's exception rolls the transaction back; its message counts a
    redelivery, the rest of the batch is delivered again uncounted."""
    dlq = dlq_setup(witness, q)
    out = q + ".out"
    witness.declare(out)
    seen: list[tuple[bytes, bool, int]] = []
    policy = RedeliveryPolicy(maximum_redeliveries=1, initial_redelivery_delay=0)
    with connect(url, redelivery_policy=policy) as conn:
        conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq})
        t = conn.session(transacted=True)
        p = t.producer(out)

        def listener(m: Message) -> None:
            seen.append((m.body, m.redelivered, m.delivery_count))
            if m.body == b"bad":
                raise ValueError("bad")
            p.send(m.body)
            if m.body == b"c":
                t.commit()

        t.consumer(q, listener=listener)
        witness.publish(q, b"a", b"bad", b"c")
        witness.wait_ready(dlq, 1)
        time.sleep(0.2)
    assert seen[:3] == [(b"a", False, 1), (b"bad", False, 1), (b"a", True, 1)]
    assert (b"bad", True, 2) in seen and seen.count((b"c", False, 1)) == 1
    assert sorted(b for _, _, b in witness.drain(out)) == [b"a", b"c"]  # once each
    witness.wait_ready(q, 0)
