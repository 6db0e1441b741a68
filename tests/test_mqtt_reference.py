"""ackmq's MQTT side by side with the reference brokers, for the behaviours they share
(N1-N8): RabbitMQ 3.10's MQTT plugin (127.0.0.1:1883, 3.1.1 only, guest/guest) and
Mosquitto 2.0 (127.0.0.1:1884, MQTT 5, anonymous: `mosquitto-local start`). Each test runs
the same steps on every broker that has the behaviour; where they differ, the test says
which broker does what and why ackmq follows the one it follows (docs/mqtt.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pytest
from conftest import BrokerProcess
from support.mqtthelp import MOSQUITTO, RABBITMQ_MQTT, Closed, Raw, client_id
from support.net import need

from ackmq.protocol.mqtt import (
    ConnAck,
    Disconnect,
    PubAck,
    Publish,
    PubRec,
    SubAck,
    SubOptions,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    encode,
)
from ackmq.protocol.mqtt import constants as rc


@dataclass
class Target:
    name: str
    port: int
    user: str | None  # None: anonymous (Mosquitto)
    amqp_url: str = ""

    def raw(self, level: int = 4) -> Raw:
        return Raw("127.0.0.1", self.port, level)

    def connect(self, r: Raw, cid: str, clean: bool = True) -> ConnAck:
        ack = r.connect(cid, self.user, self.user, clean=clean)
        assert isinstance(ack, ConnAck)
        return ack


@pytest.fixture(scope="module")
def ackmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("mqtt-ref"))
    b.start()
    yield b
    b.stop()


def _target(request: pytest.FixtureRequest, name: str) -> Target:
    if name == "ackmq":
        b = request.getfixturevalue("ackmq_broker")
        return Target("ackmq", b.mqtt_port, "guest", b.url)
    if name == "rabbitmq":
        need(RABBITMQ_MQTT, "RabbitMQ's MQTT plugin")
        return Target("rabbitmq", RABBITMQ_MQTT[1], "guest",
                      "amqp://guest:guest@127.0.0.1:5672/")
    need(MOSQUITTO, "Mosquitto (mosquitto-local start)")
    return Target("mosquitto", MOSQUITTO[1], None)


RABBIT = pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)


@pytest.fixture(params=["ackmq", RABBIT, "mosquitto"])
def any3(request: pytest.FixtureRequest) -> Target:
    return _target(request, request.param)


@pytest.fixture(params=["ackmq", RABBIT])
def with_amqp(request: pytest.FixtureRequest) -> Target:
    return _target(request, request.param)


@pytest.fixture(params=["ackmq", "mosquitto"])
def v5(request: pytest.FixtureRequest) -> Target:
    return _target(request, request.param)


# -- N1 ------------------------------------------------------------------------------------
def test_N1_wrong_password_is_connack_4(with_amqp: Target) -> None:
    with with_amqp.raw() as r:
        assert r.connect(client_id(), "guest", "wrong") == ConnAck(4, False)
        assert r.closed()


def test_N1_empty_client_id_with_a_persistent_session_is_connack_2(any3: Target) -> None:
    with any3.raw() as r:
        assert any3.connect(r, "", clean=False) == ConnAck(2, False)


def test_N8_unsupported_protocol_level_is_connack_1(any3: Target) -> None:
    """[MQTT-3.1.2-2]: CONNACK 1, then close; ackmq and Mosquitto do, RabbitMQ 3.10 only
    closes (the specification decides)."""
    with any3.raw() as r:
        r.sendraw(b"\x10\x0d\x00\x04MQTT\x07\x02\x00\x3c\x00\x01c")
        if any3.name == "rabbitmq":
            assert r.closed()
        else:
            assert r.recv() == ConnAck(1, False)
            assert r.closed()


def test_N8_a_first_packet_other_than_connect_closes(any3: Target) -> None:
    with any3.raw() as r:
        r.send(Subscribe(1, [("a", SubOptions(0))]))
        assert r.closed()


# -- N4 session present --------------------------------------------------------------------
def test_N4_session_present_flag(any3: Target) -> None:
    cid = client_id("sp")
    with any3.raw() as r:
        assert any3.connect(r, cid, clean=False).session_present is False
        r.send(Subscribe(1, [("sp/x", SubOptions(1))]))
        r.recv()
        r.send(Disconnect())
    with any3.raw() as r:
        assert any3.connect(r, cid, clean=False).session_present is True
        r.send(Disconnect())
    with any3.raw() as r:
        assert any3.connect(r, cid, clean=True).session_present is False
        r.send(Disconnect())


# -- N3 QoS 2 ------------------------------------------------------------------------------
def test_N3_qos2_granted_and_acknowledged(any3: Target) -> None:
    """ackmq and Mosquitto grant QoS 2 and answer PUBREC; RabbitMQ 3.10 downgrades the
    subscription to 1 and answers a QoS 2 PUBLISH with PUBACK (its documented limit)."""
    with any3.raw() as r:
        any3.connect(r, client_id())
        r.send(Subscribe(1, [("q2ref/x", SubOptions(2))]))
        granted = r.recv()
        r.send(Publish("q2ref/x", b"m", 2, False, False, 2))
        ack = r.recv()
        if isinstance(ack, Publish):  # the delivery may come first
            ack = r.recv()
        if any3.name == "rabbitmq":
            assert granted == SubAck(1, [1]) and ack == PubAck(2)
        else:
            assert granted == SubAck(1, [2]) and ack == PubRec(2)


# -- N5 retained ---------------------------------------------------------------------------
def test_N5_retained_message_on_subscribe(any3: Target) -> None:
    """All three send the retained message to an exact subscription; ackmq and Mosquitto
    to a wildcard one too (the specification's rule), RabbitMQ 3.10 does not."""
    topic = f"ref/{client_id()}/state"
    with any3.raw() as r:
        any3.connect(r, client_id())
        r.send(Publish(topic, b"on", 1, True, False, 1))
        assert r.recv() == PubAck(1)
        try:
            for sid, flt in ((2, topic), (3, topic.rsplit("/", 1)[0] + "/+")):
                r.send(Subscribe(sid, [(flt, SubOptions(1))]))
                assert r.recv() == SubAck(sid, [1])
                try:
                    p = r.recv(2)
                except TimeoutError:
                    p = None
                if sid == 3 and any3.name == "rabbitmq":
                    assert p is None
                    continue
                assert isinstance(p, Publish) and (p.topic, p.payload, p.retain) == \
                    (topic, b"on", True)
                r.send(PubAck(p.packet_id))
        finally:
            r.send(Publish(topic, b"", 1, True, False, 9))  # clear it


# -- N2 topic mapping (brokers with an AMQP side) ------------------------------------------
def test_N2_topic_mapping_onto_amq_topic(with_amqp: Target) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(with_amqp.amqp_url))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "refmap.*.temp")
    with with_amqp.raw() as r:
        with_amqp.connect(r, client_id())
        r.send(Subscribe(1, [("refmap/cmd/#", SubOptions(1))]))
        r.recv()
        r.send(Publish("refmap/kitchen/temp", b"21", 1, False, False, 2))
        assert r.recv() == PubAck(2)
        got = (None, None, None)
        for _ in range(100):
            got = ch.basic_get(q, auto_ack=True)
            if got[0] is not None:
                break
            time.sleep(0.05)
        method, props, body = got
        assert (method.routing_key, body) == ("refmap.kitchen.temp", b"21")
        assert props.delivery_mode == 2 and props.headers["x-mqtt-publish-qos"] == 1
        ch.basic_publish("amq.topic", "refmap.cmd.on", b"go")
        p = r.recv()
        assert isinstance(p, Publish) and (p.topic, p.payload) == ("refmap/cmd/on", b"go")
    conn.close()


