"""Delayed delivery (issue 27, SPEC L1-L4, L8): the rabbitmq_delayed_message_exchange
plugin's interface (`x-delayed-message`, `x-delayed-type`, `x-delay`), the
`x-delayed-delivery` opt-in on any exchange, and what the management plane shows.

Against an in-process ackmq (its store on, fsync on) over pika. RabbitMQ 3.10 here has no
delayed-message plugin: it refuses the exchange type (503, checked live when it runs);
the plugin's own answers, read from its source (rabbitmq-delayed-message-exchange,
src/rabbit_exchange_type_delayed_message.erl and rabbit_delayed_message_utils.erl), are
recorded below where ackmq matches them, and where ackmq chose otherwise it says why.
Timing: a message must not arrive before its delay (checked against the time taken just
before the publish, 2 ms for the broker's ms rounding) and must arrive within a generous
deadline after it; nothing depends on the machine being fast.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from conftest import rabbitmq_url
from support.pikahelp import closed_with, uniq

import ackmq

EARLY = 0.002  # the broker keeps due times in whole ms
LATE = 10.0    # a due message arrives within this (busy machine)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with ackmq.EmbeddedBroker(data_dir=tmp_path_factory.mktemp("delayed")) as b:
        yield b


@pytest.fixture
def ch(broker: Any) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    c = conn.channel()
    yield c
    if conn.is_open:
        conn.close()


def delayed_exchange(ch: Any, kind: str = "direct", durable: bool = True,
                     **args: Any) -> str:
    name = uniq("dx")
    ch.exchange_declare(name, "x-delayed-message", durable=durable,
                        arguments={"x-delayed-type": kind, **args})
    return name


def queue_bound(ch: Any, exchange: str, key: str = "k",
                arguments: dict[str, Any] | None = None) -> str:
    q = uniq("dq")
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, exchange, key, arguments=arguments)
    return q


def props(delay: Any = None, mode: int = 2, **headers: Any) -> pika.BasicProperties:
    if delay is not None:
        headers["x-delay"] = delay
    return pika.BasicProperties(delivery_mode=mode, headers=headers or None)


def get_within(ch: Any, q: str, timeout: float = LATE) -> tuple[Any, Any, bytes, float]:
    deadline = time.monotonic() + timeout
    while True:
        m, p, body = ch.basic_get(q, auto_ack=True)
        if m is not None:
            return m, p, body, time.time()
        assert time.monotonic() < deadline, f"nothing arrived on {q}"
        time.sleep(0.01)


def assert_empty(ch: Any, q: str) -> None:
    assert ch.queue_declare(q, passive=True).method.message_count == 0


# -- L1: delayed publish ------------------------------------------------------------------
@pytest.mark.parametrize("kind, key, bind_args, headers", [
    ("direct", "k", None, {}),
    ("fanout", "anything", None, {}),
    ("topic", "a.b.c", None, {}),
    ("headers", "", {"x-match": "all", "h": "v"}, {"h": "v"}),
])
def test_L1_delayed_message_arrives_after_its_delay_as_its_delayed_type_routes(
        ch: Any, kind: str, key: str, bind_args: Any, headers: dict) -> None:
    x = delayed_exchange(ch, kind)
    bkey = {"topic": "a.*.c", "fanout": "", "headers": ""}.get(kind, key)
    q = queue_bound(ch, x, bkey, bind_args)
    t0 = time.time()
    ch.basic_publish(x, key, b"m", props(800, **headers))
    time.sleep(0.3)
    assert_empty(ch, q)  # not yet
    _m, p, body, at = get_within(ch, q)
    assert body == b"m" and at >= t0 + 0.8 - EARLY
    assert p.headers["x-delay"] == -800  # the plugin's swap: "already delayed"


def test_L1_no_delay_zero_and_negative_route_at_once(ch: Any) -> None:
    """The plugin: no header, 0 and negative values (its own "already delayed" marker,
    which a republished delivery carries) are routed at once."""
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    for d in (None, 0, -5000):
        ch.basic_publish(x, "k", b"now", props(d))
        _m, p, _b, _at = get_within(ch, q, timeout=2.0)
        assert (p.headers or {}).get("x-delay") == d


@pytest.mark.parametrize("value, ms", [(700.9, 700), ("42", 42), (b" 7 ", 7), (-1.5, 0),
                                       (0, 0), (None, 0)])
def test_L1_delay_values_read_as_the_plugin_reads_them(value: Any, ms: int) -> None:
    """Integers of any width, floats truncated, numeric strings (pika cannot send a
    float: the model is driven directly)."""
    from ackmq.broker.delayed import delay_ms
    from ackmq.broker.message import Message
    from ackmq.protocol.amqp.client_codec import encode_basic_properties
    raw = encode_basic_properties(headers={"x-delay": value})
    assert delay_ms(Message("x", "k", raw, b"")) == ms


def test_L1_numeric_string_delay_counts(ch: Any) -> None:
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    t0 = time.time()
    ch.basic_publish(x, "k", b"m", props("700"))
    _m, p, _b, at = get_within(ch, q)
    assert at >= t0 + 0.7 - EARLY
    assert p.headers["x-delay"] == -700


@pytest.mark.parametrize("value, text", [
    ("soon", "PRECONDITION_FAILED - invalid message: 'x-delay' must be an integer number "
             "of milliseconds, got 'soon'"),
    (True, "PRECONDITION_FAILED - invalid message: 'x-delay' must be an integer number "
           "of milliseconds, got True"),
    (4294967296, "PRECONDITION_FAILED - invalid message: 'x-delay' 4294967296 exceeds "
                 "the largest delay, 4294967295 ms"),
])
def test_L1_bad_x_delay_is_refused_never_delivered_at_once(
        broker: Any, value: Any, text: str) -> None:
    """The plugin delivers a bool or a too-large delay at once and crashes on a
    non-numeric string; ackmq refuses all three with 406 and routes nothing."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    closed_with(lambda: (ch.basic_publish(x, "k", b"bad", props(value)),
                         ch.queue_declare(q, passive=True)), 406, text)
    ch2 = conn.channel()
    assert_empty(ch2, q)
    conn.close()


