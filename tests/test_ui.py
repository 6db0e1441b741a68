"""M2: the web UI in a real headless browser (Debian's chromium + chromium-driver, driven
by selenium): open the overview, publish and see the depth change, purge from the
queue's page, close a connection, see an alarm raised with
`ackmq ctl set_vm_memory_high_watermark`. `./run test` installs chromium and
chromium-driver when it can (root, apt); elsewhere these tests skip saying why.

ACKMQ_UI_SCREENSHOT=1 also writes the overview's screenshot to docs/ui-overview.png.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from support.mgmthelp import Target
from support.uihelp import browser_login, chrome

import ackmq

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ackmq.EmbeddedBroker]:
    data = tmp_path_factory.mktemp("ui")
    with ackmq.EmbeddedBroker(data_dir=data) as b:
        b.data_dir = data  # type: ignore[attr-defined]
        yield b


@pytest.fixture(scope="module")
def browser(broker: ackmq.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Any]:
    with chrome(tmp_path_factory.mktemp("chrome-profile")) as drv:
        browser_login(drv, broker.http_url)  # the login form, as a person (U3)
        yield drv


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def text(drv: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    try:
        return drv.find_element("css selector", css).text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def click_and_confirm(drv: Any, css: str) -> None:
    drv.find_element("css selector", css).click()
    wait_for(lambda: _alert(drv), "the confirmation dialog").accept()


def _alert(drv: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException
    try:
        return drv.switch_to.alert
    except NoAlertPresentException:
        return None


def ctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=60)


def publish(url: str, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        for i in range(n):
            ch.basic_publish("", queue, b"message %d" % i, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()


def depth(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def test_M2_overview_shows_the_depth_change_live(broker: ackmq.EmbeddedBroker,
                                                  browser: Any) -> None:
    browser.get(broker.http_url + "/")
    assert "Overview" in browser.title
    before = int(text(browser, "#total-ready").replace(",", "") or "0")
    publish(broker.url, "ui-depth", 7)
    # no reload: the page's own refresh (every 5 s) brings the new depth
    wait_for(lambda: text(browser, "#total-ready").replace(",", "") == str(before + 7),
             "the overview's ready count to grow by 7")
    assert browser.find_element("css selector", "#node").is_displayed()


def test_M2_purge_from_the_queue_page(broker: ackmq.EmbeddedBroker, browser: Any) -> None:
    publish(broker.url, "ui-purge", 5)
    browser.get(broker.http_url + "/queues")
    browser.find_element("link text", "ui-purge").click()
    wait_for(lambda: text(browser, "#q-ready") == "5", "the queue page's ready count")
    click_and_confirm(browser, "form.purge button")
    wait_for(lambda: "Queue purged (5 messages)" in text(browser, "#flash"),
             "the purge message")
    assert text(browser, "#q-ready") == "0"
    assert depth(broker.url, "ui-purge") == 0


def test_M5_ui_policy_badge_leads_to_the_policy(broker: ackmq.EmbeddedBroker,
                                                browser: Any) -> None:
    """A queue under a policy shows the policy's badge on /queues (as RabbitMQ's UI);
    clicking it opens Policies (in the top navigation) at the policy's row."""
    api = Target("ackmq", broker.http_url, broker.url)
    r = api.call("PUT", "/api/policies/%2F/ui-cap", {
        "pattern": "^ui-capped$", "apply-to": "queues", "definition": {"max-length": 3}})
    assert r.status in (201, 204), r
    try:
        publish(broker.url, "ui-capped", 0)
        browser.get(broker.http_url + "/queues")
        browser.find_element("link text", "ui-cap").click()
        wait_for(lambda: browser.current_url.endswith("/policies#policy/%2F/ui-cap"),
                 "the policies page")
        assert browser.execute_script("return document.querySelector(':target').id"
                                      ) == "policy/%2F/ui-cap"
        assert browser.find_element("css selector", "nav a.on").text == "Policies"
        browser.get(broker.http_url + "/queue?vhost=%2F&name=ui-capped")
        details = wait_for(lambda: text(browser, "#queue-details"), "the queue's details")
        assert "Effective policy definition {\"max-length\": 3}" in details, details
    finally:
        api.call("DELETE", "/api/policies/%2F/ui-cap")


def test_M2_publish_and_get_from_the_queue_page(broker: ackmq.EmbeddedBroker,
                                                browser: Any) -> None:
    publish(broker.url, "ui-pubget", 0)
    browser.get(broker.http_url + "/queue?vhost=%2F&name=ui-pubget")
    browser.find_element("css selector", "#payload").send_keys("hello from the browser")
    browser.find_element("css selector", "form.publish button").click()
    wait_for(lambda: "Message published." in text(browser, "#flash"), "the publish message")
    assert depth(broker.url, "ui-pubget") == 1
    browser.find_element("css selector", "form.get button").click()
    got = wait_for(lambda: text(browser, "#got"), "the got message")
    assert "hello from the browser" in got
    assert depth(broker.url, "ui-pubget") == 1  # "requeue true": still there


def test_M2_close_a_connection(broker: ackmq.EmbeddedBroker, browser: Any) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        local = conn._impl._transport._sock.getsockname()  # type: ignore[attr-defined]
        name = f"{local[0]}:{local[1]} -> "
        browser.get(broker.http_url + "/connections")
        row = wait_for(lambda: [r for r in browser.find_elements(
            "css selector", "#connections tbody tr") if r.text.startswith(name)],
            "the connection's row")[0]
        row.find_element("css selector", "form.close button").click()
        wait_for(lambda: _alert(browser), "the confirmation dialog").accept()
        wait_for(lambda: "closed" in text(browser, "#flash"), "the close message")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.2)
        assert e.value.reply_code == 320
        assert e.value.reply_text == "CONNECTION_FORCED - Closed via management plugin"
    finally:
        if conn.is_open:
            conn.close()


def test_M2_memory_alarm_shows_on_the_overview(broker: ackmq.EmbeddedBroker,
                                               browser: Any, tmp_path: Path) -> None:
    data = broker.data_dir  # type: ignore[attr-defined]
    publish(broker.url, "orders", 1200)
    publish(broker.url, "invoices", 340)
    browser.get(broker.http_url + "/")
    assert not browser.find_elements("css selector", ".alarm-banner")
    assert ctl(data, "set_vm_memory_high_watermark", "0.0000001").returncode == 0
    try:
        wait_for(lambda: browser.find_elements("css selector", "#alarm-memory"),
                 "the memory alarm banner")
        assert "memory" in text(browser, "#alarms")
        shot = tmp_path / "ui-overview.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("ACKMQ_UI_SCREENSHOT"):
            shutil.copy(shot, DOCS / "ui-overview.png")
    finally:
        assert ctl(data, "set_vm_memory_high_watermark", "0.4").returncode == 0
    wait_for(lambda: not browser.find_elements("css selector", "#alarm-memory"),
             "the alarm banner to go")