# -- MQTT 5 reason codes (ackmq and Mosquitto) ------------------------------------------
def test_N7_v5_reason_codes_for_unsubscribe_and_no_subscribers(v5: Target) -> None:
    with v5.raw(rc.MQTT5) as r:
        v5.connect(r, client_id())
        r.send(Unsubscribe(1, ["never/subscribed"]))
        assert r.recv() == UnsubAck(1, [rc.NO_SUBSCRIPTION_EXISTED])
        r.send(Publish(f"nobody/{client_id()}", b"x", 1, False, False, 2))
        assert r.recv() == PubAck(2, rc.NO_MATCHING_SUBSCRIBERS)


@pytest.mark.parametrize(("what", "data", "code"), [
    ("PUBLISH at QoS 3", b"\x36\x05\x00\x01a\x00\x01", rc.MALFORMED_PACKET),
    ("a wildcard in a topic name", b"\x30\x06\x00\x03a/+\x00", rc.PROTOCOL_ERROR),
    ("an unset topic alias", b"\x30\x06\x00\x00\x03\x23\x00\x05", rc.PROTOCOL_ERROR),
    ("a malformed filter", b"\x82\x0d\x00\x01\x00\x00\x07bad/#/x\x00", rc.MALFORMED_PACKET),
])
def test_N8_v5_disconnect_reason_codes(v5: Target, what: str, data: bytes, code: int) -> None:
    with v5.raw(rc.MQTT5) as r:
        v5.connect(r, client_id())
        r.sendraw(data)
        try:
            d = r.recv()
        except Closed:
            pytest.fail(f"{v5.name} closed without DISCONNECT for {what}")
        assert isinstance(d, Disconnect) and d.reason_code == code, (what, d)
        assert r.closed()