# -- declares: the plugin's codes and texts -------------------------------------------------
@pytest.mark.parametrize("args, code, text", [
    ({}, 406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an "
              "existing exchange type"),
    ({"x-delayed-type": 5}, 406, "PRECONDITION_FAILED - Invalid argument, "
                                 "'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": "x-delayed-message"}, 406, "PRECONDITION_FAILED - Invalid "
     "argument, 'x-delayed-message' can't be used for 'x-delayed-type'"),
])
def test_L1_bad_declare_answered_with_the_plugins_code_and_text(
        broker: Any, args: dict, code: int, text: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    closed_with(lambda: conn.channel().exchange_declare(uniq("bad"), "x-delayed-message",
                                                        arguments=args), code, text)
    conn.close()


def test_L1_unknown_delayed_type_closes_the_connection_503(broker: Any) -> None:
    """rabbit_exchange:check_type, as the plugin calls it: a connection error."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        conn.channel().exchange_declare(uniq("bad"), "x-delayed-message",
                                        arguments={"x-delayed-type": "nope"})
    assert ei.value.reply_code == 503
    assert ei.value.reply_text == "COMMAND_INVALID - unknown exchange type 'nope'"


def test_L1_rabbitmq_3_10_without_the_plugin_refuses_the_type() -> None:
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url()))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        conn.channel().exchange_declare(uniq("dx"), "x-delayed-message",
                                        arguments={"x-delayed-type": "direct"})
    assert ei.value.reply_code == 503
    assert ei.value.reply_text == "COMMAND_INVALID - unknown exchange type " \
                                  "'x-delayed-message'"


# -- L1 on any exchange: the opt-in ----------------------------------------------------------
def test_L1_x_delay_on_any_exchange_only_when_it_opts_in(ch: Any) -> None:
    plain, opted = uniq("plain"), uniq("opted")
    ch.exchange_declare(plain, "direct")
    ch.exchange_declare(opted, "direct", arguments={"x-delayed-delivery": True})
    q1, q2 = queue_bound(ch, plain), queue_bound(ch, opted)
    t0 = time.time()
    ch.basic_publish(plain, "k", b"p", props(700))
    ch.basic_publish(opted, "k", b"o", props(700))
    _m, p1, _b, at1 = get_within(ch, q1, 2.0)
    assert at1 < t0 + 0.7 and p1.headers["x-delay"] == 700  # no opt-in: a plain header
    _m, p2, _b, at2 = get_within(ch, q2)
    assert at2 >= t0 + 0.7 - EARLY and p2.headers["x-delay"] == -700


# -- L3: order -------------------------------------------------------------------------------
def test_L3_messages_fire_in_due_order_not_publish_order(ch: Any) -> None:
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    for d in (1200, 400, 800, 400):
        ch.basic_publish(x, "k", str(d).encode(), props(d))
    got = [get_within(ch, q)[2] for _ in range(4)]
    assert got == [b"400", b"400", b"800", b"1200"]


# -- L4: mandatory and bindings at due time --------------------------------------------------
def test_L4_mandatory_unroutable_returns_at_once(broker: Any) -> None:
    """The plugin ignores mandatory (it routes a delayed message nowhere at publish);
    ackmq returns what its bindings cannot route now, at once."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    x = delayed_exchange(ch)
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda _c, _m, _p, body: returned.append(body))
    ch.basic_publish(x, "nobody", b"r", props(60000), mandatory=True)
    conn.process_data_events(time_limit=1.0)
    assert returned == [b"r"]
    conn.close()


