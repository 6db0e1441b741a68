"""V1 remote shovels and V2 (nothing lost): a shovel running in one ackmq moves a queue to
another ackmq over the network, reconnects (with back-off) when the destination goes
away, and moves to the reference RabbitMQ. With on-confirm, a kill -9 of the
destination or of the source (the broker the shovel runs in) during a move loses
nothing: every message arrives; the duplicates the crash causes (messages the
destination stored but whose confirm never reached the source) are counted."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess
from support.mgmthelp import Target, rabbit_http
from support.shovelhelp import RABBIT_AMQP, Side, drop_side, http_target, make_side

N = 6000  # messages in the backlog moved while a broker is killed


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    a = BrokerProcess(tmp_path / "a", "--http-port", "0")
    b = BrokerProcess(tmp_path / "b", "--http-port", "0")
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


def _sides(a: BrokerProcess, b: BrokerProcess) -> tuple[Side, Side]:
    return (make_side("ackmq", http_target(a), a.url),
            make_side("ackmq", http_target(b), b.url))


def _ids(side: Side, queue: str) -> Counter[str]:
    return Counter(p.message_id for _b, p in side.drain(queue))


def test_V1_remote_shovel_between_two_ackmq_reconnects(
        two: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = two
    sa, sb = _sides(a, b)
    sa.publish("src", 100)
    assert sa.put("out", {"src-uri": sa.local, "src-queue": "src", "dest-uri": sb.remote,
                          "dest-queue": "dst", "reconnect-delay": 1}).status == 201
    sb.wait(lambda: sb.depth("dst") == 100, "100 moved to the other broker")
    st = sa.wait_state("out", "running")
    assert st["dest_uri"] == sb.remote.replace("guest:guest@", "")  # as RabbitMQ: no
    # credentials (checked on RabbitMQ 3.10: "amqp://127.0.0.1:5672/<vhost>")
    b.stop()
    sa.wait_state("out", "starting")
    sa.publish("src", 50, start=100, declare=False)
    b.start()
    sb.t = http_target(b)
    sa.wait_state("out", "running")
    sb.wait(lambda: sb.depth("dst") == 150, "the 50 published while it was down")
    assert sorted(_ids(sb, "dst")) == sorted(f"id{i}" for i in range(150))


@pytest.mark.rabbitmq
def test_V1_shovel_from_ackmq_to_rabbitmq(tmp_path: Path) -> None:
    a = BrokerProcess(tmp_path / "a", "--http-port", "0")
    a.start()
    sa = make_side("ackmq", http_target(a), a.url)
    sr = make_side("rabbitmq", Target("rabbitmq", rabbit_http(), RABBIT_AMQP), RABBIT_AMQP)
    try:
        sa.publish("src", 200)
        assert sa.put("to-rabbit", {"src-uri": sa.local, "src-queue": "src",
                                    "dest-uri": sr.remote, "dest-queue": "dst",
                                    "src-delete-after": "queue-length"}).status == 201
        sr.wait(lambda: sr.depth("dst") == 200, "200 moved to RabbitMQ")
        sa.wait(lambda: sa.status("to-rabbit") is None, "the shovel deleted itself")
        assert [b for b, _p in sr.drain("dst")] == [b"m%d" % i for i in range(200)]
    finally:
        drop_side(sr)
        a.stop()


def _kill_mid_move(victim: BrokerProcess, watch: Side, queue: str) -> int:
    """kill -9 `victim` once `queue` at `watch` holds a tenth or more but not all of the backlog;
    returns how many were there."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        n = watch.depth(queue)
        if N // 10 < n < N:
            victim.kill()
            return n
        assert n < N, "the move finished before the kill: make it slower"
        time.sleep(0.01)
    raise AssertionError("the move did not start")


