"""M2 without a browser: the web UI's login, per-vhost visibility, permission checks on
its actions, cross-origin refusal and escaping, over plain HTTP."""

from __future__ import annotations

import asyncio
import html
import time
import uuid
from collections.abc import Iterator

import pika
import pytest
from support.uihelp import ui_call

import ackmq


@pytest.fixture(scope="module")
def broker() -> Iterator[ackmq.EmbeddedBroker]:
    with ackmq.EmbeddedBroker(persistent=False) as b:
        yield b


call = ui_call  # the UI tests' name for it (test_ui_policies imports it from here)


def follow(b: ackmq.EmbeddedBroker, reply: tuple[int, dict[str, str], str],
           auth: tuple[str, str] = ("guest", "guest")) -> str:
    """The page a form's 303 leads to, its HTML entities decoded."""
    status, headers, body = reply
    assert status == 303, (status, body)
    return html.unescape(call(b, "GET", headers["location"], auth)[2])


def declare(b: ackmq.EmbeddedBroker, name: str, n: int = 0) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.queue_declare(name)
        for _ in range(n):
            ch.basic_publish("", name, b"x")
    finally:
        conn.close()


def user(b: ackmq.EmbeddedBroker, tags: list[str], perms: tuple[str, str, str] | None
         ) -> tuple[str, str]:
    """A throwaway user, made on the broker's loop (the model is the loop's alone)."""
    name, pw = f"ui-{uuid.uuid4().hex[:8]}", "pw"
    access = b.server.access

    async def make() -> None:
        access.add_user(name, pw)
        access.set_user_tags(name, tags)
        if perms is not None:
            access.set_permissions(name, "/", *perms)
    asyncio.run_coroutine_threadsafe(make(), b._loop).result(10)  # type: ignore[attr-defined]
    return name, pw


def test_M2_ui_needs_a_login(broker: ackmq.EmbeddedBroker) -> None:
    # the login form, never a Basic challenge the browser would cache (U3)
    status, headers, _ = call(broker, "GET", "/", auth=None)
    assert status == 303 and headers["location"] == "/login?next=%2F"
    assert "www-authenticate" not in headers
    status, headers, _ = call(broker, "GET", "/", auth=("guest", "wrong"))
    assert status == 401 and "www-authenticate" not in headers
    # the stylesheet needs none (a login prompt page may use it)
    assert call(broker, "GET", "/static/ackmq.css", auth=None)[0] == 200
    assert call(broker, "GET", "/static/..%2Fui.py", auth=None)[0] == 404


def test_M2_pages_render(broker: ackmq.EmbeddedBroker) -> None:
    declare(broker, "ui-http-pages", 3)
    for path in ("/", "/queues", "/connections", "/exchanges", "/admin",
                 "/queue?vhost=%2F&name=ui-http-pages"):
        status, headers, body = call(broker, "GET", path)
        assert status == 200, path
        assert headers["content-type"].startswith("text/html")
        assert '<div id="live"' in body
    body = call(broker, "GET", "/queue?vhost=%2F&name=ui-http-pages")[2]
    assert '<span id="q-ready">3</span>' in body
    assert call(broker, "GET", "/queue?vhost=%2F&name=no-such-queue")[0] == 404


def test_M2_names_are_escaped(broker: ackmq.EmbeddedBroker) -> None:
    declare(broker, "<script>alert(1)</script>")
    body = call(broker, "GET", "/queues")[2]
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_M2_cross_origin_post_refused(broker: ackmq.EmbeddedBroker) -> None:
    declare(broker, "ui-http-csrf", 2)
    status, _, _ = call(broker, "POST", "/queue/purge",
                        form={"vhost": "/", "name": "ui-http-csrf"},
                        headers={"Origin": "http://evil.example"})
    assert status == 403
    body = call(broker, "GET", "/queue?vhost=%2F&name=ui-http-csrf")[2]
    assert '<span id="q-ready">2</span>' in body
    same = broker.http_url
    body = follow(broker, call(broker, "POST", "/queue/purge",
                               form={"vhost": "/", "name": "ui-http-csrf"},
                               headers={"Origin": same}))
    assert "Queue purged (2 messages)" in body


