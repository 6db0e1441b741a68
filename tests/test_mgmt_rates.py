"""M1: message_stats in the management API — the counts and rates rabbitmqadmin and
dashboards read from /api/overview and /api/queues, as RabbitMQ 3.10 reports them."""

from __future__ import annotations

from typing import Any

import pika
from support.mgmthelp import Target, q
from support.mgmthelp import poll as _poll


def test_M1_message_stats_count_publishes_deliveries_and_acks(mgmt: Target) -> None:
    name = mgmt.name("rates")
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.amqp_url))
    try:
        ch = conn.channel()
        ch.queue_declare(name, auto_delete=False)
        mgmt.cleanup.append(("queue", name))
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("", name, b"m%d" % i)
        for _ in range(10):
            method, _props, _body = ch.basic_get(name)
            assert method is not None
            ch.basic_ack(method.delivery_tag)

        def done(body: dict[str, Any]) -> bool:
            ms = body.get("message_stats", {})
            return ms.get("publish") == 30 and ms.get("ack") == 10

        queue = _poll(mgmt, f"/api/queues/{q('/')}/{q(name)}", done)
        ms = queue["message_stats"]
        assert (ms["publish"], ms["deliver_get"], ms["ack"]) == (30, 10, 10), ms
        for key in ("publish", "deliver_get", "ack"):
            assert set(ms[key + "_details"]) >= {"rate"}, ms
            assert isinstance(ms[key + "_details"]["rate"], int | float)
        listed = [x for x in mgmt.call("GET", f"/api/queues/{q('/')}").body
                  if x["name"] == name]
        assert listed and listed[0]["message_stats"]["publish"] == 30

        overview = _poll(mgmt, "/api/overview",
                         lambda b: b.get("message_stats", {}).get("publish", 0) >= 30)
        oms = overview["message_stats"]
        for key in ("publish", "confirm", "deliver_get", "ack"):
            assert oms.get(key, 0) >= (30 if key in ("publish", "confirm") else 10), oms
            assert "rate" in oms[key + "_details"], oms
    finally:
        conn.close()
        mgmt.forget()
