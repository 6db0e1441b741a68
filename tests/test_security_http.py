"""What a web page can and cannot do to the broker (SPEC U3), and bounded JSON on the
management listener (SPEC B1): issue 34, items 1 and 5.

A page on another origin, visited by an administrator who is logged in to the UI (or
whose browser holds Basic credentials from the API's prompt), cannot change anything:
every state-changing request from another origin is 403 (the `Origin`, else `Referer`
rule), JSON bodies are accepted only as `application/json` (415 otherwise, RabbitMQ's
answer for a text/plain definitions upload), and the UI logs in with a form and an
`HttpOnly`, `SameSite=Strict` session cookie, never a Basic challenge. Programs (curl,
rabbitmqadmin, requests) send no Origin and keep working.

JSON is bounded: nested deeper than 64 levels is a 400 saying so (a 100,000-deep body
was a 500 and a RecursionError traceback); no client input gives a 5xx or a traceback.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.mgmthelp import Target, q
from support.uihelp import browser_login, chrome

import ackmq
from ackmq.broker.access import hash_password

EVIL = "http://evil.example"
TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}


class _Records(logging.Handler):
    """The broker's log (in-process): what a client's input must never produce."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def bad(self) -> list[str]:
        return [f"{r.name} {r.levelname} {r.getMessage()}" for r in self.records
                if r.levelno >= logging.ERROR or r.exc_info]


