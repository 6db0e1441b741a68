"""One management plane (issue 26): the web UI, the API and `ackmq ctl` run the same
operations (server/ops.py) and show the same views (server/views.py). Each test here
was a disagreement between them: it goes through the real UI or API over HTTP (the API
against RabbitMQ too, where the answer is RabbitMQ's)."""

from __future__ import annotations

import asyncio
import html
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from support.mgmthelp import Target, q
from support.slowfsync import SlowFsync
from support.stomphelp import Raw
from support.uihelp import ui_call

import ackmq

# every basic property, RabbitMQ's names, values RabbitMQ's publish accepts (user_id
# must be the publishing user's name: guest)
EVERY_PROPERTY: dict[str, Any] = {
    "content_type": "text/plain", "content_encoding": "utf-8", "headers": {"h": "v"},
    "delivery_mode": 2, "priority": 3, "correlation_id": "corr", "reply_to": "back",
    "expiration": "60000", "message_id": "mid", "timestamp": 1700000000, "type": "kind",
    "user_id": "guest", "app_id": "app", "cluster_id": "cl"}


def ui_post(b: ackmq.EmbeddedBroker, path: str, form: dict[str, str]) -> str:
    """The page a form's 303 leads to, its HTML entities decoded."""
    status, headers, body = ui_call(b, "POST", path, form=form)
    assert status == 303, (status, body)
    return html.unescape(ui_call(b, "GET", headers["location"])[2])


def on_loop(b: ackmq.EmbeddedBroker, fn: Any) -> Any:
    async def run() -> Any:
        return fn()
    return asyncio.run_coroutine_threadsafe(run(), b._loop).result(10)  # type: ignore[arg-type]


def received(url: str, queue: str) -> tuple[Any, bytes]:
    """The one message on `queue`, as a consumer gets it."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        method, props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None, f"nothing on {queue}"
        return props, body
    finally:
        conn.close()


def pika_props(props: Any) -> dict[str, Any]:
    got = {k: getattr(props, "type" if k == "type" else k) for k in EVERY_PROPERTY}
    got["headers"] = {k: v.decode() if isinstance(v, bytes) else v
                      for k, v in (got["headers"] or {}).items()}
    return got


# -- a UI publish is confirmed -------------------------------------------------------------
@pytest.fixture
def slow_fsync_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                      ) -> Iterator[tuple[ackmq.EmbeddedBroker, SlowFsync]]:
    slow = SlowFsync(0.3)
    monkeypatch.setattr(os, "fdatasync", slow)
    with ackmq.EmbeddedBroker(data_dir=tmp_path / "d") as b:
        yield b, slow


def test_M2_ui_publish_answers_after_the_fsync(slow_fsync_broker: Any) -> None:
    """A persistent message to a durable queue is on disk when the UI says "Message
    published." (it was answered before its fsync: an unconfirmed channel)."""
    b, slow = slow_fsync_broker
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().queue_declare("ui-durable", durable=True)
    conn.close()
    slow.done.clear()
    sent = time.monotonic()
    status, headers, _ = ui_call(b, "POST", "/queue/publish", form={
        "vhost": "/", "name": "ui-durable", "payload": "kept", "delivery_mode": "2"})
    got = time.monotonic()
    assert status == 303 and "Message+published" in headers["location"], headers
    with slow.lock:
        assert slow.done, "the UI answered before any fdatasync"
        assert sent < slow.done[0] <= got
    props, body = received(b.url, "ui-durable")
    assert (body, props.delivery_mode) == (b"kept", 2)


# -- purge of another connection's exclusive queue -------------------------------------------
@pytest.fixture(scope="module")
def plane() -> Iterator[ackmq.EmbeddedBroker]:
    with ackmq.EmbeddedBroker(persistent=False) as b:
        yield b


def _exclusive_queue(url: str, n: int) -> tuple[pika.BlockingConnection, str]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    for _ in range(n):
        ch.basic_publish("", name, b"x")
    return conn, name


LOCKED = ("cannot obtain exclusive access to locked queue '{}' in vhost '/'. It could be "
          "originally declared on another connection or the exclusive property value does "
          "not match that of the original declaration.")


def test_M1_purge_of_another_connections_exclusive_queue_refused(mgmt: Target) -> None:
    owner, name = _exclusive_queue(mgmt.amqp_url, 2)
    try:
        r = mgmt.call("DELETE", f"/api/queues/%2F/{q(name)}/contents")
        assert (r.status, r.body) == (400, {"error": "bad_request",
                                            "reason": LOCKED.format(name)})
    finally:
        owner.close()


def test_M1_delete_of_another_connections_exclusive_queue_refused(mgmt: Target) -> None:
    """RabbitMQ 3.10: 400 with the lock's text (no code), and the queue stays."""
    owner, name = _exclusive_queue(mgmt.amqp_url, 1)
    try:
        r = mgmt.call("DELETE", f"/api/queues/%2F/{q(name)}")
        assert (r.status, r.body) == (400, {"error": "bad_request",
                                            "reason": LOCKED.format(name)})
        assert mgmt.call("GET", f"/api/queues/%2F/{q(name)}").status == 200
    finally:
        owner.close()


