"""Other clients users bring, unchanged: kombu (Celery's transport) over py-amqp."""

from __future__ import annotations

import pytest

kombu = pytest.importorskip("kombu")


def test_kombu_priority_queue_with_manual_acks(broker_url: str, qname: str) -> None:
    from kombu import Connection, Consumer, Exchange, Producer, Queue

    url = broker_url.rstrip("/") + "//"  # kombu spells vhost "/" as a second slash
    ex = Exchange(qname + ".x", type="direct", durable=True)
    q = Queue(qname, ex, routing_key="k", durable=True,
              queue_arguments={"x-max-priority": 10})
    with Connection(url) as conn:
        prod = Producer(conn.channel(), exchange=ex)
        for i in range(20):
            prod.publish({"i": i}, routing_key="k", declare=[q], priority=i % 10,
                         delivery_mode=2)
        got: list[int] = []

        def on_message(body: dict, message) -> None:  # type: ignore[no-untyped-def]
            got.append(body["i"])
            message.ack()

        with Consumer(conn, queues=[q], callbacks=[on_message], accept=["json"],
                      prefetch_count=5):
            while len(got) < 20:
                conn.drain_events(timeout=10)
        q(conn.default_channel).delete()
        ex(conn.default_channel).delete()
    assert got == [i for p in range(9, -1, -1) for i in (p, p + 10)]
