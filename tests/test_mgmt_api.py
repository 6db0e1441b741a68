"""M1: the management HTTP API, each call made against ackmq and RabbitMQ alike."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.mgmthelp import REALM_HEADER, Target, q


def test_M1_overview_keys(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/overview")
    assert r.status == 200
    assert r.headers["content-type"].startswith("application/json")
    for key in ("management_version", "rates_mode", "exchange_types", "product_version",
                "product_name", "rabbitmq_version", "cluster_name", "erlang_version",
                "message_stats", "queue_totals", "object_totals", "node", "listeners",
                "contexts"):
        assert key in r.body, key
    assert set(r.body["object_totals"]) == {"channels", "connections", "consumers",
                                            "exchanges", "queues"}
    assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(
        r.body["queue_totals"])
    assert {"amqp", "http"} <= {x["protocol"] for x in r.body["listeners"]}


def test_M1_no_credentials_401_with_challenge(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/overview", auth=None)
    assert r.status == 401
    assert r.headers["www-authenticate"] == REALM_HEADER
    assert r.raw == b""


def test_M1_wrong_password_401_login_failed(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/overview", auth=("guest", "not-the-password"))
    assert r.status == 401
    assert r.headers["www-authenticate"] == REALM_HEADER
    assert r.body == {"error": "not_authorized", "reason": "Login failed"}


@pytest.mark.parametrize("header,status", [
    ("Basic !!!notbase64", 400), ("Basic " + "Z3Vlc3Q=", 400), ("Basic", 400),
    ("Bearer abc", 401)])
def test_M1_malformed_authorization(mgmt: Target, header: str, status: int) -> None:
    """A Basic header that is not user:password is a 400 with no body; another scheme
    is a failed login (RabbitMQ tries it as an OAuth 2 token)."""
    r = mgmt.call("GET", "/api/overview", auth=None, headers={"Authorization": header})
    assert r.status == status
    if status == 400:
        assert r.raw == b""
    else:
        assert r.body == {"error": "not_authorized", "reason": "Login failed"}


def test_M1_whoami(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/whoami")
    assert r.status == 200
    assert r.body == {"name": "guest", "tags": ["administrator"]}


def test_M1_auth_settings_need_no_login(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/auth", auth=None)
    assert (r.status, r.body) == (200, {"enable_uaa": False, "uaa_client_id": "",
                                        "uaa_location": ""})


def test_M1_unknown_path_404_before_login(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/no-such-thing", auth=None)
    assert (r.status, r.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_M1_wrong_method_405(mgmt: Target) -> None:
    r = mgmt.call("POST", "/api/overview")
    assert r.status == 405
    assert {"GET", "HEAD", "OPTIONS"} <= {m.strip() for m in r.headers["allow"].split(",")}


# -- queues ------------------------------------------------------------------------------
def test_M1_queue_put_get_delete(mgmt: Target) -> None:
    name = mgmt.name("q")
    path = f"/api/queues/%2F/{q(name)}"
    assert mgmt.call("PUT", path, {"durable": True, "arguments": {"x-max-length": 10}}
                     ).status == 201
    mgmt.cleanup.append(("queue", name))
    assert mgmt.call("PUT", path, {"durable": True, "arguments": {"x-max-length": 10}}
                     ).status == 204
    r = mgmt.call("GET", path)
    assert r.status == 200
    for key in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "node",
                "type", "consumer_details"):
        assert key in r.body, key
    assert (r.body["name"], r.body["vhost"], r.body["durable"], r.body["type"]) == \
        (name, "/", True, "classic")
    assert r.body["arguments"] == {"x-max-length": 10}
    listed = mgmt.call("GET", "/api/queues/%2F?columns=name,durable")
    assert {"name": name, "durable": True} in listed.body
    assert mgmt.call("DELETE", path).status == 204
    assert mgmt.call("GET", path).status == 404
    assert mgmt.call("DELETE", path).body == {"error": "Object Not Found", "reason": "Not Found"}


def test_M1_queue_put_defaults_not_durable(mgmt: Target) -> None:
    name = mgmt.name("q")
    assert mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {}).status == 201
    mgmt.cleanup.append(("queue", name))
    assert mgmt.call("GET", f"/api/queues/%2F/{q(name)}").body["durable"] is False


def test_M1_queue_inequivalent_400(mgmt: Target) -> None:
    name = mgmt.name("q")
    assert mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True}).status == 201
    mgmt.cleanup.append(("queue", name))
    r = mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})
    assert (r.status, r.body) == (400, {"error": "bad_request", "reason": (
        f"inequivalent arg 'durable' for queue '{name}' in vhost '/': received 'false' "
        "but current is 'true'")})


@pytest.mark.parametrize("method,path", [("PUT", "/api/queues/%2F/amq.mgmt-test"),
                                         ("DELETE", "/api/exchanges/%2F/amq.direct")])
def test_M1_reserved_names_401_access_refused(mgmt: Target, method: str, path: str) -> None:
    r = mgmt.call(method, path, {} if method == "PUT" else None)
    assert (r.status, r.body) == (401, {"error": "not_authorised", "reason": "Access refused."})


def test_M1_bad_json_400_not_json(mgmt: Target) -> None:
    r = mgmt.call("PUT", f"/api/queues/%2F/{mgmt.name('q')}", b"{not json")
    assert (r.status, r.body) == (400, {"error": "bad_request", "reason": "not_json"})


def test_M1_not_boolean_400(mgmt: Target) -> None:
    r = mgmt.call("PUT", f"/api/queues/%2F/{q(mgmt.name('q'))}", {"durable": "yes"})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": ["not_boolean", "yes"]})


def test_M1_queue_in_missing_vhost_404(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/queues/no-such-vhost-mgmt")
    assert (r.status, r.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_M1_publish_get_purge(mgmt: Target) -> None:
    name = mgmt.name("q")
    assert mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True}).status == 201
    mgmt.cleanup.append(("queue", name))
    r = mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": name, "payload": "hello", "payload_encoding": "string",
        "properties": {"delivery_mode": 2, "headers": {"a": 1}}})
    assert (r.status, r.body) == (200, {"routed": True})
    get = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}
    r = mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get", get)
    assert r.status == 200
    assert r.body == [{"payload_bytes": 5, "redelivered": False, "exchange": "",
                       "routing_key": name, "message_count": 0,
                       "properties": {"delivery_mode": 2, "headers": {"a": 1}},
                       "payload": "hello", "payload_encoding": "string"}]
    r = mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get", {**get, "truncate": 2})
    assert (r.body[0]["payload"], r.body[0]["redelivered"]) == ("he", True)
    assert mgmt.call("DELETE", f"/api/queues/%2F/{q(name)}/contents").status == 204
    assert mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get", get).body == []


def test_M1_get_ack_removes(mgmt: Target) -> None:
    name = mgmt.name("q")
    mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {})
    mgmt.cleanup.append(("queue", name))
    for i in range(3):
        mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", {
            "routing_key": name, "payload": base64.b64encode(bytes([i, 255])).decode(),
            "payload_encoding": "base64", "properties": {}})
    r = mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get",
                  {"count": 2, "ackmode": "ack_requeue_false", "encoding": "base64"})
    assert [m["payload"] for m in r.body] == [base64.b64encode(bytes([i, 255])).decode()
                                             for i in range(2)]
    assert [m["message_count"] for m in r.body] == [2, 1]
    r = mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get",
                  {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert len(r.body) == 1 and r.body[0]["payload_encoding"] == "base64"


def test_M1_publish_unroutable_and_errors(mgmt: Target) -> None:
    body = {"routing_key": mgmt.name("none"), "payload": "x", "payload_encoding": "string",
            "properties": {}}
    r = mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", body)
    assert (r.status, r.body) == (200, {"routed": False})
    r = mgmt.call("POST", "/api/exchanges/%2F/no-such-x-mgmt/publish", body)
    assert (r.status, r.body) == (400, {"error": "bad_request", "reason": (
        "404 NOT_FOUND - no exchange 'no-such-x-mgmt' in vhost '/'")})
    r = mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "a"})
    assert r.status == 400
    assert r.body["reason"] == ("[{key_missing,properties},\n {key_missing,payload},\n"
                                " {key_missing,payload_encoding}]")


def test_M1_get_missing_queue_404(mgmt: Target) -> None:
    r = mgmt.call("POST", "/api/queues/%2F/no-such-q-mgmt/get",
                  {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert (r.status, r.body) == (404, {"error": "not_found", "reason": (
        "NOT_FOUND - no queue 'no-such-q-mgmt' in vhost '/'")})


# -- exchanges and bindings ---------------------------------------------------------
def test_M1_exchange_put_get_delete(mgmt: Target) -> None:
    name = mgmt.name("x")
    path = f"/api/exchanges/%2F/{q(name)}"
    assert mgmt.call("PUT", path, {"type": "topic", "durable": True}).status == 201
    mgmt.cleanup.append(("exchange", name))
    r = mgmt.call("GET", path)
    assert r.status == 200
    assert {k: r.body[k] for k in ("name", "vhost", "type", "durable", "auto_delete",
                                   "internal", "arguments")} == {
        "name": name, "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {}}
    r = mgmt.call("GET", "/api/exchanges/%2F?columns=name")
    assert {"name": ""} in r.body and {"name": "amq.topic"} in r.body
    r = mgmt.call("PUT", f"/api/exchanges/%2F/{q(mgmt.name('x'))}", {"type": "nosuch"})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": "unknown exchange type 'nosuch'"})
    assert mgmt.call("DELETE", path).status == 204
    assert mgmt.call("GET", path).status == 404


def test_M1_bindings_create_list_delete(mgmt: Target) -> None:
    x, qn = mgmt.name("x"), mgmt.name("q")
    mgmt.call("PUT", f"/api/exchanges/%2F/{q(x)}", {"type": "topic"})
    mgmt.cleanup.append(("exchange", x))
    mgmt.call("PUT", f"/api/queues/%2F/{q(qn)}", {})
    mgmt.cleanup.append(("queue", qn))
    pair = f"/api/bindings/%2F/e/{q(x)}/q/{q(qn)}"
    r = mgmt.call("POST", pair, {"routing_key": "a.#", "arguments": {}})
    assert r.status == 201
    assert r.headers["location"] == f"{q(qn)}/a.%2523"
    expected = {"source": x, "vhost": "/", "destination": qn, "destination_type": "queue",
                "routing_key": "a.#", "arguments": {}, "properties_key": "a.%23"}
    assert mgmt.call("GET", pair).body == [expected]
    assert mgmt.call("GET", pair + "/a.%2523").body == expected
    qb = mgmt.call("GET", f"/api/queues/%2F/{q(qn)}/bindings").body
    assert qb[0]["source"] == "" and qb[0]["routing_key"] == qn and expected in qb
    assert mgmt.call("GET", f"/api/exchanges/%2F/{q(x)}/bindings/source").body == [expected]
    assert expected in mgmt.call("GET", "/api/bindings/%2F").body
    r = mgmt.call("POST", "/api/exchanges/%2F/" + q(x) + "/publish", {
        "routing_key": "a.b", "payload": "x", "payload_encoding": "string",
        "properties": {}})
    assert r.body == {"routed": True}
    assert mgmt.call("DELETE", pair + "/a.%2523").status == 204
    assert mgmt.call("GET", pair).body == []
    assert mgmt.call("DELETE", pair + "/a.%2523").status == 404


# -- tags and visibility ------------------------------------------------------------------
@pytest.mark.parametrize("tags,path,reason", [
    ("", "/api/overview", "Not management user"),
    ("", "/api/whoami", "Not management user"),
    ("management", "/api/users", "Not administrator user"),
    ("management", "/api/permissions", "Not administrator user"),
    ("management", "/api/definitions", "Not administrator user"),
    ("management", "/api/nodes", "Not monitor user"),
    ("monitoring", "/api/definitions", "Not administrator user"),
    ("management", "/api/vhosts/%2F", "Not administrator user"),
])
def test_M1_tags_refused_401(mgmt: Target, tags: str, path: str, reason: str) -> None:
    creds = mgmt.user(tags)
    r = mgmt.call("GET", path, auth=creds)
    assert (r.status, r.body) == (401, {"error": "not_authorised", "reason": reason})
    assert "www-authenticate" not in r.headers


def test_M1_management_user_sees_its_vhosts_only(mgmt: Target) -> None:
    vh = mgmt.vhost()
    creds = mgmt.user("management", vhost=vh)
    assert [v["name"] for v in mgmt.call("GET", "/api/vhosts", auth=creds).body] == [vh]
    r = mgmt.call("GET", "/api/queues/%2F", auth=creds)
    assert (r.status, r.body) == (401, {"error": "not_authorised",
                                        "reason": "User not authorised to access virtual host"})
    assert mgmt.call("GET", f"/api/queues/{q(vh)}", auth=creds).body == []
    assert all(x["vhost"] == vh for x in mgmt.call("GET", "/api/exchanges", auth=creds).body)
    assert mgmt.call("GET", "/api/whoami", auth=creds).body == {"name": creds[0],
                                                                "tags": ["management"]}


def test_M1_monitoring_user_needs_permissions_for_vhost_paths(mgmt: Target) -> None:
    vh = mgmt.vhost()
    creds = mgmt.user("monitoring", vhost=None)
    assert vh in [v["name"] for v in mgmt.call("GET", "/api/vhosts", auth=creds).body]
    r = mgmt.call("GET", f"/api/queues/{q(vh)}", auth=creds)
    assert r.status == 401 and r.body["reason"] == "User not authorised to access virtual host"
    assert mgmt.call("GET", "/api/nodes", auth=creds).status == 200


def test_M1_management_user_declare_needs_configure(mgmt: Target) -> None:
    vh = mgmt.vhost()
    creds = mgmt.user("management", vhost=None)
    r = mgmt.call("PUT", f"/api/permissions/{q(vh)}/{q(creds[0])}",
                  {"configure": "^nothing$", "write": ".*", "read": ".*"})
    assert r.status == 201
    r = mgmt.call("PUT", f"/api/queues/{q(vh)}/{q(mgmt.name('q'))}", {}, auth=creds)
    assert (r.status, r.body) == (401, {"error": "not_authorised", "reason": "Access refused."})


# -- users, vhosts, permissions ----------------------------------------------------------
def test_M1_users_and_permissions(mgmt: Target) -> None:
    name, pw = mgmt.user("management,monitoring")
    r = mgmt.call("GET", f"/api/users/{q(name)}")
    assert r.status == 200
    assert set(r.body) == {"name", "password_hash", "hashing_algorithm", "tags", "limits"}
    assert r.body["tags"] == ["management", "monitoring"]
    assert r.body["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert mgmt.call("GET", "/api/whoami", auth=(name, pw)).status == 200
    r = mgmt.call("GET", f"/api/permissions/%2F/{q(name)}")
    assert r.body == {"user": name, "vhost": "/", "configure": ".*", "write": ".*",
                      "read": ".*"}
    r = mgmt.call("PUT", f"/api/permissions/%2F/{q(name)}", {"configure": ".*"})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": "[{key_missing,write},{key_missing,read}]"})
    r = mgmt.call("PUT", "/api/permissions/%2F/no-such-user-mgmt",
                  {"configure": ".*", "write": ".*", "read": ".*"})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": "vhost_or_user_not_found"})
    assert mgmt.call("DELETE", f"/api/permissions/%2F/{q(name)}").status == 204
    assert mgmt.call("GET", f"/api/permissions/%2F/{q(name)}").status == 404
    assert mgmt.call("DELETE", f"/api/users/{q(name)}").status == 204
    assert mgmt.call("GET", f"/api/users/{q(name)}").status == 404


def test_M1_vhost_put_grants_creator(mgmt: Target) -> None:
    vh = mgmt.vhost()
    assert mgmt.call("PUT", f"/api/vhosts/{q(vh)}").status == 204
    r = mgmt.call("GET", f"/api/permissions/{q(vh)}/guest")
    assert r.status == 200 and r.body["configure"] == ".*"
    assert mgmt.call("GET", f"/api/vhosts/{q(vh)}").body["name"] == vh


def test_M1_vhost_limits(mgmt: Target) -> None:
    vh = mgmt.vhost()
    assert mgmt.call("PUT", f"/api/vhost-limits/{q(vh)}/max-queues", {"value": 7}
                     ).status == 204
    assert mgmt.call("GET", f"/api/vhost-limits/{q(vh)}").body == [
        {"vhost": vh, "value": {"max-queues": 7}}]
    assert mgmt.call("DELETE", f"/api/vhost-limits/{q(vh)}/max-queues").status == 204
    assert mgmt.call("GET", f"/api/vhost-limits/{q(vh)}").body == []


# -- health checks -----------------------------------------------------------------
def test_M1_health_checks(mgmt: Target) -> None:
    assert mgmt.call("GET", "/api/health/checks/alarms").body == {"status": "ok"}
    assert mgmt.call("GET", "/api/health/checks/local-alarms").body == {"status": "ok"}
    assert mgmt.call("GET", "/api/health/checks/virtual-hosts").body == {"status": "ok"}
    r = mgmt.call("GET", "/api/health/checks/protocol-listener/amqp")
    assert r.body == {"status": "ok", "protocol": "amqp"}
    # MQTT listens on both (ackmq by default, RabbitMQ with its plugin on, as CI runs it)
    r = mgmt.call("GET", "/api/health/checks/protocol-listener/mqtt")
    assert r.body == {"status": "ok", "protocol": "mqtt"}
    r = mgmt.call("GET", "/api/health/checks/protocol-listener/nope")
    assert r.status == 503
    assert {k: r.body[k] for k in ("status", "reason", "missing")} == {
        "status": "failed", "reason": "No active listener", "missing": "nope"}
    port = int(mgmt.amqp_url.rsplit(":", 1)[1].split("/")[0])
    r = mgmt.call("GET", f"/api/health/checks/port-listener/{port}")
    assert r.body == {"status": "ok", "port": port}
    r = mgmt.call("GET", "/api/health/checks/node-is-quorum-critical")
    assert r.body == {"status": "ok", "reason": "single node cluster"}
    assert mgmt.call("GET", "/api/aliveness-test/%2F").body == {"status": "ok"}


def test_M1_pagination(mgmt: Target) -> None:
    r = mgmt.call("GET", "/api/exchanges/%2F?page=1&page_size=2&columns=name")
    assert set(r.body) == {"filtered_count", "item_count", "items", "page", "page_count",
                           "page_size", "total_count"}
    assert r.body["item_count"] == 2 and r.body["page_size"] == 2
    assert all(set(i) == {"name"} for i in r.body["items"])


def test_M1_https_listener(ca: Any, tmp_path: Path) -> None:
    """`https_port` (`--https-port`): the same API over TLS with the --tls-* options."""
    import ssl
    import urllib.request

    from support.tlshelp import server_files

    import ackmq
    files = server_files(ca, tmp_path)
    with ackmq.EmbeddedBroker(persistent=False, https_port=0, tls_cert=files["cert"],
                              tls_key=files["key"]) as b:
        url = b.server.http.https_url
        assert url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(files["ca"]))
        req = urllib.request.Request(url + "/api/whoami", headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            assert json.loads(r.read()) == {"name": "guest", "tags": ["administrator"]}
        assert b.http_url.startswith("http://")  # the plain one stays


def test_M1_no_http_listener() -> None:
    import ackmq
    with ackmq.EmbeddedBroker(persistent=False, http_port=None) as b:
        assert b.http_url == "" and b.server.http is None


def test_M1_health_alarms_503_when_an_alarm_is_set() -> None:
    """ackmq only (raising an alarm on the shared RabbitMQ would block everyone): the
    body of rabbit_mgmt_wm_health_check_alarms, and the node's mem_alarm."""
    import time

    import ackmq
    with ackmq.EmbeddedBroker(persistent=False, memory_high_watermark="1MB",
                              memory_check_interval=0.05) as b:
        t = Target("ackmq", b.http_url, b.url)
        deadline = time.monotonic() + 10
        while (r := t.call("GET", "/api/health/checks/alarms")).status != 503:
            assert time.monotonic() < deadline, r
            time.sleep(0.05)
        node = t.call("GET", "/api/nodes").body[0]["name"]
        assert r.body == {"status": "failed",
                          "reason": "There are alarms in effect in the cluster",
                          "alarms": [{"node": node, "resource": "memory"}]}
        r = t.call("GET", "/api/health/checks/local-alarms")
        assert (r.status, r.body["reason"]) == (503, "There are alarms in effect on the node")
        assert t.call("GET", "/api/nodes").body[0]["mem_alarm"] is True


