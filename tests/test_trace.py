"""M9: the firehose tracer, side by side with RabbitMQ 3.10; S10: ackmq's lifecycle
events on the same exchange.

The same steps run against ackmq and RabbitMQ (each in a fresh vhost with tracing set
by `PUT /api/vhosts/<vhost> {"tracing": true}`); the copies read off
`amq.rabbitmq.trace` are compared, header by header with their AMQP types, with
RabbitMQ's answers recorded below (REFERENCE_COPIES), so the ackmq side runs without
a RabbitMQ too and the RabbitMQ side proves the recording still holds.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pika
import pytest
from conftest import BrokerProcess
from pamqp import commands
from support.mgmthelp import Target, q
from support.rawamqp import RawConnection

from ackmq.cli import main
from ackmq.protocol.amqp.table import array_items, decode_table, table_entries, table_items

TRACE = "amq.rabbitmq.trace"
HIDDEN = {"node", "connection", "vhost"}  # the brokers' own names: compared by type only


def _typed(entry: bytes) -> Any:
    """(type tag, value) of one encoded table entry, tables and arrays unfolded."""
    key_len = entry[0]
    tag = chr(entry[1 + key_len])
    if tag == "F":
        items = table_items(entry[1 + key_len:])
        assert items is not None
        return ["F", [[k.decode(), *_typed(e)] for k, e in items]]
    if tag == "A":
        items_a = array_items(entry)
        assert items_a is not None
        return ["A", [_typed(b"\x00" + v) for v in items_a]]
    value = decode_table(len(entry).to_bytes(4, "big") + entry)[entry[1:1 + key_len].decode()]
    if isinstance(value, bytes):
        value = value.decode()
    return [tag, value]


def shape(raw_properties: bytes) -> list[Any]:
    """A copy's properties as [[key, type, value], ...] in wire order; the node,
    connection and vhost values blanked (each broker names its own)."""
    flags = int.from_bytes(raw_properties[:2], "big")
    assert flags == 0x2000, hex(flags)  # only headers, as RabbitMQ
    out = []
    for k, e in table_entries(raw_properties, 2, len(raw_properties)):
        name = k.decode()
        tag, value = _typed(e)
        out.append([name, tag, "*" if name in HIDDEN else value])
    return out


def read_copies(url: str, sink: str, n: int, timeout: float = 30.0) -> list[Any]:
    """The messages on `sink` (routing key, header shape, body): `n` of them (waited
    for), and any more that come within a second after."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    with RawConnection.open(url) as raw:
        raw.open_channel(1)
        while time.monotonic() < deadline:
            reply = raw.rpc(1, commands.Basic.Get(queue=sink, no_ack=True),
                            (commands.Basic.GetOk, commands.Basic.GetEmpty))
            if isinstance(reply, commands.Basic.GetEmpty):
                if len(out) >= n:
                    break
                time.sleep(0.2)
                continue
            out.append([reply.method.routing_key, shape(reply.raw_properties),
                        reply.body.decode()])
            if len(out) == n:
                deadline = time.monotonic() + 1.0
    return out


PROPS = pika.BasicProperties(
    content_type="text/plain", content_encoding="utf-8", delivery_mode=2, priority=3,
    correlation_id="c1", reply_to="r1", expiration="60000", message_id="m1",
    timestamp=1700000000, type="t1", user_id="guest", app_id="a1",
    headers={"k": "v", "n": 5, "b": True, "CC": ["a.cc"]})


