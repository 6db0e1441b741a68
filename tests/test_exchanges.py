"""Exchanges: routing by type, predeclared exchanges, declare/delete rules and error texts.

Every test passes against RabbitMQ 3.10 (ACKMQ_TEST_URL=amqp://...:5672/): the reply
codes and reply texts asserted here are RabbitMQ's, byte for byte.
"""

from __future__ import annotations

import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ConnectionClosedByBroker, UnroutableError
from support.pikahelp import WAIT, closed_with, uniq


def bodies(ch: BlockingChannel, queue: str, settle: float = 0.0) -> list[bytes]:
    """Every ready message's body, auto-acked, in order (after an optional settle time)."""
    if settle:
        time.sleep(settle)
    out: list[bytes] = []
    while True:
        m, _p, b = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append(b)


def new_queue(ch: BlockingChannel) -> str:
    return ch.queue_declare("", exclusive=True).method.queue


def sync(ch: BlockingChannel) -> None:
    """A round trip, so asynchronous errors (publish) surface as exceptions."""
    ch.basic_qos(prefetch_count=0)


# ------------------------------------------------------------------ routing


def test_direct_exchange_routes_by_exact_key(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    ex = uniq("ex.direct")
    channel.exchange_declare(ex, "direct", auto_delete=True)
    q1, q2, q3 = new_queue(channel), new_queue(channel), new_queue(channel)
    channel.queue_bind(q1, ex, "red")
    channel.queue_bind(q2, ex, "green")
    channel.queue_bind(q3, ex, "red")
    channel.queue_bind(q3, ex, "green")
    for key in ["red", "green", "blue", "Red", "red.x", ""]:
        channel.basic_publish(ex, key, key.encode())
    sync(channel)
    assert bodies(channel, q1, 0.1) == [b"red"]
    assert bodies(channel, q2) == [b"green"]
    assert bodies(channel, q3) == [b"red", b"green"]


def test_one_copy_per_queue_even_with_several_matching_bindings(
        channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    ex = uniq("ex.topic")
    channel.exchange_declare(ex, "topic", auto_delete=True)
    q = new_queue(channel)
    for key in ["a.b", "a.*", "#", "*.b"]:
        channel.queue_bind(q, ex, key)
    channel.basic_publish(ex, "a.b", b"once")
    assert bodies(channel, q, 0.1) == [b"once"]


def test_fanout_ignores_routing_key(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    ex = uniq("ex.fanout")
    channel.exchange_declare(ex, "fanout", auto_delete=True)
    q1, q2 = new_queue(channel), new_queue(channel)
    channel.queue_bind(q1, ex, "whatever")
    channel.queue_bind(q2, ex)
    channel.basic_publish(ex, "any.key", b"1")
    channel.basic_publish(ex, "", b"2")
    assert bodies(channel, q1, 0.1) == [b"1", b"2"]
    assert bodies(channel, q2) == [b"1", b"2"]


TOPIC_CASES: list[tuple[str, list[str], list[str]]] = [
    # pattern, keys that match, keys that do not
    ("a.b.c", ["a.b.c"], ["a.b", "a.b.c.d", "a.x.c", "A.b.c"]),
    ("a.*", ["a.b", "a.", "a.xyz"], ["a", "a.b.c", "b.a", ""]),
    ("*", ["a", "xyz"], ["a.b", ".", ""]),  # "" is zero words, "." is two empty ones
    ("*.*", ["a.b", ".", "a.", ".b"], ["a", "a.b.c", ""]),
    ("#", ["", "a", "a.b", "a.b.c", ".", ".."], []),
    ("a.#", ["a", "a.b", "a.b.c", "a."], ["b", "b.a", "ab", ""]),
    ("#.a", ["a", "x.a", "x.y.a", ".a"], ["a.x", "xa", ""]),
    ("a.#.b", ["a.b", "a.x.b", "a.x.y.b", "a..b"], ["a.b.c", "b", "a", "x.a.b"]),
    ("a.*.b", ["a.x.b", "a..b"], ["a.b", "a.x.y.b"]),
    ("*.#", ["a", "a.b", "a.b.c"], [""]),
    ("#.*", ["a", "a.b", "a.b.c"], [""]),
    ("#.#", ["", "a", "a.b"], []),
    ("a.*.#", ["a.b", "a.b.c", "a."], ["a", "b.c"]),
    ("", [""], ["a", "."]),
    ("a..b", ["a..b"], ["a.b", "a.x.b"]),
]


@pytest.mark.parametrize("pattern,yes,no", TOPIC_CASES,
                         ids=[repr(c[0]) for c in TOPIC_CASES])
def test_topic_exchange_matching(channel: BlockingChannel, pattern: str, yes: list[str],
                                 no: list[str]) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    ex = uniq("ex.topic")
    channel.exchange_declare(ex, "topic", auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, ex, pattern)
    for key in yes + no:
        channel.basic_publish(ex, key, key.encode())
    assert bodies(channel, q, 0.1) == [k.encode() for k in yes]


def test_topic_bindings_added_and_removed(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    ex = uniq("ex.topic")
    channel.exchange_declare(ex, "topic", auto_delete=True)
    q1, q2 = new_queue(channel), new_queue(channel)
    channel.queue_bind(q1, ex, "stock.#")
    channel.queue_bind(q2, ex, "*.usd")
    channel.basic_publish(ex, "stock.usd", b"1")
    channel.queue_unbind(q1, ex, "stock.#")
    channel.basic_publish(ex, "stock.usd", b"2")
    assert bodies(channel, q1, 0.1) == [b"1"]
    assert bodies(channel, q2) == [b"1", b"2"]


HEADERS_CASES: list[tuple[dict, list[dict | None], list[dict | None]]] = [
    # binding arguments, message headers that match, headers that do not
    ({"x-match": "all", "a": 1, "b": "x"},
     [{"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}],
     [{"a": 1}, {"a": 2, "b": "x"}, {"b": "x"}, {}, None, {"a": "1", "b": "x"}]),
    ({"a": 1, "b": "x"},  # x-match defaults to all
     [{"a": 1, "b": "x"}],
     [{"a": 1}, None]),
    ({"x-match": "any", "a": 1, "b": "x"},
     [{"a": 1}, {"b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}],
     [{"a": 2}, {"c": 1}, {}, None]),
    ({"x-match": "all"},  # no keys to compare: everything matches
     [{"a": 1}, {}, None],
     []),
    ({"x-match": "all", "x-k": "v"},  # all ignores x- keys
     [{"x-k": "v"}, {"x-k": "other"}, {}, None],
     []),
    ({"x-match": "any", "x-k": "v", "a": 1},  # any ignores x- keys
     [{"a": 1}],
     [{"x-k": "v"}, None]),
    ({"x-match": "all-with-x", "x-k": "v", "a": 1},
     [{"x-k": "v", "a": 1}],
     [{"a": 1}, {"x-k": "v"}, {"x-k": "w", "a": 1}]),
    ({"x-match": "any-with-x", "x-k": "v", "a": 1},
     [{"x-k": "v"}, {"a": 1}, {"x-k": "v", "a": 2}],
     [{"x-k": "w"}, {"a": 2}, None]),
]


@pytest.mark.parametrize("binding,yes,no", HEADERS_CASES,
                         ids=[str(i) for i in range(len(HEADERS_CASES))])
def test_headers_exchange_matching(channel: BlockingChannel, binding: dict,
                                   yes: list[dict | None], no: list[dict | None]) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    ex = uniq("ex.headers")
    channel.exchange_declare(ex, "headers", auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, ex, "ignored.key", arguments=binding)
    msgs = yes + no
    for i, headers in enumerate(msgs):
        channel.basic_publish(ex, f"k{i}", str(i).encode(),
                              pika.BasicProperties(headers=headers))
    assert bodies(channel, q, 0.1) == [str(i).encode() for i in range(len(yes))]


def test_headers_exchange_invalid_x_match_406(channel: BlockingChannel) -> None:
    q = new_queue(channel)
    closed_with(lambda: channel.queue_bind(q, "amq.headers",
                                           arguments={"x-match": "foo"}),
                406, 'PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; '
                     "expected all, any, all-with-x, or any-with-x")


def test_default_exchange_routes_by_queue_name(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    q = new_queue(channel)
    channel.basic_publish("", q, b"direct-to-queue")
    channel.basic_publish("", q + ".nope", b"lost")
    assert bodies(channel, q, 0.1) == [b"direct-to-queue"]


def test_unroutable_mandatory_is_returned(connection, channel: BlockingChannel) -> None:
    ex = uniq("ex.direct")
    channel.exchange_declare(ex, "direct", auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, ex, "k")  # keep the exchange alive
    returned: list = []
    channel.add_on_return_callback(lambda c, m, p, b: returned.append((m, b)))
    channel.basic_publish(ex, "no.route", b"r", mandatory=True)
    deadline = time.monotonic() + WAIT
    while not returned and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert returned
    m, b = returned[0]
    assert (m.reply_code, m.reply_text, m.exchange, m.routing_key, b) == (
        312, "NO_ROUTE", ex, "no.route", b"r")


# ------------------------------------------------------------ default exchange

DEFAULT_403 = "ACCESS_REFUSED - operation not permitted on the default exchange"


def test_default_exchange_cannot_be_bound_to(channel: BlockingChannel) -> None:
    q = new_queue(channel)
    closed_with(lambda: channel.queue_bind(q, "", "x"), 403, DEFAULT_403)


def test_default_exchange_cannot_be_unbound_from(channel: BlockingChannel) -> None:
    q = new_queue(channel)
    closed_with(lambda: channel.queue_unbind(q, "", q), 403, DEFAULT_403)


@pytest.mark.parametrize("passive", [False, True])
def test_default_exchange_cannot_be_declared(channel: BlockingChannel,
                                             passive: bool) -> None:
    closed_with(lambda: channel.exchange_declare("", "direct", passive=passive), 403,
                DEFAULT_403)


def test_default_exchange_cannot_be_deleted(channel: BlockingChannel) -> None:
    closed_with(lambda: channel.exchange_delete(""), 403, DEFAULT_403)


def test_default_exchange_cannot_be_exchange_bound(channel: BlockingChannel) -> None:
    closed_with(lambda: channel.exchange_bind("", "amq.fanout"), 403, DEFAULT_403)


# ------------------------------------------------------------ predeclared


@pytest.mark.parametrize("name,kind", [("amq.direct", "direct"), ("amq.fanout", "fanout"),
                                       ("amq.topic", "topic"), ("amq.headers", "headers"),
                                       ("amq.match", "headers")])
def test_amq_exchanges_predeclared(channel: BlockingChannel, name: str, kind: str) -> None:
    channel.exchange_declare(name, passive=True)
    channel.exchange_declare(name, kind, durable=True)  # equivalent redeclare is fine


def test_amq_exchanges_route(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    q = new_queue(channel)
    channel.queue_bind(q, "amq.direct", q)
    channel.queue_bind(q, "amq.topic", q + ".#")
    channel.queue_bind(q, "amq.match", arguments={"x-match": "any", "tag": q})
    channel.basic_publish("amq.direct", q, b"d")
    channel.basic_publish("amq.topic", q + ".x.y", b"t")
    channel.basic_publish("amq.match", "", b"m", pika.BasicProperties(headers={"tag": q}))
    assert bodies(channel, q, 0.1) == [b"d", b"t", b"m"]


def test_amq_exchange_redeclare_non_durable_406(channel: BlockingChannel) -> None:
    closed_with(lambda: channel.exchange_declare("amq.direct", "direct", durable=False), 406,
                "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' "
                "in vhost '/': received 'false' but current is 'true'")


def test_declare_amq_prefix_refused_403(channel: BlockingChannel) -> None:
    closed_with(lambda: channel.exchange_declare("amq.x", "direct"), 403,
                "ACCESS_REFUSED - exchange name 'amq.x' contains reserved prefix 'amq.*'")


def test_delete_amq_exchange_refused_403(channel: BlockingChannel) -> None:
    closed_with(lambda: channel.exchange_delete("amq.direct"), 403,
                "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' "
                "not allowed")


# ------------------------------------------------------------ declare / delete


def test_declare_passive_missing_404(channel: BlockingChannel) -> None:
    name = uniq("missing.ex")
    closed_with(lambda: channel.exchange_declare(name, passive=True), 404,
                f"NOT_FOUND - no exchange '{name}' in vhost '/'")


def test_declare_passive_existing_ok(channel: BlockingChannel) -> None:
    name = uniq("ex")
    channel.exchange_declare(name, "topic", auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, name, "#")
    channel.exchange_declare(name, "fanout", passive=True)  # passive ignores the type


def test_declare_unknown_type_closes_connection_503(params) -> None:
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.exchange_declare(uniq("ex"), "no-such-type")
    assert ei.value.reply_code == 503
    assert ei.value.reply_text == "COMMAND_INVALID - unknown exchange type 'no-such-type'"


@pytest.mark.parametrize("first,second,arg,received,current", [
    ({"exchange_type": "direct"}, {"exchange_type": "fanout"}, "type", "fanout", "direct"),
    ({"exchange_type": "topic"}, {"exchange_type": "topic", "durable": True},
     "durable", "true", "false"),
    ({"exchange_type": "topic"}, {"exchange_type": "topic", "auto_delete": False},
     "auto_delete", "false", "true"),
    ({"exchange_type": "topic"}, {"exchange_type": "topic", "internal": True},
     "internal", "true", "false"),
], ids=["type", "durable", "auto_delete", "internal"])
def test_redeclare_inequivalent_406(channel: BlockingChannel, first: dict, second: dict,
                                    arg: str, received: str, current: str) -> None:
    name = uniq("ex.redecl")
    channel.exchange_declare(name, auto_delete=True, **first)
    second = {"auto_delete": True, **second}
    closed_with(lambda: channel.exchange_declare(name, **second), 406,
                f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange '{name}' in "
                f"vhost '/': received '{received}' but current is '{current}'")


def test_redeclare_equivalent_ok(channel: BlockingChannel) -> None:
    name = uniq("ex.redecl")
    channel.exchange_declare(name, "topic", auto_delete=True)
    channel.exchange_declare(name, "topic", auto_delete=True)
    channel.exchange_delete(name)


def test_durable_exchange_declare_and_delete(channel: BlockingChannel) -> None:
    name = uniq("ex.durable")
    channel.exchange_declare(name, "direct", durable=True)
    try:
        channel.exchange_declare(name, "direct", durable=True)
    finally:
        channel.exchange_delete(name)
    closed_with(lambda: channel.exchange_declare(name, passive=True), 404)


def test_internal_exchange_cannot_be_published_to_403(channel: BlockingChannel) -> None:
    name = uniq("ex.internal")
    channel.exchange_declare(name, "fanout", internal=True, auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, name)
    channel.basic_publish(name, "", b"x")
    closed_with(lambda: sync(channel), 403,
                f"ACCESS_REFUSED - cannot publish to internal exchange '{name}' in vhost '/'")


def test_internal_exchange_reachable_through_exchange_binding(
        channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    src = uniq("ex.src")
    internal = uniq("ex.internal")
    channel.exchange_declare(src, "direct", auto_delete=True)
    channel.exchange_declare(internal, "fanout", internal=True, auto_delete=True)
    channel.exchange_bind(internal, src, "k")
    q = new_queue(channel)
    channel.queue_bind(q, internal)
    channel.basic_publish(src, "k", b"via-e2e")
    assert bodies(channel, q, 0.1) == [b"via-e2e"]


def test_publish_to_missing_exchange_404(connection, channel: BlockingChannel) -> None:
    name = uniq("missing.ex")
    channel.basic_publish(name, "k", b"x")
    closed_with(lambda: sync(channel), 404, f"NOT_FOUND - no exchange '{name}' in vhost '/'")
    assert connection.is_open
    connection.channel().basic_qos(prefetch_count=0)  # other channels go on


def test_delete_missing_exchange_is_ok(channel: BlockingChannel) -> None:
    channel.exchange_delete(uniq("missing.ex"))
    sync(channel)


def test_delete_if_unused_with_bindings_406(channel: BlockingChannel) -> None:
    name = uniq("ex.inuse")
    channel.exchange_declare(name, "fanout", auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, name)
    closed_with(lambda: channel.exchange_delete(name, if_unused=True), 406,
                f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use")


def test_delete_if_unused_without_bindings_ok(channel: BlockingChannel) -> None:
    name = uniq("ex.unused")
    channel.exchange_declare(name, "fanout")
    channel.exchange_delete(name, if_unused=True)
    closed_with(lambda: channel.exchange_declare(name, passive=True), 404)


def test_delete_exchange_removes_its_bindings(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    name = uniq("ex.del")
    channel.exchange_declare(name, "fanout")
    q = new_queue(channel)
    channel.queue_bind(q, name)
    channel.exchange_delete(name)
    channel.exchange_declare(name, "fanout", auto_delete=True)  # fresh, no bindings
    channel.basic_publish(name, "", b"x")
    assert bodies(channel, q, 0.1) == []


def test_auto_delete_exchange_goes_with_last_binding(channel: BlockingChannel) -> None:
    name = uniq("ex.autodel")
    channel.exchange_declare(name, "fanout", auto_delete=True)
    time.sleep(0.1)
    channel.exchange_declare(name, passive=True)  # never bound: it stays
    q1, q2 = new_queue(channel), new_queue(channel)
    channel.queue_bind(q1, name)
    channel.queue_bind(q2, name)
    channel.queue_unbind(q1, name)
    channel.exchange_declare(name, passive=True)  # one binding left
    channel.queue_unbind(q2, name)
    closed_with(lambda: channel.exchange_declare(name, passive=True), 404)


def test_auto_delete_exchange_goes_when_bound_queue_deleted(
        channel: BlockingChannel) -> None:
    name = uniq("ex.autodel")
    channel.exchange_declare(name, "fanout", auto_delete=True)
    q = new_queue(channel)
    channel.queue_bind(q, name)
    channel.queue_delete(q)
    closed_with(lambda: channel.exchange_declare(name, passive=True), 404)


# ------------------------------------------------------------ bindings


def test_bind_to_missing_exchange_404(channel: BlockingChannel) -> None:
    name = uniq("missing.ex")
    q = new_queue(channel)
    closed_with(lambda: channel.queue_bind(q, name, "k"), 404,
                f"NOT_FOUND - no exchange '{name}' in vhost '/'")


def test_bind_missing_queue_404(channel: BlockingChannel) -> None:
    name = uniq("missing.q")
    closed_with(lambda: channel.queue_bind(name, "amq.direct", "k"), 404,
                f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_bind_is_idempotent(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    q = new_queue(channel)
    channel.queue_bind(q, "amq.direct", q)
    channel.queue_bind(q, "amq.direct", q)
    channel.basic_publish("amq.direct", q, b"x")
    assert bodies(channel, q, 0.1) == [b"x"]
    channel.queue_unbind(q, "amq.direct", q)
    channel.basic_publish("amq.direct", q, b"y")
    assert bodies(channel, q, 0.1) == []


def test_unbind_missing_binding_is_ok(channel: BlockingChannel) -> None:
    q = new_queue(channel)
    channel.queue_unbind(q, "amq.direct", "never.bound")
    sync(channel)


def test_exchange_to_exchange_bind_and_unbind(channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    src = uniq("ex.src")
    dst = uniq("ex.dst")
    channel.exchange_declare(src, "topic")
    try:
        channel.exchange_declare(dst, "fanout", auto_delete=True)
        q = new_queue(channel)
        channel.queue_bind(q, dst)
        channel.exchange_bind(dst, src, "orders.*")
        channel.basic_publish(src, "orders.new", b"1")
        channel.basic_publish(src, "payments.new", b"2")
        assert bodies(channel, q, 0.1) == [b"1"]
        channel.exchange_unbind(dst, src, "orders.*")
        channel.basic_publish(src, "orders.new", b"3")
        assert bodies(channel, q, 0.1) == []
    finally:
        channel.exchange_delete(src)


def test_auto_delete_source_exchange_goes_with_last_exchange_binding(
        channel: BlockingChannel) -> None:
    src = uniq("ex.src")
    dst = uniq("ex.dst")
    channel.exchange_declare(src, "topic", auto_delete=True)
    channel.exchange_declare(dst, "fanout")
    try:
        channel.exchange_bind(dst, src, "k")
        channel.exchange_unbind(dst, src, "k")
        channel.exchange_declare(dst, passive=True)  # the destination is not auto-delete
        closed_with(lambda: channel.exchange_declare(src, passive=True), 404)
    finally:
        conn = channel.connection
        conn.channel().exchange_delete(dst)


def test_exchange_bindings_deliver_one_copy_and_survive_cycles(
        channel: BlockingChannel) -> None:
    channel.confirm_delivery()  # each publish is in its queues once it returns
    a = uniq("ex.a")
    b = uniq("ex.b")
    channel.exchange_declare(a, "fanout", auto_delete=True)
    channel.exchange_declare(b, "fanout", auto_delete=True)
    channel.exchange_bind(b, a)
    channel.exchange_bind(a, b)  # a cycle a -> b -> a
    q = new_queue(channel)
    channel.queue_bind(q, a)
    channel.queue_bind(q, b)  # reachable by two paths
    channel.basic_publish(a, "", b"x")
    channel.basic_publish(b, "", b"y")
    assert bodies(channel, q, 0.1) == [b"x", b"y"]


def test_exchange_bind_missing_source_or_destination_404(params) -> None:
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        name = uniq("missing.ex")
        closed_with(lambda: ch.exchange_bind("amq.fanout", name), 404,
                    f"NOT_FOUND - no exchange '{name}' in vhost '/'")
        ch = conn.channel()
        closed_with(lambda: ch.exchange_bind(name, "amq.fanout"), 404,
                    f"NOT_FOUND - no exchange '{name}' in vhost '/'")
    finally:
        conn.close()


# ------------------------------------------------------------ alternate exchange

def test_alternate_exchange_takes_unroutable_messages(connection,
                                                      channel: BlockingChannel) -> None:
    """What the exchange cannot route goes to its alternate exchange: delivered with the
    original exchange and routing key, confirmed, not returned although mandatory."""
    ae = uniq("ex.ae")
    x = uniq("ex.main")
    channel.exchange_declare(ae, "fanout", auto_delete=True)
    channel.exchange_declare(x, "direct", auto_delete=True, arguments={"alternate-exchange": ae})
    routed, spare = new_queue(channel), new_queue(channel)
    channel.queue_bind(routed, x, "k")
    channel.queue_bind(spare, ae)
    returned: list = []
    channel.add_on_return_callback(lambda c, m, p, b: returned.append(b))
    channel.confirm_delivery()
    channel.basic_publish(x, "k", b"routed", mandatory=True)
    channel.basic_publish(x, "other", b"spare", mandatory=True)  # acked: no UnroutableError
    connection.process_data_events(time_limit=0.1)
    assert returned == []
    assert bodies(channel, routed) == [b"routed"]  # the AE is only for the unroutable
    m, _p, b = channel.basic_get(spare, auto_ack=True)
    assert (m.exchange, m.routing_key, b) == (x, "other", b"spare")
    assert bodies(channel, spare) == []


def test_alternate_exchange_chain_and_internal(channel: BlockingChannel) -> None:
    """Alternate exchanges apply recursively; an internal exchange may be one."""
    a, b, c = uniq("ex.a"), uniq("ex.b"), uniq("ex.c")
    channel.exchange_declare(c, "fanout", auto_delete=True, internal=True)
    channel.exchange_declare(b, "direct", auto_delete=True, arguments={"alternate-exchange": c})
    channel.exchange_declare(a, "topic", auto_delete=True, arguments={"alternate-exchange": b})
    q = new_queue(channel)
    channel.queue_bind(q, c)
    channel.queue_bind(new_queue(channel), b, "keep")  # auto-delete exchanges need a binding
    channel.queue_bind(new_queue(channel), a, "keep")
    channel.confirm_delivery()
    channel.basic_publish(a, "r.k", b"m", mandatory=True)
    m, _p, body = channel.basic_get(q, auto_ack=True)
    assert (m.exchange, m.routing_key, body) == (a, "r.k", b"m")


def test_alternate_exchange_cycle_or_missing_is_returned(channel: BlockingChannel) -> None:
    """A cycle of alternate exchanges ends; a missing alternate routes nothing. Mandatory
    messages are returned only when no alternate could route them."""
    x1, x2, x3 = uniq("ex.x1"), uniq("ex.x2"), uniq("ex.x3")
    channel.exchange_declare(x1, "direct", arguments={"alternate-exchange": x2})
    channel.exchange_declare(x2, "direct", arguments={"alternate-exchange": x1})
    channel.exchange_declare(x3, "direct", arguments={"alternate-exchange": uniq("missing")})
    try:
        channel.confirm_delivery()
        for x in (x1, x3):
            with pytest.raises(UnroutableError):
                channel.basic_publish(x, "k", b"m", mandatory=True)
    finally:
        for x in (x1, x2, x3):
            channel.exchange_delete(x)


def test_alternate_exchange_of_each_exchange_reached(channel: BlockingChannel) -> None:
    """As RabbitMQ: an exchange that routes to another exchange has routed the message (its
    own alternate is not used); the exchange that routes it nowhere uses its alternate."""
    ae = uniq("ex.ae")
    top, mid, dead_end = uniq("ex.top"), uniq("ex.mid"), uniq("ex.end")
    channel.exchange_declare(ae, "fanout")
    channel.exchange_declare(dead_end, "fanout")
    channel.exchange_declare(top, "fanout", arguments={"alternate-exchange": ae})
    channel.exchange_declare(mid, "fanout", arguments={"alternate-exchange": ae})
    try:
        q = new_queue(channel)
        channel.queue_bind(q, ae)
        channel.exchange_bind(dead_end, top)  # top -> dead_end, which routes nowhere
        channel.confirm_delivery()
        with pytest.raises(UnroutableError):
            channel.basic_publish(top, "k", b"lost", mandatory=True)
        channel.exchange_bind(mid, top)  # now also top -> mid, which uses its AE
        channel.basic_publish(top, "k", b"via-mid", mandatory=True)
        m, _p, b = channel.basic_get(q, auto_ack=True)
        assert (m.exchange, b) == (top, b"via-mid")
        assert bodies(channel, q) == []
    finally:
        for x in (top, mid, dead_end, ae):
            channel.exchange_delete(x)


def test_alternate_exchange_routes_cc_keys(channel: BlockingChannel) -> None:
    x = uniq("ex.cc")
    channel.exchange_declare(x, "direct", arguments={"alternate-exchange": "amq.direct"})
    try:
        q = new_queue(channel)
        key = uniq("cc")
        channel.queue_bind(q, "amq.direct", key)
        channel.confirm_delivery()
        channel.basic_publish(x, "nowhere", b"m", pika.BasicProperties(headers={"CC": [key]}),
                              mandatory=True)
        m, _p, b = channel.basic_get(q, auto_ack=True)
        assert (m.exchange, m.routing_key, b) == (x, "nowhere", b"m")
    finally:
        channel.exchange_delete(x)


@pytest.mark.parametrize("first, second, received, current", [
    ({"alternate-exchange": "a"}, {"alternate-exchange": "b"}, "'b'", "'a'"),
    ({"alternate-exchange": "a"}, {}, "none", "the value 'a' of type 'longstr'"),
    ({}, {"alternate-exchange": "a"}, "the value 'a' of type 'longstr'", "none"),
])
def test_redeclare_alternate_exchange_compared_406(channel: BlockingChannel, first: dict,
                                                   second: dict, received: str,
                                                   current: str) -> None:
    name = uniq("ex.redecl")
    channel.exchange_declare(name, "direct", arguments=first)
    try:
        closed_with(lambda: channel.exchange_declare(name, "direct", arguments=second), 406,
                    f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange "
                    f"'{name}' in vhost '/': received {received} but current is {current}")
    finally:
        channel.connection.channel().exchange_delete(name)


def test_redeclare_other_exchange_arguments_may_differ(channel: BlockingChannel) -> None:
    name = uniq("ex.redecl")
    channel.exchange_declare(name, "direct", auto_delete=True,
                             arguments={"alternate-exchange": "a", "x-foo": 1})
    channel.exchange_declare(name, "direct", auto_delete=True,
                             arguments={"alternate-exchange": "a", "x-foo": 2})
    channel.exchange_delete(name)


@pytest.mark.parametrize("value, typ", [(1, "signedint"), (True, "bool")])
def test_alternate_exchange_must_be_a_string_406(channel: BlockingChannel, value: object,
                                                 typ: str) -> None:
    name = uniq("ex.ae")
    closed_with(lambda: channel.exchange_declare(name, "direct",
                                                 arguments={"alternate-exchange": value}),
                406, f"PRECONDITION_FAILED - invalid type '{typ}' for arg 'alternate-exchange' "
                     f"in exchange '{name}' in vhost '/'")