def test_M1_guest_only_via_localhost() -> None:
    """loopback_users as RabbitMQ's management plugin: guest from another address is
    401 "User can only log in via localhost"; another administrator logs in."""
    import socket

    from test_connection_edges import _local_address

    import ackmq
    address = _local_address(socket.AF_INET)
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    with ackmq.EmbeddedBroker(host="0.0.0.0", persistent=False) as b:
        local = Target("ackmq", b.http_url, b.url)
        name, pw = local.user("administrator")
        remote = Target("ackmq", f"http://{address}:{b.http_port}", b.url)
        r = remote.call("GET", "/api/whoami")
        assert (r.status, r.body) == (401, {"error": "not_authorised",
                                            "reason": "User can only log in via localhost"})
        assert remote.call("GET", "/api/whoami", auth=(name, pw)).status == 200
        assert remote.call("GET", "/api/whoami", auth=("guest", "wrong")).body == {
            "error": "not_authorized", "reason": "Login failed"}


def test_M1_publish_refused_by_full_queue_400(mgmt: Target) -> None:
    name = mgmt.name("q")
    mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {"arguments": {
        "x-max-length": 1, "x-overflow": "reject-publish"}})
    mgmt.cleanup.append(("queue", name))
    body = {"routing_key": name, "payload": "x", "payload_encoding": "string",
            "properties": {}}
    assert mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", body).body == {
        "routed": True}
    r = mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", body)
    assert (r.status, r.body) == (400, {"error": "bad_request", "reason": (
        "rejected Unable to publish message. Check queue limits.")})


