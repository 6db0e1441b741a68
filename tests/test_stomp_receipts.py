"""W7 (receipts, after fsync for persistent messages to durable queues) and W8
(BEGIN / COMMIT / ABORT)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stomphelp import Closed, Raw, Target, queue_depth, wait_depth

import ackmq


def test_W7_every_frame_with_a_receipt_gets_one(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "s",
                                "ack": "client"}, receipt="sub")
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"m", receipt="send")
        m = r.expect("MESSAGE")
        r.receipt("ACK", {"id": m.headers["ack"]}, receipt="ack")
        r.receipt("BEGIN", {"transaction": "t"}, receipt="begin")
        r.receipt("ABORT", {"transaction": "t"}, receipt="abort")
        r.receipt("UNSUBSCRIBE", {"id": "s"}, receipt="unsub")
        r.receipt("DISCONNECT", receipt="bye")
        assert r.closed()


def test_W7_receipted_persistent_sends_are_in_the_queue(target: Target, queue: str) -> None:
    conn, listener = target.client()
    for i in range(20):
        conn.send(f"/queue/{queue}", f"m{i}", receipt=f"r{i}", headers={"persistent": "true"})
    assert sorted(listener.wait("receipts", 20)) == sorted(f"r{i}" for i in range(20))
    conn.disconnect()
    assert queue_depth(target, queue) == 20


def test_W7_unroutable_send_with_receipt_is_an_error_naming_the_destination(
        ackmq_target: Target, queue: str) -> None:
    """Not a silent drop: RabbitMQ would answer with a RECEIPT and drop the message."""
    with ackmq_target.raw() as r:
        r.send("SEND", {"destination": f"/amq/queue/{queue}", "receipt": "r"}, b"lost?")
        f = r.expect("ERROR")
        assert f.headers["message"] == "Unroutable message"
        assert f.headers["receipt-id"] == "r"
        assert f"/amq/queue/{queue}".encode() in f.body
        assert r.closed()


def test_W7_topic_without_subscribers_is_not_an_error(target: Target) -> None:
    """Pub/sub: a topic message with no subscriber is delivered to all zero of them."""
    with target.raw() as r:
        r.receipt("SEND", {"destination": "/topic/nobody.listens.here"}, b"x")


class _SlowFsync:
    """Wraps os.fdatasync (the store's durability call) to take 150 ms and record when
    each call ended: the real fdatasync still runs."""

    def __init__(self) -> None:
        self.real = os.fdatasync
        self.done: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        time.sleep(0.15)
        self.real(fd)
        with self.lock:
            self.done.append(time.monotonic())


@pytest.fixture
def slow_fsync_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> Iterator[tuple[ackmq.EmbeddedBroker, _SlowFsync]]:
    slow = _SlowFsync()
    monkeypatch.setattr(os, "fdatasync", slow)
    with ackmq.EmbeddedBroker(data_dir=tmp_path / "d") as b:
        yield b, slow


def _timed_receipt(r: Raw, command: str, headers: dict[str, str], body: bytes = b"") -> float:
    r.receipt(command, headers, body)
    return time.monotonic()


def test_W7_receipt_for_a_persistent_send_comes_after_its_fsync(slow_fsync_broker) -> None:
    b, slow = slow_fsync_broker
    with Raw.open("127.0.0.1", b.stomp_port) as r:
        r.connect()
        r.receipt("SEND", {"destination": "/queue/warm"}, b"declare")  # queue exists
        slow.done.clear()
        sent = time.monotonic()
        got = _timed_receipt(r, "SEND", {"destination": "/queue/warm", "persistent": "true"},
                             b"durable")
        assert slow.done, "no fdatasync before the receipt of a persistent message"
        assert sent < slow.done[0] <= got
        assert got - sent >= 0.15
        # a transient message to the same durable queue is not written: no wait
        t0 = time.monotonic()
        _timed_receipt(r, "SEND", {"destination": "/queue/warm"}, b"transient")
        assert time.monotonic() - t0 < 0.1


def test_W8_commit_receipt_comes_after_the_fsync(slow_fsync_broker) -> None:
    b, slow = slow_fsync_broker
    with Raw.open("127.0.0.1", b.stomp_port) as r:
        r.connect()
        r.receipt("SEND", {"destination": "/queue/txq"}, b"declare")
        r.send("BEGIN", {"transaction": "t"})
        for i in range(3):
            r.send("SEND", {"destination": "/queue/txq", "persistent": "true",
                            "transaction": "t"}, b"%d" % i)
        slow.done.clear()
        got = _timed_receipt(r, "COMMIT", {"transaction": "t"})
        assert slow.done and slow.done[0] <= got


# -- W8 transactions ----------------------------------------------------------------

def test_W8_sends_take_effect_at_commit(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"0")
        r.send("BEGIN", {"transaction": "t1"})
        r.send("SEND", {"destination": f"/queue/{queue}", "transaction": "t1"}, b"1")
        r.send("SEND", {"destination": f"/queue/{queue}", "transaction": "t1",
                        "receipt": "in-tx"}, b"2")
        r.receipt("BEGIN", {"transaction": "sync"}, receipt="sync")  # no "in-tx" before
        assert queue_depth(target, queue) == 1
        r.send("COMMIT", {"transaction": "t1", "receipt": "c"})
        got = {r.expect("RECEIPT").headers["receipt-id"] for _ in range(2)}
        assert got == {"in-tx", "c"}  # the SEND's receipt waits for the COMMIT
        assert wait_depth(target, queue, 3) == 3


def test_W8_abort_discards_sends(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"0")
        r.send("BEGIN", {"transaction": "t1"})
        r.send("SEND", {"destination": f"/queue/{queue}", "transaction": "t1"}, b"1")
        r.receipt("ABORT", {"transaction": "t1"})
        r.receipt("DISCONNECT")
    assert queue_depth(target, queue) == 1


def test_W8_acks_in_a_transaction_count_at_commit(target: Target, queue: str) -> None:
    with target.raw() as r:
        for i in range(2):
            r.send("SEND", {"destination": f"/queue/{queue}"}, b"%d" % i)
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = [r.expect("MESSAGE"), r.expect("MESSAGE")]
        r.send("BEGIN", {"transaction": "t"})
        r.send("ACK", {"id": m[0].headers["ack"], "transaction": "t"})
        r.receipt("ACK", {"id": m[1].headers["ack"], "transaction": "t"}, receipt="a")
        r.receipt("COMMIT", {"transaction": "t"})
        r.receipt("DISCONNECT")
    assert queue_depth(target, queue) == 0


def test_W8_abort_leaves_acks_undone(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.send("SEND", {"destination": f"/queue/{queue}"}, b"x")
        r.subscribe(f"/queue/{queue}", "s", ack="client-individual")
        m = r.expect("MESSAGE")
        r.send("BEGIN", {"transaction": "t"})
        r.send("ACK", {"id": m.headers["ack"], "transaction": "t"})
        r.receipt("ABORT", {"transaction": "t"})
        r.receipt("DISCONNECT")  # unacked: back to the queue
    assert wait_depth(target, queue, 1) == 1


def test_W8_unknown_transaction_is_an_error(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.send("SEND", {"destination": f"/queue/{queue}", "transaction": "never"}, b"x")
        f = r.expect("ERROR")
        assert f.headers["message"] == "Bad transaction"
        assert b'Invalid transaction identifier: "never"' in f.body


def test_W8_commit_without_transaction_header(target: Target) -> None:
    with target.raw() as r:
        r.send("COMMIT")
        f = r.expect("ERROR")
        assert f.headers["message"] == "Missing transaction"


def test_W8_disconnect_drops_open_transactions(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"0")
        r.send("BEGIN", {"transaction": "t"})
        r.send("SEND", {"destination": f"/queue/{queue}", "transaction": "t"}, b"1")
        r.receipt("DISCONNECT")
    assert queue_depth(target, queue) == 1


def test_W8_stomp_py_transaction(target: Target, queue: str) -> None:
    conn, listener = target.client()
    tx = conn.begin()
    for i in range(5):
        conn.send(f"/queue/{queue}", f"m{i}", transaction=tx)
    conn.commit(tx, receipt="c")
    listener.wait("receipts", 1)
    conn.disconnect()
    if target.ackmq:  # the COMMIT receipt comes after all five are enqueued
        assert queue_depth(target, queue) == 5
    else:  # RabbitMQ's plugin replays the SENDs; its queue may count them a moment later
        assert wait_depth(target, queue, 5) == 5


def test_W7_disconnect_receipt_comes_after_every_receipt_owed(ackmq_target: Target,
                                                             queue: str) -> None:
    """Pipelined persistent SENDs, then DISCONNECT: the RECEIPT of the DISCONNECT means
    everything before it is done, so the SENDs' receipts come first. (RabbitMQ answers
    the DISCONNECT at once and the SENDs' receipts still owed are never sent.)"""
    with ackmq_target.raw() as r:
        r.receipt("SEND", {"destination": f"/queue/{queue}"}, b"declare", receipt="d")
        for i in range(50):
            r.send("SEND", {"destination": f"/queue/{queue}", "persistent": "true",
                            "receipt": f"s{i}"}, b"%d" % i)
        r.send("DISCONNECT", {"receipt": "bye"})
        ids = []
        while True:
            try:
                f = r.recv()
            except Closed:
                break
            ids.append(f.headers["receipt-id"])
            if ids[-1] == "bye":
                break
    assert sorted(ids[:-1]) == sorted(f"s{i}" for i in range(50)) and ids[-1] == "bye"