def test_M1_get_from_another_connections_exclusive_queue_refused(mgmt: Target) -> None:
    """RabbitMQ 3.10's get answers the channel's close with its code and name in the
    reason ("405 RESOURCE_LOCKED - …"), unlike purge and delete."""
    owner, name = _exclusive_queue(mgmt.amqp_url, 1)
    try:
        r = mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get",
                      {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        assert (r.status, r.body) == (400, {"error": "bad_request", "reason":
                                            "405 RESOURCE_LOCKED - " + LOCKED.format(name)})
    finally:
        owner.close()


def test_M2_ui_purge_of_another_connections_exclusive_queue_refused(
        plane: ackmq.EmbeddedBroker) -> None:
    owner, name = _exclusive_queue(plane.url, 2)
    try:
        api = Target("ackmq", plane.http_url, plane.url).call(
            "DELETE", f"/api/queues/%2F/{q(name)}/contents")
        assert api.status == 400
        page = ui_post(plane, "/queue/purge", {"vhost": "/", "name": name})
        assert api.body["reason"] in page  # the API's text
        assert "Queue purged" not in page
        assert '<span id="q-ready">2</span>' in page
    finally:
        owner.close()


# -- connections: protocol and channels ------------------------------------------------------
def _connections_page(b: ackmq.EmbeddedBroker) -> str:
    return html.unescape(ui_call(b, "GET", "/connections")[2])


def _stomp_conn(b: ackmq.EmbeddedBroker) -> Any:
    return on_loop(b, lambda: next(c for c in b.server.ctx.connections
                                   if type(c).__name__ == "StompConnection"))


def test_M2_ui_and_api_show_the_negotiated_stomp_version(plane: ackmq.EmbeddedBroker) -> None:
    api = Target("ackmq", plane.http_url, plane.url)
    with Raw.open("127.0.0.1", plane.stomp_port) as r:
        r.connect("1.1")
        conns = api.call("GET", "/api/connections").body
        assert [c["protocol"] for c in conns] == ["STOMP 1.1"]
        page = _connections_page(plane)
        assert "<td>STOMP 1.1</td>" in page and "STOMP 1.2" not in page


def test_M2_ui_hides_a_closed_stomp_channel_as_the_api(plane: ackmq.EmbeddedBroker) -> None:
    """A STOMP connection whose session channel is closed while its socket is still
    listed: no channel, in the UI as in the API."""
    api = Target("ackmq", plane.http_url, plane.url)
    with Raw.open("127.0.0.1", plane.stomp_port) as r:
        r.connect("1.2")
        conn = _stomp_conn(plane)
        assert api.call("GET", "/api/connections").body[0]["channels"] == 1
        assert "(1)</td>" in _connections_page(plane)
        on_loop(plane, lambda: conn.channel.close())
        assert api.call("GET", "/api/channels").body == []
        assert api.call("GET", "/api/connections").body[0]["channels"] == 0
        page = _connections_page(plane)
        assert "no channels" in page and "(1)</td>" not in page


# -- every basic property publishes ----------------------------------------------------------
def test_M1_publish_every_basic_property(mgmt: Target) -> None:
    name = mgmt.name("props")
    assert mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {}).status == 201
    mgmt.cleanup.append(("queue", name))
    r = mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": name, "payload": "p", "payload_encoding": "string",
        "properties": EVERY_PROPERTY})
    assert (r.status, r.body) == (200, {"routed": True})
    props, body = received(mgmt.amqp_url, name)
    assert body == b"p"
    assert pika_props(props) == EVERY_PROPERTY
    # the API's get shows them under RabbitMQ's names, `type` included
    mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": name, "payload": "p", "payload_encoding": "string",
        "properties": EVERY_PROPERTY})
    got = mgmt.call("POST", f"/api/queues/%2F/{q(name)}/get",
                    {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert got.body[0]["properties"] == EVERY_PROPERTY


def test_M1_publish_user_id_of_another_user_refused(mgmt: Target) -> None:
    name = mgmt.name("uid")
    assert mgmt.call("PUT", f"/api/queues/%2F/{q(name)}", {}).status == 201
    mgmt.cleanup.append(("queue", name))
    r = mgmt.call("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": name, "payload": "p", "payload_encoding": "string",
        "properties": {"user_id": "bob"}})
    assert (r.status, r.body) == (400, {"error": "bad_request", "reason": (
        "406 PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user "
        "was 'guest'")})


def test_M2_ui_publishes_every_basic_property(plane: ackmq.EmbeddedBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(plane.url))
    conn.channel().queue_declare("ui-every-property")
    conn.close()
    others = {k: v for k, v in EVERY_PROPERTY.items() if k not in ("headers", "delivery_mode")}
    page = ui_post(plane, "/queue/publish", {
        "vhost": "/", "name": "ui-every-property", "payload": "p", "delivery_mode": "2",
        "headers": "h=v", "properties": ", ".join(f"{k}={v}" for k, v in others.items())})
    assert "Message published." in page, page
    props, body = received(plane.url, "ui-every-property")
    assert body == b"p"
    assert pika_props(props) == EVERY_PROPERTY
    page = ui_post(plane, "/queue/publish", {
        "vhost": "/", "name": "ui-every-property", "payload": "p", "delivery_mode": "1",
        "properties": "user_id=bob"})
    assert ("PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user "
            "was 'guest'") in page
