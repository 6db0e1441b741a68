"""C5: one timer service for every deadline (broker/timers.py, driven on the loop by
server/timers.py). In process: the service on a fake clock (arm, re-arm earlier and
later, cancel, fire order, a callback's re-arm), and a broker whose deadlines of every
kind are entries of that one service. The live behaviour of each kind is covered by
tests/test_delayed*.py, test_retry_timeout.py, test_scheduled*.py, test_liveness.py,
test_connection*.py, test_queues.py and test_dead_letter.py."""

from __future__ import annotations

import logging

import pytest

from ackmq.broker.broker import BrokerModel, NullScheduler
from ackmq.broker.timers import Deadline, Timers
from ackmq.protocol.amqp.properties import encode_fields


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def service() -> tuple[Timers, Clock, list[str]]:
    clock = Clock()
    return Timers(now=clock), clock, []


def test_C5_deadlines_fire_in_due_order_ties_in_arm_order() -> None:
    timers, clock, fired = service()
    for name, due in (("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("d", 9.0)):
        Deadline(timers, lambda name=name: fired.append(name)).arm(clock.t + due)  # type: ignore[misc]
    assert len(timers) == 5 and timers.soonest() == clock.t + 1.0
    clock.t += 0.5
    assert timers.run() == 0 and fired == []  # nothing due yet
    clock.t += 2.5
    assert timers.run() == 4
    assert fired == ["a", "b1", "b2", "c"]
    assert len(timers) == 1 and timers.soonest() == 1009.0


def test_C5_rearm_earlier_and_later_fires_once_at_the_last_due() -> None:
    timers, clock, fired = service()
    d = Deadline(timers, lambda: fired.append("d"))
    d.arm(clock.t + 10)
    d.arm_by(clock.t + 5)   # earlier: moved
    assert d.due == clock.t + 5
    d.arm_by(clock.t + 8)   # later: arm_by keeps the earlier one
    assert d.due == clock.t + 5
    d.arm(clock.t + 20)     # arm moves it later
    assert d.due == clock.t + 20 and len(timers) == 1
    clock.t += 6
    assert timers.run() == 0 and fired == []  # the stale entries at 5 and 10 are dead
    clock.t += 14
    assert timers.run() == 1 and fired == ["d"]
    assert not d.armed and d.due is None and len(timers) == 0
    assert timers.soonest() is None


def test_C5_cancel_is_never_fired_and_the_heap_sheds_dead_entries() -> None:
    timers, clock, fired = service()
    ds = [Deadline(timers, lambda i=i: fired.append(str(i))) for i in range(1000)]  # type: ignore[misc]
    for i, d in enumerate(ds):
        d.arm(clock.t + i)
    for d in ds[:900]:
        d.cancel()
    ds[950].cancel()
    ds[950].cancel()  # twice: nothing more
    assert len(timers) == 99
    assert len(timers._heap) <= 2 * 99 + 64  # rebuilt once the dead outnumbered the live
    clock.t += 2000
    assert timers.run() == 99
    assert fired == [str(i) for i in range(900, 1000) if i != 950]


def test_C5_a_callbacks_rearm_fires_on_the_next_run_and_a_failure_stops_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    timers, clock, fired = service()
    again = Deadline(timers, lambda: None)

    def tick() -> None:
        fired.append("tick")
        again.arm_in(0)  # due at once: the next run, not this one (no starving the loop)

    def boom() -> None:
        raise RuntimeError("boom")

    again.fn = tick
    Deadline(timers, boom).arm(clock.t)
    again.arm(clock.t)
    late = Deadline(timers, lambda: fired.append("late"))
    late.arm(clock.t + 1)

    def cancel_late() -> None:
        late.cancel()  # a callback cancels one due later in the same run
    Deadline(timers, cancel_late).arm(clock.t)
    clock.t += 1
    with caplog.at_level(logging.ERROR, "ackmq.timers"):
        assert timers.run() == 3  # boom, tick, cancel_late; late was cancelled
    assert fired == ["tick"] and "boom" in caplog.text
    assert timers.run() == 1 and fired == ["tick", "tick"]


def test_C5_the_driver_is_woken_only_when_the_soonest_gets_earlier() -> None:
    timers, clock, _ = service()
    woken: list[float] = []
    timers.wake = woken.append
    a, b = Deadline(timers, lambda: None), Deadline(timers, lambda: None)
    a.arm(clock.t + 5)
    b.arm(clock.t + 7)   # later than the driver's timer: no wake
    b.arm(clock.t + 2)   # earlier: wake
    assert woken == [1005.0, 1002.0]
    clock.t += 2
    timers.run()         # b fired; the driver is told the next soonest (a)
    assert woken[-1] == 1005.0
    a.cancel()
    clock.t += 3
    assert timers.run() == 0 and timers.soonest() is None


def test_C5_one_service_owns_every_deadline_of_the_broker() -> None:
    """Queue TTL, x-expires, retry back-off, a delayed message and a consumer timeout
    are all entries of the broker's one Timers (one loop timer drives them all)."""
    broker = BrokerModel(NullScheduler(), consumer_timeout_ms=60_000)
    broker.start()
    vh = broker.vhosts["/"]
    timers = broker.timers
    assert len(timers) == 0
    vh.declare_queue("ttl", False, False, False, False,
                     {"x-expires": 600_000, "x-message-ttl": 600_000}, None)
    assert len(timers) == 1  # x-expires counts down from the declare
    ch = broker.open_channel(vh, object(), _Output(), "guest")
    ch.basic_publish("", "ttl", False, False, b"\x00\x00", b"m")
    assert len(timers) == 2  # the head's TTL
    vh.declare_queue("retry", False, False, False, False,
                     {"x-delayed-retry-min": 600_000}, None)
    ch.basic_publish("", "retry", False, False, b"\x00\x00", b"m")
    got = ch.basic_get("retry", False)
    assert got is not None
    assert len(timers) == 3  # the channel's consumer timeout
    ch.basic_reject(got[0], True)
    assert len(timers) == 4  # the back-off (the delivery's timeout stays armed: lazy)
    vh.declare_exchange("later", "x-delayed-message", False, False, False, False,
                        {"x-delayed-type": "direct"})
    vh.bind("later", vh.queues["ttl"], "k", {})
    props = encode_fields({"headers": {"x-delay": 600_000}})
    ch.basic_publish("later", "k", False, False, props, b"m")
    assert len(timers) == 5  # the delayed store's wake
    # deleting and closing stop them
    ch.close()
    vh.delete_queue(vh.queues["ttl"])
    vh.delete_queue(vh.queues["retry"])
    assert len(timers) == 1  # the delayed message still waits


class _Output:
    writable = True
    number = 1
    cancel_notify = False

    def deliver(self, consumer: object, delivery_tag: int, entry: object) -> None:
        pass

    def unroutable(self, message: object) -> None:
        pass

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        pass

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        pass

    def close(self, code: int, text: str) -> None:
        raise AssertionError(f"channel closed: {code} {text}")


def test_C5_the_loop_driver_keeps_one_loop_timer_at_the_soonest() -> None:
    """server/timers.py: the service on a real asyncio loop; however many deadlines are
    armed, the loop holds one timer handle for them (at the soonest)."""
    import asyncio

    from ackmq.server.timers import LoopTimers

    async def main() -> tuple[list[str], int, int]:
        loop = asyncio.get_running_loop()
        timers = Timers()
        flushed = [0]
        driver = LoopTimers(timers, loop, lambda: flushed.__setitem__(0, flushed[0] + 1))
        fired: list[str] = []
        done = loop.create_future()
        for name, delay in (("c", 0.06), ("a", 0.02), ("b", 0.04)):
            Deadline(timers, lambda name=name: fired.append(name)).arm_in(delay)  # type: ignore[misc]
        Deadline(timers, lambda: done.set_result(None)).arm_in(0.08)
        # asyncio's timer heap (its cancelled handles wait there until they come up)
        handles = sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]
        await asyncio.wait_for(done, 30)
        driver.close()
        return fired, handles, flushed[0]

    fired, handles, flushed = asyncio.run(main())
    assert fired == ["a", "b", "c"]
    assert handles == 1  # four deadlines, one loop timer
    assert flushed >= 1  # the end of turn asked for after a run that fired