@pytest.mark.parametrize("query,status,error", [
    ("page=0", 400, {"error": "invalid_pagination_parameters", "reason": (
        "Invalid pagination parameters: page number 0, page size undefined")}),
    ("page=x", 400, {"error": "bad_request", "reason": "Pagination parameters are invalid"}),
    ("page=1&page_size=1000", 400, {"error": "invalid_pagination_parameters", "reason": (
        "Invalid pagination parameters: page number 1, page size 1000")}),
    ("page=1&use_regex=true&name=(", 400, {
        "error": "bad_request", "reason": "Pagination parameters are invalid"}),
    ("page=9&page_size=5&name=amq.dir", 400, {
        "error": "page_out_of_range", "reason": "Page out of range, page: 9 page size: 5, "
        "len: 1"}),
])
def test_M1_pagination_errors(mgmt: Target, query: str, status: int, error: dict) -> None:
    r = mgmt.call("GET", f"/api/exchanges/%2F?{query}")
    assert (r.status, r.body) == (status, error)



# keys RabbitMQ has that ackmq leaves out, on purpose (Erlang internals, statistics
# ackmq does not sample, clustering); everything else RabbitMQ answers, ackmq answers
_ERLANG_ONLY = {"garbage_collection", "memory", "reductions", "reductions_details",
                "backing_queue_status", "consumer_capacity", "consumer_utilisation",
                "head_message_timestamp", "idle_since", "message_bytes",
                "message_bytes_paged_out", "message_bytes_persistent", "message_bytes_ram",
                "message_bytes_ready", "message_bytes_unacknowledged", "messages_paged_out",
                "messages_persistent", "messages_ram", "messages_ready_ram",
                "messages_unacknowledged_ram", "recoverable_slaves", "single_active_consumer_tag",
                "churn_rates", "statistics_db_event_queue", "erlang_full_version"}


