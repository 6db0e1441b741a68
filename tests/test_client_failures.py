"""What ackmq.client users meet when things go wrong: ConnectionLost on the next call,
redelivery of unacked messages (D8), reconnect=True, broker-closed channels with the
broker's code and text, and no call that hangs."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pika
import pytest
from conftest import BrokerProcess

from ackmq.client import (
    AckMode,
    ChannelClosed,
    ConnectionLost,
    Message,
    TransactionRolledBack,
    connect,
)

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]


@pytest.fixture
def own_broker(tmp_path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker
    if broker.proc and broker.proc.poll() is None:
        os.kill(broker.proc.pid, signal.SIGCONT)
    broker.stop()


def restart(broker: BrokerProcess) -> BrokerProcess:
    """Kill -9 and start again on the same port and data dir."""
    broker.kill()
    again = BrokerProcess(broker.data_dir, port=broker.port)
    deadline = time.monotonic() + 10
    while True:
        try:
            again.start()
            return again
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_connection_lost_on_the_next_call_after_the_broker_dies(own_broker: BrokerProcess,
                                                                q: str) -> None:
    conn = connect(own_broker.url)
    s = conn.session(AckMode.CLIENT)
    p = s.producer(q)
    c = s.consumer(q)
    p.send(b"before")
    own_broker.kill()
    with pytest.raises(ConnectionLost):
        p.send(b"after", timeout=5)
    with pytest.raises(ConnectionLost):
        c.receive(timeout=1)
    with pytest.raises(ConnectionLost):
        conn.session()
    assert not conn.is_open
    conn.close()  # closing a lost connection is fine


def test_D8_unacked_deliveries_come_back_redelivered(url: str, q: str,
                                                     witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"work")
    conn = connect(url)
    m = conn.session(AckMode.CLIENT).consumer(q).receive(timeout=2)
    assert not m.redelivered
    conn.abort()
    with connect(url) as conn:
        again = conn.session(AckMode.CLIENT).consumer(q).receive(timeout=2)
        assert (again.body, again.redelivered, again.delivery_count) == (b"work", True, 2)
        again.acknowledge()
        with pytest.raises(ConnectionLost):
            m.acknowledge()  # from the aborted connection: the broker has it back


def test_reconnect_re_establishes_sessions_and_consumers(own_broker: BrokerProcess,
                                                         q: str) -> None:
    got: list[bytes] = []
    conn = connect(own_broker.url, reconnect=True, reconnect_timeout=20)
    try:
        s = conn.session(AckMode.AUTO)
        p = s.producer(q)
        pulled = s.consumer(q + ".pull")
        # kill -9 may lose the AUTO ack of "before" (sent as the listener returns): it may
        # then come back redelivered (at least once). That duplicate used to be held 1 s by
        # the client's redelivery delay, past this test's window; on ackmq the delay is
        # the broker's now (SPEC L6) and a restart makes a message ready at once.
        s.consumer(q, listener=lambda m: None if m.redelivered else got.append(m.body))
        s.producer(q + ".pull").send(b"p1")
        assert pulled.receive(timeout=2).body == b"p1"
        p.send(b"before")
        deadline = time.monotonic() + 5
        while got != [b"before"] and time.monotonic() < deadline:
            time.sleep(0.01)
        broker = restart(own_broker)
        own_broker.proc = broker.proc  # the fixture stops this one
        sent_after = False
        for _ in range(3):  # the call in flight when the loss is noticed may raise
            try:
                p.send(b"after")
                sent_after = True
                break
            except ConnectionLost:
                continue
        assert sent_after
        s.producer(q + ".pull").send(b"p2")
        assert pulled.receive(timeout=5).body == b"p2"
        deadline = time.monotonic() + 5
        while b"after" not in got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [b"before", b"after"]
        assert conn.generation == 2
    finally:
        conn.close()


def test_sends_during_a_reconnect_by_another_thread_are_all_confirmed(
        own_broker: BrokerProcess, q: str) -> None:
    """A listener's thread reconnects while the main thread sends: a send must neither
    raise (the producer is idempotent: it waits for the reconnect) nor go out on the
    restored channel before confirm.select-ok (no sequence number, never a confirm)."""
    got: set[bytes] = set()
    conn = connect(own_broker.url, reconnect=True, reconnect_timeout=20, send_timeout=5000)
    try:
        s = conn.session(AckMode.AUTO)
        p = s.producer(q)
        s.consumer(q, listener=lambda m: got.add(m.body))
        sent: list[bytes] = []
        for cycle in range(4):
            broker = restart(own_broker)
            own_broker.proc = broker.proc
            for i in range(3):
                body = f"{cycle}.{i}".encode()
                p.send(body)  # ConfirmTimeout or ConnectionLost here is the bug
                sent.append(body)
        deadline = time.monotonic() + 10
        while not got.issuperset(sent) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got.issuperset(sent)
        assert conn.generation == 5
    finally:
        conn.close()


def test_transaction_interrupted_by_a_reconnect_is_rolled_back(own_broker: BrokerProcess,
                                                               q: str) -> None:
    conn = connect(own_broker.url, reconnect=True, heartbeat=1)
    try:
        t = conn.session(transacted=True)
        p = t.producer(q)
        p.send(b"half of a transaction")
        broker = restart(own_broker)
        own_broker.proc = broker.proc
        deadline = time.monotonic() + 5
        while conn.core.error is None:  # the heartbeat thread notices the loss
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(TransactionRolledBack):
            t.commit()  # reconnects, and says the transaction's work is gone
        p.send(b"whole")
        t.commit()
        c = conn.session().consumer(q)
        assert c.receive(timeout=2).body == b"whole"
        assert c.receive(timeout=0.2) is None
    finally:
        conn.close()


def test_commit_in_flight_when_the_connection_drops_is_reported(own_broker: BrokerProcess,
                                                                q: str) -> None:
    conn = connect(own_broker.url, reconnect=True, heartbeat=0)
    try:
        t = conn.session(transacted=True)
        p = t.producer(q)
        p.send(b"maybe")
        broker = restart(own_broker)
        own_broker.proc = broker.proc
        with pytest.raises(ConnectionLost, match="commit outcome unknown"):
            t.commit()
        p.send(b"next")  # reconnected; a new transaction
        t.commit()
        c = conn.session().consumer(q)
        assert c.receive(timeout=2).body == b"next"
    finally:
        conn.close()


def test_a_channel_closed_by_the_broker_raises_its_code_and_text(url: str, q: str,
                                                                 witness: Witness) -> None:
    witness.declare(q)
    holder = pika.BlockingConnection(pika.URLParameters(url))
    try:
        hch = holder.channel()
        hch.basic_consume(q, lambda *a: None, exclusive=True)
        with connect(url) as conn:
            s = conn.session()
            with pytest.raises(ChannelClosed) as info:
                s.consumer(q)
            assert info.value.code == 403
            assert "ACCESS_REFUSED" in info.value.text and "exclusive" in info.value.text
            with pytest.raises(ChannelClosed):  # the session stays closed
                s.producer(q).send(b"x")
            with pytest.raises(ChannelClosed) as info:
                conn.declare_queue("amq.reserved")
            assert info.value.code == 403
            with pytest.raises(ChannelClosed) as info:
                conn.declare_queue(q, durable=False)  # exists, durable
            assert info.value.code == 406 and "PRECONDITION_FAILED" in info.value.text
            other = conn.session()  # the connection and other sessions go on
            other.producer(q).send(b"fine")
    finally:
        holder.close()


def test_a_refused_login_says_so(url: str) -> None:
    bad = url.replace("guest:guest", "guest:wrong")
    with pytest.raises(ConnectionLost) as info:
        connect(bad)
    assert info.value.code == 403


def test_no_call_hangs_on_a_frozen_broker(own_broker: BrokerProcess, q: str) -> None:
    os.kill(own_broker.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="handshake"):
            connect(own_broker.url, connect_timeout=0.5)
        assert time.monotonic() - started < 3
    finally:
        os.kill(own_broker.proc.pid, signal.SIGCONT)
    conn = connect(own_broker.url, heartbeat=1)
    try:
        c = conn.session().consumer(q)
        os.kill(own_broker.proc.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="heartbeat"):
            c.receive()  # no timeout: the missed heartbeats end it
        assert time.monotonic() - started < 5
    finally:
        os.kill(own_broker.proc.pid, signal.SIGCONT)
        conn.close()


def test_listener_thread_sees_the_loss_and_stops(own_broker: BrokerProcess, q: str) -> None:
    conn = connect(own_broker.url)
    seen = threading.Event()

    def listener(m: Message) -> None:
        seen.set()

    conn.session().consumer(q, listener=listener)
    own_broker.kill()
    dispatcher = conn._dispatcher
    assert dispatcher is not None
    dispatcher.join(5)
    assert not dispatcher.is_alive()
    conn.close()