def scenario(url: str) -> list[Any]:
    """Publishes (routed to two queues, to the default exchange, unroutable), a get,
    a nack with requeue, a redelivered get, a consume with ack; the copies it causes."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        setup = conn.channel()  # channel 1
        setup.queue_declare("tr.sink")
        setup.queue_bind("tr.sink", TRACE, "#")
        setup.exchange_declare("tr.x", "topic")
        setup.queue_declare("tr.q")
        setup.queue_bind("tr.q", "tr.x", "a.*")
        setup.queue_declare("tr.q2")
        setup.queue_bind("tr.q2", "tr.x", "a.#")
        ch = conn.channel()  # channel 2: the traced one
        ch.basic_publish("tr.x", "a.b", b"hello", PROPS)
        ch.basic_publish("", "tr.q", b"direct")
        ch.basic_publish("tr.x", "zzz", b"unroutable")
        ch.queue_declare("tr.q", passive=True)  # a round trip: the publishes are in
        m, _p, _b = ch.basic_get("tr.q", auto_ack=False)
        assert m is not None
        ch.basic_nack(m.delivery_tag, requeue=True)
        m, _p, _b = ch.basic_get("tr.q", auto_ack=True)  # redelivered
        assert m is not None and m.redelivered
        got: list[bytes] = []
        ch.basic_consume("tr.q2", lambda c, m, p, b: (got.append(b),
                                                      c.basic_ack(m.delivery_tag)))
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            conn.process_data_events(0.2)
        copies = read_copies(url, "tr.sink", 6)
        setup.queue_delete("tr.sink")
        return copies
    finally:
        with contextlib.suppress(Exception):
            conn.close()


_PROPS_TABLE = ["F", [
    ["app_id", "S", "a1"], ["user_id", "S", "guest"], ["type", "S", "t1"],
    ["timestamp", "I", 1700000000], ["message_id", "S", "m1"],
    ["expiration", "S", "60000"], ["reply_to", "S", "r1"], ["correlation_id", "S", "c1"],
    ["priority", "I", 3], ["delivery_mode", "I", 2],
    ["headers", "F", [["k", "S", "v"], ["n", "I", 5], ["b", "t", True],
                      ["CC", "A", [["S", "a.cc"]]]]],
    ["content_encoding", "S", "utf-8"], ["content_type", "S", "text/plain"]]]


def _pub(x: str, keys: list[str], props: list[Any], routed: list[str]) -> list[Any]:
    return [["exchange_name", "S", x], ["routing_keys", "A", [["S", k] for k in keys]],
            ["properties", *props], ["node", "S", "*"], ["vhost", "S", "*"],
            ["connection", "S", "*"], ["channel", "I", 2], ["user", "S", "guest"],
            ["routed_queues", "A", [["S", r] for r in routed]]]


def _dlv(x: str, keys: list[str], props: list[Any], redelivered: int) -> list[Any]:
    return [["exchange_name", "S", x], ["routing_keys", "A", [["S", k] for k in keys]],
            ["properties", *props], ["node", "S", "*"], ["redelivered", "I", redelivered],
            ["vhost", "S", "*"], ["connection", "S", "*"], ["channel", "I", 2],
            ["user", "S", "guest"]]


# RabbitMQ 3.10.8's copies of `scenario`, read off the wire (the test's rabbitmq side
# checks this recording against the live broker)
REFERENCE_COPIES = [
    ["publish.tr.x", _pub("tr.x", ["a.b", "a.cc"], _PROPS_TABLE, ["tr.q", "tr.q2"]), "hello"],
    ["publish.", _pub("", ["tr.q"], ["F", []], ["tr.q"]), "direct"],
    ["publish.tr.x", _pub("tr.x", ["zzz"], ["F", []], []), "unroutable"],
    ["deliver.tr.q", _dlv("tr.x", ["a.b", "a.cc"], _PROPS_TABLE, 0), "hello"],
    ["deliver.tr.q", _dlv("tr.x", ["a.b", "a.cc"], _PROPS_TABLE, 1), "hello"],
    ["deliver.tr.q2", _dlv("tr.x", ["a.b", "a.cc"], _PROPS_TABLE, 0), "hello"],
    # the message to the default exchange was the queue's second: never fetched
]


def _traced_vhost(mgmt: Target) -> str:
    vhost = mgmt.vhost()
    r = mgmt.call("PUT", f"/api/vhosts/{q(vhost)}", {"tracing": True})
    assert r.status in (201, 204), r
    assert mgmt.call("GET", f"/api/vhosts/{q(vhost)}").body["tracing"] is True
    return vhost


def test_M9_firehose_copies_as_rabbitmq(mgmt: Target) -> None:
    vhost = _traced_vhost(mgmt)
    url = mgmt.amqp_url.rstrip("/") + "/" + quote(vhost, safe="")
    copies = scenario(url)
    assert copies == REFERENCE_COPIES, mgmt.kind


def test_M9_trace_exchange_in_every_vhost(mgmt: Target) -> None:
    """A new vhost lists amq.rabbitmq.trace (topic, durable, internal) as RabbitMQ's."""
    vhost = mgmt.vhost()
    r = mgmt.call("GET", f"/api/exchanges/{q(vhost)}")
    got = sorted((x["name"], x["type"], x["durable"], x["internal"], x["auto_delete"])
                 for x in r.body)
    assert got == [("", "direct", True, False, False),
                   ("amq.direct", "direct", True, False, False),
                   ("amq.fanout", "fanout", True, False, False),
                   ("amq.headers", "headers", True, False, False),
                   ("amq.match", "headers", True, False, False),
                   ("amq.rabbitmq.trace", "topic", True, True, False),
                   ("amq.topic", "topic", True, False, False)]
    assert mgmt.call("GET", f"/api/vhosts/{q(vhost)}").body["tracing"] is False
    conn = pika.BlockingConnection(pika.URLParameters(
        mgmt.amqp_url.rstrip("/") + "/" + quote(vhost, safe="")))
    try:  # internal: no client publishes to it
        ch = conn.channel()
        ch.basic_publish(TRACE, "x", b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("", exclusive=True)
        assert e.value.reply_code == 403
        assert e.value.reply_text == (f"ACCESS_REFUSED - cannot publish to internal exchange "
                                      f"'{TRACE}' in vhost '{vhost}'")
    finally:
        conn.close()


# -- ctl ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("trace") / "data", "--no-stomp")
    b.start()
    yield b
    b.stop()


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ctl", *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_M9_ctl_trace_on_off_as_rabbitmqctl(proc: BrokerProcess) -> None:
    """rabbitmqctl 3.10's output, recorded: the result line is printed with -q too."""
    d = str(proc.data_dir)
    r = ctl("--data-dir", d, "trace_on")
    assert (r.returncode, r.stdout) == (
        0, 'Starting tracing for vhost "/" ...\nTrace enabled for vhost /\n'), r
    r = ctl("--data-dir", d, "trace_off", "-p", "/")
    assert (r.returncode, r.stdout) == (
        0, 'Stopping tracing for vhost "/" ...\nTrace disabled for vhost /\n'), r
    r = ctl("--data-dir", d, "-q", "trace_on", "-p", "no-such-vhost")
    assert (r.returncode, r.stdout) == (0, "Trace enabled for vhost no-such-vhost\n"), r


def test_M9_off_means_no_copies(proc: BrokerProcess) -> None:
    """trace_off stops the copies; nothing is copied while off."""
    d = str(proc.data_dir)
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    try:
        ch = conn.channel()
        sink = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(sink, TRACE, "#")
        ch.queue_declare("tr.off")
        assert ctl("--data-dir", d, "trace_on").returncode == 0
        ch.basic_publish("", "tr.off", b"on")
        assert ctl("--data-dir", d, "trace_off").returncode == 0
        ch.basic_publish("", "tr.off", b"off")
        ch.queue_declare("tr.off", passive=True)
        assert ch.queue_declare(sink, passive=True).method.message_count == 1
        m, _p, body = ch.basic_get(sink, auto_ack=True)
        assert m is not None and (m.routing_key, body) == ("publish.", b"on")
        ch.queue_delete("tr.off")
    finally:
        conn.close()


# -- S10: lifecycle events ------------------------------------------------------------
def events_by_message(url: str, sink: str, n: int) -> dict[str, list[dict[str, Any]]]:
    """The events on `sink`, as header dicts (plus `key`), grouped by message_id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, hdrs, _body in read_copies(url, sink, n):
        ev = {k: v for k, _t, v in hdrs}
        ev["key"] = key
        props = ev.get("properties")
        mid = ev.get("message_id") or next(
            (v for k, _t, v in (props or []) if k == "message_id"), None)
        out.setdefault(mid, []).append(ev)
    return out


def test_S10_lifecycle_events_join_on_one_id(proc: BrokerProcess) -> None:
    """publish, route, confirm (with fsync time), deliver, ack, nack, reject,
    deadletter, expire: each once, all of one message under one x-ackmq-id (its
    dead-lettered copy's too); consuming the events adds none."""
    d = str(proc.data_dir)
    assert ctl("--data-dir", d, "trace_on", "--lifecycle").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    try:
        ch = conn.channel()
        sink = "lc.sink"
        ch.queue_declare(sink)
        ch.queue_bind(sink, TRACE, "#")
        ch.exchange_declare("lc.dlx", "fanout")
        ch.queue_declare("lc.dlq", durable=True)
        ch.queue_bind("lc.dlq", "lc.dlx")
        ch.queue_declare("lc.q", durable=True, arguments={"x-dead-letter-exchange": "lc.dlx"})
        ch.queue_declare("lc.ttl", durable=True, arguments={"x-message-ttl": 200})
        ch.confirm_delivery()
        for mid, queue in (("m-ack", "lc.q"), ("m-nack", "lc.q"), ("m-reject", "lc.q"),
                           ("m-exp", "lc.ttl")):
            ch.basic_publish("", queue, mid.encode(),
                             pika.BasicProperties(message_id=mid, delivery_mode=2))
        tags = {}
        for _ in range(3):
            m, p, _b = ch.basic_get("lc.q")
            tags[p.message_id] = m.delivery_tag
        ch.basic_ack(tags["m-ack"])
        ch.basic_nack(tags["m-nack"], requeue=False)  # -> lc.dlx -> lc.dlq
        ch.basic_reject(tags["m-reject"], requeue=True)
        m, p, _b = ch.basic_get("lc.q")
        assert p.message_id == "m-reject" and m.redelivered
        ch.basic_ack(m.delivery_tag)
        m, p, _b = ch.basic_get("lc.dlq")
        assert p.message_id == "m-nack"
        ch.basic_ack(m.delivery_tag)
        deadline = time.monotonic() + 30  # m-exp expires (200 ms TTL)
        while ch.queue_declare("lc.ttl", passive=True).method.message_count and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        ev = events_by_message(proc.url, sink, 24)
        for name in ("lc.q", "lc.dlq", "lc.ttl", sink):
            ch.queue_delete(name)
        ch.exchange_delete("lc.dlx")
    finally:
        conn.close()
        ctl("--data-dir", d, "trace_off")
    assert set(ev) == {"m-ack", "m-nack", "m-reject", "m-exp"}, ev.keys()
    keys = {mid: sorted(e["key"] for e in es) for mid, es in ev.items()}
    common = ["confirm.", "publish.", "route."]
    assert keys["m-ack"] == sorted([*common, "deliver.lc.q", "ack.lc.q"])
    assert keys["m-nack"] == sorted([*common, "deliver.lc.q", "nack.lc.q",
                                     "deadletter.lc.q", "deliver.lc.dlq", "ack.lc.dlq"])
    assert keys["m-reject"] == sorted([*common, "deliver.lc.q", "reject.lc.q",
                                       "deliver.lc.q", "ack.lc.q"])
    assert keys["m-exp"] == sorted([*common, "expire.lc.ttl"])
    for mid, es in ev.items():
        assert len({e["x-ackmq-id"] for e in es}) == 1, (mid, es)  # one identity
        assert all(e["x-ackmq-time-us"] > 0 for e in es)
        confirm = next(e for e in es if e["key"] == "confirm.")
        assert confirm["ack"] is True and confirm["fsync_us"] > 0, confirm
    dl = next(e for e in ev["m-nack"] if e["key"] == "deadletter.lc.q")
    assert (dl["reason"], dl["exchange_name"], dl["routed_queues"]) == (
        "rejected", "lc.dlx", [["S", "lc.dlq"]])
    rej = next(e for e in ev["m-reject"] if e["key"] == "reject.lc.q")
    assert rej["requeue"] is True


def test_M9_tracing_flag_checked_as_rabbitmq(mgmt: Target) -> None:
    """PUT /api/vhosts: "true"/"false" strings count; anything else is RabbitMQ's 400
    ["not_boolean", value], and the vhost is not created; without the key the state
    stays."""
    vhost = mgmt.vhost()
    path = f"/api/vhosts/{q(vhost)}"
    r = mgmt.call("PUT", path, {"tracing": "x"})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": ["not_boolean", "x"]})
    assert mgmt.call("PUT", path, {"tracing": "true"}).status == 204
    assert mgmt.call("PUT", path, {}).status == 204
    assert mgmt.call("GET", path).body["tracing"] is True
    assert mgmt.call("PUT", path, {"tracing": False}).status == 204
    assert mgmt.call("GET", path).body["tracing"] is False
    fresh = f"/api/vhosts/{q(mgmt.name('vh'))}"
    assert mgmt.call("PUT", fresh, {"tracing": 1}).status == 400
    assert mgmt.call("GET", fresh).status == 404


def test_S10_stomp_nack_dead_lettered_is_a_nack_not_an_ack(ackmq_target: Any,
                                                            ackmq_stomp: BrokerProcess,
                                                            queue: str) -> None:
    """A STOMP NACK that dead-letters to ActiveMQ.DLQ (W6) settles the original as an
    ack inside the model; its lifecycle events say nack (requeue false) and
    deadletter, never ack."""
    d = str(ackmq_stomp.data_dir)
    conn = ackmq_target.pika()
    try:
        ch = conn.channel()
        sink = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(sink, TRACE, f"*.{queue}")
        ch.queue_bind(sink, TRACE, "*.ActiveMQ.DLQ")
        assert ctl("--data-dir", d, "trace_on", "--lifecycle").returncode == 0
        try:
            with ackmq_target.raw() as r:
                r.receipt("SEND", {"destination": f"queue://{queue}"}, b"rejected")
                r.subscribe(f"queue://{queue}", "s", ack="client-individual")
                r.ack(r.expect("MESSAGE"), "NACK", requeue="false")
                deadline = time.monotonic() + 30
                while not ch.queue_declare("ActiveMQ.DLQ", passive=True).method \
                        .message_count and time.monotonic() < deadline:
                    time.sleep(0.1)
        finally:
            ctl("--data-dir", d, "trace_off")
        keys = []
        while True:
            m, p, _b = ch.basic_get(sink, auto_ack=True)
            if m is None:
                break
            keys.append((m.routing_key, p.headers.get("requeue")))
        ch.queue_purge("ActiveMQ.DLQ")
    finally:
        conn.close()
    assert sorted(keys) == sorted([(f"deliver.{queue}", None),
                                   (f"nack.{queue}", False),
                                   (f"deadletter.{queue}", None)]), keys


def test_M9_ctl_trace_on_off_with_url(mgmt: Target) -> None:
    """`ackmq ctl --url` turns a broker's tracing on and off through its management API
    (ackmq's or RabbitMQ's), with rabbitmqctl's lines; a missing vhost is not made."""
    vhost = mgmt.vhost()
    url = mgmt.base.replace("http://", "http://guest:guest@")
    path = f"/api/vhosts/{q(vhost)}"
    r = ctl("--url", url, "trace_on", "-p", vhost)
    assert (r.returncode, r.stdout) == (0, f'Starting tracing for vhost "{vhost}" ...\n'
                                           f"Trace enabled for vhost {vhost}\n"), r
    assert mgmt.call("GET", path).body["tracing"] is True
    r = ctl("--url", url, "-q", "trace_off", "-p", vhost)
    assert (r.returncode, r.stdout) == (0, f"Trace disabled for vhost {vhost}\n"), r
    assert mgmt.call("GET", path).body["tracing"] is False
    missing = mgmt.name("vh")
    assert ctl("--url", url, "trace_on", "-p", missing).returncode == 0
    assert mgmt.call("GET", f"/api/vhosts/{q(missing)}").status == 404