def test_M1_same_keys_as_rabbitmq(ackmq_mgmt: Any) -> None:
    """Each object's JSON keys in ackmq and RabbitMQ, for the same objects made the same
    way: ackmq misses none but the Erlang/statistics ones listed above."""
    from support.mgmthelp import rabbit_http
    rabbit = Target("rabbitmq", rabbit_http(), "")
    ours = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url)
    try:
        shapes = {}
        for t in (rabbit, ours):
            qn, xn = t.name("keys-q"), t.name("keys-x")
            t.call("PUT", f"/api/queues/%2F/{q(qn)}", {"durable": True})
            t.cleanup.append(("queue", qn))
            t.call("PUT", f"/api/exchanges/%2F/{q(xn)}", {"type": "fanout"})
            t.cleanup.append(("exchange", xn))
            t.call("POST", f"/api/bindings/%2F/e/{q(xn)}/q/{q(qn)}", {"routing_key": "k"})
            t.call("POST", f"/api/exchanges/%2F/{q(xn)}/publish", {
                "routing_key": "k", "payload": "x", "payload_encoding": "string",
                "properties": {}})
            shapes[t.kind] = {
                "queue": t.call("GET", f"/api/queues/%2F/{q(qn)}").body,
                "exchange": t.call("GET", f"/api/exchanges/%2F/{q(xn)}").body,
                "binding": t.call("GET", f"/api/bindings/%2F/e/{q(xn)}/q/{q(qn)}").body[0],
                "overview": t.call("GET", "/api/overview").body,
                "vhost": next(v for v in t.call("GET", "/api/vhosts").body if v["name"] == "/"),
                "user": t.call("GET", "/api/users/guest").body,
                "whoami": t.call("GET", "/api/whoami").body,
                "node": t.call("GET", "/api/nodes").body[0],
            }
        # RabbitMQ fills a queue's statistics a few seconds after its creation
        deadline = time.monotonic() + 20
        while "messages" not in shapes["rabbitmq"]["queue"] and time.monotonic() < deadline:
            time.sleep(0.5)
            qn = next(n for k, n in rabbit.cleanup if k == "queue")
            shapes["rabbitmq"]["queue"] = rabbit.call("GET", f"/api/queues/%2F/{q(qn)}").body
        missing = {what: sorted(set(shapes["rabbitmq"][what]) - set(shapes["ackmq"][what])
                                - _ERLANG_ONLY - _NODE_ONLY)
                   for what in shapes["rabbitmq"]}
        assert missing == {what: [] for what in missing}
    finally:
        rabbit.forget()