def test_M2_actions_follow_the_users_permissions(broker: ackmq.EmbeddedBroker) -> None:
    declare(broker, "ui-http-perm", 1)
    # read only: may get and purge, not delete (configure) nor publish (write)
    reader = user(broker, ["management"], ("^$", "^$", ".*"))
    body = follow(broker, call(broker, "POST", "/queue/delete", reader,
                               {"vhost": "/", "name": "ui-http-perm"}), reader)
    assert ("ACCESS_REFUSED - access to queue 'ui-http-perm' in vhost '/' refused for "
            f"user '{reader[0]}'") in body
    body = follow(broker, call(broker, "POST", "/queue/publish", reader,
                               {"vhost": "/", "name": "ui-http-perm", "payload": "x",
                                "delivery_mode": "1"}), reader)
    assert "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused" in body
    status, _, body = call(broker, "POST", "/queue/get", reader,
                           {"vhost": "/", "name": "ui-http-perm", "count": "1",
                            "ackmode": "ack_requeue_true"})
    assert status == 200 and '<pre class="payload">x</pre>' in body
    # no permissions on "/": the queue is not even visible
    outsider = user(broker, ["management"], None)
    assert call(broker, "GET", "/queue?vhost=%2F&name=ui-http-perm", outsider)[0] == 404
    assert "ui-http-perm" not in call(broker, "GET", "/queues", outsider)[2]
    # no management tag: no UI, as RabbitMQ
    plain = user(broker, [], (".*", ".*", ".*"))
    status, _, body = call(broker, "GET", "/", plain)
    assert status == 401 and "Not management user" in body


def test_M2_publish_form_rejects_bad_properties(broker: ackmq.EmbeddedBroker) -> None:
    declare(broker, "ui-http-props")
    form = {"vhost": "/", "name": "ui-http-props", "payload": "x", "delivery_mode": "2"}
    body = follow(broker, call(broker, "POST", "/queue/publish",
                               form={**form, "headers": "novalue"}))
    assert "'novalue': write key=value" in body
    body = follow(broker, call(broker, "POST", "/queue/publish",
                               form={**form, "properties": "colour=red"}))
    assert "unknown properties colour" in body
    body = follow(broker, call(broker, "POST", "/queue/publish",
                               form={**form, "properties": "expiration=soon"}))
    assert "PRECONDITION_FAILED" in body
    body = call(broker, "GET", "/queue?vhost=%2F&name=ui-http-props")[2]
    assert '<span id="q-ready">0</span>' in body


def test_M2_queue_rates_between_two_views(broker: ackmq.EmbeddedBroker) -> None:
    """A queue's rates are measured between two showings of it (nothing is sampled per
    queue while nobody looks); the interval is shortened here to keep the test short."""
    from ackmq.server.http.ui import SAMPLER_KEY
    sampler = broker.server.http._runner.app[SAMPLER_KEY]
    old, sampler.interval = sampler.interval, 0.5
    try:
        declare(broker, "ui-http-rates")
        call(broker, "GET", "/queue?vhost=%2F&name=ui-http-rates")  # the first snapshot
        declare(broker, "ui-http-rates", 40)
        time.sleep(0.6)
        body = call(broker, "GET", "/queue?vhost=%2F&name=ui-http-rates")[2]
        row = body.split('<table id="queue">', 1)[1].split("</table>", 1)[0]
        heads = [h.split("</th>")[0] for h in row.split("<th>")[1:]]
        cells = [c.split("</td>")[0] for c in row.split("<td>")[1:]]
        incoming = float(cells[heads.index("Incoming")].removesuffix("/s").replace(",", ""))
        assert incoming > 0, cells
    finally:
        sampler.interval = old