@pytest.fixture(scope="module")
def logged() -> Iterator[tuple[ackmq.EmbeddedBroker, _Records]]:
    rec = _Records()
    loggers = [logging.getLogger(n) for n in ("ackmq", "aiohttp", "asyncio")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(rec)
        lg.setLevel(logging.DEBUG)
    try:
        with ackmq.EmbeddedBroker(persistent=False) as b:
            rec.records.clear()
            yield b, rec
    finally:
        for lg, level in zip(loggers, old, strict=True):
            lg.removeHandler(rec)
            lg.setLevel(level)


@pytest.fixture
def broker(logged: tuple[ackmq.EmbeddedBroker, _Records]) -> Iterator[ackmq.EmbeddedBroker]:
    b, rec = logged
    rec.records.clear()
    yield b
    assert rec.bad() == [], "client input made the broker log an error or a traceback"


def api(b: ackmq.EmbeddedBroker) -> Target:
    return Target("ackmq", b.http_url, b.url)


def users(b: ackmq.EmbeddedBroker) -> set[str]:
    return {u["name"] for u in api(b).call("GET", "/api/users").body}


def evil_definitions(name: str) -> bytes:
    """The issue's body: a definitions upload that makes an administrator."""
    return json.dumps({"users": [{"name": name, "password_hash": hash_password("x"),
                                  "tags": "administrator"}]}).encode()


def declare(b: ackmq.EmbeddedBroker, queue: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        for _ in range(n):
            ch.basic_publish("", queue, b"x")
    finally:
        conn.close()


def depth(b: ackmq.EmbeddedBroker, queue: str) -> int:
    return int(api(b).call("GET", f"/api/queues/%2F/{q(queue)}").body["messages_ready"])


# -- the origin rule ------------------------------------------------------------------
def test_U3_cross_origin_definitions_post_is_403(broker: ackmq.EmbeddedBroker) -> None:
    """The issue's curl: guest's Basic credentials (as a browser resends them), an
    Origin elsewhere and a text/plain body -> 403, and no user `x` is made; with an
    application/json body it is 403 just the same (the Origin decides)."""
    name = f"csrf-{uuid.uuid4().hex[:6]}"
    for ctype in (TEXT, JSON):
        r = api(broker).call("POST", "/api/definitions", evil_definitions(name),
                             headers={"Origin": EVIL, **ctype})
        assert r.status == 403, r
        assert r.body == {"error": "forbidden", "reason": "cross-origin request refused: "
                          f"{EVIL} is not this broker's origin"}
    assert name not in users(broker)


def test_U3_referer_or_null_origin_from_elsewhere_is_403(broker: ackmq.EmbeddedBroker
                                                        ) -> None:
    """Without Origin the Referer decides; Origin "null" (a sandboxed frame, a data:
    page) is refused too; the same origin and no header at all are served."""
    name = f"csrf-{uuid.uuid4().hex[:6]}"
    path = f"/api/users/{name}"
    body = {"password": "pw", "tags": ""}
    for headers in ({"Referer": EVIL + "/page.html"}, {"Origin": "null"},
                    {"Origin": broker.http_url.replace("127.0.0.1", "localhost")},
                    {"Origin": broker.http_url + ".evil.example"},
                    {"Origin": "file://"}):
        assert api(broker).call("PUT", path, body, headers=headers).status == 403, headers
    assert name not in users(broker)
    assert api(broker).call("PUT", path, body, headers={
        "Origin": broker.http_url}).status == 201
    assert api(broker).call("DELETE", path, headers={
        "Referer": broker.http_url + "/admin"}).status == 204
    assert api(broker).call("PUT", path, body).status == 201  # curl: neither header
    assert api(broker).call("DELETE", path).status == 204


def test_U3_cross_origin_refused_on_every_state_changing_route(
        broker: ackmq.EmbeddedBroker) -> None:
    """The API's PUT/POST/DELETE and the UI's forms: one rule, before any login (a
    wrong password from elsewhere is 403 too); reads are left to the browser's
    same-origin policy."""
    queue = f"csrf-{uuid.uuid4().hex[:6]}"
    declare(broker, queue, 3)
    t, o = api(broker), {"Origin": EVIL}
    assert t.call("DELETE", f"/api/queues/%2F/{queue}/contents", headers=o).status == 403
    assert t.call("DELETE", f"/api/queues/%2F/{queue}", headers=o).status == 403
    assert t.call("PUT", "/api/queues/%2F/csrf-new", {}, headers=o).status == 403
    assert t.call("POST", f"/api/queues/%2F/{queue}/get", {"count": 3, "ackmode":
                  "ack_requeue_false", "encoding": "auto"}, headers=o).status == 403
    assert t.call("PUT", "/api/policies/%2F/csrf", {"pattern": ".*", "definition": {
        "max-length": 0}}, headers=o).status == 403
    assert t.call("PUT", "/api/queues/%2F/csrf-new", {}, auth=("guest", "wrong"),
                  headers=o).status == 403
    form = urlencode({"vhost": "/", "name": queue}).encode()
    for path in ("/queue/purge", "/queue/delete", "/policies/add", "/login", "/logout"):
        r = t.call("POST", path, form, headers={
            **o, "Content-Type": "application/x-www-form-urlencoded"})
        assert r.status == 403, (path, r)
    assert depth(broker, queue) == 3
    assert t.call("GET", "/api/queues/%2F/csrf-new").status == 404
    assert t.call("GET", "/api/policies").body == []
    assert t.call("GET", "/api/overview", headers=o).status == 200


# -- application/json only ------------------------------------------------------------
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   None])
def test_U3_definitions_body_not_json_type_is_415_as_rabbitmq(mgmt: Target,
                                                             ctype: str | None) -> None:
    """RabbitMQ 3.10 answers a definitions upload that is not application/json (the
    types a page may send elsewhere without a preflight, or none) with 415 and an
    empty body; a JSON body with charset and in capitals is fine."""
    headers = {"Content-Type": ctype} if ctype else {"Content-Type": ""}
    r = mgmt.call("POST", "/api/definitions", b"{}", headers=headers)
    assert (r.status, r.raw) == (415, b""), r
    for ok in ("application/json; charset=utf-8", "APPLICATION/JSON"):
        r = mgmt.call("POST", "/api/definitions", b"{}", headers={"Content-Type": ok})
        assert r.status == 204, (ok, r)


def test_U3_every_json_body_must_be_application_json(broker: ackmq.EmbeddedBroker) -> None:
    """Beyond RabbitMQ 3.10 (which takes any type on its other routes): every JSON
    body, so a page elsewhere has no route it may post to without a preflight. An
    empty body needs no type (`curl -X PUT`), as there."""
    name = f"ct-{uuid.uuid4().hex[:6]}"
    t = api(broker)
    for path in (f"/api/users/{name}", f"/api/queues/%2F/{name}"):
        assert t.call("PUT", path, b'{"password":"x","tags":"administrator"}',
                      headers=TEXT).status == 415
    assert t.call("POST", "/api/exchanges/%2F/amq.default/publish", json.dumps(
        {"routing_key": name, "payload": "x", "payload_encoding": "string",
         "properties": {}}).encode(), headers=TEXT).status == 415
    assert name not in users(broker)
    assert t.call("GET", f"/api/queues/%2F/{name}").status == 404
    r = t.call("PUT", f"/api/queues/%2F/{name}", headers={"Content-Length": "0"})
    assert r.status == 201
    assert t.call("DELETE", f"/api/queues/%2F/{name}").status == 204


