"""The audit's calls and what is kept of each answer (SPEC M8).

Each probe has an id and turns one broker's answer into plain JSON: the status and
body where a script reads both (errors, health checks), the keys where values vary
(ports), property values after a publish and a get, the metric families with their
type and label names. Ports are written as "{amqp_port}" so RabbitMQ's 5672 and an
ackmq on a free port compare equal. Names are fixed (`audit-…`) and removed after.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

QUEUE = "audit-probe"  # the queue every publish probe routes to (vhost "/")
VHOST = "audit-vh"  # a vhost made to see what a new vhost holds
GUEST = ("guest", "guest")
# a name no broker has seen (RabbitMQ's text for an exchange type differs once the name
# is an Erlang atom: "unknown exchange type" first, "invalid exchange type" after)
UNIQUE = f"audit{uuid.uuid4().hex[:10]}"


@dataclass
class Target:
    """One broker: its management base URL, the base URL of its Prometheus paths, its
    AMQP port (written as {amqp_port}), and whether its UI has ackmq's publish form."""

    kind: str  # "rabbitmq" | "ackmq"
    base: str
    metrics_base: str
    amqp_port: int
    auth: tuple[str, str] = GUEST

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
             auth: Any = "default", base: str | None = None,
             form: dict[str, str] | None = None) -> tuple[int, Any, str]:
        """(status, parsed JSON or text, raw text)."""
        url = urllib.parse.urlsplit(base or self.base)
        conn = http.client.HTTPConnection(url.netloc, timeout=60)
        h: dict[str, str] = {}
        creds = self.auth if auth == "default" else auth
        if creds is not None:
            h["Authorization"] = "Basic " + base64.b64encode(
                f"{creds[0]}:{creds[1]}".encode()).decode()
        data = raw
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            h["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            text = r.read().decode("utf-8", "replace")
        finally:
            conn.close()
        try:
            parsed = json.loads(text) if text.strip() else None
        except ValueError:
            parsed = None
        return r.status, parsed, text


Keep = Callable[[Target, int, Any, str], Any]


def _ports(t: Target, v: Any) -> Any:
    """The answer with the target's AMQP port written as {amqp_port} (and this run's
    unique name as {unique})."""
    if isinstance(v, str) and UNIQUE in v:
        return v.replace(UNIQUE, "{unique}")
    if isinstance(v, dict):
        return {k: _ports(t, x) for k, x in v.items()}
    if isinstance(v, list):
        return [_ports(t, x) for x in v]
    if v == t.amqp_port or v == str(t.amqp_port):
        return "{amqp_port}"
    return v


def keep_all(t: Target, status: int, body: Any, text: str) -> Any:
    return [status, _ports(t, body)]


def keep_keys(t: Target, status: int, body: Any, text: str) -> Any:
    """Status and the body's keys with the values that do not list this node's
    listeners (which differ by nature: RabbitMQ has clustering and Prometheus ports)."""
    if not isinstance(body, dict):
        return [status, body]
    return [status, {k: (_ports(t, v) if not isinstance(v, list) else "[…]")
                     for k, v in sorted(body.items())}]


def keep_status(t: Target, status: int, body: Any, text: str) -> Any:
    return [status]


@dataclass
class Call:
    id: str
    method: str
    path: str
    body: Any = None
    raw: bytes | None = None
    keep: Keep = keep_all
    auth: Any = "default"


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _publish(props: Any, rk: str = QUEUE) -> dict[str, Any]:
    return {"routing_key": rk, "payload": "x", "payload_encoding": "string",
            "properties": props}


PUB = "/api/exchanges/%2F/amq.default/publish"

# -- 404 / 400 reasons ---------------------------------------------------------------
ERRORS: list[Call] = [
    Call("404 unknown path", "GET", "/api/nope"),
    Call("404 vhost: queues", "GET", "/api/queues/audit-none"),
    Call("404 vhost: exchanges", "GET", "/api/exchanges/audit-none"),
    Call("404 vhost: bindings", "GET", "/api/bindings/audit-none"),
    Call("404 vhost: get", "GET", "/api/vhosts/audit-none"),
    Call("404 vhost: permissions", "GET", "/api/vhosts/audit-none/permissions"),
    Call("404 vhost: publish", "POST", "/api/exchanges/audit-none/amq.default/publish",
         _publish({})),
    Call("404 vhost: put queue", "PUT", "/api/queues/audit-none/q", {}),
    Call("404 vhost: put exchange", "PUT", "/api/exchanges/audit-none/x", {"type": "direct"}),
    Call("404 vhost: create binding", "POST", "/api/bindings/audit-none/e/amq.direct/q/x", {}),
    Call("404 binding: no destination queue", "POST",
         "/api/bindings/%2F/e/amq.direct/q/audit-none", {}),
    Call("404 binding: no destination exchange", "POST",
         "/api/bindings/%2F/e/amq.direct/e/audit-none", {}),
    Call("404 binding: no source exchange", "POST",
         "/api/bindings/%2F/e/audit-none/e/amq.direct", {}),
    Call("404 binding: delete unknown", "DELETE",
         f"/api/bindings/%2F/e/amq.direct/q/{QUEUE}/audit-none"),
    Call("404 vhost: get queue", "GET", "/api/queues/audit-none/x"),
    Call("404 vhost: delete queue", "DELETE", "/api/queues/audit-none/x"),
    Call("404 vhost: put permission", "PUT", "/api/permissions/audit-none/guest",
         {"configure": ".*", "write": ".*", "read": ".*"}),
    Call("404 queue: get", "GET", "/api/queues/%2F/audit-none"),
    Call("404 queue: delete", "DELETE", "/api/queues/%2F/audit-none"),
    Call("404 queue: purge", "DELETE", "/api/queues/%2F/audit-none/contents"),
    Call("404 queue: get messages", "POST", "/api/queues/%2F/audit-none/get",
         {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}),
    Call("404 queue: bindings", "GET", "/api/queues/%2F/audit-none/bindings"),
    Call("404 exchange: get", "GET", "/api/exchanges/%2F/audit-none"),
    Call("404 exchange: delete", "DELETE", "/api/exchanges/%2F/audit-none"),
    Call("404 exchange: publish", "POST", "/api/exchanges/%2F/audit-none/publish",
         _publish({})),
    Call("404 exchange: bindings", "GET", "/api/exchanges/%2F/audit-none/bindings/source"),
    Call("404 binding: pair", "GET", "/api/bindings/%2F/e/audit-none/q/audit-none"),
    Call("404 binding: create", "POST", "/api/bindings/%2F/e/audit-none/q/audit-none",
         {"routing_key": "k"}),
    Call("404 user: get", "GET", "/api/users/audit-none"),
    Call("404 user: delete", "DELETE", "/api/users/audit-none"),
    Call("404 user: permissions", "GET", "/api/users/audit-none/permissions"),
    Call("404 permission: get", "GET", "/api/permissions/%2F/audit-none"),
    Call("404 connection", "GET", "/api/connections/audit-none"),
    Call("404 channel", "GET", "/api/channels/audit-none"),
    Call("404 node", "GET", "/api/nodes/audit-none"),
    Call("400 bad JSON: put queue", "PUT", f"/api/queues/%2F/{QUEUE}-x", raw=b"{nope"),
    Call("400 bad JSON: put exchange", "PUT", "/api/exchanges/%2F/audit-x", raw=b"{nope"),
    Call("400 bad JSON: put user", "PUT", "/api/users/audit-u", raw=b"{nope"),
    Call("400 bad JSON: publish", "POST", PUB, raw=b"{nope"),
    Call("400 bad JSON: get messages", "POST", f"/api/queues/%2F/{QUEUE}/get", raw=b"{nope"),
    Call("400 bad JSON: definitions", "POST", "/api/definitions", raw=b"{nope"),
    Call("400 bad JSON: bindings", "POST", f"/api/bindings/%2F/e/amq.direct/q/{QUEUE}",
         raw=b"{nope"),
    Call("400 user: no tags", "PUT", "/api/users/audit-u", {}),
    Call("400 vhost: tracing not boolean", "PUT", "/api/vhosts/audit-vh2", {"tracing": "x"}),
    Call("400 permission: unknown user", "PUT", "/api/permissions/%2F/audit-none",
         {"configure": ".*", "write": ".*", "read": ".*"}),
    Call("400 permission: keys missing", "PUT", "/api/permissions/%2F/guest", {}),
    Call("401 exchange: redeclare amq.default", "PUT", "/api/exchanges/%2F/amq.default",
         {"type": "direct"}),
    Call("401 exchange: delete amq.direct", "DELETE", "/api/exchanges/%2F/amq.direct"),
    Call("400 not boolean: durable", "PUT", f"/api/queues/%2F/{QUEUE}-x",
         {"durable": "yes"}),
    Call("400 argument: x-max-length not int", "PUT", f"/api/queues/%2F/{QUEUE}-x",
         {"arguments": {"x-max-length": "ten"}}),
    Call("400 argument: x-message-ttl negative", "PUT", f"/api/queues/%2F/{QUEUE}-x",
         {"arguments": {"x-message-ttl": -1}}),
    Call("400 argument: x-queue-type unknown", "PUT", f"/api/queues/%2F/{QUEUE}-x",
         {"arguments": {"x-queue-type": "bogus"}}),
    Call("400 argument: x-overflow unknown", "PUT", f"/api/queues/%2F/{QUEUE}-x",
         {"arguments": {"x-overflow": "bogus"}}),
    Call("400 argument: inequivalent", "PUT", f"/api/queues/%2F/{QUEUE}",
         {"arguments": {"x-max-length": 5}}),
    Call("400 exchange type unknown", "PUT", "/api/exchanges/%2F/audit-x",
         {"type": UNIQUE}),
    Call("400 exchange: amq. prefix", "PUT", "/api/exchanges/%2F/amq.audit",
         {"type": "direct"}),
    Call("400 publish: keys missing", "POST", PUB, {"payload": "x"}),
    Call("400 publish: payload encoding", "POST", PUB,
         {**_publish({}), "payload_encoding": "bogus"}),
    Call("400 publish: not base64", "POST", PUB,
         {**_publish({}), "payload": "!!", "payload_encoding": "base64"}),
    Call("400 publish: priority not int", "POST", PUB, _publish({"priority": "x"})),
    Call("400 publish: delivery_mode not int", "POST", PUB,
         _publish({"delivery_mode": "2"})),
    Call("400 publish: timestamp not int", "POST", PUB, _publish({"timestamp": "x"})),
    Call("400 publish: expiration not string", "POST", PUB, _publish({"expiration": 6})),
    Call("400 publish: content_type not string", "POST", PUB,
         _publish({"content_type": 5})),
    Call("400 publish: user_id not the user", "POST", PUB, _publish({"user_id": "other"})),
    Call("400 publish: header null", "POST", PUB, _publish({"headers": {"n": None}})),
    Call("400 publish: nested header null", "POST", PUB,
         _publish({"headers": {"a": [None]}})),
    Call("400 publish: priority null", "POST", PUB, _publish({"priority": None})),
    Call("400 publish: content_type null", "POST", PUB, _publish({"content_type": None})),
    Call("400 publish: priority float", "POST", PUB, _publish({"priority": 1.5})),
    Call("400 publish: priority boolean", "POST", PUB, _publish({"priority": True})),
    Call("400 publish: first refusal in name order", "POST", PUB,
         _publish({"priority": "x", "content_type": 5})),
    Call("400 publish: payload not string", "POST", PUB, {**_publish({}), "payload": 5}),
    Call("400 get: ackmode", "POST", f"/api/queues/%2F/{QUEUE}/get",
         {"count": 1, "ackmode": "bogus", "encoding": "auto"}),
    Call("400 get: encoding", "POST", f"/api/queues/%2F/{QUEUE}/get",
         {"count": 1, "ackmode": "ack_requeue_true", "encoding": "bogus"}),
    Call("400 pagination", "GET", "/api/queues?page=0"),
    Call("401 no login", "GET", "/api/overview", auth=None, keep=keep_status),
    Call("401 bad login", "GET", "/api/overview", auth=("guest", "wrong")),
]

# -- health checks (RabbitMQ 3.10's every path, deprecated ones included) ---------------
H = "/api/health/checks/"
HEALTH: list[Call] = [
    Call("health alarms", "GET", H + "alarms"),
    Call("health local-alarms", "GET", H + "local-alarms"),
    Call("health certificate-expiration 1 days", "GET", H + "certificate-expiration/1/days"),
    Call("health certificate-expiration 1 weeks", "GET",
         H + "certificate-expiration/1/weeks"),
    Call("health certificate-expiration bad unit", "GET",
         H + "certificate-expiration/1/fortnights"),
    Call("health certificate-expiration bad value", "GET",
         H + "certificate-expiration/x/days"),
    Call("health certificate-expiration both bad", "GET",
         H + "certificate-expiration/x/fortnights"),
    Call("health certificate-expiration negative", "GET",
         H + "certificate-expiration/-1/days"),
    Call("health certificate-expiration unit in capitals", "GET",
         H + "certificate-expiration/2/MONTHS"),
    Call("health port-listener amqp", "GET", H + "port-listener/{amqp_port}"),
    Call("health port-listener none", "GET", H + "port-listener/1", keep=keep_keys),
    Call("health port-listener not a port", "GET", H + "port-listener/abc"),
    Call("health protocol-listener amqp091", "GET", H + "protocol-listener/amqp091"),
    Call("health protocol-listener amqp", "GET", H + "protocol-listener/amqp"),
    Call("health protocol-listener AMQP 0.9.1", "GET", H + "protocol-listener/amqp0-9-1"),
    Call("health protocol-listener stomp", "GET", H + "protocol-listener/stomp"),
    Call("health protocol-listener amqp0.9.1", "GET", H + "protocol-listener/amqp0.9.1"),
    Call("health protocol-listener AMQP091", "GET", H + "protocol-listener/AMQP091"),
    Call("health protocol-listener amqp10", "GET", H + "protocol-listener/amqp10"),
    Call("health protocol-listener stomp1.2", "GET", H + "protocol-listener/stomp1.2"),
    Call("health protocol-listener management", "GET",
         H + "protocol-listener/management"),
    Call("health protocol-listener amqps", "GET", H + "protocol-listener/amqps",
         keep=keep_keys),
    Call("health protocol-listener stomps", "GET", H + "protocol-listener/stomps",
         keep=keep_keys),
    Call("health protocol-listener mqtt", "GET", H + "protocol-listener/mqtt",
         keep=keep_keys),
    Call("health protocol-listener http", "GET", H + "protocol-listener/http"),
    Call("health protocol-listener none", "GET", H + "protocol-listener/nope",
         keep=keep_keys),
    Call("health virtual-hosts", "GET", H + "virtual-hosts"),
    Call("health node-is-mirror-sync-critical", "GET", H + "node-is-mirror-sync-critical"),
    Call("health node-is-quorum-critical", "GET", H + "node-is-quorum-critical"),
    Call("health unknown check", "GET", H + "nope"),
    Call("health deprecated healthchecks/node", "GET", "/api/healthchecks/node"),
    Call("health deprecated healthchecks/node/other", "GET",
         "/api/healthchecks/node/audit@none"),
    Call("health aliveness-test /", "GET", "/api/aliveness-test/%2F"),
    Call("health aliveness-test unknown vhost", "GET", "/api/aliveness-test/audit-none"),
]

# -- every basic property through the API's publish and back through its get ----------
PROPERTY_VALUES: dict[str, Any] = {
    "content_type": "text/plain", "content_encoding": "gzip",
    "headers": {"i": 1, "s": "x", "f": 1.5, "b": True, "l": [1, "a"], "t": {"x": 1},
                "neg": -5, "big": 2 ** 40},
    "delivery_mode": 2, "priority": 3, "correlation_id": "c-1", "reply_to": "r-1",
    "expiration": "60000", "message_id": "m-1", "timestamp": 1700000000, "type": "t-1",
    "user_id": "guest", "app_id": "a-1", "cluster_id": "cl-1",
}
# RabbitMQ's UI publish form's property list (priv/www/js/main.js, publish_msg0);
# recorded from RabbitMQ's own main.js by `record`
UI_JS = "/js/main.js"


def ui_property_names(t: Target) -> list[str]:
    """The names RabbitMQ's UI publish form sends (read from its JavaScript)."""
    status, _, text = t.call("GET", UI_JS, auth=None)
    m = re.search(r"var props = \[(.*?)\];", text, re.S)
    if status != 200 or m is None:
        raise RuntimeError(f"{t.base}{UI_JS}: no property list ({status})")
    return re.findall(r"\['(\w+)',", m.group(1))


def _get_one(t: Target) -> Any:
    status, body, _ = t.call("POST", f"/api/queues/%2F/{QUEUE}/get",
                             {"count": 1, "ackmode": "ack_requeue_false",
                              "encoding": "auto"})
    if status != 200 or not body:
        return [status, body]
    return body[0]["properties"]


def property_probe(t: Target, props: dict[str, Any]) -> Any:
    """[publish's status, publish's body, the properties a get shows]."""
    t.call("DELETE", f"/api/queues/%2F/{QUEUE}/contents")
    status, body, _ = t.call("POST", PUB, _publish(props))
    return [status, body, _get_one(t) if status == 200 else None]


def ui_property_probe(t: Target, name: str) -> Any:
    """One property through the UI's publish: RabbitMQ's UI posts the API with
    `delivery_mode` and the property (its JavaScript); ackmq's UI has a form."""
    value = PROPERTY_VALUES[name]
    if t.kind == "rabbitmq":
        return property_probe(t, {"delivery_mode": 2, name: value})[2]
    t.call("DELETE", f"/api/queues/%2F/{QUEUE}/contents")
    status, _, text = t.call("POST", "/queue/publish", form={
        "vhost": "/", "name": QUEUE, "payload": "x", "delivery_mode": "2",
        "properties": f"{name}={value}"})
    if status not in (200, 303):
        return [status, text[:200]]
    return _get_one(t)


# -- what a new vhost holds -------------------------------------------------------------
def new_vhost_exchanges(t: Target) -> Any:
    t.call("DELETE", f"/api/vhosts/{VHOST}")
    status, _, _ = t.call("PUT", f"/api/vhosts/{VHOST}", {})
    try:
        s, body, _ = t.call("GET", f"/api/exchanges/{VHOST}?columns=name,type,durable,"
                                   "auto_delete,internal,arguments")
        return [status, s, {x.pop("name"): x for x in body} if s == 200 else body]
    finally:
        t.call("DELETE", f"/api/vhosts/{VHOST}")


# -- metric families ---------------------------------------------------------------------
METRIC_PATHS = ["/metrics", "/metrics/per-object", "/metrics/detailed",
                "/metrics/detailed?vhost=%2F&family=queue_coarse_metrics"] + [
    f"/metrics/detailed?family={f}" for f in (
        "queue_coarse_metrics", "queue_consumer_count", "queue_metrics",
        "connection_coarse_metrics", "connection_metrics", "channel_metrics",
        "channel_queue_metrics", "channel_exchange_metrics",
        "channel_queue_exchange_metrics", "channel_process_metrics",
        "connection_churn_metrics", "exchange_names", "exchange_bindings",
        "vhost_status")]
# the prometheus plugin's telemetry about its own scrapes: its label sets show the
# scrapes seen so far (a registry's labels appear after its first scrape, `encoding`
# after a gzip one), so a recording from one history never matches another's; kept by
# name and type only (CI's fresh RabbitMQ answered [] where the recording had labels)
HISTORY_LABELS = ("telemetry_scrape_",)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def metric_families(text: str) -> dict[str, list[Any]]:
    """{family: [type, sorted label names over its samples]} of a Prometheus text
    (histogram `le` and summary `quantile` left out: they come with the type)."""
    out: dict[str, list[Any]] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
            out.setdefault(name, [kind.strip(), []])
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name = m.group(1)
        fam = name if name in types else re.sub(r"_(bucket|sum|count)$", "", name)
        entry = out.setdefault(fam, [types.get(fam, "untyped"), []])
        labels = set(entry[1]) | {k for k in _LABEL.findall(m.group(2) or "")
                                  if k not in ("le", "quantile")}
        entry[1] = sorted(labels)
    for fam, entry in out.items():
        if fam.startswith(HISTORY_LABELS):
            entry[1] = []
    return out


def metrics_probe(t: Target, path: str) -> Any:
    status, _, text = t.call("GET", path, auth=None, base=t.metrics_base)
    return [status, metric_families(text) if status == 200 else text.strip()[:200]]


@contextlib.contextmanager
def amqp_session(t: Target, settle: float) -> Iterator[None]:
    """An AMQP connection with a confirm channel, a consumer and an unacked delivery
    while the metrics are read, so the per-connection, per-channel and per-queue
    families have samples (and so their label names) on both brokers. `settle`:
    seconds to wait for the broker's statistics (RabbitMQ emits them every 5 s)."""
    import pika  # the bench/test extras
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", t.amqp_port, credentials=pika.PlainCredentials(*t.auth)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_qos(prefetch_count=5)
        ch.basic_publish("", QUEUE, b"x")
        ch.basic_consume(QUEUE, lambda *a: None)
        conn.process_data_events(settle)
        yield
    finally:
        conn.close()


def run(t: Target, only: str | None = None) -> dict[str, Any]:
    """Every probe against `t`: {id: answer}. `only`: a regex on the ids."""
    rx = re.compile(only) if only else None
    out: dict[str, Any] = {}
    t.call("DELETE", f"/api/queues/%2F/{QUEUE}")
    t.call("PUT", f"/api/queues/%2F/{QUEUE}", {"durable": False})
    try:
        todo = [(pid, fn) for pid, fn in _probes(t) if rx is None or rx.search(pid)]
        for pid, fn in todo:
            if not pid.startswith("metrics "):
                out[pid] = fn()
        metrics = [(pid, fn) for pid, fn in todo if pid.startswith("metrics ")]
        if metrics:
            with amqp_session(t, 7.0 if t.kind == "rabbitmq" else 0.5):
                for pid, fn in metrics:
                    out[pid] = fn()
    finally:
        t.call("DELETE", f"/api/queues/%2F/{QUEUE}")
        for c in ERRORS:  # anything a refused call may have made after all
            if c.method == "PUT" and c.path.startswith("/api/queues/%2F/"):
                t.call("DELETE", c.path)
    return out


def _probes(t: Target) -> Iterator[tuple[str, Callable[[], Any]]]:
    for c in ERRORS + HEALTH:
        def call(c: Call = c) -> Any:
            path = c.path.replace("{amqp_port}", str(t.amqp_port))
            status, body, text = t.call(c.method, path, c.body, c.raw, c.auth)
            return c.keep(t, status, body, text)
        yield c.id, call
    for name, value in PROPERTY_VALUES.items():
        yield f"property {name} (API)", lambda n=name, v=value: property_probe(t, {n: v})
    yield "property all at once (API)", lambda: property_probe(t, dict(PROPERTY_VALUES))
    yield "property unknown name (API)", lambda: property_probe(t, {"bogus": "1"})
    yield "property none, as []", lambda: property_probe(t, [])
    yield "property none, as {}", lambda: property_probe(t, {})
    yield "property headers empty, as []", lambda: property_probe(t, {"headers": []})
    if t.kind == "rabbitmq":
        yield "UI publish form's property names", lambda: sorted(ui_property_names(t))
    else:
        from ackmq.server.http.ui import FORM_PROPERTIES
        yield "UI publish form's property names", lambda: sorted(FORM_PROPERTIES)
    for name in PROPERTY_VALUES:
        if name not in ("headers", "delivery_mode"):
            yield f"property {name} (UI form)", lambda n=name: ui_property_probe(t, n)
    yield "new vhost's exchanges", lambda: new_vhost_exchanges(t)
    for path in METRIC_PATHS:
        yield f"metrics {path}", lambda p=path: metrics_probe(t, p)
