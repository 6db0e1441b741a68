"""M1: message_stats of exchanges and channels, and connections' octet counters — the
same pika traffic against ackmq and RabbitMQ 3.10, then the JSON of /api/exchanges,
/api/channels and /api/connections compared (RabbitMQ's statistics arrive every 5 s:
polled)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from support.mgmthelp import Target, q
from support.mgmthelp import poll as _mgmt_poll


def _poll(mgmt: Target, path: str, ok: Callable[[Any], bool]) -> Any:
    return _mgmt_poll(mgmt, path, ok, timeout=25.0)




def _settled(want: dict[str, int]) -> Callable[[Any], bool]:
    """A poll predicate: the object's message_stats counts are `want` (every counter, not
    one of them: RabbitMQ emits a channel's and a queue's counters on separate timers, so
    one can be shown seconds before the other)."""
    def ok(body: Any) -> bool:
        ms = body.get("message_stats", {})
        return {k: v for k, v in ms.items() if not k.endswith("_details")} == want
    return ok


def _counts(ms: dict[str, Any]) -> dict[str, int]:
    """The counts of a message_stats object, after checking each has its rate."""
    out = {}
    for k, v in ms.items():
        if k.endswith("_details"):
            assert isinstance(v["rate"], int | float), ms
            assert k[:-len("_details")] in ms, ms
        else:
            assert isinstance(v, int), ms
            assert k + "_details" in ms, ms
            out[k] = v
    return out


@pytest.fixture
def amqp(mgmt: Target) -> Iterator[tuple[pika.BlockingConnection, str]]:
    """A pika connection with a unique connection_name, and that name."""
    tag = mgmt.name("conn")
    params = pika.URLParameters(mgmt.amqp_url)
    params.client_properties = {"connection_name": tag}
    conn = pika.BlockingConnection(params)
    try:
        yield conn, tag
    finally:
        if conn.is_open:
            conn.close()


def _connection(mgmt: Target, tag: str, ok: Callable[[Any], bool] = lambda c: True
                ) -> dict[str, Any]:
    def find(body: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((c for c in body if c.get("user_provided_name") == tag), None)
    found = _poll(mgmt, "/api/connections", lambda b: (c := find(b)) is not None and ok(c))
    conn = find(found)
    assert conn is not None, found
    return conn


def test_M1_exchange_message_stats_publish_in_and_out(
        mgmt: Target, amqp: tuple[pika.BlockingConnection, str]) -> None:
    conn, _ = amqp
    fan, lone, idle = mgmt.name("fan"), mgmt.name("lone"), mgmt.name("idle")
    ch = conn.channel()
    for x, kind in ((fan, "fanout"), (lone, "direct"), (idle, "topic")):
        ch.exchange_declare(x, kind, auto_delete=False)
        mgmt.cleanup.append(("exchange", x))
    for i in range(2):
        name = mgmt.name(f"q{i}")
        ch.queue_declare(name, auto_delete=True)
        ch.queue_bind(name, fan)
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish(fan, "", b"m%d" % i)
    ch.basic_publish(lone, "nowhere", b"x")  # routed to no queue: publish_in only

    path = f"/api/exchanges/{q('/')}/{q(fan)}"
    body = _poll(mgmt, path, _settled({"publish_in": 10, "publish_out": 20}))
    assert _counts(body["message_stats"]) == {"publish_in": 10, "publish_out": 20}, body
    assert body["incoming"] == [] and body["outgoing"] == []

    body = _poll(mgmt, f"/api/exchanges/{q('/')}/{q(lone)}", _settled({"publish_in": 1}))
    assert _counts(body["message_stats"]) == {"publish_in": 1}, body

    listed = {x["name"]: x for x in mgmt.call("GET", f"/api/exchanges/{q('/')}").body}
    assert _counts(listed[fan]["message_stats"]) == {"publish_in": 10, "publish_out": 20}
    assert "message_stats" not in listed[idle], listed[idle]  # nobody published to it


def _flag_on(mgmt: Target, name: str) -> bool:
    """Whether the target's feature flag `name` is enabled. RabbitMQ 3.10's management
    agent counts `drop_unroutable` and `get_empty` only under the flags
    drop_unroutable_metric and empty_basic_get_metric (rabbit_mgmt_data's
    maybe_convert_for_compatibility; rabbit_mgmt_db fills a 0 in). Flags a plugin brings
    are enabled only on a node's first boot: Debian's package starts the node on install,
    before the management plugin is on, so a fresh Debian 3.10.8 has both off and shows
    0 for both — what CI saw. ackmq counts both and lists the flags as enabled."""
    r = mgmt.call("GET", "/api/feature-flags")
    assert r.status == 200, r
    state = {f["name"]: f["state"] for f in r.body}
    assert name in state, state
    return bool(state[name] == "enabled")


def test_M1_channel_message_stats_publish_and_deliver_groups(
        mgmt: Target, amqp: tuple[pika.BlockingConnection, str]) -> None:
    conn, tag = amqp
    name, empty = mgmt.name("q"), mgmt.name("empty")
    pub = conn.channel()  # channel 1: publishes
    pub.queue_declare(name, auto_delete=True)
    pub.queue_declare(empty, auto_delete=True)
    pub.confirm_delivery()
    for i in range(12):
        pub.basic_publish("", name, b"m%d" % i)
    pub.basic_publish("", mgmt.name("nowhere"), b"x")  # dropped
    conn.channel()  # channel 2: idle
    sub = conn.channel()  # channel 3: gets, acks, consumes
    for _ in range(2):
        method, _p, _b = sub.basic_get(name)
        sub.basic_ack(method.delivery_tag)
    method, _p, _b = sub.basic_get(name)
    sub.basic_nack(method.delivery_tag, requeue=True)
    sub.basic_get(name, auto_ack=True)  # the requeued one: a redelivery
    assert sub.basic_get(empty) == (None, None, None)
    got: list[Any] = []
    sub.basic_consume(name, lambda _c, m, _p, _b: got.append(m))
    deadline = time.monotonic() + 10
    while len(got) < 9 and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert len(got) == 9
    sub.basic_ack(got[-1].delivery_tag, multiple=True)
    conn.process_data_events(0.1)

    cname = _connection(mgmt, tag)["name"]
    dropped = 1 if _flag_on(mgmt, "drop_unroutable_metric") else 0
    empty_gets = 1 if _flag_on(mgmt, "empty_basic_get_metric") else 0
    if mgmt.kind == "ackmq":
        assert dropped == empty_gets == 1  # ackmq always counts both
    want_pub = {"publish": 13, "confirm": 13, "drop_unroutable": dropped,
                "return_unroutable": 0}
    want_sub = {"ack": 11, "deliver": 9, "deliver_get": 13, "deliver_no_ack": 0, "get": 3,
                "get_no_ack": 1, "get_empty": empty_gets, "redeliver": 1}

    def settled(body: list[dict[str, Any]]) -> bool:
        # every counter, not only confirm/ack: RabbitMQ's collector may show a channel's
        # counters in more than one emission, so wait for all before asserting
        by = {c["number"]: c for c in body}
        return (_settled(want_pub)(by.get(1, {})) and _settled(want_sub)(by.get(3, {})))

    listed = _poll(mgmt, f"/api/connections/{q(cname)}/channels", settled)
    by = {c["number"]: c for c in listed}
    assert _counts(by[1]["message_stats"]) == want_pub, by[1]
    assert "message_stats" not in by[2], by[2]  # an idle channel has none
    assert _counts(by[3]["message_stats"]) == want_sub, by[3]

    one = mgmt.call("GET", f"/api/channels/{q(by[3]['name'])}")
    assert one.status == 200, one
    assert _counts(one.body["message_stats"]) == want_sub
    assert len(one.body["consumer_details"]) == 1, one.body
    assert one.body["publishes"] == [] and one.body["deliveries"] == []
    everyone = [c for c in mgmt.call("GET", "/api/channels").body
                if c["connection_details"]["name"] == cname]
    assert {c["number"] for c in everyone} == {1, 2, 3}


def test_M1_connection_octets_and_counts(
        mgmt: Target, amqp: tuple[pika.BlockingConnection, str]) -> None:
    conn, tag = amqp
    name = mgmt.name("q")
    ch = conn.channel()
    ch.queue_declare(name, auto_delete=True)
    ch.confirm_delivery()
    body = b"x" * 200_000
    for _ in range(3):
        ch.basic_publish("", name, body)
    for _ in range(3):
        method, _p, got = ch.basic_get(name, auto_ack=True)
        assert got == body
    # RabbitMQ emits a connection's statistics while it is busy: keep it talking
    stop = time.monotonic() + 25

    def sent(c: dict[str, Any]) -> bool:
        # RabbitMQ lists a connection before its first statistics emission (no
        # recv_oct yet): not sent, keep polling
        if c.get("recv_oct", 0) >= 600_000 and c.get("send_oct", 0) >= 600_000:
            return True
        if time.monotonic() < stop:
            ch.basic_publish("", name, b"tick")
            ch.basic_get(name, auto_ack=True)
        return False

    c = _connection(mgmt, tag, sent)
    for key in ("recv_oct", "send_oct", "recv_cnt", "send_cnt"):
        assert isinstance(c[key], int), c
    for key in ("recv_oct", "send_oct"):
        assert c[key] >= 600_000, c
        assert isinstance(c[key + "_details"]["rate"], int | float), c
    assert c["recv_cnt"] >= 1 and c["send_cnt"] >= 1, c
    one = mgmt.call("GET", f"/api/connections/{q(c['name'])}").body
    assert one["recv_oct"] >= c["recv_oct"] and one["send_oct"] >= c["send_oct"], one


def test_M1_closed_channels_stay_in_the_totals(ackmq_mgmt: Any) -> None:
    """A channel's counts move into its protocol's totals when it closes: the
    overview's and /metrics' counters never go back."""
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)

    def published() -> int:
        return int(t.call("GET", "/api/overview").body["message_stats"].get("publish", 0))

    before = published()
    conn = pika.BlockingConnection(pika.URLParameters(t.amqp_url))
    try:
        ch = conn.channel()
        name = t.name("q")
        ch.queue_declare(name, auto_delete=True)
        for i in range(5):
            ch.basic_publish("", name, b"m%d" % i)
        conn.channel().close()
        assert published() == before + 5
        ch.close()
        assert published() == before + 5  # folded into the closed channels' sum
    finally:
        conn.close()
    assert published() == before + 5
    metrics = t.call("GET", "/metrics").raw.decode()
    line = next(x for x in metrics.splitlines()
                if x.startswith('rabbitmq_global_messages_received_total{protocol="amqp091"'))
    assert float(line.split()[-1]) >= before + 5


def test_M1_stomp_channel_message_stats(mgmt: Target) -> None:
    """A STOMP session is a channel too: 5 SENDs with receipts (confirms, as RabbitMQ's
    STOMP plugin counts them) and an auto-ack subscription that takes them."""
    import socket
    port = mgmt.server.stomp_port if mgmt.server is not None else 61623
    dest = "/queue/" + mgmt.name("stomp")
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        pytest.skip(f"no STOMP listener on {port}: {e!r}")
    try:
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00")
        got = b""
        while b"\x00" not in got:
            got += s.recv(4096)
        assert got.startswith(b"CONNECTED"), got
        for i in range(5):
            s.sendall(b"SEND\ndestination:%s\nreceipt:r%d\n\nhello\x00" % (dest.encode(), i))
        s.sendall(b"SUBSCRIBE\nid:1\ndestination:%s\nack:auto\n\n\x00" % dest.encode())
        got = b""
        while got.count(b"MESSAGE\n") < 5:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        host, sport = s.getsockname()[:2]
        local = f"{host}:{sport}"

        want = {
            "publish": 5, "confirm": 5, "drop_unroutable": 0, "return_unroutable": 0,
            "ack": 0, "deliver": 0, "deliver_get": 5, "deliver_no_ack": 5, "get": 0,
            "get_empty": 0, "get_no_ack": 0, "redeliver": 0}

        def ours(body: list[dict[str, Any]]) -> bool:
            return any(c["name"].startswith(local + " ->") and _settled(want)(c)
                       for c in body)

        listed = _poll(mgmt, "/api/channels", ours)
        (ch,) = [c for c in listed if c["name"].startswith(local + " ->")]
        assert _counts(ch["message_stats"]) == want, ch
        assert list(ch["message_stats"]) == sorted(ch["message_stats"])  # RabbitMQ's order
        s.sendall(b"UNSUBSCRIBE\nid:1\n\n\x00")
    finally:
        s.close()
        mgmt.call("DELETE", f"/api/queues/{q('/')}/{q(dest.split('/')[-1])}")


def test_M1_exchange_channel_and_connection_rates_move(ackmq_mgmt: Any) -> None:
    """The `_details.rate` of an exchange, a channel and a connection: measured between
    two showings at least the sampler's interval apart (5 s, RabbitMQ's
    collect_statistics_interval; shortened here to keep the test short)."""
    from ackmq.server.http.sampler import SAMPLER_KEY
    t = Target("ackmq", ackmq_mgmt.http_url, ackmq_mgmt.url, ackmq_mgmt.server)
    sampler = ackmq_mgmt.server.http._runner.app[SAMPLER_KEY]
    old, sampler.interval = sampler.interval, 0.5
    tag = t.name("conn")
    params = pika.URLParameters(t.amqp_url)
    params.client_properties = {"connection_name": tag}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        x, name = t.name("x"), t.name("q")
        ch.exchange_declare(x, "fanout", auto_delete=True)
        ch.queue_declare(name, auto_delete=True)
        ch.queue_bind(name, x)
        ch.basic_publish(x, "", b"first")
        cname = _connection(t, tag)["name"]
        paths = (f"/api/exchanges/{q('/')}/{q(x)}", f"/api/channels/{q(cname + ' (1)')}",
                 f"/api/connections/{q(cname)}")
        for p in paths:  # the first showing takes the snapshot: rates 0.0
            assert t.call("GET", p).status == 200
        for _ in range(200):
            ch.basic_publish(x, "", b"m" * 1000)
        conn.process_data_events(0.1)
        time.sleep(0.6)
        xs, chs, cs = (t.call("GET", p).body for p in paths)
        assert xs["message_stats"]["publish_in_details"]["rate"] > 0, xs
        assert xs["message_stats"]["publish_out_details"]["rate"] > 0, xs
        assert chs["message_stats"]["publish_details"]["rate"] > 0, chs
        assert chs["message_stats"]["confirm_details"]["rate"] == 0.0, chs
        assert cs["recv_oct_details"]["rate"] > 0, cs  # (nothing was sent back: no confirms)
    finally:
        sampler.interval = old
        conn.close()
