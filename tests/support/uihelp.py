"""One HTTP call to an embedded broker's management listener, as a browser or a script
makes it (the UI's forms, /metrics): status, lower-cased headers, body text."""

from __future__ import annotations

import base64
import http.client
from urllib.parse import urlencode

import ackmq


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