# -- the UI's login -------------------------------------------------------------------
def _raw(b: ackmq.EmbeddedBroker, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str,
                                                         list[str]]:
    conn = http.client.HTTPConnection(b.http_url.split("//", 1)[1], timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        cookies = r.headers.get_all("Set-Cookie") or []
        return (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode(),
                cookies)
    finally:
        conn.close()


def _login(b: ackmq.EmbeddedBroker, user: str, password: str, next_: str = "/"
           ) -> tuple[int, dict[str, str], str, list[str]]:
    return _raw(b, "POST", "/login", urlencode({"username": user, "password": password,
                                                "next": next_}).encode(),
                {"Content-Type": "application/x-www-form-urlencoded"})


def test_U3_ui_pages_send_the_login_page_never_a_basic_challenge(
        broker: ackmq.EmbeddedBroker) -> None:
    """A browser never sees `WWW-Authenticate: Basic` from the UI, so it never caches
    Basic credentials for it; the API keeps RabbitMQ's challenge for programs."""
    for path in ("/", "/queues", "/admin", "/policies"):
        status, headers, _, _ = _raw(broker, "GET", path)
        assert status == 303 and headers["location"] == "/login?" + urlencode(
            {"next": path}), (path, status, headers)
        assert "www-authenticate" not in headers
    status, headers, _, _ = _raw(broker, "POST", "/queue/purge", b"vhost=%2F&name=x",
                                 {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303 and "www-authenticate" not in headers
    status, headers, body, _ = _raw(broker, "GET", "/login?next=%2Fqueues")
    assert status == 200 and 'id="login"' in body and "www-authenticate" not in headers
    assert headers["x-frame-options"] == "DENY"
    status, headers, _, _ = _raw(broker, "GET", "/api/overview")
    assert status == 401 and headers["www-authenticate"] == \
        'Basic realm="RabbitMQ Management"'


def test_U3_login_form_opens_an_httponly_strict_session(broker: ackmq.EmbeddedBroker
                                                       ) -> None:
    status, headers, _, cookies = _login(broker, "guest", "guest", "/queues")
    assert status == 303 and headers["location"] == "/queues"
    (cookie,) = cookies
    attrs = [a.strip() for a in cookie.split(";")]
    name, _, token = attrs[0].partition("=")
    assert name == f"ackmq_session_{broker.http_port}" and len(token) >= 32
    assert {"HttpOnly", "Path=/", "SameSite=Strict"} <= set(attrs), cookie
    jar = {"Cookie": f"{name}={token}"}
    status, _, body, _ = _raw(broker, "GET", "/queues", headers=jar)
    assert status == 200 and "user <b>guest</b>" in body and 'id="logout"' in body
    status, _, body, _ = _raw(broker, "GET", "/api/whoami", headers=jar)
    assert status == 200 and json.loads(body)["name"] == "guest"
    # logout ends it, on the broker (not only in the browser)
    status, headers, _, cookies = _raw(broker, "POST", "/logout", b"", {
        **jar, "Origin": broker.http_url})
    assert status == 303 and headers["location"] == "/login"
    assert cookies and cookies[0].startswith(f"{name}=") and "Max-Age=0" in cookies[0]
    assert _raw(broker, "GET", "/queues", headers=jar)[0] == 303
    assert _raw(broker, "GET", "/api/whoami", headers=jar)[0] == 401


def test_U3_login_form_refusals(broker: ackmq.EmbeddedBroker) -> None:
    """A wrong password, a user without a management tag (RabbitMQ's "Not management
    user"), a `next` that leaves the broker (never followed), a forged cookie."""
    status, _, body, cookies = _login(broker, "guest", "wrong")
    assert status == 200 and "Login failed" in body and cookies == []
    plain = api(broker).user("")
    status, _, body, cookies = _login(broker, *plain)
    assert "Not management user" in body and cookies == []
    for target in ("//evil.example/x", "http://evil.example/", "/\\evil.example"):
        status, headers, _, _ = _login(broker, "guest", "guest", target)
        assert status == 303 and headers["location"] == "/", target
    forged = {"Cookie": f"ackmq_session_{broker.http_port}=forged"}
    assert _raw(broker, "GET", "/", headers=forged)[0] == 303
    api(broker).forget()


def test_U3_session_ends_when_the_password_changes(broker: ackmq.EmbeddedBroker) -> None:
    name, pw = api(broker).user("management")
    _, _, _, cookies = _login(broker, name, pw)
    jar = {"Cookie": cookies[0].split(";")[0]}
    assert _raw(broker, "GET", "/", headers=jar)[0] == 200
    assert api(broker).call("PUT", f"/api/users/{name}", {"password": "new",
                                                          "tags": "management"}
                            ).status == 204
    assert _raw(broker, "GET", "/", headers=jar)[0] == 303
    api(broker).forget()


# -- bounded JSON ---------------------------------------------------------------------
MAX_JSON_DEPTH = 64  # the bound docs/management.md states


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def json_depth(v: Any) -> int:
    if isinstance(v, dict):
        v = list(v.values())
    return 1 + max(map(json_depth, v), default=0) if isinstance(v, list) else 0


@pytest.mark.parametrize("method,path,wrap", [
    ("POST", "/api/definitions", b"%s"),
    ("PUT", "/api/queues/%2F/deep", b'{"arguments":{"x-deep":%s}}'),
    ("POST", "/api/exchanges/%2F/amq.default/publish", b'{"properties":{"headers":%s}}'),
    ("PUT", "/api/users/deep", b'{"password":"x","tags":%s}'),
    ("PUT", "/api/policies/%2F/deep", b'{"pattern":".*","definition":%s}'),
])
def test_B1_deep_json_is_400_not_500(broker: ackmq.EmbeddedBroker, method: str, path: str,
                                     wrap: bytes) -> None:
    """100,000 levels (the issue's body) and 65 in all (one past the bound) -> 400
    saying so, no traceback (the fixture checks the log); 64 levels parse (and are
    then judged as the route judges any value)."""
    outer = json_depth(json.loads(wrap % b"0"))  # the levels around the deep value
    for n in (100_000, MAX_JSON_DEPTH + 1 - outer):
        r = api(broker).call(method, path, wrap % deep(n), headers=JSON)
        assert r.status == 400, (n, r.status, r.raw[:300])
        assert r.body == {"error": "bad_request",
                          "reason": "not_json: nested deeper than 64 levels"}
    r = api(broker).call(method, path, wrap % deep(MAX_JSON_DEPTH - outer), headers=JSON)
    assert r.status < 500 and "nested deeper" not in r.raw.decode()
    assert "deep" not in users(broker)
    api(broker).call("DELETE", "/api/queues/%2F/deep")


def test_B1_deep_json_in_the_ui_policy_form_is_refused_plainly(
        broker: ackmq.EmbeddedBroker) -> None:
    status, headers, _, _ = _raw(broker, "POST", "/policies/add", urlencode({
        "kind": "policy", "vhost": "/", "name": "deep", "pattern": ".*",
        "apply-to": "queues", "priority": "0", "definition": "[" * 100_000}).encode(),
        {"Content-Type": "application/x-www-form-urlencoded",
         "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    assert status == 303, status
    assert "nested+deeper+than+64+levels" in headers["location"]


_scalar = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=12))
_wrong = st.recursive(_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    st.sampled_from(["arguments", "durable", "type", "payload", "properties", "headers",
                     "users", "queues", "permissions", "password", "tags", "count",
                     "definition", "pattern", "routing_key", "vhost", "name",
                     "delivery_mode", "x-max-length", "value", "ackmode"]), c,
    max_size=5), max_leaves=10)
_bodies = st.one_of(
    _wrong.map(lambda v: json.dumps(v).encode()),
    st.integers(60, 200_000).map(deep),
    st.integers(60, 50_000).map(lambda n: b'{"arguments":' + b'{"a":' * n + b"1"
                                + b"}" * n + b"}"),
    st.integers(1, 3_000_000).map(lambda n: b'{"payload":"' + b"x" * n + b'"}'),
    st.sampled_from([b"{", b"[1,", b'{"a":NaN}', b'{"a":Infinity}', b"\xff\xfe{}",
                     b'{"a":1e999999}', b"1" * 5000, b'"\\ud800"', b"{}" * 1000,
                     b'{"arguments":{"x-max-length":"1e999"}}', b"null", b"",
                     b'{"count":1e308,"ackmode":"ack_requeue_true","encoding":"auto"}']),
    st.binary(max_size=64))
_targets = st.sampled_from([
    "/api/definitions", "/api/definitions/%2F", "/api/queues/%2F/fz",
    "/api/queues/%2F/fz/get", "/api/queues/%2F/fz/contents", "/api/exchanges/%2F/fz",
    "/api/exchanges/%2F/amq.default/publish", "/api/bindings/%2F/e/amq.direct/q/fz",
    "/api/users/fz", "/api/permissions/%2F/fz", "/api/topic-permissions/%2F/fz",
    "/api/policies/%2F/fz", "/api/operator-policies/%2F/fz", "/api/vhosts/fz",
    "/api/vhost-limits/%2F/max-queues", "/api/user-limits/fz/max-channels",
    "/api/parameters/x/%2F/fz", "/api/global-parameters/fz", "/api/queues/%2F/%00",
    "/api/queues/%ZZ/x", "/api/../api/users/fz", "/api/queues/%2F/fz/bindings",
    "/api/nodes/x", "/login", "/logout", "/policies/add", "/queue/publish",
    "/queue/%2e%2e", "/static/..%2F..%2Fetc"])
_methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD",
                            "FOO", "TRACE"])
