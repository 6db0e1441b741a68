"""Dead-lettering (SPEC D6): reasons, the x-death history as RabbitMQ writes it, cycles.

Every test passes against RabbitMQ 3.10 (ACKMQ_TEST_URL=amqp://...:5672/).
"""

from __future__ import annotations

import datetime as dt
import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from support.pikahelp import WAIT, ready_count, take, wait_ready


def reject_one(ch: BlockingChannel, queue: str) -> None:
    m, _p, _b = take(ch, queue, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)


def dlq_to(ch: BlockingChannel, name: str, target: str, **args: object) -> str:
    """Declare `name` dead-lettering through the default exchange into `target`."""
    arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target, **args}
    ch.queue_declare(name, exclusive=True, arguments=arguments)
    return name


@pytest.fixture
def names(qname: str) -> dict[str, str]:
    return {k: f"{qname}.{k}" for k in ("a", "b", "c", "dead", "mon")}


def assert_death(entry: dict, queue: str, reason: str, count: int = 1,
                 exchange: str = "", routing_keys: list[str] | None = None) -> None:
    """One x-death table, with exactly RabbitMQ's keys."""
    keys = {"count", "reason", "queue", "time", "exchange", "routing-keys"}
    if "original-expiration" in entry:
        keys.add("original-expiration")
    assert set(entry) == keys
    assert entry["queue"] == queue
    assert entry["reason"] == reason
    assert entry["count"] == count
    assert entry["exchange"] == exchange
    assert entry["routing-keys"] == (routing_keys if routing_keys is not None else [queue])
    t = entry["time"]
    assert isinstance(t, dt.datetime)  # an AMQP timestamp, seconds resolution
    assert abs(t.timestamp() - time.time()) < 120


# ------------------------------------------------------------------ reasons


def test_reason_rejected(channel: BlockingChannel, names: dict[str, str]) -> None:
    channel.queue_declare(names["dead"], exclusive=True)
    src = dlq_to(channel, names["a"], names["dead"])
    props = pika.BasicProperties(headers={"app": "x"}, message_id="m1", priority=3,
                                 delivery_mode=2, correlation_id="c1", content_type="t/p")
    channel.basic_publish("", src, b"body", props)
    reject_one(channel, src)
    m, p, b = take(channel, names["dead"])
    assert (b, m.exchange, m.routing_key) == (b"body", "", names["dead"])
    assert (p.message_id, p.priority, p.delivery_mode, p.correlation_id, p.content_type) == (
        "m1", 3, 2, "c1", "t/p")
    assert p.headers["app"] == "x"
    (death,) = p.headers["x-death"]
    assert_death(death, src, "rejected")
    assert p.headers["x-first-death-queue"] == src
    assert p.headers["x-first-death-reason"] == "rejected"
    assert p.headers["x-first-death-exchange"] == ""


def test_reason_nack_is_rejected_too(channel: BlockingChannel, names: dict[str, str]) -> None:
    channel.queue_declare(names["dead"], exclusive=True)
    src = dlq_to(channel, names["a"], names["dead"])
    for i in range(3):
        channel.basic_publish("", src, str(i).encode())
    wait_ready(channel, src, 3)
    for _ in range(3):
        take(channel, src, auto_ack=False)
    channel.basic_nack(0, multiple=True, requeue=False)
    wait_ready(channel, names["dead"], 3)
    for i in range(3):  # dead-lettered in their original order
        _m, p, b = take(channel, names["dead"])
        assert b == str(i).encode()
        assert p.headers["x-death"][0]["reason"] == "rejected"


def test_reason_expired_queue_ttl(channel: BlockingChannel, names: dict[str, str]) -> None:
    channel.queue_declare(names["dead"], exclusive=True)
    src = dlq_to(channel, names["a"], names["dead"], **{"x-message-ttl": 100})
    channel.queue_bind(src, "amq.topic", names["a"] + ".#")
    channel.basic_publish("amq.topic", names["a"] + ".k", b"ttl")
    _m, p, b = take(channel, names["dead"])
    assert b == b"ttl"
    (death,) = p.headers["x-death"]
    assert_death(death, src, "expired", exchange="amq.topic", routing_keys=[src + ".k"])
    assert p.headers["x-first-death-exchange"] == "amq.topic"


