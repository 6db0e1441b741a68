"""ackmq.client with the broker's redelivery back-off (SPEC L6) and consumer timeout
(SPEC L7).

Why: ActiveMQ's RedeliveryPolicy holds a failed message in the consumer for its delay,
where it fills the prefetch window and blocks the messages behind it; on ackmq the
broker holds it instead. Against RabbitMQ (3.10 here) the client keeps doing it itself.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from ackmq.client import AckMode, ConsumerCancelled, Message, RedeliveryPolicy, connect

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]


def wait_until(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_L6_client_policy_delay_does_not_hold_the_prefetch_on_ackmq(
        url: str, q: str, witness: Witness) -> None:
    """Prefetch 1, a listener that fails A once, policy delay 800 ms. On ackmq the delay
    is kept by the broker (x-delayed-retry-* consume arguments): B is processed during
    A's wait, A comes back after it (A, B, A). Against RabbitMQ the client holds A in
    its one prefetch slot for the delay, and B waits behind it (A, A, B)."""
    witness.declare(q)
    log: list[tuple[bytes, float, int]] = []
    failed_at: list[float] = []

    def listener(m: Message) -> None:
        log.append((m.body, time.monotonic(), m.delivery_count))
        if m.body == b"A" and not m.redelivered:
            failed_at.append(time.monotonic())
            raise RuntimeError("later")

    policy = RedeliveryPolicy(initial_redelivery_delay=800, redelivery_delay=800)
    with connect(url, redelivery_policy=policy, queue_prefetch=1) as conn:
        ackmq = conn.is_ackmq
        conn.session(AckMode.AUTO).consumer(q, listener=listener)
        witness.publish(q, b"A", b"B")
        wait_until(lambda: len(log) == 3)
    assert [b for b, _t, _c in log] == ([b"A", b"B", b"A"] if ackmq else [b"A", b"A", b"B"])
    again = next(t for b, t, c in log if b == b"A" and c == 2)
    assert again - failed_at[0] >= 0.75  # the policy's delay, wherever it is kept
    witness.wait_ready(q, 0)


def test_L6_policy_as_broker_arguments() -> None:
    """The policies the broker's rule expresses exactly become consume arguments; the
    others stay client-side (None)."""
    assert RedeliveryPolicy().broker_arguments() == {
        "x-delayed-retry-type": "all", "x-delayed-retry-min": 1000,
        "x-delayed-retry-multiplier": 1}
    exp = RedeliveryPolicy(initial_redelivery_delay=100, redelivery_delay=100,
                           use_exponential_back_off=True, back_off_multiplier=2,
                           maximum_redelivery_delay=500)
    assert exp.broker_arguments() == {
        "x-delayed-retry-type": "all", "x-delayed-retry-min": 100,
        "x-delayed-retry-multiplier": 2, "x-delayed-retry-max": 500}
    assert RedeliveryPolicy(initial_redelivery_delay=0, redelivery_delay=0) \
        .broker_arguments() is None
    assert RedeliveryPolicy(initial_redelivery_delay=100, redelivery_delay=200) \
        .broker_arguments() is None  # first delay unlike the later ones: client-side


def test_L7_receive_raises_consumer_cancelled_on_timeout(ackmq_url: str, q: str) -> None:
    """A message held past the queue's x-consumer-timeout: the broker cancels the
    consumer (ackmq.client advertises consumer_cancel_notify) and returns the message;
    receive() raises ConsumerCancelled; the session goes on (a new consumer gets the
    message, redelivered). RabbitMQ 3.10 has no x-consumer-timeout queue argument."""
    from support.clienthelp import Witness
    witness = Witness(ackmq_url)
    try:
        witness.declare(q, **{"x-consumer-timeout": 400})
        witness.publish(q, b"slow job")
        with connect(ackmq_url) as conn:
            s = conn.session(AckMode.CLIENT)
            c = s.consumer(q)
            m = c.receive(timeout=5)
            assert m is not None and m.body == b"slow job"
            with pytest.raises(ConsumerCancelled) as ei:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    c.receive(timeout=0.2)
            assert ei.value.unacked == 1 and "consumer timeout" in str(ei.value)
            m.acknowledge()  # late: ignored by the broker, the session stays usable
            s.producer(q).send(b"next")
            [(method, _p, body), (_m2, _p2, body2)] = witness.drain(q, timeout=5)
            assert (body, method.redelivered, body2) == (b"slow job", True, b"next")
    finally:
        witness.close()
