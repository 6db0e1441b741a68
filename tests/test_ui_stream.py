"""The web UI's stream connections (SPEC X1 with M2), as RabbitMQ's management UI with
rabbitmq_stream_management shows them: a "Stream Connections" tab listing the stream
protocol's connections, each leading to its page with its Publishers and Consumers.
A real stream client (raw frames by rstream's codec) on an embedded broker, the UI in
headless chromium; visibility over plain HTTP. The reference broker here has no
rabbitmq_stream_management: the tab, columns and sections follow that plugin's UI."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from rstream import AMQPMessage, OffsetType, schema
from support.streamraw import StreamPeer
from support.uihelp import browser_login, chrome, ui_call
from test_ui_http import user

import ackmq


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ackmq.EmbeddedBroker]:
    with ackmq.EmbeddedBroker(data_dir=tmp_path_factory.mktemp("ui-stream")) as b:
        yield b


@pytest.fixture
def session(broker: ackmq.EmbeddedBroker) -> Iterator[tuple[str, str]]:
    """A stream connection with a named publisher that published 3 messages and a
    subscription that got them: (its name as the UI shows it, the stream)."""
    stream = f"ui-s-{time.monotonic_ns()}"
    p = StreamPeer(broker.stream_port)
    try:
        assert p.login() == 1
        assert p.call(schema.Create(p.next_corr(), stream=stream, arguments=[]),
                      schema.CreateResponse).response_code == 1
        assert p.call(schema.DeclarePublisher(p.next_corr(), publisher_id=2,
                                              reference="ui-ref", stream=stream),
                      schema.DeclarePublisherResponse).response_code == 1
        p.send(schema.Publish(publisher_id=2, messages=[schema.Message(
            publishing_id=i, filter_value=None, data=bytes(AMQPMessage(body=b"u")))
            for i in (1, 2, 3)]))
        got: list[int] = []
        while len(got) < 3:
            got += p.wait(schema.PublishConfirm).publishing_ids
        spec = schema.OffsetSpec.from_params(OffsetType.FIRST, None)
        assert p.call(schema.Subscribe(p.next_corr(), subscription_id=5, stream=stream,
                                       offset_spec=spec, credit=4,
                                       properties=[schema.Property("name", "ui-c")]),
                      schema.SubscribeResponse).response_code == 1
        p.wait(schema.Deliver)
        local = p.sock.getsockname()
        yield f"{local[0]}:{local[1]} -> ", stream
    finally:
        p.call(schema.Delete(p.next_corr(), stream=stream), schema.DeleteResponse)
        p.close()


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def rows(drv: Any, css: str) -> list[list[str]]:
    from selenium.common.exceptions import StaleElementReferenceException
    try:
        return [[td.text for td in r.find_elements("css selector", "td")]
                for r in drv.find_elements("css selector", css)]
    except StaleElementReferenceException:  # the live part was swapped meanwhile
        return []


def test_X1_ui_stream_connections_tab_and_connection_page(
        broker: ackmq.EmbeddedBroker, session: tuple[str, str], tmp_path: Path) -> None:
    name, stream = session
    with chrome(tmp_path / "profile") as drv:
        browser_login(drv, broker.http_url)
        drv.find_element("link text", "Stream Connections").click()
        row = wait_for(lambda: [r for r in rows(drv, "#stream-connections tbody tr")
                                if r[1].startswith(name)], "the connection's row")[0]
        assert row[0] == "/" and row[2] == "guest" and row[5:] == ["1", "1"]
        drv.find_element("partial link text", name).click()
        pubs = wait_for(lambda: rows(drv, "#stream-publishers tbody tr"), "publishers")
        assert pubs == [[stream, "2", "ui-ref", "3", "3", "0"]]
        (con,) = rows(drv, "#stream-consumers tbody tr")
        assert con[:2] == [stream, "5"] and con[3:6] == ["3", "3", "0"]
        assert con[7] == "up" and '"name": "ui-c"' in con[8]
        assert drv.find_element("css selector", "nav a.on").text == "Stream Connections"


def test_X1_ui_stream_connections_follow_the_connections_visibility(
        broker: ackmq.EmbeddedBroker, session: tuple[str, str]) -> None:
    """As the Connections page: a management user sees only its own connections (none
    here), a monitoring user every one; a connection page it may not see: 404."""
    name, _ = session
    (full,) = [c["name"] for c in json.loads(ui_call(broker, "GET",
                                                     "/api/stream/connections")[2])
               if c["name"].startswith(name)]
    page = "/stream/connection?" + urlencode({"vhost": "/", "name": full})
    assert full in html.unescape(ui_call(broker, "GET", "/stream/connections")[2])
    assert ui_call(broker, "GET", page)[0] == 200
    plain = user(broker, ["management"], (".*", ".*", ".*"))
    body = html.unescape(ui_call(broker, "GET", "/stream/connections", plain)[2])
    assert full not in body and "no stream connections" in body
    assert ui_call(broker, "GET", page, plain)[0] == 404
    monitor = user(broker, ["monitoring"], (".*", ".*", ".*"))
    assert full in html.unescape(ui_call(broker, "GET", "/stream/connections", monitor)[2])
    assert ui_call(broker, "GET", page, monitor)[0] == 200