def test_L4_bindings_at_due_time_decide(ch: Any) -> None:
    """Routable when published, re-routed when due: a queue bound meanwhile gets it, a
    queue unbound meanwhile does not."""
    x = delayed_exchange(ch)
    q1 = queue_bound(ch, x)
    q2 = uniq("late")
    ch.queue_declare(q2, durable=True)
    ch.basic_publish(x, "k", b"m", props(900), mandatory=True)
    ch.queue_bind(q2, x, "k")
    ch.queue_unbind(q1, x, "k")
    get_within(ch, q2)
    assert_empty(ch, q1)


def test_L4_deleting_the_exchange_drops_its_pending_messages(ch: Any) -> None:
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    ch.basic_publish(x, "k", b"m", props(500))
    ch.exchange_delete(x)
    time.sleep(1.0)
    assert_empty(ch, q)


# -- L2 (in process): confirms wait for the timer store's fsync ------------------------------
def test_L2_persistent_delayed_publish_is_confirmed(ch: Any) -> None:
    ch.confirm_delivery()
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    ch.basic_publish(x, "k", b"m", props(300))  # raises if nacked
    get_within(ch, q)


# -- L8: visibility ---------------------------------------------------------------------------
def _http(broker: Any, path: str) -> str:
    req = urllib.request.Request(broker.http_url + path)
    import base64
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_L8_pending_count_in_api_exchanges_ui_and_metrics(ch: Any, broker: Any) -> None:
    import json
    x = delayed_exchange(ch)
    queue_bound(ch, x)
    for _ in range(3):
        ch.basic_publish(x, "k", b"m", props(60000))
    xs = {e["name"]: e for e in json.loads(_http(broker, "/api/exchanges"))}
    assert xs[x]["messages_delayed"] == 3
    assert "messages_delayed" not in xs["amq.direct"]  # only delaying exchanges have it
    one = json.loads(_http(broker, f"/api/exchanges/%2F/{x}"))
    assert one["messages_delayed"] == 3
    metrics = _http(broker, "/metrics")
    assert f'ackmq_exchange_messages_delayed{{exchange="{x}",vhost="/"}} 3.0' in metrics
    assert "<th>Delayed</th>" in _http(broker, "/exchanges")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                          str(broker.server.config.data_dir), "list_exchanges", "name",
                          "messages_delayed"], capture_output=True, text=True, check=True)
    assert f"{x}\t3" in out.stdout.splitlines()
    ch.exchange_delete(x)


def test_L8_publish_in_and_out_counted_once_per_delayed_message(ch: Any, broker: Any) -> None:
    """/api/exchanges' message_stats for what pika published: publish_in once per
    message, publish_out once per queue the message reached — when it fires, not also
    when it went into the timer store (it was counted twice). A fanout to two queues:
    3 delayed + 1 undelayed messages are 4 in, 8 out."""
    import json
    x = delayed_exchange(ch, "fanout")
    qs = [queue_bound(ch, x, "") for _ in range(2)]
    for i in range(3):
        ch.basic_publish(x, "", b"d%d" % i, props(300))
    ch.basic_publish(x, "", b"now", props())
    for q in qs:
        for _ in range(4):
            get_within(ch, q)
    deadline = time.monotonic() + LATE
    while True:
        one = json.loads(_http(broker, f"/api/exchanges/%2F/{x}"))
        ms = {k: v for k, v in one.get("message_stats", {}).items() if not k.endswith("_details")}
        if ms == {"publish_in": 4, "publish_out": 8} or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ms == {"publish_in": 4, "publish_out": 8}, one
    assert one["messages_delayed"] == 0
    ch.exchange_delete(x)


