"""ackmq.client publishing strategies (SPEC J10): send() with its confirm, send_batch()
with one wait, publish() -> Future with asynchronous confirm tracking."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from conftest import BrokerProcess
from pamqp import commands as C

from ackmq.client import (
    AckMode,
    ConfirmTimeout,
    NackError,
    OutboundMessage,
    ReturnedError,
    connect,
)
from ackmq.client.core import Core
from ackmq.client.options import Options
from ackmq.protocol.amqp import encode_ack, encode_method, encode_nack, encode_return

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]

FULL = {"x-max-length": 3, "x-overflow": "reject-publish"}


@pytest.fixture
def own_broker(tmp_path) -> Iterator[BrokerProcess]:
    """An ackmq of this test's own, to kill or freeze."""
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker
    if broker.proc and broker.proc.poll() is None:
        os.kill(broker.proc.pid, signal.SIGCONT)
    broker.stop()


def test_J10_send_returns_after_the_fsynced_confirm(own_broker: BrokerProcess, q: str,
                                                   tmp_path) -> None:
    """Every send() that returned survives kill -9 of the broker (P9 through the client)."""
    conn = connect(own_broker.url)
    p = conn.session().producer(q)
    for i in range(200):
        p.send(f"m{i}".encode())
    own_broker.kill()
    conn.abort()
    again = BrokerProcess(own_broker.data_dir)
    again.start()
    try:
        with connect(again.url) as conn:
            c = conn.session().consumer(q)
            got = [c.receive(timeout=2) for _ in range(200)]
            assert [m.body for m in got] == [f"m{i}".encode() for i in range(200)]
            assert c.receive(timeout=0.1) is None
    finally:
        again.stop()


def test_J10_send_raises_returned_error_when_no_queue_takes_it(url: str, q: str,
                                                               witness: Witness) -> None:
    with connect(url) as conn:
        p = conn.session().producer(q)
        p.send(b"routed")
        witness.delete(q)
        with pytest.raises(ReturnedError) as info:
            p.send(b"lost?", headers={"k": 1})
        assert info.value.code == 312
        [back] = info.value.messages
        assert back.body == b"lost?" and back.headers == {"k": 1}


def test_J10_send_raises_nack_error_when_the_broker_refuses(url: str, q: str,
                                                            witness: Witness) -> None:
    witness.declare(q, **FULL)
    with connect(url) as conn:
        p = conn.session().producer(q)
        for _ in range(3):
            p.send(b"fits")
        with pytest.raises(NackError) as info:
            p.send(b"does not fit")
        assert [m.body for m in info.value.messages] == [b"does not fit"]
    assert witness.ready(q) == 3


def test_J10_send_times_out_with_confirm_timeout(own_broker: BrokerProcess, q: str) -> None:
    with connect(own_broker.url, heartbeat=0) as conn:
        p = conn.session().producer(q)
        p.send(b"ok")
        os.kill(own_broker.proc.pid, signal.SIGSTOP)  # the broker stops answering
        try:
            started = time.monotonic()
            with pytest.raises(ConfirmTimeout):
                p.send(b"unanswered", timeout=0.5)
            assert 0.45 <= time.monotonic() - started < 3
        finally:
            os.kill(own_broker.proc.pid, signal.SIGCONT)
        p.send(b"answered again")


def test_J10_send_batch_waits_once_for_all(url: str, q: str, witness: Witness) -> None:
    with connect(url) as conn:
        p = conn.session().producer(q)
        p.send_batch([f"b{i}".encode() for i in range(100)])
        assert witness.ready(q) == 100  # all confirmed when send_batch returned
    full = q + ".full"
    witness.declare(full, **FULL)
    with connect(url) as conn:
        p = conn.session().producer(full)
        with pytest.raises(NackError) as info:
            p.send_batch([(f"n{i}".encode(), {"i": i}) for i in range(10)])
        assert sorted(m.headers["i"] for m in info.value.messages) == list(range(3, 10))