def test_reason_expired_per_message(channel: BlockingChannel, names: dict[str, str]) -> None:
    channel.queue_declare(names["dead"], exclusive=True)
    src = dlq_to(channel, names["a"], names["dead"])
    channel.basic_publish("", src, b"pm", pika.BasicProperties(expiration="150"))
    _m, p, b = take(channel, names["dead"])
    assert b == b"pm" and p.expiration is None
    (death,) = p.headers["x-death"]
    assert_death(death, src, "expired")
    assert death["original-expiration"] == "150"


def test_reason_maxlen(channel: BlockingChannel, names: dict[str, str]) -> None:
    channel.queue_declare(names["dead"], exclusive=True)
    src = dlq_to(channel, names["a"], names["dead"], **{"x-max-length": 1})
    channel.basic_publish("", src, b"old")
    channel.basic_publish("", src, b"new")
    _m, p, b = take(channel, names["dead"])
    assert b == b"old"
    (death,) = p.headers["x-death"]
    assert_death(death, src, "maxlen")
    assert take(channel, src)[2] == b"new"


def test_dead_letter_keeps_routing_key_without_override(
        channel: BlockingChannel, names: dict[str, str]) -> None:
    dlx = names["a"] + ".dlx"
    channel.exchange_declare(dlx, "direct", auto_delete=True)
    channel.queue_declare(names["dead"], exclusive=True)
    channel.queue_bind(names["dead"], dlx, "orig.key")
    channel.queue_declare(names["a"], exclusive=True,
                          arguments={"x-dead-letter-exchange": dlx})
    channel.queue_bind(names["a"], "amq.direct", "orig.key")
    channel.basic_publish("amq.direct", "orig.key", b"k")
    reject_one(channel, names["a"])
    m, p, _b = take(channel, names["dead"])
    assert (m.exchange, m.routing_key) == (dlx, "orig.key")
    assert_death(p.headers["x-death"][0], names["a"], "rejected", exchange="amq.direct",
                 routing_keys=["orig.key"])


def test_x_death_routing_keys_include_cc(channel: BlockingChannel,
                                         names: dict[str, str]) -> None:
    """Sender-selected distribution: CC keys are routing keys too, BCC is stripped."""
    channel.queue_declare(names["dead"], exclusive=True)
    src = dlq_to(channel, names["a"], names["dead"])
    channel.queue_bind(src, "amq.direct", "cc.key")
    channel.basic_publish("amq.direct", "main.key", b"cc",
                          pika.BasicProperties(headers={"CC": ["cc.key"], "BCC": ["b"]}))
    m, _p, _b = take(channel, src, auto_ack=False)
    channel.basic_reject(m.delivery_tag, requeue=False)
    _m, p, _b = take(channel, names["dead"])
    (death,) = p.headers["x-death"]
    assert death["routing-keys"] == ["main.key", "cc.key"]
    assert "BCC" not in p.headers


# ------------------------------------------------------------------ history


def test_x_death_count_increments_on_second_cycle(channel: BlockingChannel,
                                                  names: dict[str, str]) -> None:
    """Rejected into itself twice: one entry for (queue, reason), count 2."""
    q = dlq_to(channel, names["a"], names["a"])
    channel.basic_publish("", q, b"loop")
    reject_one(channel, q)
    m, p, _b = take(channel, q, auto_ack=False)
    assert m.redelivered is False  # a dead letter is a new message
    (death,) = p.headers["x-death"]
    assert_death(death, q, "rejected", count=1)
    channel.basic_reject(m.delivery_tag, requeue=False)
    _m, p, _b = take(channel, q)
    (death,) = p.headers["x-death"]
    assert_death(death, q, "rejected", count=2)
    assert p.headers["x-first-death-queue"] == q
    assert p.headers["x-first-death-reason"] == "rejected"


def test_x_death_history_most_recent_first(channel: BlockingChannel,
                                           names: dict[str, str]) -> None:
    """a (rejected) -> b (expired) -> c: two entries, newest first; first-death stays a."""
    channel.queue_declare(names["c"], exclusive=True)
    dlq_to(channel, names["b"], names["c"], **{"x-message-ttl": 100})
    dlq_to(channel, names["a"], names["b"])
    channel.basic_publish("", names["a"], b"h")
    reject_one(channel, names["a"])
    _m, p, _b = take(channel, names["c"])
    deaths = p.headers["x-death"]
    assert [(d["queue"], d["reason"]) for d in deaths] == [(names["b"], "expired"),
                                                          (names["a"], "rejected")]
    assert_death(deaths[0], names["b"], "expired")
    assert_death(deaths[1], names["a"], "rejected")
    assert (p.headers["x-first-death-queue"], p.headers["x-first-death-reason"]) == (
        names["a"], "rejected")


