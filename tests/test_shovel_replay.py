"""V4 replay: a dead-letter queue's messages moved back to where each died (its
x-first-death-queue) or to a queue named, from the API, ctl and the UI, through a
self-deleting on-confirm shovel (src-delete-after): order kept, x-death kept, nothing
left behind, and the shovel visible while it runs. RabbitMQ has no such route (its UI
moves messages with a shovel whose destination is one queue): ackmq's own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pika
import pytest
from conftest import BrokerProcess
from support.mgmthelp import q
from support.shovelhelp import Side, drop_side, http_target, make_side


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("replay"), "--http-port", "0")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def side(broker: BrokerProcess) -> Iterator[Side]:
    s = make_side("ackmq", http_target(broker), broker.url)
    yield s
    drop_side(s)


def _dead_letter(s: Side, counts: dict[str, int]) -> None:
    """Each queue of `counts` gets that many messages, all rejected into `dlq`."""
    conn = s.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dlq", durable=True)
    for queue, n in counts.items():
        ch.queue_declare(queue, durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
        for i in range(n):
            ch.basic_publish("", queue, f"{queue}-{i}".encode(),
                             pika.BasicProperties(delivery_mode=2))
        for _ in range(n):
            m, _p, _b = ch.basic_get(queue)
            ch.basic_reject(m.delivery_tag, requeue=False)
    conn.close()
    s.wait(lambda: s.depth("dlq") == sum(counts.values()), "dead-lettered")


def _replay(s: Side, body: dict[str, object], queue: str = "dlq") -> object:
    return s.t.call("POST", f"/api/queues/{q(s.vhost)}/{q(queue)}/replay", body)


def test_V4_replay_back_to_each_x_first_death_queue(side: Side) -> None:
    _dead_letter(side, {"orders": 10, "invoices": 5})
    r = _replay(side, {})
    assert r.status == 201, r
    name = r.body["shovel"]
    assert r.body["value"]["src-delete-after"] == "queue-length"
    side.wait(lambda: side.depth("dlq") == 0, "the dead-letter queue drained")
    side.wait(lambda: side.status(name) is None, "the replay shovel deleted itself")
    orders = side.drain("orders")
    assert [b for b, _p in orders] == [f"orders-{i}".encode() for i in range(10)]
    assert orders[0][1].headers["x-first-death-queue"] == "orders"
    assert orders[0][1].headers["x-death"][0]["reason"] == "rejected"
    assert [b for b, _p in side.drain("invoices")] == \
        [f"invoices-{i}".encode() for i in range(5)]


def test_V4_replay_to_a_named_queue_and_a_count(side: Side) -> None:
    _dead_letter(side, {"orders": 8})
    r = _replay(side, {"destination": "parking", "count": 3})
    assert r.status == 201, r
    side.wait(lambda: side.depth("parking") == 3, "3 parked")
    side.wait(lambda: side.status(r.body["shovel"]) is None, "the shovel deleted itself")
    assert side.depth("dlq") == 5
    assert [b for b, _p in side.drain("parking")] == [f"orders-{i}".encode()
                                                      for i in range(3)]


def test_V4_replay_bad_requests(side: Side) -> None:
    _dead_letter(side, {"orders": 1})
    assert _replay(side, {}, queue="no-such-queue").status == 404
    for body, reason in (({"count": 0}, "count must be a positive integer"),
                         ({"count": "all"}, "count must be a positive integer"),
                         ({"destination": ""}, "destination must be a queue name"),
                         ({"destination": 5}, "destination must be a queue name")):
        r = _replay(side, body)
        assert (r.status, r.body["reason"]) == (400, reason), r
    assert side.depth("dlq") == 1


def test_V4_ctl_replay_messages(broker: BrokerProcess, side: Side) -> None:
    _dead_letter(side, {"orders": 4})
    r = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                        str(broker.data_dir), "replay_messages", "-p", side.vhost, "dlq"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f'Replaying the messages of queue "dlq" in vhost '
                               f'"{side.vhost}" ...\nStarted shovel replay-dlq-')
    side.wait(lambda: side.depth("orders") == 4, "back in orders")
    r = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                        str(broker.data_dir), "replay_messages", "-p", side.vhost, "nope"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 69 and "no queue 'nope'" in r.stderr, r
