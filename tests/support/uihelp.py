"""One HTTP call to an embedded broker's management listener, as a browser or a script
makes it (the UI's forms, /metrics): status, lower-cased headers, body text. And the
real browser of the UI tests: headless chromium driven by selenium (`chrome`), logged in
through the UI's login form (`browser_login`)."""

from __future__ import annotations

import base64
import http.client
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import ackmq

CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1400,1000")


def chrome_or_skip() -> tuple[str, str]:
    """chromium's and chromedriver's paths, or a skip saying what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip("no chromium / chromedriver on PATH: apt-get install chromium "
                    "chromium-driver (./run test does it when run as root)")
    return chrome, driver


@contextmanager
def chrome(profile: Path) -> Iterator[Any]:
    """A headless chromium with its own (empty) profile: no cookie, no credential."""
    binary, driver_path = chrome_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        drv.set_page_load_timeout(30)
        yield drv
    finally:
        drv.quit()


def browser_login(drv: Any, base_url: str, user: str = "guest", password: str = "guest",
                  timeout: float = 20.0) -> None:
    """Log in as a person does: the login form, then the overview."""
    drv.get(base_url + "/login")
    name = drv.find_element("id", "username")
    name.clear()
    name.send_keys(user)
    drv.find_element("id", "password").send_keys(password)
    drv.find_element("id", "login-button").click()
    deadline = time.monotonic() + timeout
    while drv.current_url.split("?")[0].endswith("/login") or not drv.find_elements(
            "id", "logout"):
        assert time.monotonic() < deadline, f"login as {user} failed: {drv.current_url}"
        time.sleep(0.1)


def ui_call(b: ackmq.EmbeddedBroker, method: str, path: str,
            auth: tuple[str, str] | None = ("guest", "guest"),
            form: dict[str, str] | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(b.http_url.split("//", 1)[1], timeout=30)
    h = dict(headers or {})
    if auth is not None:
        h["Authorization"] = "Basic " + base64.b64encode(
            f"{auth[0]}:{auth[1]}".encode()).decode()
    body = None
    if form is not None:
        body = urlencode(form).encode()
        h["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()