_ctypes = st.sampled_from(["application/json", "application/json; charset=latin-1",
                           "text/plain", "multipart/form-data; boundary=x",
                           "multipart/form-data", "application/x-www-form-urlencoded",
                           "application/json; charset=utf-16", "", "\x7f/\x01"])
_extra = st.sampled_from([{}, {"Origin": EVIL}, {"Origin": "null"},
                          {"Referer": "::::"}, {"Origin": "http://[::1"},
                          {"Cookie": "ackmq_session_1=x; =; ;;"},
                          {"Authorization": "Basic !!!"}, {"Authorization": "Bearer x"},
                          {"Accept": "application/xml"}, {"Content-Encoding": "gzip"},
                          {"Authorization": ""}])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=_methods, path=_targets, body=_bodies, ctype=_ctypes, extra=_extra)
def test_B1_json_endpoints_fuzz_no_5xx_no_traceback(
        logged: tuple[ackmq.EmbeddedBroker, _Records], method: str, path: str,
        body: bytes, ctype: str, extra: dict[str, str]) -> None:
    """Malformed, deep, huge and wrong-typed JSON, odd methods, paths and headers at
    the JSON endpoints: always a 4xx (or a 2xx), never a 5xx, never a traceback or an
    ERROR line in the broker's log, and the broker still answers."""
    b, rec = logged
    rec.records.clear()
    headers = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": ctype, **extra}
    try:
        status, _, text, _ = _raw(b, method, path, body, headers)
    except (http.client.HTTPException, ConnectionError) as e:  # refused at the parser
        status, text = 400, repr(e)
    assert status < 500, (method, path, body[:200], headers, status, text[:500])
    assert rec.bad() == [], (method, path, body[:200], headers)