def test_V2_kill9_destination_mid_move_loses_nothing(
        two: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = two
    sa, sb = _sides(a, b)
    sa.publish("src", N)
    assert sa.put("move", {"src-uri": sa.local, "src-queue": "src", "dest-uri": sb.remote,
                           "dest-queue": "dst", "ack-mode": "on-confirm",
                           "src-prefetch-count": 20, "reconnect-delay": 1}).status == 201
    at_kill = _kill_mid_move(b, sb, "dst")
    b.start()
    sb.t = http_target(b)
    sa.wait(lambda: sa.depth("src") == 0, "the source drained", timeout=120)
    sa.wait(lambda: sa.t.call("GET", f"/api/queues/{sa.vhost}/src").body
            .get("messages_unacknowledged") == 0, "nothing unacked at the source", 60)
    ids = _ids(sb, "dst")
    missing = {f"id{i}" for i in range(N)} - set(ids)
    duplicates = sum(ids.values()) - len(ids)
    print(f"kill -9 of the destination at {at_kill}/{N}: {len(missing)} lost, "
          f"{duplicates} duplicates")
    assert not missing
    assert set(ids) == {f"id{i}" for i in range(N)}


def test_V2_kill9_source_mid_move_loses_nothing(
        two: tuple[BrokerProcess, BrokerProcess]) -> None:
    """The shovel runs in the source broker: kill -9 takes both; after the restart the
    saved shovel starts again and moves what was not confirmed."""
    a, b = two
    sa, sb = _sides(a, b)
    sa.publish("src", N)
    assert sa.put("move", {"src-uri": sa.local, "src-queue": "src", "dest-uri": sb.remote,
                           "dest-queue": "dst", "ack-mode": "on-confirm",
                           "src-prefetch-count": 20, "reconnect-delay": 1}).status == 201
    at_kill = _kill_mid_move(a, sb, "dst")
    a.start()
    sa.t = http_target(a)
    sa.wait(lambda: sa.depth("src") == 0, "the source drained", timeout=120)
    sa.wait(lambda: sb.depth("dst") >= N, "everything at the destination", 60)
    time.sleep(1)  # the last confirms' acks
    ids = _ids(sb, "dst")
    missing = {f"id{i}" for i in range(N)} - set(ids)
    duplicates = sum(ids.values()) - len(ids)
    print(f"kill -9 of the source at {at_kill}/{N}: {len(missing)} lost, "
          f"{duplicates} duplicates")
    assert not missing


def test_V2_dedup_queue_at_an_ackmq_destination_removes_the_duplicates(
        two: tuple[BrokerProcess, BrokerProcess]) -> None:
    """The destination queue deduplicates by x-deduplication-header (docs/dedup.md): the
    copies a kill -9 of the destination causes are dropped there, so exactly N arrive."""
    a, b = two
    sa, sb = _sides(a, b)
    sa.publish("src", N, dedup=True)
    assert sa.put("move", {"src-uri": sa.local, "src-queue": "src", "dest-uri": sb.remote,
                           "dest-queue": "dst", "dest-queue-args":
                               {"x-message-deduplication": True},
                           "src-prefetch-count": 20, "reconnect-delay": 1}).status == 201
    _kill_mid_move(b, sb, "dst")
    b.start()
    sb.t = http_target(b)
    sa.wait(lambda: sa.depth("src") == 0, "the source drained", timeout=120)
    sa.wait(lambda: sa.t.call("GET", f"/api/queues/{sa.vhost}/src").body
            .get("messages_unacknowledged") == 0, "nothing unacked at the source", 60)
    ids = _ids(sb, "dst")
    assert set(ids) == {f"id{i}" for i in range(N)}
    assert sum(ids.values()) == N  # no duplicate


@pytest.mark.rabbitmq
def test_V1_rabbitmqs_shovel_moves_into_ackmq(tmp_path: Path) -> None:
    """The other way: RabbitMQ 3.10's own shovel with an ackmq as its destination
    (on-confirm: ackmq's confirms after fsync are what it waits for)."""
    a = BrokerProcess(tmp_path / "a", "--http-port", "0")
    a.start()
    sa = make_side("ackmq", http_target(a), a.url)
    sr = make_side("rabbitmq", Target("rabbitmq", rabbit_http(), RABBIT_AMQP), RABBIT_AMQP)
    try:
        sr.publish("src", 200)
        assert sr.put("to-ackmq", {"src-uri": sr.local, "src-queue": "src",
                                   "dest-uri": sa.remote, "dest-queue": "dst",
                                   "ack-mode": "on-confirm",
                                   "src-delete-after": "queue-length"}).status == 201
        sa.wait(lambda: sa.depth("dst") == 200, "200 moved into ackmq")
        assert [b for b, _p in sa.drain("dst")] == [b"m%d" % i for i in range(200)]
        sr.wait(lambda: sr.depth("src") == 0, "acked at RabbitMQ")
    finally:
        drop_side(sr)
        a.stop()
