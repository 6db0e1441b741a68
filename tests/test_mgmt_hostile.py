"""B1 on the management listener: malformed requests, huge headers and bodies, slow
clients, unauthenticated and wrong-tag calls, random JSON bodies -> HTTP's errors (4xx),
never a 500 or a traceback in the log, and the broker keeps serving HTTP and AMQP."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.mgmthelp import Target

AUTH = b"Authorization: Basic " + base64.b64encode(b"guest:guest")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def bad(self) -> list[str]:
        return [f"{r.name} {r.levelname} {r.getMessage()}" for r in self.records
                if r.levelno >= logging.WARNING or r.exc_info]


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[Any, _Records]]:
    import ackmq
    rec = _Records()
    loggers = [logging.getLogger(n) for n in ("ackmq", "aiohttp", "asyncio")]
    for lg in loggers:
        lg.addHandler(rec)
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
    try:
        with ackmq.EmbeddedBroker(persistent=False) as b:
            rec.records.clear()  # start-up lines
            yield b, rec
    finally:
        for lg, level in zip(loggers, old, strict=True):
            lg.removeHandler(rec)
            lg.setLevel(level)


def _raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while b"\r\n\r\n" not in out:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def _req(method: str, path: str, body: bytes = b"", *headers: bytes) -> bytes:
    head = [f"{method} {path} HTTP/1.1".encode(), b"Host: x", AUTH, *headers]
    if body:
        head += [b"Content-Length: %d" % len(body), b"Content-Type: application/json"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


CASES = [
    ("garbage request line", b"GARBAGE\r\n\r\n", b"400"),
    ("unknown HTTP version", b"GET / HTTP/9.9\r\n\r\n", b"400"),
    ("header line of 20 kB", b"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Big: "
     + b"a" * 20000 + b"\r\n\r\n", b"400"),
    ("request line of 20 kB", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b"400"),
    ("announced 100 MB body", _req("PUT", "/api/queues/%2F/h", b"",
                                   b"Content-Length: 100000000") + b"{}", b"413"),
    ("body not an object", _req("PUT", "/api/queues/%2F/h", b"[1,2]"), b"400"),
    ("truncated JSON", _req("PUT", "/api/queues/%2F/h", b'{"arguments":{"x-max'), b"400"),
    ("bad percent escape", _req("GET", "/api/queues/%ZZ/h"), b"404"),
    ("NUL in a name", _req("GET", "/api/queues/%2F/%00"), b"404"),
    ("non-UTF-8 credentials", b"GET /api/overview HTTP/1.1\r\nHost: x\r\n"
     b"Authorization: Basic \xff\xfe\r\n\r\n", b"400"),
    ("bad chunk size", _req("POST", "/api/queues/%2F/h/get", b"", b"Transfer-Encoding: chunked")
     + b"zz\r\n", b"400"),
    ("bad delivery_mode", _req("POST", "/api/exchanges/%2F/amq.default/publish", json.dumps(
        {"routing_key": "h", "payload": "x", "payload_encoding": "string",
         "properties": {"delivery_mode": "zz"}}).encode()), b"400"),
    ("bad base64 payload", _req("POST", "/api/exchanges/%2F/amq.default/publish", json.dumps(
        {"routing_key": "h", "payload": "!!", "payload_encoding": "base64",
         "properties": {}}).encode()), b"400"),
    ("negative get count", _req("POST", "/api/queues/%2F/h/get", json.dumps(
        {"count": -1, "ackmode": "ack_requeue_true", "encoding": "auto"}).encode()), b"400"),
    ("unknown ackmode", _req("POST", "/api/queues/%2F/h/get", json.dumps(
        {"count": 1, "ackmode": "x", "encoding": "auto"}).encode()), b"400"),
    ("definitions not an object", _req("POST", "/api/definitions", b"[1]"), b"400"),
    ("bad pagination", _req("GET", "/api/queues?page=x"), b"400"),
    ("no credentials", b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n", b"401"),
]


@pytest.mark.parametrize("what,data,status", CASES, ids=[c[0] for c in CASES])
def test_B1_http_bad_input_answered(hostile: tuple[Any, _Records], what: str, data: bytes,
                                    status: bytes) -> None:
    b, rec = hostile
    out = _raw(b.http_port, data)
    assert out.split(b"\r\n", 1)[0].split(b" ")[1:2] == [status], (what, out[:200])
    assert rec.bad() == []
    assert Target("ackmq", b.http_url, b.url).call("GET", "/api/overview").status == 200


def test_B1_http_slow_clients_do_not_stop_others(hostile: tuple[Any, _Records]) -> None:
    """Fifty clients stalled halfway through their headers; others are served, AMQP too."""
    b, rec = hostile
    stalled = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", b.http_port), timeout=10)
            s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            stalled.append(s)
        t = Target("ackmq", b.http_url, b.url)
        assert t.call("GET", "/api/queues", timeout=10).status == 200
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        qname = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", qname, b"x")
        assert ch.basic_get(qname, auto_ack=True)[2] == b"x"
        conn.close()
    finally:
        for s in stalled:
            s.close()
    assert rec.bad() == []


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                     | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(
                         st.text(max_size=10), c, max_size=4), max_leaves=12)
_keys = st.sampled_from(["durable", "auto_delete", "arguments", "type", "internal",
                         "routing_key", "payload", "payload_encoding", "properties", "count",
                         "ackmode", "encoding", "truncate", "password", "tags", "configure",
                         "write", "read", "value", "exchange", "queues", "exchanges",
                         "bindings", "users", "vhosts", "permissions", "x-max-length",
                         "delivery_mode", "headers"])
_bodies = st.dictionaries(_keys, _json, max_size=6) | _json
_paths = st.sampled_from([
    ("PUT", "/api/queues/%2F/fz"), ("PUT", "/api/exchanges/%2F/fz"),
    ("POST", "/api/exchanges/%2F/amq.default/publish"), ("POST", "/api/queues/%2F/fz/get"),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/fz"), ("PUT", "/api/users/fz-user"),
    ("PUT", "/api/permissions/%2F/fz-user"), ("PUT", "/api/vhost-limits/%2F/max-queues"),
    ("PUT", "/api/topic-permissions/%2F/fz-user"), ("POST", "/api/definitions/%2F"),
    ("PUT", "/api/user-limits/fz-user/max-channels")])


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(target=_paths, body=_bodies)
def test_B1_http_random_json_bodies(hostile: tuple[Any, _Records], target: tuple[str, str],
                                    body: Any) -> None:
    b, rec = hostile
    method, path = target
    r = Target("ackmq", b.http_url, b.url).call(method, path, json.dumps(body).encode())
    assert r.status < 500, (method, path, body, r)
    assert rec.bad() == [], (method, path, body)
