"""AMQP 1.0 on the AMQP port (SPEC A1-A10) with real clients: python-qpid-proton's
blocking API against `ackmq serve`, each case that RabbitMQ 3.10's rabbitmq_amqp1_0
plugin also has run against it too (v1 addresses; skipped when it is not on
127.0.0.1:5672). Where only RabbitMQ 4 or the OASIS text has the rule, the case runs
against ackmq alone and its docstring names the source. A hand-driven peer
(support/amqp10help.RawPeer) sends what proton will not: bad frames, SASL left open."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.amqp10help import WAIT, RawPeer, connect, uniq
from support.mgmthelp import http_url_of

from ackmq.protocol.amqp10 import AMQP_HEADER, SASL_HEADER, Composite, encode_frame
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.types import UInt

proton = pytest.importorskip("proton")
from proton import Delivery, Message  # noqa: E402
from proton.utils import SendException  # noqa: E402


class Target:
    def __init__(self, kind: str, port: int, http: str = "") -> None:
        self.kind = kind
        self.port = port
        self.http = http

    @property
    def pika(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:guest@127.0.0.1:{self.port}/"))


@pytest.fixture(scope="module")
def ackmq_broker(tmp_path_factory: pytest.TempPathFactory):
    b = BrokerProcess(tmp_path_factory.mktemp("a10"), "--handshake-timeout", "2")
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def ackmq10(ackmq_broker: BrokerProcess) -> Target:
    http = http_url_of(ackmq_broker)
    return Target("ackmq", ackmq_broker.port, http)


@pytest.fixture(params=["ackmq", "rabbitmq"])
def target(request: pytest.FixtureRequest, ackmq10: Target) -> Target:
    if request.param == "ackmq":
        return ackmq10
    url = rabbitmq_url()  # skips when the reference broker is absent
    return Target("rabbitmq", int(url.rsplit(":", 1)[1].split("/")[0]))


def _declare(t: Target, queue: str, **args: object) -> None:
    c = t.pika
    c.channel().queue_declare(queue, durable=True, arguments=args or None)
    c.close()


def _delete(t: Target, queue: str) -> None:
    c = t.pika
    c.channel().queue_delete(queue)
    c.close()


def _get(t: Target, queue: str):
    c = t.pika
    ch = c.channel()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            c.close()
            return method, props, body
        time.sleep(0.05)
    c.close()
    return None, None, None


# -- A1 connection and SASL ------------------------------------------------------------------
def test_A1_both_protocols_on_one_port(target: Target) -> None:
    q = uniq("a1-one-port")
    _declare(target, q)
    conn = connect(target.port)
    try:
        conn.create_sender(f"/amq/queue/{q}").send(Message(body=b"over 1.0", inferred=True))
    finally:
        conn.close()
    method, _props, body = _get(target, q)  # the same port, 0-9-1
    _delete(target, q)
    assert method is not None
    if target.kind == "ackmq":  # RabbitMQ 3.10 hands 0-9-1 the encoded 1.0 sections
        assert body == b"over 1.0"


@pytest.mark.parametrize("head", [b"AMQP\x03\x07\x00\x00", b"AMQP\x03\x01\x09\x05",
                                  b"AMQP\x00\x01\x05\x00", b"AMQP\x03" + bytes(range(60))],
                         ids=["sasl-id-other-version", "sasl-1-other-minor", "amqp-1-5",
                              "sasl-id-then-garbage"])
def test_A1_another_amqp_header_gets_the_0_9_1_header_and_a_close(target: Target,
                                                                   head: bytes) -> None:
    """Only the two AMQP 1.0 headers themselves are AMQP 1.0 on the shared port: any other
    header starting `AMQP` (a 1.0 protocol id with another version too) is answered with
    AMQP 0-9-1's header and the socket closed, as RabbitMQ's reader does. (ackmq answered
    such a header with the SASL header until a random-garbage test drew a 3 fifth.)"""
    got = b""
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as s:
        s.sendall(head)
        try:
            while chunk := s.recv(100):
                got += chunk
        except ConnectionResetError:  # RabbitMQ resets the socket once its header is out
            pass
    assert got == b"AMQP\x00\x00\x09\x01"


def test_A1_wrong_password_is_refused(target: Target) -> None:
    with pytest.raises(proton.ConnectionException):
        connect(target.port, password="not-the-password")


def test_A1_anonymous_is_refused_unless_configured(ackmq10: Target) -> None:
    """RabbitMQ 4 (docs/amqp, "Authentication"): ANONYMOUS only when configured."""
    p = RawPeer(ackmq10.port)
    try:
        p.send(SASL_HEADER)
        p.read(until=lambda g: p.performative("sasl_mechanisms") is not None)
        mechs = p.performative("sasl_mechanisms").sasl_server_mechanisms
        assert "PLAIN" in mechs and "ANONYMOUS" not in mechs
        p.send(encode_frame(0, Composite("sasl_init", mechanism="ANONYMOUS"), b"",
                            F.SASL_FRAME))
        p.read()
        assert p.performative("sasl_outcome").code == 1 and p.closed
    finally:
        p.close()


def test_A1_no_sasl_is_refused(ackmq10: Target) -> None:
    """RabbitMQ 4 (docs/amqp, "Version negotiation"): SASL is required; a client that
    starts without it gets the SASL header and the connection closes (OASIS 2.2)."""
    p = RawPeer(ackmq10.port)
    try:
        p.send(AMQP_HEADER)
        p.read()
        assert p.got and p.got[0].raw == SASL_HEADER and p.closed
    finally:
        p.close()


def test_A1_vhost_from_hostname(ackmq10: Target) -> None:
    """RabbitMQ 4: `vhost:NAME` in open's hostname names the vhost; an unknown one is
    answered with open then close (OASIS 2.4.1) carrying amqp:not-found."""
    p = RawPeer(ackmq10.port)
    try:
        p.login(hostname="vhost:no-such-vhost")
        p.read(until=lambda g: p.performative("close") is not None)
        close = p.performative("close")
        assert close is not None and close.error.condition == F.NOT_FOUND
    finally:
        p.close()


def test_A1_no_amqp10_switch(tmp_path: Path) -> None:
    """--no-amqp10: the port speaks 0-9-1 only (answers a 1.0 header with 0-9-1's)."""
    b = BrokerProcess(tmp_path, "--no-amqp10", "--no-stomp")
    b.start()
    try:
        p = RawPeer(b.port)
        p.send(SASL_HEADER)
        p.read()
        assert p.got and p.got[0] == ("bad-header", b"AMQP\x00\x00\x09\x01")
        p.close()
        c = pika.BlockingConnection(pika.URLParameters(b.url))
        c.close()
    finally:
        b.stop()


# -- A2 addresses ----------------------------------------------------------------------------
def test_A2_v2_queue_address_must_exist(ackmq10: Target) -> None:
    """RabbitMQ 4 (docs/amqp, "Addresses"): /queues/:q never declares; attaching to a
    missing queue is refused with amqp:not-found."""
    conn = connect(ackmq10.port)
    try:
        with pytest.raises(proton.LinkException):
            conn.create_sender(f"/queues/{uniq('missing')}")
    finally:
        conn.close()


@pytest.mark.parametrize("form", ["v2", "v2-exchange", "v1", "v1-amq", "activemq", "bare"])
def test_A2_address_families_reach_the_queue(ackmq10: Target, form: str) -> None:
    q = uniq(f"a2-{form}")
    _declare(ackmq10, q)
    c = ackmq10.pika
    c.channel().queue_bind(q, "amq.direct", routing_key=q)
    c.close()
    address = {"v2": f"/queues/{q}", "v2-exchange": f"/exchanges/amq.direct/{q}",
               "v1": f"/queue/{q}", "v1-amq": f"/amq/queue/{q}", "activemq": f"queue://{q}",
               "bare": q}[form]
    conn = connect(ackmq10.port)
    try:
        conn.create_sender(address).send(Message(body=form))
        r = conn.create_receiver(address if form != "v2-exchange" else f"/queues/{q}")
        m = r.receive(timeout=WAIT)
        r.accept()
        assert m.body == form
    finally:
        conn.close()
        _delete(ackmq10, q)


def test_A2_topic_source_gets_its_own_queue(target: Target) -> None:
    key = uniq("a2.topic")
    conn = connect(target.port)
    try:
        r = conn.create_receiver(f"/topic/{key}", credit=5)
        conn.create_sender(f"/topic/{key}").send(Message(body="to all"))
        m = r.receive(timeout=WAIT)
        r.accept()
        assert m.body == "to all"
    finally:
        conn.close()


# -- A3 sender settlement --------------------------------------------------------------------
def test_A3_unroutable_is_released(ackmq10: Target) -> None:
    """RabbitMQ 4 (docs/amqp, "Outcomes"): a message no queue takes is `released`."""
    conn = connect(ackmq10.port)
    try:
        s = conn.create_sender(f"/exchanges/amq.direct/{uniq('nobody')}")
        with pytest.raises(SendException) as e:
            s.send(Message(body="lost"))
        assert e.value.state == Delivery.RELEASED
    finally:
        conn.close()


def test_A3_queue_refusal_is_rejected(ackmq10: Target) -> None:
    """RabbitMQ 4: a queue that refuses (x-overflow reject-publish) -> `rejected`."""
    q = uniq("a3-full")
    _declare(ackmq10, q, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    conn = connect(ackmq10.port)
    try:
        s = conn.create_sender(f"/queues/{q}")
        assert s.send(Message(body="1")).remote_state == Delivery.ACCEPTED
        with pytest.raises(SendException) as e:
            s.send(Message(body="2"))
        assert e.value.state == Delivery.REJECTED
    finally:
        conn.close()
        _delete(ackmq10, q)


def test_A3_presettled_is_at_most_once(target: Target) -> None:
    from proton.reactor import AtMostOnce
    q = uniq("a3-presettled")
    _declare(target, q)
    conn = connect(target.port)
    try:
        s = conn.create_sender(f"/amq/queue/{q}", options=AtMostOnce())
        for i in range(5):
            s.send(Message(body=str(i)))
        r = conn.create_receiver(f"/amq/queue/{q}", credit=10)
        got = []
        for _ in range(5):
            got.append(r.receive(timeout=WAIT).body)
            r.accept()
        assert got == [str(i) for i in range(5)]
    finally:
        conn.close()
        _delete(target, q)


# -- A4 receiver outcomes --------------------------------------------------------------------
def _one(target: Target, q: str, outcome: str) -> None:
    conn = connect(target.port)
    try:
        conn.create_sender(f"/amq/queue/{q}").send(Message(body="m", durable=True))
        r = conn.create_receiver(f"/amq/queue/{q}", credit=1)
        r.receive(timeout=WAIT)
        if outcome == "accept":
            r.accept()
        elif outcome == "release":
            r.release(delivered=False)
        elif outcome == "modified":
            r.release(delivered=True)
        else:
            r.reject()
        if target.kind == "ackmq":  # RabbitMQ 3.10's plugin never answers this detach
            r.close()
    finally:
        conn.close()


@pytest.mark.parametrize("outcome", ["accept", "release", "modified", "reject"])
def test_A4_outcomes_settle_as_acks(target: Target, outcome: str) -> None:
    q, dlq = uniq(f"a4-{outcome}"), uniq("a4-dlq")
    _declare(target, dlq)
    _declare(target, q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    try:
        _one(target, q, outcome)
        method, props, body = _get(target, q) if outcome in ("release", "modified") \
            else (None, None, None)
        if outcome in ("release", "modified"):
            assert method is not None and body is not None  # requeued
        else:
            c = target.pika
            left = c.channel().queue_declare(q, passive=True).method.message_count
            c.close()
            assert left == 0
        if outcome == "reject":
            method, props, body = _get(target, dlq)  # dead-lettered
            assert method is not None and props.headers["x-death"][0]["reason"] == "rejected"
    finally:
        _delete(target, q)
        _delete(target, dlq)


def test_A4_detach_requeues_what_was_held(target: Target) -> None:
    q = uniq("a4-detach")
    _declare(target, q)
    conn = connect(target.port)
    try:
        conn.create_sender(f"/amq/queue/{q}").send(Message(body="held"))
        r = conn.create_receiver(f"/amq/queue/{q}", credit=1)
        r.receive(timeout=WAIT)
        if target.kind == "ackmq":  # RabbitMQ 3.10's plugin never answers a detach here:
            r.close()  # never settled  (there, the lost connection requeues it, as D8)
    finally:
        conn.close()
    method, _p, _b = _get(target, q)
    _delete(target, q)
    assert method is not None and method.redelivered


# -- A5 credit and flow ----------------------------------------------------------------------
def _attach_receiver(p: RawPeer, source: str) -> None:
    p.send(encode_frame(1, Composite("begin", next_outgoing_id=UInt(0),
                                     incoming_window=UInt(10000), outgoing_window=UInt(10000))))
    p.send(encode_frame(1, Composite(
        "attach", name="r", handle=UInt(0), role=True, rcv_settle_mode=0,
        source=Composite("source", address=source), target=Composite("target"))))


def _flow(p: RawPeer, credit: int, delivery_count: int = 0, drain: bool = False) -> None:
    p.send(encode_frame(1, Composite(
        "flow", next_incoming_id=UInt(0), incoming_window=UInt(10000),
        next_outgoing_id=UInt(0), outgoing_window=UInt(10000), handle=UInt(0),
        delivery_count=UInt(delivery_count), link_credit=UInt(credit), drain=drain)))


def test_A5_link_credit_bounds_deliveries_and_drain(target: Target) -> None:
    q = uniq("a5-credit")
    _declare(target, q)
    c = target.pika
    ch = c.channel()
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    c.close()
    p = RawPeer(target.port)
    try:
        p.login()
        _attach_receiver(p, f"/amq/queue/{q}")
        _flow(p, 2)
        transfers = lambda g: [e for e in g if getattr(getattr(e, "performative", None),  # noqa: E731
                                                         "kind", "") == "transfer"]
        p.read(until=lambda g: len(transfers(g)) >= 2)
        p.read(timeout=1.0)  # nothing past the credit
        assert len(transfers(p.got)) == 2
        if target.kind == "rabbitmq":  # 3.10's plugin ends the session on a drain
            return  # (amqp:internal-error, function_clause in rabbit_classic_queue)
        _flow(p, 10, delivery_count=2, drain=True)
        p.read(until=lambda g: any(getattr(getattr(e, "performative", None), "drain", False)
                                   for e in g))
        assert len(transfers(p.got)) == 5  # OASIS 2.6.7: the drained flow follows them
        drained = [e.performative for e in p.got if getattr(getattr(e, "performative", None),
                                                            "kind", "") == "flow"][-1]
        assert drained.drain and drained.link_credit == 0 and drained.delivery_count == 12
    finally:
        p.close()
        _delete(target, q)


# -- A8 message mapping ------------------------------------------------------------------------
def test_A8_amqp10_to_amqp091_and_back(ackmq10: Target) -> None:
    """RabbitMQ 4's conversions (docs/conversions): properties, application-properties
    -> headers, data body byte for byte; and back for a 0-9-1 publish."""
    q = uniq("a8")
    _declare(ackmq10, q)
    conn = connect(ackmq10.port)
    try:
        m = Message(body=b"\x00bytes", inferred=True, durable=True, priority=5, id="mid-1",
                    correlation_id="cid-1", subject="kind", reply_to="/queues/replies",
                    content_type="application/octet-stream", properties={"n": 7, "s": "v"},
                    user_id=b"guest")
        conn.create_sender(f"/queues/{q}").send(m)
        method, props, body = _get(ackmq10, q)
        assert body == b"\x00bytes"
        assert (props.delivery_mode, props.priority, props.message_id, props.correlation_id,
                props.type, props.reply_to, props.content_type, props.user_id) == (
            2, 5, "mid-1", "cid-1", "kind", "/queues/replies", "application/octet-stream",
            "guest")
        assert props.headers == {"n": 7, "s": "v"}
        c = ackmq10.pika
        c.channel().basic_publish("", q, b"from 091", pika.BasicProperties(
            message_id="m2", content_type="text/plain", delivery_mode=2, app_id="app",
            headers={"k": "v", "x-custom": 3, "nested": {"t": 1}}))
        c.close()
        r = conn.create_receiver(f"/queues/{q}", credit=1)
        got = r.receive(timeout=WAIT)
        r.accept()
        assert (got.body, got.id, got.content_type, got.durable) == (b"from 091", "m2",
                                                                     "text/plain", True)
        assert got.properties == {"k": "v"}  # a table cannot be an application-property
        ann = got.annotations
        assert ann["x-custom"] == 3 and ann["x-basic-app-id"] == "app"
        assert ann["x-routing-key"] == q and ann["x-exchange"] == ""
    finally:
        conn.close()
        _delete(ackmq10, q)


def test_A8_amqp_value_round_trips_between_1_0_clients(ackmq10: Target) -> None:
    q = uniq("a8-value")
    _declare(ackmq10, q)
    conn = connect(ackmq10.port)
    try:
        s = conn.create_sender(f"/queues/{q}")
        s.send(Message(body={"a": [1, 2, "x"]}))
        s.send(Message(body="text"))
        r = conn.create_receiver(f"/queues/{q}", credit=2)
        assert r.receive(timeout=WAIT).body == {"a": [1, 2, "x"]}
        assert r.receive(timeout=WAIT).body == "text"
        r.accept()
    finally:
        conn.close()
        _delete(ackmq10, q)


def test_A8_stomp_to_amqp10(ackmq_broker: BrokerProcess, ackmq10: Target) -> None:
    import stomp
    q = uniq("a8-stomp")
    port = int(ackmq_broker.stomp_url.rsplit(":", 1)[1])
    sc = stomp.Connection([("127.0.0.1", port)])
    sc.connect("guest", "guest", wait=True)
    sc.send(f"/queue/{q}", "from stomp", headers={"persistent": "true", "color": "red"})
    sc.disconnect()
    conn = connect(ackmq10.port)
    try:
        r = conn.create_receiver(f"/queue/{q}", credit=1)
        m = r.receive(timeout=WAIT)
        r.accept()
        assert m.body == b"from stomp" and m.properties["color"] == "red" and m.durable
    finally:
        conn.close()
        _delete(ackmq10, q)


# -- A9 errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["garbage", "too-big", "unknown-descriptor", "out-of-order"])
def test_A9_bad_input_closes_with_the_condition(ackmq10: Target, case: str) -> None:
    bystander = connect(ackmq10.port)
    p = RawPeer(ackmq10.port)
    try:
        if case == "out-of-order":
            p.login(open_=False)
            p.send(AMQP_HEADER + encode_frame(0, Composite(
                "begin", next_outgoing_id=UInt(0), incoming_window=UInt(1),
                outgoing_window=UInt(1))))
            expected = F.ILLEGAL_STATE
        else:
            p.login()
            if case == "garbage":
                p.send(b"\x00\x00\x00\x0c\x02\x00\x00\x00\xc0\xff\xff\xff")
                expected = F.DECODE_ERROR
            elif case == "too-big":
                p.send(b"\x00\x10\x00\x00\x02\x00\x00\x00" + b"\x00" * 64)
                expected = F.FRAME_SIZE_TOO_SMALL
            else:
                p.send(encode_frame(0, Composite("close"))[:8].replace(b"\x00\x00\x00\x0c",
                                                                         b"\x00\x00\x00\x0d")
                       + b"\x00\x53\x99\x45\x40")
                expected = F.DECODE_ERROR
        p.read(until=lambda g: p.performative("close") is not None)
        close = p.performative("close")
        assert close is not None and close.error is not None
        assert close.error.condition == expected
        # everyone else is still served
        q = uniq("a9-bystander")
        _declare(ackmq10, q)
        bystander.create_sender(f"/queues/{q}").send(Message(body="fine"))
        _delete(ackmq10, q)
    finally:
        p.close()
        bystander.close()


def test_A9_unfinished_sasl_is_dropped(ackmq10: Target) -> None:
    """A client that never finishes SASL is dropped after the handshake timeout
    (--handshake-timeout 2 here; RabbitMQ's handshake_timeout)."""
    p = RawPeer(ackmq10.port)
    try:
        p.send(SASL_HEADER)
        p.read(timeout=8)
        assert p.closed
    finally:
        p.close()


# -- management ---------------------------------------------------------------------------------
def test_A1_connections_listed_as_amqp_1_0(ackmq10: Target) -> None:
    conn = connect(ackmq10.port)
    try:
        req = urllib.request.Request(ackmq10.http + "/api/connections")
        import base64
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        deadline = time.monotonic() + WAIT
        protocols: list[str] = []
        while time.monotonic() < deadline and "AMQP 1-0" not in protocols:
            with urllib.request.urlopen(req, timeout=WAIT) as resp:
                protocols = [c["protocol"] for c in json.load(resp)]
            time.sleep(0.2)
        assert "AMQP 1-0" in protocols
        with urllib.request.urlopen(ackmq10.http + "/metrics", timeout=WAIT) as resp:
            text = resp.read().decode()
        assert 'protocol="amqp10"' in text
    finally:
        conn.close()


# -- A6 streams ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["first", "offset", "next"])
def test_A6_stream_offset_spec_filter(ackmq10: Target, spec: str) -> None:
    """RabbitMQ 4 (docs/amqp, "Streams"): the source filter `rabbitmq:stream-offset-spec`
    (first, last, next, an offset, a timestamp) says where a stream consumer starts."""
    from proton import Described as PD
    from proton import symbol, ulong
    from proton.reactor import Filter
    q = uniq("a6-stream")
    _declare(ackmq10, q, **{"x-queue-type": "stream"})
    conn = connect(ackmq10.port)
    try:
        s = conn.create_sender(f"/queues/{q}")
        for i in range(4):
            s.send(Message(body=str(i)))
        value = {"first": "first", "offset": ulong(2), "next": "next"}[spec]
        f = Filter({symbol("rabbitmq:stream-offset-spec"):
                    PD(symbol("rabbitmq:stream-offset-spec"), value)})
        r = conn.create_receiver(f"/queues/{q}", credit=10, options=f)
        if spec == "next":
            s.send(Message(body="later"))
        first = r.receive(timeout=WAIT)
        r.accept()
        assert first.body == {"first": "0", "offset": "2", "next": "later"}[spec]
        assert first.annotations["x-stream-offset"] == {"first": 0, "offset": 2, "next": 4}[spec]
    finally:
        conn.close()
        _delete(ackmq10, q)


def test_A9_bad_outcome_in_a_disposition_ends_the_session(ackmq10: Target) -> None:
    """Found by the listener fuzzer: a disposition whose state is no outcome ends the
    session with amqp:decode-error (it names deliveries, not a link); no traceback."""
    from ackmq.protocol.amqp10.types import Described, ULong
    q = uniq("a9-disposition")
    _declare(ackmq10, q)
    c = ackmq10.pika
    c.channel().basic_publish("", q, b"x")
    c.close()
    p = RawPeer(ackmq10.port)
    try:
        p.login()
        _attach_receiver(p, f"/amq/queue/{q}")
        _flow(p, 1)
        p.read(until=lambda g: p.performative("transfer") is not None)
        p.send(encode_frame(1, Composite("disposition", role=True, first=UInt(0),
                                         settled=True, state=Described(ULong(0x80), []))))
        p.read(until=lambda g: p.performative("end") is not None)
        end = p.performative("end")
        assert end is not None and end.error.condition == F.DECODE_ERROR
        assert not p.closed  # the connection stays
    finally:
        p.close()
    method, _props, _body = _get(ackmq10, q)  # the delivery went back (D8)
    _delete(ackmq10, q)
    assert method is not None


def test_A1_anonymous_when_configured(tmp_path: Path) -> None:
    """--amqp10-anonymous-user USER offers ANONYMOUS and logs it in as USER (RabbitMQ 4's
    anonymous_login_user)."""
    b = BrokerProcess(tmp_path, "--no-stomp", "--amqp10-anonymous-user", "guest")
    b.start()
    try:
        from proton.utils import BlockingConnection
        conn = BlockingConnection(f"amqp://127.0.0.1:{b.port}", timeout=WAIT,
                                  allowed_mechs="ANONYMOUS")
        try:
            s = conn.create_sender("/queue/a1-anon")
            assert s.send(Message(body="anon")).remote_state == Delivery.ACCEPTED
        finally:
            conn.close()
    finally:
        b.stop()


def test_A4_redelivery_header_after_kept_deliveries(ackmq10: Target) -> None:
    """Messages alike but for their body, so the delivery's conversion is kept (issue
    39): a released one comes back with header.delivery-count 1, as the full
    conversion writes it (and as before the conversion was kept), the others with 0."""
    q = uniq("a4-kept-redelivery")
    _declare(ackmq10, q)
    conn = connect(ackmq10.port)
    try:
        s = conn.create_sender(f"/amq/queue/{q}")
        for i in range(3):
            s.send(Message(body=b"m%d" % i, inferred=True, durable=True,
                           content_type="text/plain"))
        r = conn.create_receiver(f"/amq/queue/{q}", credit=10)
        got = [r.receive(timeout=WAIT)]
        r.release()  # released: back to the queue, redelivered after the two in flight
        for _ in range(3):
            got.append(r.receive(timeout=WAIT))
            r.accept()
    finally:
        conn.close()
    _delete(ackmq10, q)
    assert [(bytes(m.body), m.delivery_count) for m in got] == [
        (b"m0", 0), (b"m1", 0), (b"m2", 0), (b"m0", 1)]


def test_A4_modified_counts_toward_the_delivery_limit(ackmq10: Target) -> None:
    """RabbitMQ 4: `modified` (delivery-failed) requeues and counts toward
    x-delivery-limit; past it the message is dead-lettered."""
    q, dlq = uniq("a4-limit"), uniq("a4-limit-dlq")
    _declare(ackmq10, dlq)
    _declare(ackmq10, q, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                            "x-dead-letter-routing-key": dlq})
    conn = connect(ackmq10.port)
    try:
        conn.create_sender(f"/queues/{q}").send(Message(body="m"))
        r = conn.create_receiver(f"/queues/{q}", credit=1)
        for _ in range(2):
            r.receive(timeout=WAIT)
            r.release(delivered=True)  # modified, delivery-failed
    finally:
        conn.close()
    method, props, _body = _get(ackmq10, dlq)
    _delete(ackmq10, q)
    _delete(ackmq10, dlq)
    assert method is not None and props.headers["x-death"][0]["reason"] == "delivery_limit"


def test_A8_amqp10_to_stomp(ackmq_broker: BrokerProcess, ackmq10: Target) -> None:
    from support.stomphelp import Raw
    q = uniq("a8-to-stomp")
    port = int(ackmq_broker.stomp_url.rsplit(":", 1)[1])
    s = Raw.open("127.0.0.1", port)
    try:
        s.connect()
        s.subscribe(f"/queue/{q}", "s1")
        time.sleep(0.3)
        conn = connect(ackmq10.port)
        try:
            conn.create_sender(f"/queue/{q}").send(Message(
                body=b"to stomp", inferred=True, durable=True, content_type="text/plain",
                correlation_id="c-1", properties={"color": "blue"}))
        finally:
            conn.close()
        f = s.recv(timeout=WAIT)
        assert f.command == "MESSAGE" and f.body == b"to stomp"
        h = f.headers
        assert (h["persistent"], h["content-type"], h["correlation-id"], h["color"]) == (
            "true", "text/plain", "c-1", "blue")
    finally:
        s.close()
        _delete(ackmq10, q)


def test_A5_large_messages_span_frames_both_ways(target: Target) -> None:
    """A 1 MiB message is sent and delivered in many transfer frames (`more`), each
    within the peer's max-frame-size (OASIS 2.6.14)."""
    q = uniq("a5-large")
    _declare(target, q)
    body = bytes(range(256)) * 4096
    conn = connect(target.port)
    try:
        s = conn.create_sender(f"/amq/queue/{q}")
        assert s.send(Message(body=body, inferred=True)).remote_state == Delivery.ACCEPTED
        r = conn.create_receiver(f"/amq/queue/{q}", credit=1)
        got = r.receive(timeout=WAIT)
        r.accept()
        assert bytes(got.body) == body
    finally:
        conn.close()
        _delete(target, q)


def test_A3_missing_queue_is_rejected_not_found(ackmq10: Target) -> None:
    """RabbitMQ 4: a transfer to a /queues/ node that is gone (deleted after the attach,
    or named by `to` on the anonymous terminus) is `rejected` with amqp:not-found."""
    q = uniq("a3-gone")
    _declare(ackmq10, q)
    conn = connect(ackmq10.port)
    try:
        s = conn.create_sender(f"/queues/{q}")
        _delete(ackmq10, q)
        with pytest.raises(SendException) as e:
            s.send(Message(body="nowhere"))
        assert e.value.state == Delivery.REJECTED
        anon = conn.create_sender(None)
        with pytest.raises(SendException) as e:
            anon.send(Message(body="nowhere", address=f"/queues/{uniq('never')}"))
        assert e.value.state == Delivery.REJECTED
    finally:
        conn.close()


def test_A2_refused_attach_has_a_null_terminus_then_detach(ackmq10: Target) -> None:
    """OASIS 2.6.3: a link to a node that is not there is answered with an attach whose
    terminus (here the source) is null, then a detach with the error (amqp:not-found)."""
    p = RawPeer(ackmq10.port)
    try:
        p.login()
        _attach_receiver(p, f"/queues/{uniq('nowhere')}")
        p.read(until=lambda g: p.performative("detach") is not None)
        attach, detach = p.performative("attach"), p.performative("detach")
        assert attach is not None and attach.source is None and attach.role is False
        assert detach.closed and detach.error.condition == F.NOT_FOUND
    finally:
        p.close()


def test_A4_queue_deleted_under_a_receiver_detaches_it(ackmq10: Target) -> None:
    """RabbitMQ 4: the queue deleted under a receiving link detaches the link with
    amqp:resource-deleted; the connection and its other links go on."""
    q = uniq("a4-deleted")
    _declare(ackmq10, q)
    conn = connect(ackmq10.port)
    try:
        r = conn.create_receiver(f"/queues/{q}", credit=5)
        _delete(ackmq10, q)
        with pytest.raises(proton.utils.LinkDetached) as e:
            r.receive(timeout=WAIT)
        assert e.value.condition == F.RESOURCE_DELETED
        q2 = uniq("a4-still")
        _declare(ackmq10, q2)
        conn.create_sender(f"/queues/{q2}").send(Message(body="still served"))
        _delete(ackmq10, q2)
    finally:
        conn.close()


def test_A2_dynamic_source_gets_its_own_queue(ackmq10: Target) -> None:
    """OASIS 3.5.3 (RabbitMQ 4's reply queues): a receiver asking for a dynamic source
    gets a server-named exclusive queue, its `/queues/` address in the attach."""
    conn = connect(ackmq10.port)
    try:
        r = conn.create_receiver(None, dynamic=True, credit=1)
        address = r.link.remote_source.address
        assert address.startswith("/queues/amq.gen-")
        conn.create_sender(address).send(Message(body="reply"))
        m = r.receive(timeout=WAIT)
        r.accept()
        assert m.body == "reply"
    finally:
        conn.close()
