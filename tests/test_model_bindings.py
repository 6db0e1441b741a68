"""In-process: `VHost.bindings_to`, what MQTT restores a persistent session's
subscriptions from (N4): every binding to a queue, from any exchange, and none once
unbound or deleted."""

from __future__ import annotations

from ackmq.broker.broker import BrokerModel, NullScheduler


def test_N4_bindings_to_lists_a_queues_bindings() -> None:
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhost("/")
    q = vh.declare_queue("mqtt-subscription-c1qos1", False, False, False, False, {}, None)
    other = vh.declare_queue("other", False, False, False, False, {}, None)
    vh.bind("amq.topic", q, "a.*.c", {})
    vh.bind("amq.topic", q, "x.#", {})
    vh.bind("amq.direct", q, "d", {})
    vh.bind("amq.topic", other, "a.*.c", {})
    assert sorted(vh.bindings_to(q)) == [("amq.direct", "d"), ("amq.topic", "a.*.c"),
                                         ("amq.topic", "x.#")]
    vh.unbind("amq.topic", "queue", q.name, "x.#", {})
    assert sorted(vh.bindings_to(q)) == [("amq.direct", "d"), ("amq.topic", "a.*.c")]
    vh.delete_queue(q)
    assert vh.bindings_to(q) == []
    assert vh.bindings_to(other) == [("amq.topic", "a.*.c")]
