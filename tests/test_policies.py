"""M5-M7: policies and operator policies, side by side with RabbitMQ 3.10 (the `mgmt`
fixture runs each test against an embedded ackmq and against RabbitMQ's management API,
skipped when absent). The texts and codes asserted are RabbitMQ 3.10's answers, recorded
here, so the ackmq half checks them without RabbitMQ too.

Against the shared RabbitMQ every policy matches only this test's unique names and is
removed after."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from support.mgmthelp import Target, escaped, q

POLICIES = "/api/policies/%2F/"
OPERATOR = "/api/operator-policies/%2F/"


@pytest.fixture
def pol(mgmt: Target) -> Iterator[Callable[..., Any]]:
    """pol(name, body, operator=False) -> Reply of the PUT; every policy made is
    deleted after the test."""
    made: list[str] = []

    def put(name: str, body: dict[str, Any], operator: bool = False) -> Any:
        path = (OPERATOR if operator else POLICIES) + q(name)
        made.append(path)
        return mgmt.call("PUT", path, body)

    yield put
    for path in made:
        mgmt.call("DELETE", path)


@pytest.fixture
def amqp(mgmt: Target) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.amqp_url))
    ch = conn.channel()
    ch.confirm_delivery()
    yield ch
    conn.close()


def _declare(mgmt: Target, ch: Any, name: str, **args: Any) -> None:
    ch.queue_declare(name, arguments=args or None)
    mgmt.cleanup.append(("queue", name))


def _depth(ch: Any, name: str) -> int:
    return ch.queue_declare(name, passive=True).method.message_count


def _until(cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll: RabbitMQ applies a policy to its queues a moment after the PUT."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.2)


def _anchored(name: str) -> str:
    return "^" + re.escape(name) + "$"


# -- M5: the API -------------------------------------------------------------------------
def test_M5_policy_put_get_list_delete(mgmt: Target, pol: Any) -> None:
    name = mgmt.name("pol")
    body = {"pattern": "^" + name, "definition": {"max-length": 1}, "apply-to": "queues"}
    assert pol(name, body).status == 201
    assert pol(name, {**body, "priority": 3}).status == 204  # replaced
    r = mgmt.call("GET", POLICIES + q(name))
    assert r.status == 200
    assert r.body == {"vhost": "/", "name": name, "pattern": "^" + name,
                      "apply-to": "queues", "definition": {"max-length": 1}, "priority": 3}
    assert r.body in mgmt.call("GET", "/api/policies").body
    assert r.body in mgmt.call("GET", "/api/policies/%2F").body
    default = mgmt.name("pol")
    assert pol(default, {"pattern": "^" + default, "definition": {"expires": 10000}}).status \
        == 201
    got = mgmt.call("GET", POLICIES + q(default)).body
    assert (got["apply-to"], got["priority"]) == ("all", 0)  # RabbitMQ's defaults
    assert mgmt.call("DELETE", POLICIES + q(name)).status == 204
    for method in ("GET", "DELETE"):
        r = mgmt.call(method, POLICIES + q(name))
        assert (r.status, r.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_M5_policy_in_missing_vhost(mgmt: Target) -> None:
    r = mgmt.call("PUT", "/api/policies/no-such-vhost-m5/p",
                  {"pattern": ".*", "definition": {"max-length": 1}})
    assert (r.status, r.body) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert mgmt.call("GET", "/api/policies/no-such-vhost-m5").status == 404


# (body, RabbitMQ 3.10's reason) for PUT /api/policies/%2F/x; the reason is HTML-escaped
# by RabbitMQ's management API for policies
REFUSED = [
    ({"pattern": "^zz", "definition": {"foo": 1}},
     '[{<<"foo">>,1}] are not recognised policy settings'),
    ({"pattern": "^zz", "definition": {"max-length": 1, "bogus": 2, "zap": 3}},
     '[{<<"bogus">>,2},{<<"zap">>,3}] are not recognised policy settings'),
    ({"pattern": "^zz", "definition": {"single-active-consumer": True}},
     '[{<<"single-active-consumer">>,true}] are not recognised policy settings'),
    ({"pattern": "^zz", "definition": {"max-length": "x"}},
     '<<"x">> is not a valid maximum length'),
    ({"pattern": "^zz", "definition": {"max-length": -1}}, "-1 is not a valid maximum length"),
    ({"pattern": "^zz", "definition": {"max-length": True}},
     "true is not a valid maximum length"),
    ({"pattern": "^zz", "definition": {"max-length-bytes": -1}},
     "-1 is not a valid maximum length in bytes"),
    ({"pattern": "^zz", "definition": {"message-ttl": -1}}, "-1 is not a valid message TTL"),
    ({"pattern": "^zz", "definition": {"message-ttl": 1.5}}, "1.5 is not a valid message TTL"),
    ({"pattern": "^zz", "definition": {"message-ttl": None}},
     "null is not a valid message TTL"),
    ({"pattern": "^zz", "definition": {"message-ttl": {"a": 1}}},
     '#{<<"a">> => 1} is not a valid message TTL'),
    ({"pattern": "^zz", "definition": {"message-ttl": [1, "b"]}},
     '[1,<<"b">>] is not a valid message TTL'),
    ({"pattern": "^zz", "definition": {"expires": 0}}, "0 is not a valid queue expiry"),
    ({"pattern": "^zz", "definition": {"dead-letter-exchange": 1}},
     "1 is not a valid dead letter exchange name"),
    ({"pattern": "^zz", "definition": {"dead-letter-routing-key": 1}},
     "1 is not a valid dead letter routing key"),
    ({"pattern": "^zz", "definition": {"overflow": "x"}},
     '<<"x">> is not a valid overflow value'),
    ({"pattern": "^zz", "definition": {"delivery-limit": -1}},
     "-1 is not a valid delivery limit"),
    ({"pattern": "^zz", "definition": {"alternate-exchange": 1}},
     "1 is not a valid alternate exchange name"),
    ({"pattern": "^zz", "definition": {"stream-max-segment-size-bytes": "a"}},
     '<<"a">> is not a valid segment size'),
    ({"pattern": "^zz", "definition": {"queue-mode": "x"}},
     '<<"x">> is not a valid queue-mode value'),
    ({"pattern": "^zz", "definition": {"queue-version": 3}},
     "3 is not a valid queue-version value"),
    ({"pattern": "^zz", "definition": {"queue-master-locator": "x"}},
     '<<"x">> invalid queue-master-locator value'),
    ({"pattern": "^zz", "definition": {"queue-leader-locator": "x"}},
     '<<"x">> is not a valid queue leader locator value'),
    ({"pattern": "^zz", "definition": {"dead-letter-strategy": "x"}},
     '<<"x">> is not a valid dead letter strategy'),
    ({"pattern": "^zz", "definition": {"max-in-memory-length": -1}},
     "-1 is not a valid maximum memory in bytes"),
    ({"pattern": "^zz", "definition": {"initial-cluster-size": "a"}},
     '<<"a">> is not a valid cluster size'),
    ({"pattern": "^zz", "definition": {"ha-mode": "x"}}, '<<"x">> is not a valid ha-mode value'),
    ({"pattern": "^zz", "definition": {"ha-mode": "exactly"}},
     'ha-mode="exactly" takes an integer, none given'),
    ({"pattern": "^zz", "definition": {"ha-mode": "exactly", "ha-params": "a"}},
     'ha-mode="exactly" takes an integer, <<"a">> given'),
    ({"pattern": "^zz", "definition": {"ha-mode": "exactly", "ha-params": 0}},
     'ha-mode="exactly" takes an integer, 0 given'),
    ({"pattern": "^zz", "definition": {"ha-mode": "all", "ha-params": 1}},
     'ha-mode="all" does not take parameters'),
    ({"pattern": "^zz", "definition": {"ha-mode": "nodes"}},
     'ha-mode="nodes" takes a list, none given'),
    ({"pattern": "^zz", "definition": {"ha-mode": "nodes", "ha-params": "a"}},
     'ha-mode="nodes" takes a list, <<"a">> given'),
    ({"pattern": "^zz", "definition": {"ha-mode": "nodes", "ha-params": []}},
     'ha-mode="nodes" list must be non-empty'),
    ({"pattern": "^zz", "definition": {"ha-mode": "all", "ha-sync-batch-size": 0}},
     "ha-sync-batch-size takes an integer greater than 0, 0 given"),
    ({"pattern": "^zz", "definition": {"ha-mode": "all", "ha-promote-on-failure": "x"}},
     'ha-promote-on-failure must be "always" or "when-synced", got <<"x">>'),
    ({"pattern": "^zz", "definition": {"expires": "7"}}, '<<"7">> is not a valid queue expiry'),
    ({"pattern": "^zz", "definition": {"max-length": 1}, "apply-to": None},
     "apply-to 'null' unrecognised; should be 'queues', 'exchanges' or 'all'"),
    ({"pattern": "^zz", "definition": {"ha-sync-mode": "automatic"}},
     "ha-mode must be specified to specify ha-params, ha-sync-mode or "
     "ha-promote-on-shutdown"),
    ({"pattern": "^zz", "definition": {"ha-mode": "all", "ha-sync-mode": "x"}},
     'ha-sync-mode must be "manual" or "automatic", got <<"x">>'),
    ({"pattern": "^zz", "definition": {"ha-mode": "all", "ha-promote-on-shutdown": "x"}},
     'ha-promote-on-shutdown must be "always" or "when-synced", got <<"x">>'),
    ({"pattern": "^zz", "definition": {"max-length": 1, "message-ttl": "a", "expires": "b"}},
     '<<"b">> is not a valid queue expiry'),  # the first key in order is reported
    ({"pattern": "^zz", "definition": {}}, "no policy provided"),
    ({"pattern": "^zz", "definition": {"max-length": 1}, "apply-to": "blah"},
     "apply-to 'blah' unrecognised; should be 'queues', 'exchanges' or 'all'"),
    ({"pattern": "^zz", "definition": {"max-length": 1}, "priority": "a"},
     'priority should be a number, actually was <<"a">>'),
    ({"pattern": "^zz", "definition": {"max-length": 1}, "priority": "5"},
     'priority should be a number, actually was <<"5">>'),
    ({"pattern": 1, "definition": {"max-length": 1}}, "pattern should be a binary but was 1"),
    ({"pattern": "(", "definition": {"max-length": 1}},
     'pattern should be regular expression but is invalid: {"missing )",1}'),
    ({"pattern": "*", "definition": {"max-length": 1}},
     'pattern should be regular expression but is invalid: {"nothing to repeat",0}'),
    ({"pattern": "a[", "definition": {"max-length": 1}},
     'pattern should be regular expression but is invalid: {"missing terminating ] for '
     'character class",\n' + " " * 54 + "2}"),
]


@pytest.mark.parametrize("body,reason", REFUSED, ids=[r for _b, r in REFUSED])
def test_M5_refused_policy_texts(mgmt: Target, pol: Any, body: dict[str, Any],
                                 reason: str) -> None:
    r = pol(mgmt.name("bad"), body)
    assert (r.status, r.body) == (400, {"error": "bad_request", "reason": escaped(
        f"Validation failed\n\n{reason}\n")})


def test_M5_refused_without_keys(mgmt: Target, pol: Any) -> None:
    r = pol(mgmt.name("bad"), {"definition": {"max-length": 1}})
    assert (r.status, r.body["reason"]) == (400, "[{key_missing,pattern}]")
    r = pol(mgmt.name("bad"), {"pattern": "^zz"})
    assert (r.status, r.body["reason"]) == (400, "[{key_missing,definition}]")
    r = mgmt.call("PUT", POLICIES + "bad", b"xx")
    assert (r.status, r.body["reason"]) == (400, "not_json")


def test_M5_accepted_keys(mgmt: Target, pol: Any) -> None:
    """Every key RabbitMQ 3.10 takes in a policy is taken (ha-* too: no effect on one
    node)."""
    for definition in ({"dead-letter-exchange": "dlx", "dead-letter-routing-key": "k",
                        "message-ttl": 315360000001, "expires": 1, "max-length": 0,
                        "max-length-bytes": 10, "overflow": "reject-publish-dlx",
                        "delivery-limit": 3, "alternate-exchange": "",
                        "stream-max-segment-size-bytes": 100, "queue-mode": "lazy",
                        "queue-version": 2, "queue-master-locator": "random",
                        "queue-leader-locator": "balanced", "initial-cluster-size": 0,
                        "max-in-memory-length": 1, "max-in-memory-bytes": 1,
                        "dead-letter-strategy": "at-least-once", "max-age": "7D"},
                       {"ha-mode": "exactly", "ha-params": 2},
                       {"ha-mode": "nodes", "ha-params": ["a"]},
                       {"ha-mode": "all", "ha-sync-mode": "manual", "ha-sync-batch-size": 5,
                        "ha-promote-on-shutdown": "always",
                        "ha-promote-on-failure": "when-synced"}):
        r = pol(mgmt.name("ok"), {"pattern": "^zz-none-such", "definition": definition,
                                  "priority": 1.5})
        assert r.status == 201, (definition, r)


def test_M5_ackmq_extensions(mgmt: Target, pol: Any) -> None:
    """Where ackmq takes more than RabbitMQ 3.10, on purpose: RabbitMQ 4's apply-to
    values, `consumer-timeout` (RabbitMQ 3.12+), an invalid `max-age` refused with a
    text (3.10: 500)."""
    if mgmt.kind == "rabbitmq":
        r = pol(mgmt.name("ext"), {"pattern": "^zz", "definition": {"max-length": 1},
                                   "apply-to": "classic_queues"})
        assert r.status == 400  # 3.10 does not know it
        return
    for at in ("classic_queues", "quorum_queues", "streams"):
        assert pol(mgmt.name("ext"), {"pattern": "^zz", "definition": {"max-length": 1},
                                      "apply-to": at}).status == 201
    assert pol(mgmt.name("ext"), {"pattern": "^zz", "definition": {
        "consumer-timeout": 1000, "max-age": "7D"}}).status == 201
    r = pol(mgmt.name("ext"), {"pattern": "^zz", "definition": {"max-age": "7X"}})
    assert r.body["reason"] == escaped('Validation failed\n\n<<"7X">> is not a valid max '
                                        "age\n")


# -- M5: in force ------------------------------------------------------------------------
def test_M5_policy_limits_and_dead_letters(mgmt: Target, pol: Any, amqp: Any) -> None:
    name, dlq = mgmt.name("q"), mgmt.name("dlq")
    _declare(mgmt, amqp, dlq)
    assert pol(name, {"pattern": _anchored(name), "apply-to": "queues", "definition": {
        "max-length": 2, "dead-letter-exchange": "", "dead-letter-routing-key": dlq}}
        ).status == 201
    _declare(mgmt, amqp, name)
    r = _until(lambda: mgmt.call("GET", f"/api/queues/%2F/{q(name)}").body.get("policy"))
    assert r == name
    for i in range(5):
        amqp.basic_publish("", name, str(i).encode())
    assert _until(lambda: _depth(amqp, dlq) == 3)
    assert _depth(amqp, name) == 2
    got = [amqp.basic_get(name, auto_ack=True)[2] for _ in range(2)]
    assert got == [b"3", b"4"]  # drop-head: the oldest went to the DLX
    body = amqp.basic_get(dlq, auto_ack=True)
    assert body[1].headers["x-death"][0]["reason"] == "maxlen"


def test_M5_highest_priority_wins(mgmt: Target, pol: Any, amqp: Any) -> None:
    name = mgmt.name("q")
    low, high = mgmt.name("low"), mgmt.name("high")
    assert pol(low, {"pattern": _anchored(name), "priority": 1,
                     "definition": {"max-length": 1}}).status == 201
    assert pol(high, {"pattern": "^" + re.escape(name), "priority": 2,
                      "definition": {"max-length": 3}}).status == 201
    _declare(mgmt, amqp, name)
    path = f"/api/queues/%2F/{q(name)}"
    assert _until(lambda: mgmt.call("GET", path).body.get("policy") == high)
    for _ in range(5):
        amqp.basic_publish("", name, b"x")
    assert _until(lambda: _depth(amqp, name) == 3)  # one policy only: max-length 3
    body = _until(lambda: (b := mgmt.call("GET", path).body).get(
        "effective_policy_definition") and b)
    assert body["effective_policy_definition"] == {"max-length": 3}
    assert body["operator_policy"] is None


def test_M5_alternate_exchange_policy(mgmt: Target, pol: Any, amqp: Any) -> None:
    x, ae, lost = mgmt.name("x"), mgmt.name("ae"), mgmt.name("lost")
    amqp.exchange_declare(x, "direct")
    amqp.exchange_declare(ae, "fanout")
    mgmt.cleanup += [("exchange", x), ("exchange", ae)]
    _declare(mgmt, amqp, lost)
    amqp.queue_bind(lost, ae)
    assert pol(x, {"pattern": _anchored(x), "apply-to": "exchanges",
                   "definition": {"alternate-exchange": ae}}).status == 201
    r = _until(lambda: mgmt.call("GET", f"/api/exchanges/%2F/{q(x)}").body.get("policy"))
    assert r == x
    assert "policy" not in mgmt.call("GET", f"/api/exchanges/%2F/{q(ae)}").body
    amqp.basic_publish(x, "nowhere", b"unroutable")
    assert _until(lambda: _depth(amqp, lost) == 1)
    assert mgmt.call("GET", f"/api/queues/%2F/{q(lost)}").body.get("policy") is None


# -- M6: operator policies and precedence ---------------------------------------------------
OPERATOR_REFUSED = [
    ({"overflow": "drop-head"}, '[{<<"overflow">>,<<"drop-head">>}] are not recognised '
                                "policy settings"),
    ({"dead-letter-exchange": "x"}, '[{<<"dead-letter-exchange">>,<<"x">>}] are not '
                                    "recognised policy settings"),
    ({"ha-mode": "all"}, '[{<<"ha-mode">>,<<"all">>}] are not recognised policy settings'),
    ({"max-length": "a"}, '<<"a">> is not a valid maximum length'),
]


@pytest.mark.parametrize("definition,reason", OPERATOR_REFUSED,
                         ids=[r for _d, r in OPERATOR_REFUSED])
def test_M6_operator_policy_keys(mgmt: Target, pol: Any, definition: dict[str, Any],
                                 reason: str) -> None:
    """Operator policies take only the numeric limits; RabbitMQ does not HTML-escape
    their texts (it does for policies)."""
    r = pol(mgmt.name("op"), {"pattern": "^zz", "definition": definition}, operator=True)
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": f"Validation failed\n\n{reason}\n"})


def test_M6_operator_policy_crud(mgmt: Target, pol: Any) -> None:
    name = mgmt.name("op")
    for definition in ({"max-length": 1}, {"message-ttl": 1}, {"expires": 1},
                       {"max-length-bytes": 1}, {"delivery-limit": 1},
                       {"max-in-memory-length": 1}, {"max-in-memory-bytes": 1}):
        assert pol(name, {"pattern": "^zz", "definition": definition}, operator=True
                   ).status in (201, 204)
    r = mgmt.call("GET", OPERATOR + q(name))
    assert r.body == {"vhost": "/", "name": name, "pattern": "^zz", "apply-to": "all",
                      "definition": {"max-in-memory-bytes": 1}, "priority": 0}
    assert r.body in mgmt.call("GET", "/api/operator-policies").body
    assert r.body not in mgmt.call("GET", "/api/policies").body
    assert mgmt.call("DELETE", OPERATOR + q(name)).status == 204
    assert mgmt.call("DELETE", OPERATOR + q(name)).status == 404


def test_M6_precedence_lower_limit_wins(mgmt: Target, pol: Any, amqp: Any) -> None:
    """RabbitMQ 3.10, recorded: argument x-max-length 5, policy 3, operator policy 4 ->
    3 messages kept; argument 2 -> 2; the policy's DLX loses to the argument's; the
    effective definition is policy ⊕ operator policy, the lower of each numeric limit."""
    base = mgmt.name("prec")
    a, b, c, d = (f"{base}.{s}" for s in "abcd")
    dlq_arg, dlq_pol = mgmt.name("dlqa"), mgmt.name("dlqp")
    for dq in (dlq_arg, dlq_pol):
        _declare(mgmt, amqp, dq)
    _declare(mgmt, amqp, a, **{"x-max-length": 5})
    _declare(mgmt, amqp, b, **{"x-max-length": 2})
    _declare(mgmt, amqp, c)
    _declare(mgmt, amqp, d, **{"x-dead-letter-exchange": "",
                               "x-dead-letter-routing-key": dlq_arg})
    pattern = "^" + re.escape(base) + r"\."
    assert pol(base, {"pattern": pattern, "apply-to": "queues", "definition": {
        "max-length": 3, "message-ttl": 100000, "dead-letter-exchange": "",
        "dead-letter-routing-key": dlq_pol}}).status == 201
    assert pol(base, {"pattern": pattern, "apply-to": "queues", "definition": {
        "max-length": 4, "message-ttl": 50000}}, operator=True).status == 201
    path = f"/api/queues/%2F/{q(c)}"
    assert _until(lambda: mgmt.call("GET", path).body.get("operator_policy") == base)
    for qn in (a, b, c, d):
        for _ in range(6):
            amqp.basic_publish("", qn, b"x")
    assert _until(lambda: [_depth(amqp, qn) for qn in (a, b, c, d)] == [3, 2, 3, 3])
    assert _until(lambda: _depth(amqp, dlq_arg) == 3)  # d's own DLX, not the policy's
    assert _until(lambda: _depth(amqp, dlq_pol) == 3 + 4 + 3)  # a, b and c's overflow
    body = _until(lambda: (j := mgmt.call("GET", path).body).get(
        "effective_policy_definition") and j)
    assert (body["policy"], body["operator_policy"]) == (base, base)
    assert body["effective_policy_definition"] == {
        "max-length": 3, "message-ttl": 50000, "dead-letter-exchange": "",
        "dead-letter-routing-key": dlq_pol}


# -- M7: live re-apply ----------------------------------------------------------------------
def test_M7_policy_change_applies_to_existing_queue(mgmt: Target, pol: Any, amqp: Any) -> None:
    """A lower max-length on a queue that holds more drops (dead-letters) the oldest at
    once; clearing the policy lifts the limit for what comes next."""
    name, dlq = mgmt.name("live"), mgmt.name("dlq")
    _declare(mgmt, amqp, dlq)
    _declare(mgmt, amqp, name)
    for i in range(5):
        amqp.basic_publish("", name, str(i).encode())
    assert pol(name, {"pattern": _anchored(name), "definition": {
        "max-length": 2, "dead-letter-exchange": "", "dead-letter-routing-key": dlq}}
        ).status == 201
    assert _until(lambda: _depth(amqp, name) == 2)
    assert _until(lambda: _depth(amqp, dlq) == 3)
    assert mgmt.call("DELETE", POLICIES + q(name)).status == 204
    assert _until(lambda: mgmt.call("GET", f"/api/queues/%2F/{q(name)}").body.get("policy")
                  is None)
    for _ in range(5):
        amqp.basic_publish("", name, b"more")
    assert _until(lambda: _depth(amqp, name) == 7)
    assert _depth(amqp, dlq) == 3


def test_M7_new_dlx_takes_the_next_dead_letter(mgmt: Target, pol: Any, amqp: Any) -> None:
    name, one, two = mgmt.name("dl"), mgmt.name("one"), mgmt.name("two")
    for qn in (one, two, name):
        _declare(mgmt, amqp, qn)
    for i in range(2):
        amqp.basic_publish("", name, str(i).encode())
    body = {"pattern": _anchored(name), "definition": {"dead-letter-exchange": "",
                                                         "dead-letter-routing-key": one}}
    assert pol(name, body).status == 201
    _until(lambda: mgmt.call("GET", f"/api/queues/%2F/{q(name)}").body.get("policy"))
    m = amqp.basic_get(name)
    amqp.basic_reject(m[0].delivery_tag, requeue=False)
    assert _until(lambda: _depth(amqp, one) == 1)
    body["definition"]["dead-letter-routing-key"] = two
    assert pol(name, body).status == 204
    assert _until(lambda: mgmt.call("GET", f"/api/queues/%2F/{q(name)}").body.get(
        "effective_policy_definition", {}).get("dead-letter-routing-key") == two)
    m = amqp.basic_get(name)
    amqp.basic_reject(m[0].delivery_tag, requeue=False)
    assert _until(lambda: _depth(amqp, two) == 1)
    assert _depth(amqp, one) == 1


# -- M5/M6: definitions both ways with RabbitMQ ----------------------------------------------
def _vhost_topology(t: Target, vh: str, qname: str) -> None:
    """A policy, an operator policy and a queue they match, in vhost `vh` of `t`."""
    for path, body in ((f"/api/policies/{q(vh)}/cap", {
            "pattern": "^capped", "apply-to": "queues", "priority": 1,
            "definition": {"max-length": 2, "dead-letter-exchange": "dlx"}}),
            (f"/api/operator-policies/{q(vh)}/ttl", {
                "pattern": "^capped", "definition": {"message-ttl": 60000}}),
            (f"/api/queues/{q(vh)}/{q(qname)}", {"durable": True})):
        r = t.call("PUT", path, body)
        assert r.status in (201, 204), (path, r)


def _in_force(t: Target, vh: str, qname: str) -> None:
    """The imported policies are in force: the queue names them, and keeps 2 of 4."""
    body = _until(lambda: (b := t.call("GET", f"/api/queues/{q(vh)}/{q(qname)}").body
                           ).get("operator_policy") and b)
    assert (body["policy"], body["operator_policy"]) == ("cap", "ttl")
    assert body["effective_policy_definition"] == {
        "max-length": 2, "dead-letter-exchange": "dlx", "message-ttl": 60000}
    host, port = t.amqp_url.split("@", 1)[1].rstrip("/").split(":")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host, int(port), vh, pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", qname, str(i).encode())
    assert _until(lambda: _depth(ch, qname) == 2)
    conn.close()


def _move_vhost(src: Target, dst: Target, vh: str) -> None:
    defs = src.call("GET", f"/api/definitions/{q(vh)}").body
    assert [p["name"] for p in defs["policies"]] == ["cap"]
    assert [p["name"] for p in defs["parameters"] if p["component"] == "operator_policy"] \
        == ["ttl"]
    r = dst.call("PUT", f"/api/vhosts/{q(vh)}")
    assert r.status in (201, 204)
    dst.cleanup.append(("vhost", vh))
    assert dst.call("PUT", f"/api/permissions/{q(vh)}/guest",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    r = dst.call("POST", f"/api/definitions/{q(vh)}", defs)
    assert r.status in (200, 201, 204), r


@pytest.mark.rabbitmq
@pytest.mark.parametrize("direction", ["ackmq->rabbitmq", "rabbitmq->ackmq"])
def test_M5_M6_definitions_move_both_ways_with_policies(ackmq_mgmt: Any, direction: str
                                                        ) -> None:
    """A vhost's export (GET /api/definitions/{vhost}) with a policy and an operator
    policy, imported by the other broker (POST): both in force there."""
    from support.mgmthelp import rabbit_http
    rabbit = Target("rabbitmq", rabbit_http(), "amqp://guest:guest@127.0.0.1:5672/")
    mine = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    src, dst = (mine, rabbit) if direction.startswith("ackmq") else (rabbit, mine)
    vh = src.vhost()
    try:
        assert src.call("PUT", f"/api/permissions/{q(vh)}/guest",
                        {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
        _vhost_topology(src, vh, "capped-q")
        _in_force(src, vh, "capped-q")
        _move_vhost(src, dst, vh)
        _in_force(dst, vh, "capped-q")
    finally:
        src.forget()
        dst.forget()


def test_M5_policies_go_with_their_vhost(mgmt: Target) -> None:
    """Deleting a vhost deletes its policies: the vhost made again has none."""
    vh = mgmt.vhost()
    for base in ("/api/policies/", "/api/operator-policies/"):
        r = mgmt.call("PUT", f"{base}{q(vh)}/p", {"pattern": ".*",
                                                  "definition": {"max-length": 1}})
        assert r.status == 201
    assert mgmt.call("DELETE", f"/api/vhosts/{q(vh)}").status == 204
    assert mgmt.call("PUT", f"/api/vhosts/{q(vh)}").status == 201
    for base in ("/api/policies/", "/api/operator-policies/"):
        assert mgmt.call("GET", f"{base}{q(vh)}").body == []


def test_M5_who_may_change_policies(mgmt: Target) -> None:
    """policymaker (or administrator) for policies, administrator for operator policies;
    a management user may list but not change; a policymaker needs access to the vhost."""
    body = {"pattern": "^zz-none", "definition": {"max-length": 1}}
    name = mgmt.name("who")
    for tags, path, status in (("management", POLICIES, 401), ("policymaker", POLICIES, 201),
                               ("policymaker", OPERATOR, 401), ("administrator", OPERATOR, 201)):
        who = mgmt.user(tags)
        try:
            assert mgmt.call("PUT", path + q(name), body, auth=who).status == status, tags
            assert mgmt.call("GET", path[:-5], auth=who).status == 200
        finally:
            mgmt.call("DELETE", path + q(name))
    outsider = mgmt.user("policymaker", vhost=None)
    r = mgmt.call("PUT", POLICIES + q(name), body, auth=outsider)
    mgmt.call("DELETE", POLICIES + q(name))
    assert r.status == 401


def test_M7_stream_retention_from_a_policy_set_later(ackmq_mgmt: Any) -> None:
    """A stream takes a policy's max-length-bytes when the policy comes after it: the
    oldest segments go as new ones roll (ackmq only: RabbitMQ applies stream retention
    on its own schedule)."""
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    name = t.name("stream")
    conn = pika.BlockingConnection(pika.URLParameters(t.amqp_url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream",
                                                    "x-stream-max-segment-size-bytes": 4000})
    t.cleanup.append(("queue", name))
    try:
        for _ in range(100):
            ch.basic_publish("", name, b"x" * 500)
        assert _depth(ch, name) == 100
        assert t.call("PUT", POLICIES + q(name), {
            "pattern": _anchored(name), "apply-to": "streams",
            "definition": {"max-length-bytes": 8000}}).status == 201
        for _ in range(20):
            ch.basic_publish("", name, b"x" * 500)
        assert _until(lambda: _depth(ch, name) < 40)
    finally:
        t.call("DELETE", POLICIES + q(name))
        conn.close()
        t.forget()