def test_J10_publish_futures_and_nacked_messages_handed_back(url: str, q: str,
                                                             witness: Witness) -> None:
    witness.declare(q, **FULL)
    with connect(url) as conn:
        p = conn.session().producer(q)
        futures = [p.publish(f"p{i}".encode()) for i in range(10)]
        p.wait_for_confirms(timeout=5)
        assert all(f.done() for f in futures)
        assert [f.exception() is None for f in futures] == [True] * 3 + [False] * 7
        assert all(isinstance(f.exception(), NackError) for f in futures[3:])
        failed = p.take_failed()
        assert [m.body for m in failed] == [f"p{i}".encode() for i in range(3, 10)]
        assert p.take_failed() == []
        # the caller re-publishes once there is room (never from the I/O path)
        witness.drain(q)
        again = [p.publish(m) for m in failed[:3]]
        assert [f.result(timeout=5) for f in again] == [None] * 3
        assert all(f.done() for f in again)
    assert sorted(b for _, _, b in witness.drain(q)) == [b"p3", b"p4", b"p5"]


def test_J10_publish_many_then_one_wait(url: str, q: str, witness: Witness) -> None:
    with connect(url) as conn:
        p = conn.session().producer(q)
        futures = [p.publish(b"x" * 100) for _ in range(5000)]
        p.wait_for_confirms(timeout=20)
        assert all(f.done() and f.exception() is None for f in futures)
        assert p.take_failed() == []
        assert len(conn.sessions[0].chan.outstanding) == 0
    witness.wait_ready(q, 5000)


def test_J10_topic_producer_to_no_subscriber_is_not_an_error(url: str, q: str) -> None:
    with connect(url) as conn:
        s = conn.session(AckMode.AUTO)
        s.producer("topic://nobody." + q).send(b"into the void")  # as in JMS
        sub = s.consumer("topic://news." + q)
        s.producer("topic://news." + q).send(b"read all about it")
        assert sub.receive(timeout=2).body == b"read all about it"


def _core() -> tuple[Core, object]:
    """A client core past its handshake with one confirm channel (no socket: the core is
    sans-I/O, bytes in and out)."""
    from concurrent.futures import Future
    core = Core(Options(), Future)
    core.opened.set_result(None)
    chan, fut = core.open_channel()
    core.feed(encode_method(chan.number, C.Channel.OpenOk()))
    chan.confirm = True
    return core, chan


def test_J10_outstanding_confirms_are_a_sorted_map_settled_by_multiple() -> None:
    from concurrent.futures import Future
    core, chan = _core()
    futures = []
    failed: list[OutboundMessage] = []
    for i in range(1, 11):
        f: Future = Future()
        chan.publish(OutboundMessage(b"%d" % i, "", "q", b"\x00\x00", f"id{i}", False), f,
                     failed)
        futures.append(f)
    assert list(chan.outstanding) == list(range(1, 11))
    core.feed(encode_ack(chan.number, 4, True))          # settles 1..4
    assert list(chan.outstanding) == list(range(5, 11))
    core.feed(encode_nack(chan.number, 7, False, False))  # one, out of order (P7)
    core.feed(encode_ack(chan.number, 9, False))
    assert list(chan.outstanding) == [5, 6, 8, 10]
    core.feed(encode_nack(chan.number, 10, True, False))  # the rest, nacked
    assert not chan.outstanding
    assert [f.exception() is None for f in futures] == \
        [True] * 4 + [False, False, False, False, True, False]
    assert [m.body for m in failed] == [b"7", b"5", b"6", b"8", b"10"]


def test_J10_a_return_fails_its_publish_even_though_it_is_acked() -> None:
    from concurrent.futures import Future
    core, chan = _core()
    f1: Future = Future()
    f2: Future = Future()
    chan.publish(OutboundMessage(b"a", "", "nowhere", b"\x00\x80\x02id", "id", True), f1, None)
    chan.publish(OutboundMessage(b"b", "", "q", b"\x00\x80\x02jd", "jd", True), f2, None)
    core.feed(encode_return(chan.number, 312, "NO_ROUTE", "", "nowhere", b"\x00\x80\x02id",
                            b"a", 131072))
    core.feed(encode_ack(chan.number, 2, True))
    assert isinstance(f1.exception(), ReturnedError)
    assert f2.exception() is None


def test_J10_transacted_publishes_to_no_queue_are_reported_by_commit(url: str, q: str,
                                                                     witness: Witness) -> None:
    with connect(url) as conn:
        t = conn.session(transacted=True)
        p = t.producer(q)
        p.send(b"kept")
        t.commit()
        witness.delete(q)
        gone = t.producer(q)  # cached as known: the send goes to no queue
        gone.send(b"to nowhere")
        with pytest.raises(ReturnedError) as info:
            t.commit()
        assert [m.body for m in info.value.messages] == [b"to nowhere"]