def test_N2_wildcard_first_level_does_not_match_dollar_topics(any3: Target) -> None:
    """[MQTT-4.7.2-1]: `+/x` does not match `$d/x`. ackmq and Mosquitto hold to it;
    RabbitMQ 3.10 delivers it (amq.topic's `*` matches `$d`): the specification decides."""
    level = uuid_level()
    with any3.raw() as sub, any3.raw() as pub:
        any3.connect(sub, client_id())
        sub.send(Subscribe(1, [(f"+/{level}", SubOptions(1))]))
        assert isinstance(sub.recv(), SubAck)
        any3.connect(pub, client_id())
        for i, topic in enumerate((f"$d/{level}", f"d/{level}"), 1):
            pub.send(Publish(topic, b"m", 1, packet_id=i))
            assert isinstance(pub.recv(), PubAck)
        got = []
        while not got or got[-1] != f"d/{level}":  # FIFO: a `$d` one would come first
            p = sub.recv()
            if isinstance(p, Publish):
                got.append(p.topic)
        if any3.name == "rabbitmq":
            assert got == [f"$d/{level}", f"d/{level}"]
        else:
            assert got == [f"d/{level}"]


def test_N7_receive_maximum_exceeded_is_disconnect_0x93(v5: Target) -> None:
    """[MQTT-3.3.4-7]: CONNACK tells the server's Receive Maximum (ackmq 1024, Mosquitto
    20); one more QoS 2 PUBLISH without its PUBREL is DISCONNECT 0x93 on ackmq, as the
    specification says; Mosquitto 2.0 answers that one PUBREC 0x97 (quota exceeded)."""
    with v5.raw(rc.MQTT5) as r:
        ack = v5.connect(r, client_id())
        most = ack.properties["receive_maximum"]
        assert most == {"ackmq": 1024, "mosquitto": 20}[v5.name]
        r.sendraw(b"".join(encode(Publish(f"rm/{uuid_level()}", b"x", 2, packet_id=i),
                                  rc.MQTT5) for i in range(1, most + 2)))
        got = [r.recv()]
        # PUBRECs answered before the one too many came: success, or on ackmq 0x10 (the
        # topic has no subscribers), now that a PUBREC waits for one fsync, not two
        while isinstance(got[-1], PubRec) and got[-1].reason_code in (
                0, rc.NO_MATCHING_SUBSCRIBERS) and got[-1].packet_id <= most:
            got.append(r.recv())
        if v5.name == "mosquitto":
            assert got[-1] == PubRec(most + 1, rc.QUOTA_EXCEEDED)
        else:  # the PUBRECs not yet synced when the one too many came are not sent
            assert isinstance(got[-1], Disconnect), got[-1]
            assert got[-1].reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED


def uuid_level() -> str:
    return client_id("lvl")


def _publishes_within(r: Raw, wait: float) -> list[Publish]:
    got: list[Publish] = []
    try:
        while True:
            p = r.recv(wait)
            if isinstance(p, Publish):
                got.append(p)
                if p.qos == 1:
                    r.send(PubAck(p.packet_id))
    except TimeoutError:
        return got


def test_N7_no_local(v5: Target) -> None:
    """[MQTT-3.8.3-3]: a No Local subscription gets nothing its own client published."""
    topic = f"nolocal/{client_id()}"
    with v5.raw(rc.MQTT5) as r, v5.raw(rc.MQTT5) as other:
        v5.connect(r, client_id())
        v5.connect(other, client_id())
        r.send(Subscribe(1, [(topic, SubOptions(1, no_local=True))]))
        assert r.recv() == SubAck(1, [1])
        r.send(Publish(topic, b"mine", 1, False, False, 2))
        other.send(Publish(topic, b"theirs", 1, False, False, 3))
        assert other.recv() == PubAck(3)
        assert [p.payload for p in _publishes_within(r, 1.5)] == [b"theirs"]


def test_N5_retained_message_expires_and_carries_what_is_left(v5: Target) -> None:
    """[MQTT-3.3.2-5]: a retained message whose Message Expiry Interval has passed is not
    sent to a new subscriber; one that has not is sent with what is left of it
    ([MQTT-3.3.2-6])."""
    base = f"retexp/{client_id()}"
    with v5.raw(rc.MQTT5) as pub:
        v5.connect(pub, client_id())
        pub.send(Publish(base + "/short", b"s", 1, True, False, 1,
                         {"message_expiry_interval": 1}))
        pub.send(Publish(base + "/long", b"l", 1, True, False, 2,
                         {"message_expiry_interval": 60}))
        assert {pub.recv().packet_id, pub.recv().packet_id} == {1, 2}  # type: ignore[attr-defined]
    time.sleep(2.5)
    with v5.raw(rc.MQTT5) as r:
        v5.connect(r, client_id())
        r.send(Subscribe(1, [(base + "/#", SubOptions(1))]))
        assert r.recv() == SubAck(1, [1])
        got = _publishes_within(r, 1.5)
        assert [(p.topic, p.retain) for p in got] == [(base + "/long", True)]
        assert 0 < got[0].properties["message_expiry_interval"] <= 58
        r.send(Publish(base + "/long", b"", 1, True, False, 3))