# -- a real browser: a page elsewhere -------------------------------------------------
EVIL_PAGE = """<!doctype html><html><body>
<iframe name="f1"></iframe>
<form id="purge" method="post" action="{broker}/queue/purge" target="f1">
<input name="vhost" value="/"><input name="name" value="{queue}"></form>
<form id="defs" method="post" action="{broker}/api/definitions" enctype="text/plain">
<input name='{form_json}' value='"}}'></form>
<script>
async function go() {{
  const opts = {{method: "POST", mode: "no-cors", credentials: "include"}};
  try {{ await fetch("{broker}/api/definitions", Object.assign({{}}, opts, {{
    headers: {{"Content-Type": "text/plain"}}, body: '{fetch_json}'}})); }} catch (e) {{}}
  try {{ await fetch("{broker}/api/definitions", Object.assign({{}}, opts, {{
    body: new Blob(['{blob_json}'])}})); }} catch (e) {{}}
  try {{ await fetch("{broker}/api/users/{name}-put", {{method: "PUT",
    credentials: "include", headers: {{"Content-Type": "application/json"}},
    body: '{{"password": "x", "tags": "administrator"}}'}}); }} catch (e) {{}}
  const loaded = new Promise(function (r) {{
    document.querySelector("iframe").addEventListener("load", r); }});
  document.getElementById("purge").submit();
  await Promise.race([loaded, new Promise(function (r) {{ setTimeout(r, 5000); }})]);
  document.title = "submitting";
  document.getElementById("defs").submit();
}}
go();
</script></body></html>"""


