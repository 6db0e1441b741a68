"""V5 the way out: a running ackmq moved to a RabbitMQ node (docs/migrating.md) —
definitions (policies and shovels included) imported there, every queue's backlog
shovelled on-confirm, the publisher and the consumer repointed while messages flow —
with every confirmed message arriving, none lost, duplicates counted.

Uses a vhost of its own on the shared RabbitMQ (same name as on ackmq, so that the
shovels' `amqp:///<vhost>` URIs mean the same there), deleted afterwards."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess
from support.mgmthelp import Target, q, rabbit_http
from support.shovelhelp import RABBIT_AMQP, Side, drop_side, http_target, make_side

QUEUES = {"orders": "order.*", "invoices": "invoice.*", "audit": "#"}
BACKLOG = 300


class Publisher(threading.Thread):
    """Publishes order.<i> with confirms to `url`, switching to `next_url` when told;
    remembers the ids confirmed."""

    def __init__(self, url: str, next_url: str) -> None:
        super().__init__(daemon=True)
        self.urls = [url, next_url]
        self.switch, self.stop = threading.Event(), threading.Event()
        self.confirmed: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            i = 0
            for n, url in enumerate(self.urls):
                conn = pika.BlockingConnection(pika.URLParameters(url))
                ch = conn.channel()
                ch.confirm_delivery()
                while not (self.switch.is_set() if n == 0 else self.stop.is_set()):
                    mid = f"live-{i}"
                    ch.basic_publish("events", "order.live", mid.encode(),
                                     pika.BasicProperties(delivery_mode=2, message_id=mid))
                    self.confirmed.append(mid)
                    i += 1
                    time.sleep(0.002)
                conn.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


class Consumer(threading.Thread):
    """Consumes `orders` (manual acks) from `url`, then from `next_url` when told."""

    def __init__(self, url: str, next_url: str) -> None:
        super().__init__(daemon=True)
        self.urls = [url, next_url]
        self.switch, self.stop = threading.Event(), threading.Event()
        self.got: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for n, url in enumerate(self.urls):
                conn = pika.BlockingConnection(pika.URLParameters(url))
                ch = conn.channel()
                ch.basic_qos(prefetch_count=50)
                done = self.switch if n == 0 else self.stop
                for m, props, _body in ch.consume("orders", inactivity_timeout=0.2):
                    if m is not None:
                        self.got[props.message_id] += 1
                        ch.basic_ack(m.delivery_tag)
                    if done.is_set():
                        break
                ch.cancel()
                conn.close()
        except BaseException as e:  # noqa: BLE001
            self.error = e


@pytest.mark.rabbitmq
def test_V5_move_a_running_ackmq_to_rabbitmq(tmp_path: Path) -> None:
    target = Target("rabbitmq", rabbit_http(), RABBIT_AMQP)
    a = BrokerProcess(tmp_path / "a", "--http-port", "0")
    a.start()
    sa = make_side("ackmq", http_target(a), a.url)
    sr = Side("rabbitmq", target, sa.vhost, RABBIT_AMQP)
    try:
        # a topology with a backlog, a policy and an application's shovel on ackmq
        conn = sa.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("events", "topic", durable=True)
        for queue, key in QUEUES.items():
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, "events", key)
        assert sa.t.call("PUT", f"/api/policies/{q(sa.vhost)}/audit-cap", {
            "pattern": "^audit$", "definition": {"max-length": 100000},
            "apply-to": "queues"}).status in (201, 204)
        assert sa.put("archive", {"src-uri": sa.local, "src-exchange": "events",
                                  "src-exchange-key": "invoice.*", "dest-uri": sa.local,
                                  "dest-queue": "archive"}).status == 201
        sa.wait_state("archive", "running")
        for i in range(BACKLOG):
            for kind in ("order", "invoice"):
                ch.basic_publish("events", f"{kind}.old", f"{kind}-{i}".encode(),
                                 pika.BasicProperties(delivery_mode=2,
                                                      message_id=f"{kind}-{i}"))
        conn.close()
        sa.wait(lambda: sa.depth("archive") == BACKLOG, "archived")

        # 1. definitions: ackmq -> RabbitMQ (same vhost name there)
        defs = sa.t.call("GET", f"/api/definitions/{q(sa.vhost)}").body
        assert target.call("PUT", f"/api/vhosts/{q(sa.vhost)}").status in (201, 204)
        target.call("PUT", f"/api/permissions/{q(sa.vhost)}/guest",
                    {"configure": ".*", "write": ".*", "read": ".*"})
        r = target.call("POST", f"/api/definitions/{q(sa.vhost)}", defs)
        assert r.status in (200, 201, 204), r
        assert target.call("GET", f"/api/policies/{q(sa.vhost)}/audit-cap").status == 200
        sr.wait_state("archive", "running")  # the application's shovel runs there now

        # 2. live clients on ackmq
        pub = Publisher(sa.amqp, sr.amqp)
        sub = Consumer(sa.amqp, sr.amqp)
        pub.start()
        sub.start()
        time.sleep(1)

        # 3. every queue's backlog shovelled on-confirm to RabbitMQ, clients repointed
        for queue in [*QUEUES, "archive"]:
            assert sa.put(f"out-{queue}", {"src-uri": sa.local, "src-queue": queue,
                                           "dest-uri": sr.remote, "dest-queue": queue,
                                           "ack-mode": "on-confirm"}).status == 201
        time.sleep(1)
        pub.switch.set()
        time.sleep(0.5)
        sub.switch.set()
        for queue in [*QUEUES, "archive"]:
            sa.wait(lambda queue=queue: sa.t.call(  # type: ignore[misc]
                "GET", f"/api/queues/{q(sa.vhost)}/{queue}").body.get("messages", -1) == 0
                and sa.depth(queue) == 0, f"{queue} drained on ackmq", 120)
        time.sleep(1)
        pub.stop.set()
        pub.join(30)
        sr.wait(lambda: sr.depth("orders") == 0, "the consumer caught up", 60)
        sub.stop.set()
        sub.join(30)
        assert pub.error is None and sub.error is None, (pub.error, sub.error)

        # 4. nothing lost
        expected_orders = {f"order-{i}" for i in range(BACKLOG)} | set(pub.confirmed)
        missing = expected_orders - set(sub.got)
        duplicates = sum(sub.got.values()) - len(sub.got)
        invoices = Counter(p.message_id for _b, p in sr.drain("invoices"))
        archive = Counter(p.message_id for _b, p in sr.drain("archive"))
        audit = Counter(p.message_id for _b, p in sr.drain("audit"))
        print(f"V5: {len(pub.confirmed)} live publishes, {len(expected_orders)} orders, "
              f"0 expected lost, {len(missing)} lost, {duplicates} duplicate orders, "
              f"{sum(invoices.values()) - len(invoices)} duplicate invoices")
        assert not missing
        assert set(invoices) == {f"invoice-{i}" for i in range(BACKLOG)}
        assert set(archive) == {f"invoice-{i}" for i in range(BACKLOG)}
        assert set(audit) >= {f"invoice-{i}" for i in range(BACKLOG)} | {
            f"order-{i}" for i in range(BACKLOG)}
    finally:
        for queue in [*QUEUES, "archive"]:
            sa.delete(f"out-{queue}")
        drop_side(sr)
        drop_side(sa)
        a.stop()
