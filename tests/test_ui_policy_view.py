"""M2/M5: what the web UI shows of policies and arguments, over HTTP (the rendered HTML).

As RabbitMQ 3.10's management UI (looked at in a browser with a vhost, queues, a policy
and an operator policy of our own): /queues' Features shows D, TTL, DLX ... "Args" and
then the policy and the operator policy in force as badges (RabbitMQ's
`fmt_policy_short`); the queue page has the rows "Policy", "Operator policy" and
"Effective policy definition" (the API's `effective_policy_definition`); Policies is in
the top navigation. Every arguments / definition / headers value shows as JSON, never
as a Python repr (`b'dlx'`, `{'k': 1}`)."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator

import pika
import pytest
from support.mgmthelp import Target
from test_ui_http import call

import ackmq


@pytest.fixture(scope="module")
def broker() -> Iterator[ackmq.EmbeddedBroker]:
    with ackmq.EmbeddedBroker(persistent=False) as b:
        yield b


def _api(b: ackmq.EmbeddedBroker) -> Target:
    return Target("ackmq", b.http_url, b.url)


def _put(b: ackmq.EmbeddedBroker, path: str, body: dict[str, object]) -> None:
    r = _api(b).call("PUT", path, body)
    assert r.status in (201, 204), r


def _delete(b: ackmq.EmbeddedBroker, path: str) -> None:
    _api(b).call("DELETE", path)


def _row(body: str, name: str) -> str:
    """The <tr> of /queues that links to queue `name`."""
    link = f"name={name}\">{name}</a>"
    assert link in body, body
    start = body.rindex("<tr>", 0, body.index(link))
    return body[start:body.index("</tr>", start)]


@pytest.fixture(scope="module")
def policed(broker: ackmq.EmbeddedBroker) -> Iterator[str]:
    """A queue under a policy and an operator policy, declared by pika (its string
    arguments reach the model as AMQP long strings)."""
    q = "polview-q1"
    _put(broker, "/api/policies/%2F/polview-pol",
         {"pattern": "^polview-", "apply-to": "queues", "definition": {
             "max-length": 100, "message-ttl": 5000, "dead-letter-exchange": "pdlx"}})
    _put(broker, "/api/operator-policies/%2F/polview-op",
         {"pattern": "^polview-q1$", "apply-to": "queues",
          "definition": {"max-length": 10}})
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments={
            "x-message-ttl": 60000, "x-dead-letter-exchange": "dlx", "x-custom": "a<b"})
        ch.queue_declare("polview-plain", durable=True)
    finally:
        conn.close()
    yield q
    _delete(broker, "/api/policies/%2F/polview-pol")
    _delete(broker, "/api/operator-policies/%2F/polview-op")


def test_M5_ui_queue_list_shows_its_policy(broker: ackmq.EmbeddedBroker,
                                           policed: str) -> None:
    status, _, body = call(broker, "GET", "/queues?filter=polview-")
    assert status == 200
    row = _row(body, policed)
    # RabbitMQ's order: D, then the known arguments' short names, then Args, then policies
    assert ('<abbr title="durable: true">D</abbr> '
            '<abbr title="x-message-ttl: 60000">TTL</abbr> '
            '<abbr title="x-dead-letter-exchange: &quot;dlx&quot;">DLX</abbr> '
            '<abbr title="{&quot;x-custom&quot;: &quot;a&lt;b&quot;}">Args</abbr> '
            '<abbr class="policy" title="Policy: polview-pol">'
            '<a href="/policies#policy/%2F/polview-pol">polview-pol</a></abbr> '
            '<abbr class="policy" title="Operator policy: polview-op">'
            '<a href="/policies#operator/%2F/polview-op">polview-op</a></abbr>') in row
    # a queue the operator policy's pattern does not match shows the policy alone
    plain = _row(body, "polview-plain")
    assert "Policy: polview-pol" in plain and "Operator policy" not in plain
    # the links lead to the policies' rows on /policies
    policies = call(broker, "GET", "/policies")[2]
    assert '<a id="policy/%2F/polview-pol">polview-pol</a>' in policies
    assert '<a id="operator/%2F/polview-op">polview-op</a>' in policies


def test_M5_ui_queue_page_shows_policy_operator_policy_and_effective_definition(
        broker: ackmq.EmbeddedBroker, policed: str) -> None:
    status, _, body = call(broker, "GET", f"/queue?vhost=%2F&name={policed}")
    assert status == 200
    details = body.split('<table id="queue-details">', 1)[1].split("</table>", 1)[0]
    api = _api(broker).call("GET", f"/api/queues/%2F/{policed}").body
    effective = {"dead-letter-exchange": "pdlx", "max-length": 10, "message-ttl": 5000}
    assert api["effective_policy_definition"] == effective  # the page shows the API's
    assert ('<tr><td>Policy</td><td><abbr class="policy" title="Policy: polview-pol">'
            '<a href="/policies#policy/%2F/polview-pol">polview-pol</a></abbr></td></tr>'
            ) in details
    assert ('<tr><td>Operator policy</td><td><abbr class="policy" '
            'title="Operator policy: polview-op"><a href="/policies#operator/%2F/'
            'polview-op">polview-op</a></abbr></td></tr>') in details
    shown = details.split("<td>Effective policy definition</td><td>", 1)[1]
    shown = shown.split("</td>", 1)[0]
    assert shown == ('<code class="json">'
                     + html.escape(json.dumps(effective, sort_keys=True)) + "</code>")
    args = details.split("<td>Arguments</td><td>", 1)[1].split("</td>", 1)[0]
    assert html.unescape(args) == ('<code class="json">{"x-custom": "a<b", '
                                   '"x-dead-letter-exchange": "dlx", '
                                   '"x-message-ttl": 60000}</code>')
    # without a policy: dashes, no stale name
    plain = call(broker, "GET", "/queue?vhost=%2F&name=polview-plain")[2]
    plain = plain.split('<table id="queue-details">', 1)[1].split("</table>", 1)[0]
    assert "<td>Operator policy</td><td>–</td>" in plain


def test_M5_ui_navigation_links_policies(broker: ackmq.EmbeddedBroker) -> None:
    for path in ("/", "/queues", "/exchanges", "/admin"):
        nav = call(broker, "GET", path)[2].split("<nav>", 1)[1].split("</nav>", 1)[0]
        assert '<a href="/policies" class="">Policies</a>' in nav, path
    nav = call(broker, "GET", "/policies")[2].split("<nav>", 1)[1].split("</nav>", 1)[0]
    assert '<a href="/policies" class="on">Policies</a>' in nav


def test_M2_ui_arguments_render_as_json(broker: ackmq.EmbeddedBroker) -> None:
    """Exchanges, bindings, a queue page's bindings, a got message's headers: JSON (AMQP
    strings as strings, tables as objects), HTML-escaped; never `b'...'` or `{'k': ...}`."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.exchange_declare("jsonview-x", "headers", arguments={
            "alternate-exchange": "jsonview-ae", "x-note": "<i>"})
        ch.queue_declare("jsonview-q")
        ch.queue_bind("jsonview-q", "jsonview-x", "",
                      arguments={"x-match": "all", "n": 5, "t": {"k": "v"}})
        ch.basic_publish("", "jsonview-q", b"body", pika.BasicProperties(
            content_type="text/plain", headers={"h": "v", "n": 1}))
    finally:
        conn.close()
    page = call(broker, "GET", "/exchanges")[2]
    assert "b&#x27;" not in page and "{&#x27;" not in page
    xrow = page[page.rindex("<tr>", 0, page.index("<td>jsonview-x</td>")):]
    xrow = html.unescape(xrow[:xrow.index("</tr>")])
    assert '<code class="json">{"alternate-exchange": "jsonview-ae", "x-note": "<i>"}</code>' \
        in xrow
    assert '<abbr title="alternate-exchange: &quot;jsonview-ae&quot;">AE</abbr>' in \
        page[page.index("<td>jsonview-x</td>"):]
    binding = '<code class="json">{"n": 5, "t": {"k": "v"}, "x-match": "all"}</code>'
    assert binding in html.unescape(page.split('id="bindings"', 1)[1])
    queue = call(broker, "GET", "/queue?vhost=%2F&name=jsonview-q")[2]
    assert binding in html.unescape(queue.split('id="bindings"', 1)[1])
    got = call(broker, "POST", "/queue/get", form={
        "vhost": "/", "name": "jsonview-q", "ackmode": "ack_requeue_false", "count": "1"})[2]
    got = html.unescape(got.split('id="got"', 1)[1])
    assert '<td>Headers</td><td><code class="json">{"h": "v", "n": 1}</code>' in got
    assert '"content_type": "text/plain"' in got and "{'" not in got


def test_M5_ui_exchange_list_shows_its_policy(broker: ackmq.EmbeddedBroker) -> None:
    """RabbitMQ's exchange list: the features, then the policy in force, linked."""
    _put(broker, "/api/policies/%2F/polview-xpol",
         {"pattern": "^polview-x$", "apply-to": "exchanges",
          "definition": {"alternate-exchange": "polview-ae"}})
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        try:
            conn.channel().exchange_declare("polview-x", durable=True)
        finally:
            conn.close()
        page = call(broker, "GET", "/exchanges")[2]
        row = page[page.index("<td>polview-x</td>"):]
        row = row[:row.index("</tr>")]
        assert ('<abbr title="durable: true">D</abbr> <abbr class="policy" '
                'title="Policy: polview-xpol"><a href="/policies#policy/%2F/polview-xpol">'
                'polview-xpol</a></abbr>') in row
    finally:
        _delete(broker, "/api/policies/%2F/polview-xpol")