def test_L1_x_delay_on_the_default_exchange_when_the_queue_opts_in(ch: Any) -> None:
    """Queue argument `x-delayed-delivery: true`: a positive x-delay on any route to the
    queue (here the default exchange) waits in the queue's timer store."""
    plain, opted = uniq("plainq"), uniq("optedq")
    ch.queue_declare(plain, durable=True)
    ch.queue_declare(opted, durable=True, arguments={"x-delayed-delivery": True})
    t0 = time.time()
    ch.basic_publish("", plain, b"p", props(700))
    ch.basic_publish("", opted, b"o", props(700))
    _m, _p, _b, at1 = get_within(ch, plain, 2.0)
    assert at1 < t0 + 0.7
    m, p2, _b, at2 = get_within(ch, opted)
    assert at2 >= t0 + 0.7 - EARLY and p2.headers["x-delay"] == -700
    assert m.exchange == "" and m.routing_key == opted
    ch.queue_delete(opted)


def test_L1_queue_opt_in_argument_must_be_a_bool(broker: Any) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    closed_with(lambda: conn.channel().queue_declare(
        uniq("bad"), arguments={"x-delayed-delivery": "yes"}), 406)
    conn.close()


def test_L1_client_delivery_delay_on_ackmq(broker: Any, ch: Any) -> None:
    """ackmq.client producer.send(..., delivery_delay=s) (JMS 2.0 setDeliveryDelay)."""
    from ackmq.client import connect
    q = uniq("clientq")
    ch.queue_declare(q, durable=True, arguments={"x-delayed-delivery": True})
    with connect(broker.url) as conn:
        s = conn.session()
        t0 = time.time()
        s.producer(q).send(b"later", delivery_delay=0.8)
        m = s.consumer(q).receive(timeout=LATE)
        assert m is not None and m.body == b"later" and time.time() >= t0 + 0.8 - EARLY


def test_L1_client_delivery_delay_refused_against_rabbitmq() -> None:
    """RabbitMQ (no plugin, and the client publishes to the default exchange) would
    deliver at once: the client refuses instead of delivering early."""
    from ackmq.client import ClientError, connect
    url = rabbitmq_url()
    q = uniq("rq")
    with connect(url) as conn:
        p = conn.session().producer(q)
        with pytest.raises(ClientError, match="delivery_delay needs ackmq"):
            p.send(b"x", delivery_delay=1)
    rabbit = pika.BlockingConnection(pika.URLParameters(url))
    rabbit.channel().queue_delete(q)
    rabbit.close()


def test_L3_paged_messages_fire_in_due_order_never_early(
        ch: Any, broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored messages due beyond NEAR_MS wait as 8-byte seqs in due-time buckets (no
    body, no heap entry) and are read back LEAD_MS before their bucket: here nearly
    all of them are paged, and they still fire in due order, none early."""
    from ackmq.broker import delayed
    monkeypatch.setattr(delayed, "NEAR_MS", 100)
    monkeypatch.setattr(delayed, "LEAD_MS", 300)
    x = delayed_exchange(ch)
    q = queue_bound(ch, x)
    t0 = time.time()
    delays = (4500, 700, 3800, 1200, 1200, 5100)
    for d in delays:
        ch.basic_publish(x, "k", str(d).encode(), props(d))
    ch.queue_declare(q, passive=True)  # a round trip: the publishes are in
    timers = broker.server.broker.vhosts["/"].exchanges[x].timers
    # the three due >= 3.8 s are read back no sooner than ~2.5 s from now
    assert timers._far_count >= 3 and timers.message_count == len(delays)
    got = []
    for _ in delays:
        _m, _p, body, at = get_within(ch, q)
        assert at >= t0 + int(body) / 1000 - EARLY
        got.append(int(body))
    assert got == sorted(delays)


@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_L1_opt_in_is_compared_on_redeclare(broker: Any, kind: str) -> None:
    """Adding (or dropping) `x-delayed-delivery` on a redeclare is an inequivalent
    argument (406), never a silent no-delay."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    name = uniq("redecl")
    if kind == "exchange":
        ch.exchange_declare(name, "direct")
        again = lambda: ch.exchange_declare(  # noqa: E731
            name, "direct", arguments={"x-delayed-delivery": True})
    else:
        ch.queue_declare(name)
        again = lambda: ch.queue_declare(  # noqa: E731
            name, arguments={"x-delayed-delivery": True})
    text = closed_with(again, 406)
    assert "inequivalent arg 'x-delayed-delivery'" in text
    conn.close()