# the node's Erlang VM and I/O statistics: ackmq reports memory, disk, alarms, uptime
_NODE_ONLY = {"applications", "channel_closed", "channel_closed_details", "channel_created",
              "channel_created_details", "connection_closed", "connection_closed_details",
              "connection_created", "connection_created_details", "context_switches",
              "context_switches_details", "disk_free_details", "fd_used", "fd_used_details",
              "gc_bytes_reclaimed", "gc_bytes_reclaimed_details", "gc_num", "gc_num_details",
              "mem_used_details", "metrics_gc_queue_length", "mnesia_disk_tx_count",
              "mnesia_disk_tx_count_details", "mnesia_ram_tx_count",
              "mnesia_ram_tx_count_details", "msg_store_read_count",
              "msg_store_read_count_details", "msg_store_write_count",
              "msg_store_write_count_details", "proc_used_details", "queue_created",
              "queue_created_details", "queue_declared", "queue_declared_details",
              "queue_deleted", "queue_deleted_details", "queue_index_read_count",
              "queue_index_read_count_details", "queue_index_write_count",
              "queue_index_write_count_details", "ra_open_file_metrics",
              "sockets_used_details", "enabled_plugin_file"}
_NODE_ONLY |= {f"io_{k}{s}" for k in ("read_avg_time", "read_bytes", "read_count",
                                     "reopen_count", "seek_avg_time", "seek_count",
                                     "sync_avg_time", "sync_count", "write_avg_time",
                                     "write_bytes", "write_count") for s in ("", "_details")}
