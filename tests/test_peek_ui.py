"""V3 in the web UI: the queue page's "Browse messages" pages through a queue with the
peek operation in a real headless browser (the M2 fixtures of tests/test_ui.py): rows
with properties, headers and body, x-death on a dead-lettered message, Next / Previous,
and the queue unchanged afterwards (nothing taken, nothing redelivered)."""

from __future__ import annotations

from typing import Any

import pika
from test_ui import _alert, broker, browser, wait_for  # noqa: F401 - the fixtures

import ackmq


def test_V3_ui_browses_pages_and_shows_x_death(broker: ackmq.EmbeddedBroker,  # noqa: F811
                                                browser: Any) -> None:  # noqa: F811
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("ui-browse-dlq", durable=True)
    ch.queue_declare("ui-browse", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ui-browse-dlq"})
    for i in range(25):
        ch.basic_publish("", "ui-browse", f"body-{i}".encode(), pika.BasicProperties(
            delivery_mode=2, content_type="text/plain", headers={"n": i}))
    ch.basic_publish("", "ui-browse", b"doomed", pika.BasicProperties(delivery_mode=2))
    # the doomed one is last: take everything, reject it, requeue the rest in place
    tags = []
    while True:
        m, _p, body = ch.basic_get("ui-browse")
        if m is None:
            break
        tags.append((m.delivery_tag, body))
    for tag, body in tags:
        if body == b"doomed":
            ch.basic_reject(tag, requeue=False)
    ch.basic_nack(tags[-2][0], multiple=True, requeue=True)

    browser.get(broker.http_url + "/queue?vhost=%2F&name=ui-browse")
    browser.find_element("css selector", "a.browse").click()
    rows = wait_for(lambda: browser.find_elements("css selector", "#messages tbody tr"),
                    "message rows")
    assert len(rows) == 20
    assert "body-0" in rows[0].text and '"n": 0' in rows[0].text
    assert "text/plain" in rows[0].text
    browser.find_element("css selector", "a.next").click()
    rows = wait_for(lambda: browser.find_elements("css selector", "#messages tbody tr"),
                    "second page")
    assert [r.text.split()[0] for r in rows] == [str(i) for i in range(20, 25)]
    assert "body-24" in rows[-1].text
    browser.find_element("css selector", "a.prev").click()
    wait_for(lambda: "body-0" in browser.find_element("css selector", "#messages").text,
             "back on the first page")

    browser.get(broker.http_url + "/queue/browse?vhost=%2F&name=ui-browse-dlq")
    dead = browser.find_element("css selector", "#messages").text
    assert "doomed" in dead and "ui-browse: rejected ×1" in dead

    # nothing was taken by browsing, the order is as published
    got = []
    while True:
        m, _p, body = ch.basic_get("ui-browse", auto_ack=True)
        if m is None:
            break
        got.append(body)
    assert got == [f"body-{i}".encode() for i in range(25)]
    conn.close()


def test_V4_ui_replay_button_moves_dead_letters_back(broker: ackmq.EmbeddedBroker,  # noqa: F811
                                                     browser: Any) -> None:  # noqa: F811
    """The browse page's Replay button: the dead-letter queue's messages go back to their
    x-first-death-queue through a shovel (the embedded broker gets the shovel component
    `ackmq serve` registers)."""
    from ackmq.shovel.component import ShovelComponent
    params = broker.server.parameters
    if "shovel" not in params.components:
        params.register(ShovelComponent(params))
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("ui-replay-dlq", durable=True)
    ch.queue_declare("ui-replay", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ui-replay-dlq"})
    for i in range(3):
        ch.basic_publish("", "ui-replay", f"r{i}".encode())
    for _ in range(3):
        m, _p, _b = ch.basic_get("ui-replay")
        ch.basic_reject(m.delivery_tag, requeue=False)
    browser.get(broker.http_url + "/queue/browse?vhost=%2F&name=ui-replay-dlq")
    wait_for(lambda: len(browser.find_elements("css selector", "#messages tbody tr")) == 3,
             "three dead letters listed")
    browser.find_element("css selector", "form.replay button").click()
    alert = wait_for(lambda: _alert(browser), "the confirm dialog")
    alert.accept()
    wait_for(lambda: "Replay started" in browser.page_source, "the flash")
    wait_for(lambda: ch.queue_declare("ui-replay", passive=True).method.message_count == 3,
             "the three back in ui-replay")
    assert ch.queue_declare("ui-replay-dlq", passive=True).method.message_count == 0
    conn.close()


def test_V1_ui_shovel_status_page(broker: ackmq.EmbeddedBroker,  # noqa: F811
                                  browser: Any) -> None:  # noqa: F811
    """Admin → Shovel status: a running shovel listed with its source and destination;
    Restart restarts it."""
    from support.mgmthelp import Target

    from ackmq.shovel.component import ShovelComponent
    params = broker.server.parameters
    if "shovel" not in params.components:
        params.register(ShovelComponent(params))
    t = Target("ackmq", broker.http_url, broker.url)
    assert t.call("PUT", "/api/parameters/shovel/%2F/ui-shovel", {"value": {
        "src-uri": "amqp://", "src-queue": "ui-sh-src", "dest-uri": "amqp://",
        "dest-queue": "ui-sh-dst"}}).status == 201
    try:
        browser.get(broker.http_url + "/admin")
        browser.find_element("css selector", "#shovels-link").click()
        row = wait_for(lambda: [r for r in browser.find_elements(
            "css selector", "#shovels tbody tr") if "ui-shovel" in r.text
            and "running" in r.text], "the running shovel listed")[0]
        assert "amqp:// ui-sh-src" in row.text and "amqp:// ui-sh-dst" in row.text
        row.find_element("css selector", "form button").click()
        wait_for(lambda: "Shovel ui-shovel restarted" in browser.page_source, "restarted")
    finally:
        t.call("DELETE", "/api/parameters/shovel/%2F/ui-shovel")