def test_x_death_entry_moves_to_front_when_counted_again(
        channel: BlockingChannel, names: dict[str, str]) -> None:
    """a -> b -> a -> b, rejected each time: [b x1, a x1], then [a x2, b x1]."""
    a, b = names["a"], names["b"]
    dlq_to(channel, a, b)
    dlq_to(channel, b, a)
    channel.basic_publish("", a, b"pingpong")
    reject_one(channel, a)
    reject_one(channel, b)
    m, p, _b = take(channel, a, auto_ack=False)
    assert [(d["queue"], d["count"]) for d in p.headers["x-death"]] == [(b, 1), (a, 1)]
    channel.basic_reject(m.delivery_tag, requeue=False)
    _m, p, _b = take(channel, b)
    deaths = p.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        (a, "rejected", 2), (b, "rejected", 1)]
    assert p.headers["x-first-death-queue"] == a


def test_same_queue_different_reasons_are_separate_entries(
        channel: BlockingChannel, names: dict[str, str]) -> None:
    a, dead = names["a"], names["dead"]
    channel.queue_declare(dead, exclusive=True)
    dlq_to(channel, a, dead)
    dlq_to(channel, names["b"], a)
    channel.basic_publish("", a, b"r")
    reject_one(channel, a)                                # a / rejected -> dead
    m, p, body = take(channel, dead)
    # send the dead letter, with its history, back through b (expiring) into a
    channel.basic_publish("", names["b"], body,
                          pika.BasicProperties(headers=p.headers, expiration="50"))
    _m, p2, _b = take(channel, a, auto_ack=False)
    deaths = p2.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        (names["b"], "expired", 1), (a, "rejected", 1)]


# ------------------------------------------------------------------ cycles


def test_expiry_cycle_is_dropped(channel: BlockingChannel, names: dict[str, str]) -> None:
    """a (ttl) dead-letters to a fanout bound to a and a monitor: the copy back into a is
    a cycle with no rejection in it and is dropped; the monitor gets exactly one."""
    a, mon = names["a"], names["mon"]
    fan = a + ".fan"
    channel.exchange_declare(fan, "fanout", auto_delete=True)
    channel.queue_declare(a, exclusive=True,
                          arguments={"x-message-ttl": 100, "x-dead-letter-exchange": fan})
    channel.queue_declare(mon, exclusive=True)
    channel.queue_bind(a, fan)
    channel.queue_bind(mon, fan)
    channel.basic_publish("", a, b"cyc")
    wait_ready(channel, mon, 1)
    time.sleep(0.5)  # several TTLs: a loop would have produced more copies by now
    assert ready_count(channel, mon) == 1
    assert ready_count(channel, a) == 0
    _m, p, _b = take(channel, mon)
    (death,) = p.headers["x-death"]
    assert_death(death, a, "expired")


def test_expiry_cycle_through_two_queues_is_dropped(channel: BlockingChannel,
                                                    names: dict[str, str]) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    a, b = names["a"], names["b"]
    dlq_to(channel, a, b, **{"x-message-ttl": 100})
    dlq_to(channel, b, a, **{"x-message-ttl": 100})
    channel.basic_publish("", a, b"two-step")
    deadline = time.monotonic() + WAIT
    while ready_count(channel, a) + ready_count(channel, b) > 0:
        assert time.monotonic() < deadline, "message still cycling"
        time.sleep(0.05)
    time.sleep(0.3)
    assert ready_count(channel, a) + ready_count(channel, b) == 0


def test_cycle_with_rejection_is_not_dropped(channel: BlockingChannel,
                                             names: dict[str, str]) -> None:
    """a rejects into b, b expires back into a: a rejection breaks the cycle rule."""
    a, b = names["a"], names["b"]
    dlq_to(channel, a, b)
    dlq_to(channel, b, a, **{"x-message-ttl": 100})
    channel.basic_publish("", a, b"kept")
    reject_one(channel, a)
    _m, p, body = take(channel, a)
    assert body == b"kept"
    assert [(d["queue"], d["reason"]) for d in p.headers["x-death"]] == [
        (b, "expired"), (a, "rejected")]


def test_maxlen_cycle_is_dropped(channel: BlockingChannel, names: dict[str, str]) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    a = names["a"]
    dlq_to(channel, a, a, **{"x-max-length": 1})
    channel.basic_publish("", a, b"first")
    channel.basic_publish("", a, b"second")  # drops "first" into a itself: a cycle
    time.sleep(0.2)
    assert ready_count(channel, a) == 1
    assert take(channel, a)[2] == b"second"

