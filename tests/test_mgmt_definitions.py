"""M1/M4: definitions in RabbitMQ's format both ways. A topology made in RabbitMQ and
exported by it imports into ackmq (users log in with their exported hashes); one made in
ackmq and exported imports into RabbitMQ. Against the shared RabbitMQ only unique vhosts
and users are touched (guest never: its hash differs per broker), and removed after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from support.mgmthelp import Target, q, rabbit_http

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def rabbit() -> Iterator[Target]:
    t = Target("rabbitmq", rabbit_http(), "amqp://guest:guest@127.0.0.1:5672/")
    yield t
    t.forget()


@pytest.fixture
def ackmq_target(ackmq_mgmt: Any) -> Iterator[Target]:
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    yield t
    t.forget()


def _topology(t: Target, vh: str, user: str, pw: str) -> None:
    """The same objects, made through the API of either broker."""
    def ok(method: str, path: str, body: Any = None) -> None:
        r = t.call(method, path, body)
        assert r.status in (201, 204), (method, path, r)

    ok("PUT", f"/api/users/{q(user)}", {"password": pw, "tags": "management"})
    t.cleanup.append(("user", user))
    ok("PUT", f"/api/permissions/{q(vh)}/{q(user)}",
       {"configure": "^cfg-.*", "write": ".*", "read": "^(in|out)$"})
    ok("PUT", f"/api/topic-permissions/{q(vh)}/{q(user)}",
       {"exchange": "amq.topic", "write": "^a\\.", "read": ".*"})
    ok("PUT", f"/api/vhost-limits/{q(vh)}/max-queues", {"value": 50})
    ok("PUT", f"/api/exchanges/{q(vh)}/in", {"type": "topic", "durable": True})
    ok("PUT", f"/api/exchanges/{q(vh)}/ae", {"type": "fanout", "durable": True})
    ok("PUT", f"/api/exchanges/{q(vh)}/out", {
        "type": "direct", "durable": True, "arguments": {"alternate-exchange": "ae"}})
    ok("PUT", f"/api/queues/{q(vh)}/orders", {"durable": True, "arguments": {
        "x-max-length": 1000, "x-dead-letter-exchange": "out", "x-message-ttl": 60000}})
    ok("PUT", f"/api/queues/{q(vh)}/lost", {"durable": True})
    ok("POST", f"/api/bindings/{q(vh)}/e/in/q/orders", {"routing_key": "order.#"})
    ok("POST", f"/api/bindings/{q(vh)}/e/in/e/out", {"routing_key": "x"})
    ok("POST", f"/api/bindings/{q(vh)}/e/ae/q/lost", {"routing_key": ""})


def _mine(defs: dict[str, Any], vh: str, user: str) -> dict[str, Any]:
    """The parts of a whole-broker export that belong to this test."""
    return {
        "users": [u for u in defs["users"] if u["name"] == user],
        "vhosts": [v for v in defs["vhosts"] if v["name"] == vh],
        "permissions": [p for p in defs["permissions"] if p["vhost"] == vh],
        "topic_permissions": [p for p in defs["topic_permissions"] if p["vhost"] == vh],
        "parameters": [p for p in defs["parameters"] if p.get("vhost") == vh],
        **{k: [x for x in defs[k] if x["vhost"] == vh]
           for k in ("queues", "exchanges", "bindings")},
    }


def _shape(t: Target, vh: str, user: str) -> dict[str, Any]:
    """What a broker reports of the topology, in comparable form."""
    defs = t.call("GET", "/api/definitions").body
    mine = _mine(defs, vh, user)
    return {
        "queues": sorted((x["name"], x["durable"], tuple(sorted(x["arguments"].items())))
                         for x in mine["queues"]),
        "exchanges": sorted((x["name"], x["type"], x["durable"],
                             tuple(sorted(x["arguments"].items())))
                            for x in mine["exchanges"]),
        "bindings": sorted((b["source"], b["destination"], b["destination_type"],
                            b["routing_key"]) for b in mine["bindings"]),
        "permissions": [(p["user"], p["configure"], p["write"], p["read"])
                        for p in mine["permissions"] if p["user"] == user],
        "topic_permissions": [(p["user"], p["exchange"], p["write"], p["read"])
                              for p in mine["topic_permissions"]],
        "limits": [p["value"] for p in mine["parameters"]
                   if p.get("component") == "vhost-limits"],
        "users": [(u["name"], sorted(u["tags"]) if isinstance(u["tags"], list)
                   else sorted(u["tags"].split(","))) for u in mine["users"]],
    }


def _login(url_host: str, user: str, pw: str, vh: str) -> None:
    params = pika.ConnectionParameters(url_host.split(":")[0], int(url_host.split(":")[1]),
                                       vh, pika.PlainCredentials(user, pw))
    pika.BlockingConnection(params).close()


def _move(src: Target, dst: Target, vh: str, user: str) -> None:
    defs = src.call("GET", "/api/definitions").body
    assert {"rabbit_version", "users", "vhosts", "permissions", "queues", "exchanges",
            "bindings", "parameters", "policies"} <= set(defs)
    mine = _mine(defs, vh, user)
    assert all(u["name"] != "guest" for u in mine["users"])
    dst.cleanup.append(("vhost", vh))
    dst.cleanup.append(("user", user))
    r = dst.call("POST", "/api/definitions", mine)
    assert r.status in (200, 201, 204), r


def test_M1_rabbitmq_export_imports_into_ackmq(rabbit: Target, ackmq_target: Target) -> None:
    vh, user, pw = rabbit.vhost(), rabbit.name("defs-u"), "pw-" + uuid.uuid4().hex[:8]
    _topology(rabbit, vh, user, pw)
    _move(rabbit, ackmq_target, vh, user)
    shape = _shape(rabbit, vh, user)
    assert len(shape["queues"]) == 2 and len(shape["bindings"]) == 3 and shape["limits"]
    assert _shape(ackmq_target, vh, user) == shape
    host = ackmq_target.amqp_url.split("@", 1)[1].rstrip("/")
    _login(host, user, pw, vh)  # RabbitMQ's salted SHA-256 hash, imported, logs in


def test_M1_ackmq_export_imports_into_rabbitmq(rabbit: Target, ackmq_target: Target) -> None:
    vh, user, pw = ackmq_target.vhost(), ackmq_target.name("defs-u"), "pw-" + uuid.uuid4().hex[:8]
    _topology(ackmq_target, vh, user, pw)
    _move(ackmq_target, rabbit, vh, user)
    assert _shape(rabbit, vh, user) == _shape(ackmq_target, vh, user)
    _login("127.0.0.1:5672", user, pw, vh)  # ackmq's hash logs in to RabbitMQ


def test_M1_definitions_refused_import_400(ackmq_target: Target) -> None:
    r = ackmq_target.call("POST", "/api/definitions", {"queues": [
        {"name": "bad-defs-q", "vhost": "/", "durable": True,
         "arguments": {"x-max-length": "many"}}]})
    assert r.status == 400 and "x-max-length" in r.body["reason"]
    r = ackmq_target.call("POST", "/api/definitions", b"[1, 2]")
    assert r.status == 400


def test_M1_per_vhost_definitions(ackmq_target: Target) -> None:
    vh = ackmq_target.vhost()
    assert ackmq_target.call("PUT", f"/api/queues/{q(vh)}/only-here", {"durable": True}
                             ).status == 201
    r = ackmq_target.call("GET", f"/api/definitions/{q(vh)}")
    assert r.status == 200
    assert r.body["queues"] == [{"name": "only-here", "durable": True, "auto_delete": False,
                                 "arguments": {}}]
    assert "users" not in r.body
    other = ackmq_target.vhost()
    assert ackmq_target.call("POST", f"/api/definitions/{q(other)}", r.body).status == 204
    assert ackmq_target.call("GET", f"/api/queues/{q(other)}/only-here").status == 200



def test_M1_import_goes_on_past_a_refused_definition(ackmq_target: Target) -> None:
    """A definitions file may hold what the broker refuses (here a queue argument of the
    wrong type): the rest is imported and the answer names what was not."""
    vh = ackmq_target.vhost()
    defs = {"queues": [
        {"name": "s1", "vhost": vh, "durable": True, "auto_delete": False,
         "arguments": {"x-max-length": "ten"}},
        {"name": "ok1", "vhost": vh, "durable": True, "auto_delete": False,
         "arguments": {}}],
        "bindings": [{"source": "amq.direct", "vhost": vh, "destination": "ok1",
                      "destination_type": "queue", "routing_key": "k", "arguments": {}}]}
    r = ackmq_target.call("POST", "/api/definitions", defs)
    assert r.status == 400
    assert r.body["reason"].startswith(f"not imported: queue 's1' in vhost '{vh}': ")
    assert ackmq_target.call("GET", f"/api/queues/{q(vh)}/ok1").status == 200
    assert ackmq_target.call("GET", f"/api/queues/{q(vh)}/s1").status == 404
    assert len(ackmq_target.call("GET", f"/api/bindings/{q(vh)}/e/amq.direct/q/ok1").body) == 1
