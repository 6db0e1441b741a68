"""Durability end to end: a real `ackmq serve` stopped, killed and restarted on one data dir.

ackmq only (these tests own their broker process); SPEC P9 and D8.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from conftest import BrokerProcess
from support.pikahelp import confirmed_publisher

pytestmark = pytest.mark.slow

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    b.stop()


def connect(b: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url))


def restart(b: BrokerProcess, how: str) -> None:
    if how == "kill":
        b.kill()
    else:
        b.stop()
    b.start()


def exists(conn: pika.BlockingConnection, kind: str, name: str) -> bool:
    """Passive declare on a throwaway channel: 404 closes only that channel."""
    ch = conn.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    ch.close()
    return True


def drain(ch, queue: str) -> list[tuple[bytes, bool]]:
    """(body, redelivered) of every ready message, in order, acked."""
    out = []
    while True:
        m, _p, body = ch.basic_get(queue)
        if m is None:
            return out
        out.append((body, m.redelivered))
        ch.basic_ack(m.delivery_tag)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_durable_server_named_queue_survives_restart_with_its_messages(
        broker: BrokerProcess, how: str) -> None:
    """queue.declare("", durable=True) names the queue amq.gen-…; RabbitMQ recovers it
    like any durable queue. The reserved-prefix rule is for clients' declares, not for
    recovery: once it refused the stored queue and the broker would not start."""
    conn = connect(broker)
    ch = conn.channel()
    name = ch.queue_declare("", durable=True).method.queue
    assert name.startswith("amq.gen-")
    ch.confirm_delivery()
    ch.basic_publish("", name, b"kept", PERSISTENT)
    conn.close()
    restart(broker, how)
    conn = connect(broker)
    try:
        assert drain(conn.channel(), name) == [(b"kept", False)]
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_durable_definitions_survive_restart_and_transient_ones_do_not(
        broker: BrokerProcess, how: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("d.topic", "topic", durable=True)
    ch.exchange_declare("d.fan", "fanout", durable=True)
    ch.exchange_declare("t.direct", "direct", durable=False)
    ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 1000})
    ch.queue_declare("d.q2", durable=True)
    ch.queue_declare("t.q", durable=False)
    ch.queue_bind("d.q", "d.topic", "a.*")
    ch.queue_bind("d.q2", "d.fan")
    ch.exchange_bind("d.fan", "d.topic", "b.#")       # exchange-to-exchange, both durable
    ch.queue_bind("t.q", "d.topic", "a.*")           # goes away with the transient queue
    ch.queue_declare("d.unbound", durable=True)
    ch.queue_bind("d.unbound", "d.topic", "gone")
    ch.queue_unbind("d.unbound", "d.topic", "gone")
    ch.exchange_declare("d.deleted", "direct", durable=True)
    ch.exchange_delete("d.deleted")
    conn.close()

    restart(broker, how)

    conn = connect(broker)
    try:
        assert exists(conn, "exchange", "d.topic") and exists(conn, "exchange", "d.fan")
        assert exists(conn, "queue", "d.q") and exists(conn, "queue", "d.q2")
        assert exists(conn, "queue", "d.unbound")
        assert not exists(conn, "exchange", "t.direct")
        assert not exists(conn, "queue", "t.q")
        assert not exists(conn, "exchange", "d.deleted")
        ch = conn.channel()
        ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 1000})  # equivalent
        ch.confirm_delivery()
        ch.basic_publish("d.topic", "a.x", b"to-q", PERSISTENT)
        ch.basic_publish("d.topic", "b.y", b"to-q2", PERSISTENT)
        ch.basic_publish("d.topic", "gone", b"nowhere", PERSISTENT)
        assert drain(ch, "d.q") == [(b"to-q", False)]
        assert drain(ch, "d.q2") == [(b"to-q2", False)]
        assert drain(ch, "d.unbound") == []
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_P9_persistent_messages_survive_in_order_with_redelivered_flags(
        broker: BrokerProcess, how: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("keep", durable=True)
    ch.queue_declare("transient", durable=False)
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", "keep", b"p%d" % i, PERSISTENT)
        if i % 4 == 0:
            ch.basic_publish("", "keep", b"t%d" % i, TRANSIENT)  # durable queue, not persistent
    ch.basic_publish("", "transient", b"gone", PERSISTENT)
    got = []
    for _ in range(4):  # p0 t0 p1 p2: delivered, not acked
        m, _p, body = ch.basic_get("keep")
        got.append(body)
    assert got == [b"p0", b"t0", b"p1", b"p2"]
    ch.basic_ack(m.delivery_tag)  # p2 acked (not a durability promise under kill -9)
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=100)
    ch2.basic_get("transient", auto_ack=True)
    ch.close()  # p0, t0, p1 back in the queue, redelivered
    if how == "stop":
        conn.close()
    restart(broker, how)

    conn = connect(broker)
    try:
        ch = conn.channel()
        assert not exists(conn, "queue", "transient")
        after = drain(ch, "keep")
        expected = [(b"p0", True), (b"p1", True)]
        if how == "kill" and (b"p2", True) in after:
            expected.append((b"p2", True))  # the ack was lost with the broker: allowed
        expected += [(b"p%d" % i, False) for i in range(3, 10)]
        assert after == expected
    finally:
        conn.close()


def test_P9_kill_9_under_confirmed_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rnd = random.Random(9)
    b = BrokerProcess(tmp_path / "data")
    confirmed: list[str] = []
    try:
        for cycle in range(5):
            b.start()
            conn = connect(b)
            conn.channel().queue_declare("crash", durable=True)
            conn.close()
            stop = threading.Event()
            threads = [threading.Thread(target=confirmed_publisher,
                                        args=(b.url, "crash", f"c{cycle}p{i}", confirmed, stop))
                       for i in range(4)]
            for t in threads:
                t.start()
            time.sleep(rnd.uniform(0.5, 2.0))
            b.kill()
            stop.set()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads)
        b.start()
        conn = connect(b)
        ch = conn.channel()
        bodies = [body.decode() for body, _r in drain(ch, "crash")]
        conn.close()
    finally:
        b.stop()
    counts = Counter(bodies)
    assert len(confirmed) > 100
    missing = set(confirmed) - counts.keys()
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
    dups = [x for x, c in counts.items() if c > 1]
    assert not dups, f"duplicated: {dups[:5]}"
    for name in {x.rsplit("-", 1)[0] for x in bodies}:  # per publisher, order is kept
        ns = [int(x.rsplit("-", 1)[1]) for x in bodies if x.rsplit("-", 1)[0] == name]
        assert ns == sorted(ns)
