"""Management API tests' fixtures: the same HTTP calls against an embedded ackmq and
against RabbitMQ's management plugin (http://127.0.0.1:15672, guest/guest, skipped
when absent), so keys, codes and texts are compared, not guessed.

`mgmt` is parametrized over both: `mgmt.call("GET", "/api/overview")` -> `Reply(status,
body, headers)`; `mgmt.user(tags)` makes a throwaway user (deleted after the test);
`mgmt.amqp_url` for pika; `mgmt.name("q")` a unique name (RabbitMQ is shared).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest

REALM_HEADER = 'Basic realm="RabbitMQ Management"'
RABBIT_HTTP = os.environ.get("ACKMQ_RABBITMQ_HTTP", "http://127.0.0.1:15672")


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]
    raw: bytes = b""


_HTTP_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


def http_url_of(proc: Any, timeout: float = 10.0) -> str:
    """The management listener's URL a `BrokerProcess` logged at start ("" if none)."""
    deadline = time.monotonic() + timeout
    while True:
        m = _HTTP_URL.search("".join(proc.log))
        if m or time.monotonic() > deadline:
            return m.group(1) if m else ""
        time.sleep(0.05)


def q(name: str) -> str:
    """A path segment as RabbitMQ's UI and rabbitmqadmin quote it ("/" -> %2F)."""
    return quote(name, safe="")


@dataclass
class Target:
    kind: str  # "ackmq" | "rabbitmq"
    base: str  # http://host:port
    amqp_url: str
    server: Any = None  # ackmq's Server (in-process), None for RabbitMQ
    auth: tuple[str, str] = ("guest", "guest")
    cleanup: list[tuple[str, str]] = field(default_factory=list)

    def call(self, method: str, path: str, body: Any = None, auth: Any = "default",
             headers: dict[str, str] | None = None, timeout: float = 30.0) -> Reply:
        host = self.base.split("//", 1)[1]
        conn = http.client.HTTPConnection(host, timeout=timeout)
        h = dict(headers or {})
        creds = self.auth if auth == "default" else auth
        if creds is not None:
            h["Authorization"] = "Basic " + base64.b64encode(
                f"{creds[0]}:{creds[1]}".encode()).decode()
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            raw = r.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            return Reply(r.status, parsed, {k.lower(): v for k, v in r.getheaders()}, raw)
        finally:
            conn.close()

    def name(self, prefix: str) -> str:
        return f"mgmt-{prefix}-{uuid.uuid4().hex[:10]}"

    def user(self, tags: str = "", vhost: str | None = "/") -> tuple[str, str]:
        """A throwaway user with `tags` (comma-separated), full permissions on `vhost`."""
        name, pw = self.name("u"), "pw-" + uuid.uuid4().hex[:6]
        r = self.call("PUT", f"/api/users/{q(name)}", {"password": pw, "tags": tags})
        assert r.status in (201, 204), r
        self.cleanup.append(("user", name))
        if vhost is not None:
            r = self.call("PUT", f"/api/permissions/{q(vhost)}/{q(name)}",
                          {"configure": ".*", "write": ".*", "read": ".*"})
            assert r.status in (201, 204), r
        return name, pw

    def vhost(self) -> str:
        name = self.name("vh")
        r = self.call("PUT", f"/api/vhosts/{q(name)}")
        assert r.status in (201, 204), r
        self.cleanup.append(("vhost", name))
        return name

    def forget(self) -> None:
        for kind, name in reversed(self.cleanup):
            path = {"user": "/api/users/", "vhost": "/api/vhosts/", "queue": "/api/queues/%2F/",
                    "exchange": "/api/exchanges/%2F/"}[kind] + q(name)
            self.call("DELETE", path)
        self.cleanup.clear()


_rabbit_reason: list[str | None] = []


def rabbit_http() -> str:
    """RabbitMQ's management base URL, or a skip saying why it is not there."""
    if not _rabbit_reason:
        try:
            t = Target("rabbitmq", RABBIT_HTTP, "")
            r = t.call("GET", "/api/whoami", timeout=5)
            _rabbit_reason.append(None if r.status == 200 else
                                  f"{RABBIT_HTTP} answered {r.status} to guest/guest")
        except OSError as e:
            _rabbit_reason.append(f"no RabbitMQ management API at {RABBIT_HTTP} ({e!r}); "
                                  "start one with ../shared/tools/rabbitmq-local start")
    if _rabbit_reason[0] is not None:
        pytest.skip(_rabbit_reason[0])
    return RABBIT_HTTP


@pytest.fixture(scope="module")
def ackmq_mgmt() -> Iterator[Any]:
    import ackmq
    with ackmq.EmbeddedBroker(persistent=False) as b:
        yield b


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def mgmt(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "ackmq":
        b = request.getfixturevalue("ackmq_mgmt")
        t = Target("ackmq", b.http_url, b.url, b.server)
    else:
        base = rabbit_http()
        t = Target("rabbitmq", base, os.environ.get(
            "ACKMQ_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    yield t
    t.forget()


def poll(mgmt: Target, path: str, ok: Callable[[Any], bool], timeout: float = 20.0) -> Any:
    """GET `path` until `ok(body)` or the timeout: RabbitMQ refreshes its statistics
    every 5 s (ackmq's sampler too)."""
    deadline = time.monotonic() + timeout
    while True:
        r = mgmt.call("GET", path)
        assert r.status == 200, r
        if ok(r.body) or time.monotonic() > deadline:
            return r.body
        time.sleep(0.5)


def escaped(text: str) -> str:
    """A reason text as RabbitMQ's management API sends it (`<`, `>`, `&` escaped)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
