"""JMS Session.recover() in ackmq.client (issue 23; SPEC J1, J6): the session's
delivered-unacknowledged messages are delivered again, oldest first, each counting as a
redelivery — past maximumRedeliveries poisoned. ActiveMQ's semantics (its
ActiveMQSession.recover() rolls back every consumer; its JmsTopicRedeliverTest.testRecover
is the first test here). Against ackmq and RabbitMQ."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from ackmq.client import (
    AckMode,
    IllegalStateError,
    Message,
    RedeliveryPolicy,
    connect,
    connect_async,
)

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]

NO_DELAY = RedeliveryPolicy(initial_redelivery_delay=0, redelivery_delay=0)


def test_J6_recover_redelivers_the_unacked_message_then_nothing(url: str, q: str,
                                                                witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"TEST", message_id="m-1")
    with connect(url, redelivery_policy=NO_DELAY) as conn:
        s = conn.session(AckMode.CLIENT)
        c = s.consumer(q)
        first = c.receive(timeout=5)
        assert first is not None and not first.redelivered and first.delivery_count == 1
        s.recover()
        again = c.receive(timeout=5)
        assert again is not None and again.body == b"TEST" and again.message_id == "m-1"
        assert again.redelivered and again.delivery_count == 2
        again.acknowledge()
        s.recover()
        assert c.receive(timeout=0.3) is None
    witness.wait_ready(q, 0)


def test_J6_recover_starts_again_with_the_oldest_unacked(url: str, q: str,
                                                         witness: Witness) -> None:
    """Delivered-unacked messages come back first, in order, before prefetched ones."""
    witness.declare(q)
    witness.publish(q, *[str(i).encode() for i in range(6)])
    with connect(url, redelivery_policy=NO_DELAY) as conn:
        s = conn.session(AckMode.CLIENT)
        c = s.consumer(q)
        got = [c.receive(timeout=5) for _ in range(3)]
        assert [m.body for m in got if m] == [b"0", b"1", b"2"]
        s.recover()
        rest = [c.receive(timeout=5) for _ in range(6)]
        assert [(m.body, m.redelivered) for m in rest if m] == [
            (b"0", True), (b"1", True), (b"2", True),
            (b"3", False), (b"4", False), (b"5", False)]
        rest[-1].acknowledge()  # CLIENT: the whole session
    witness.wait_ready(q, 0)


def test_J6_recover_counts_toward_maximum_redeliveries(url: str, q: str,
                                                       witness: Witness) -> None:
    dlq = q + ".dlq"
    witness.declare(dlq)
    witness.declare(q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    witness.publish(q, b"poison")
    policy = RedeliveryPolicy(maximum_redeliveries=2, initial_redelivery_delay=0,
                              redelivery_delay=0)
    with connect(url, redelivery_policy=policy) as conn:
        conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq})
        s = conn.session(AckMode.INDIVIDUAL)
        c = s.consumer(q)
        counts = []
        for _ in range(3):
            m = c.receive(timeout=5)
            assert m is not None
            counts.append(m.delivery_count)
            s.recover()
        assert counts == [1, 2, 3]
        assert c.receive(timeout=0.3) is None  # the third recover poisoned it
    witness.wait_ready(dlq, 1)
    witness.wait_ready(q, 0)
    [(_, props, _body)] = witness.drain(dlq)
    assert props.headers["x-ackmq-dlq-cause"] == \
        "recover(): redelivery 3 exceeds maximumRedeliveries 2"


def test_J6_recover_applies_the_redelivery_delay(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"x")
    policy = RedeliveryPolicy(initial_redelivery_delay=300, redelivery_delay=300)
    with connect(url, redelivery_policy=policy) as conn:
        s = conn.session(AckMode.CLIENT)
        c = s.consumer(q)
        assert c.receive(timeout=5) is not None
        s.recover()
        assert c.receive(timeout=0.05) is None  # held back for the delay
        m = c.receive(timeout=5)
        assert m is not None and m.redelivered
        m.acknowledge()


def test_J6_recover_in_a_listener_redelivers_its_message_in_auto_mode(
        url: str, q: str, witness: Witness) -> None:
    """JMS: recover() called by an AUTO listener redelivers the current message (it is
    acked only when the listener returns)."""
    witness.declare(q)
    seen: list[tuple[bytes, bool]] = []

    with connect(url, redelivery_policy=NO_DELAY) as conn:
        s = conn.session(AckMode.AUTO)

        def listener(m: Message) -> None:
            seen.append((m.body, m.redelivered))
            if len(seen) == 1:
                s.recover()

        s.consumer(q, listener=listener)
        witness.publish(q, b"job")
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert seen == [(b"job", False), (b"job", True)]
    witness.wait_ready(q, 0)


def test_J2_recover_on_a_transacted_session_is_an_error(url: str) -> None:
    with connect(url) as conn:
        with pytest.raises(IllegalStateError, match="transacted"):
            conn.session(transacted=True).recover()


def test_J6_recover_asyncio(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"a")

    async def run() -> list[tuple[bytes, bool, int]]:
        async with await connect_async(url, redelivery_policy=NO_DELAY) as conn:
            s = await conn.session(AckMode.CLIENT)
            c = await s.consumer(q)
            m1 = await c.receive(timeout=5)
            assert m1 is not None
            first = (m1.body, m1.redelivered, m1.delivery_count)
            await s.recover()
            m2 = await c.receive(timeout=5)
            assert m2 is not None
            m2.acknowledge()
            return [first, (m2.body, m2.redelivered, m2.delivery_count)]

    assert asyncio.run(run()) == [(b"a", False, 1), (b"a", True, 2)]
    witness.wait_ready(q, 0)
