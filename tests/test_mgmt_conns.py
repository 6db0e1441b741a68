"""M1: connections, channels and consumers over the management API, and closing a
connection from it — against ackmq and RabbitMQ alike (RabbitMQ's listings lag by its
statistics interval, so both are polled)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pika
import pytest
from support.mgmthelp import Target, q


def _poll(mgmt: Target, path: str, pick: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = mgmt.call("GET", path)
        assert r.status == 200, r
        found = pick(r.body)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def test_M1_connections_channels_consumers_and_close(mgmt: Target) -> None:
    tag = "mgmt-ctag-" + uuid.uuid4().hex[:8]
    cname = "mgmt-conn-" + uuid.uuid4().hex[:8]
    params = pika.URLParameters(mgmt.amqp_url)
    params.client_properties = {"connection_name": cname}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=7)
        qname = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_consume(qname, lambda *a: None, consumer_tag=tag)

        def mine(items: list[dict[str, Any]]) -> dict[str, Any] | None:
            return next((c for c in items if (c.get("client_properties") or {}).get(
                "connection_name") == cname and c.get("channels") == 1), None)

        c = _poll(mgmt, "/api/connections", mine)
        assert c is not None
        assert (c["user"], c["vhost"], c["protocol"]) == ("guest", "/", "AMQP 0-9-1")
        for key in ("name", "node", "peer_host", "peer_port", "host", "port", "state",
                    "channel_max", "frame_max", "timeout", "ssl", "auth_mechanism"):
            assert key in c, key
        assert c["name"] == f"{c['peer_host']}:{c['peer_port']} -> {c['host']}:{c['port']}"
        assert mgmt.call("GET", f"/api/connections/{q(c['name'])}").body["name"] == c["name"]
        assert mine(mgmt.call("GET", "/api/vhosts/%2F/connections").body) is not None

        chans = _poll(mgmt, f"/api/connections/{q(c['name'])}/channels",
                      lambda items: [x for x in items if x.get("consumer_count") == 1])
        assert len(chans) == 1
        assert (chans[0]["number"], chans[0]["name"]) == (1, f"{c['name']} (1)")
        assert chans[0]["connection_details"]["name"] == c["name"]
        assert mgmt.call("GET", f"/api/channels/{q(chans[0]['name'])}").status == 200

        cons = _poll(mgmt, "/api/consumers/%2F",
                     lambda items: [x for x in items if x["consumer_tag"] == tag])
        assert len(cons) == 1
        assert cons[0]["queue"] == {"name": qname, "vhost": "/"}
        assert (cons[0]["ack_required"], cons[0]["prefetch_count"]) == (True, 7)
        assert cons[0]["channel_details"]["connection_name"] == c["name"]

        assert mgmt.call("DELETE", f"/api/connections/{q(c['name'])}").status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            conn.process_data_events(5)
            conn.process_data_events(5)
        assert (e.value.reply_code, e.value.reply_text) == (
            320, "CONNECTION_FORCED - Closed via management plugin")
    finally:
        if conn.is_open:
            conn.close()


def test_M1_delete_unknown_connection_404(mgmt: Target) -> None:
    r = mgmt.call("DELETE", "/api/connections/" + q("127.0.0.1:1 -> 127.0.0.1:2"))
    assert (r.status, r.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_M1_management_user_sees_own_connections_only(mgmt: Target) -> None:
    name, pw = mgmt.user("management")
    host = mgmt.amqp_url.split("@", 1)[1]
    own = pika.BlockingConnection(pika.URLParameters(f"amqp://{name}:{pw}@{host}"))
    guest = pika.BlockingConnection(pika.URLParameters(mgmt.amqp_url))
    try:
        seen = _poll(mgmt, "/api/connections",
                     lambda items: [c for c in items if c["user"] == name])
        assert seen
        r = mgmt.call("GET", "/api/connections", auth=(name, pw))
        assert r.status == 200
        assert {c["user"] for c in r.body} == {name}
    finally:
        own.close()
        guest.close()


_STATS_ONLY = {"garbage_collection", "reductions", "reductions_details", "recv_cnt",
               "send_cnt", "recv_oct_details", "send_oct_details", "peer_cert_issuer",
               "peer_cert_subject", "peer_cert_validity", "ssl_cipher", "ssl_hash",
               "ssl_key_exchange", "ssl_protocol", "idle_since", "pending_raft_commands"}


@pytest.mark.rabbitmq
def test_M1_connection_channel_consumer_keys_as_rabbitmq(ackmq_mgmt: Any) -> None:
    from support.mgmthelp import rabbit_http
    targets = [Target("rabbitmq", rabbit_http(), "amqp://guest:guest@127.0.0.1:5672/"),
               Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url)]
    keys: dict[str, dict[str, set[str]]] = {}
    conns = []
    try:
        for t in targets:
            cname = "keys-" + uuid.uuid4().hex[:8]
            params = pika.URLParameters(t.amqp_url)
            params.client_properties = {"connection_name": cname}
            conn = pika.BlockingConnection(params)
            conns.append(conn)
            ch = conn.channel()
            qname = ch.queue_declare("", exclusive=True).method.queue
            tag = "keys-" + uuid.uuid4().hex[:8]
            ch.basic_consume(qname, lambda *a: None, consumer_tag=tag)
            c = _poll(t, "/api/connections", lambda items, cname=cname: next(
                (x for x in items if (x.get("client_properties") or {}).get(
                    "connection_name") == cname and x.get("channels") == 1), None))
            chan = _poll(t, f"/api/connections/{q(c['name'])}/channels",
                         lambda items: [x for x in items if x.get("consumer_count") == 1])
            cons = _poll(t, "/api/consumers",
                         lambda items, tag=tag: [x for x in items if x["consumer_tag"] == tag])
            keys[t.kind] = {"connection": set(c), "channel": set(chan[0]),
                            "consumer": set(cons[0])}
        missing = {k: sorted(keys["rabbitmq"][k] - keys["ackmq"][k] - _STATS_ONLY)
                   for k in keys["rabbitmq"]}
        assert missing == {"connection": [], "channel": [], "consumer": []}
    finally:
        for conn in conns:
            if conn.is_open:
                conn.close()