class _Page(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def evil_site(broker: ackmq.EmbeddedBroker) -> Iterator[tuple[str, str, str]]:
    """A page on another origin (127.0.0.1, another port: the same *site*, so even a
    SameSite=Strict cookie goes along) that posts an `enctype=text/plain` form making
    an administrator, `fetch()`es the same, and purges a queue through the UI's form."""
    name, queue = f"evil-{uuid.uuid4().hex[:6]}", f"victim-{uuid.uuid4().hex[:6]}"
    declare(broker, queue, 2)

    def defs(who: str) -> str:
        return json.dumps({"users": [{"name": who, "password_hash": hash_password("x"),
                                      "tags": "administrator"}]})
    # text/plain form bodies are "name=value": the name opens the JSON, the value ends it
    form_json = defs(f"{name}-form")[:-1] + ',"ignore":"'
    handler = type("EvilPage", (_Page,), {"page": EVIL_PAGE.format(
        broker=broker.http_url, queue=queue, name=name, form_json=form_json,
        fetch_json=defs(f"{name}-fetch"), blob_json=defs(f"{name}-blob")).encode()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/", name, queue
    finally:
        srv.shutdown()
        srv.server_close()


def _visit(drv: Any, b: ackmq.EmbeddedBroker, site: tuple[str, str, str]) -> str:
    """Open the page, wait for its last form to land on the broker (or for one of its
    users to exist: a 204 leaves the browser on the page); the page shown."""
    url, name, _ = site
    drv.get(url)
    deadline = time.monotonic() + 30
    while not drv.current_url.startswith(b.http_url + "/api/definitions"):
        if any(u.startswith(name) for u in users(b)):
            break
        assert time.monotonic() < deadline, f"the page did not submit: {drv.current_url}"
        time.sleep(0.2)
    time.sleep(0.5)  # the page's answer is shown
    return str(drv.page_source)


def _nothing_changed(b: ackmq.EmbeddedBroker, site: tuple[str, str, str], shown: str
                     ) -> None:
    _, name, queue = site
    made = {u for u in users(b) if u.startswith(name)}
    assert made == set(), f"a page on another origin made users {made}"
    assert depth(b, queue) == 2, "a page on another origin purged a queue"
    assert "cross-origin request refused" in shown, shown[:500]  # it did arrive


def test_U3_cross_origin_page_cannot_change_anything_while_logged_in(
        broker: ackmq.EmbeddedBroker, evil_site: tuple[str, str, str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """An administrator logged in to the UI (the session cookie), in the same browser,
    visits a page on another origin: nothing changes."""
    with chrome(tmp_path_factory.mktemp("chrome")) as drv:
        browser_login(drv, broker.http_url)
        _nothing_changed(broker, evil_site, _visit(drv, broker, evil_site))
        drv.get(broker.http_url + "/queues")  # still logged in, the UI still works
        assert "user <b>guest</b>" in drv.page_source


def test_U3_cross_origin_page_cannot_use_cached_basic_credentials(
        broker: ackmq.EmbeddedBroker, evil_site: tuple[str, str, str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The browser holds Basic credentials for the API (its prompt answered once, here
    through the URL): a page on another origin still cannot change anything."""
    with chrome(tmp_path_factory.mktemp("chrome")) as drv:
        host = broker.http_url.split("//", 1)[1]
        drv.get(f"http://guest:guest@{host}/api/whoami")
        assert '"name":"guest"' in drv.page_source.replace(" ", "")
        drv.get(f"http://{host}/api/whoami")  # sent again without asking: cached
        assert '"name":"guest"' in drv.page_source.replace(" ", "")
        _nothing_changed(broker, evil_site, _visit(drv, broker, evil_site))
