"""In-process: `VHost.bindings_to`, what MQTT restores a persistent session's
subscriptions from (N4): every binding to a queue, from any exchange, with its arguments
(an MQTT 5 subscription's options), and none once unbound or deleted; and
`VHost.set_queue_arguments`, how a session's expiry interval reaches its queues."""

from __future__ import annotations

from ackmq.broker.broker import BrokerModel, NullScheduler


def test_N4_bindings_to_lists_a_queues_bindings() -> None:
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhost("/")
    q = vh.declare_queue("mqtt-subscription-c1qos1", False, False, False, False, {}, None)
    other = vh.declare_queue("other", False, False, False, False, {}, None)
    opts = {"x-mqtt-subscription-opts": {"qos": 1, "no-local": True}}
    vh.bind("amq.topic", q, "a.*.c", {})
    vh.bind("amq.topic", q, "x.#", opts)
    vh.bind("amq.direct", q, "d", {})
    vh.bind("amq.topic", other, "a.*.c", {})
    assert sorted(vh.bindings_to(q)) == [("amq.direct", "d", {}), ("amq.topic", "a.*.c", {}),
                                         ("amq.topic", "x.#", opts)]
    vh.unbind("amq.topic", "queue", q.name, "x.#", opts)
    assert sorted(vh.bindings_to(q)) == [("amq.direct", "d", {}), ("amq.topic", "a.*.c", {})]
    vh.delete_queue(q)
    assert vh.bindings_to(q) == []
    assert vh.bindings_to(other) == [("amq.topic", "a.*.c", {})]


def test_N4_set_queue_arguments_changes_x_expires() -> None:
    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhost("/")
    q = vh.declare_queue("mqtt-subscription-c2qos1", False, True, False, False,
                         {"x-expires": 300_000}, None)
    assert q.expires == 300_000
    vh.set_queue_arguments(q, {"x-expires": 60_000})
    assert q.arguments == {"x-expires": 60_000} and q.expires == 60_000
    vh.set_queue_arguments(q, {})
    assert q.expires is None
