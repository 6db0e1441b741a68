"""MQTT 3.1.1 and 5.0 on ackmq (SPEC N1-N9) with paho-mqtt (and a raw client on the codec
for what paho hides) against a real `ackmq serve`; pika on the same broker for the AMQP
side of the topic mapping. docs/mqtt.md."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from conftest import BrokerProcess
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.mqtthelp import Raw, client_id, paho, wait_for

from ackmq.ctl.socket_client import request
from ackmq.protocol.mqtt import (
    ConnAck,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    SubOptions,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
)
from ackmq.protocol.mqtt import constants as rc

V5 = rc.MQTT5


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("mqtt"))
    b.start()
    sock = b.data_dir / "ctl.sock"
    assert request(sock, "add_vhost", ["mqtt-vh"])["ok"]
    assert request(sock, "add_user", ["dev", "devpw"])["ok"]  # no permissions on mqtt-vh
    yield b
    b.stop()
    assert not [line for line in b.log if "Traceback" in line], "".join(b.log[-50:])


@pytest.fixture(scope="module")
def port(broker: BrokerProcess) -> int:
    assert broker.mqtt_port > 0
    return broker.mqtt_port


def _pika(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def _http(broker: BrokerProcess, path: str) -> Any:
    url = next(m.group(1) for line in broker.log
               if (m := re.search(r"(http://\S+:\d+)", line)))
    req = urllib.request.Request(url + path, headers={
        "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _stop(*clients: Any) -> None:
    for c in clients:
        c.disconnect()
        c.loop_stop()


# -- N1 the listener and login --------------------------------------------------------------
def test_N1_listener_is_logged_and_speaks_3_1_1_and_5(broker: BrokerProcess, port: int) -> None:
    assert any(f"mqtt://127.0.0.1:{port}" in line for line in broker.log)
    for v5 in (False, True):
        c = paho(port, v5=v5)
        assert not c.connack[0].is_failure
        _stop(c)
    with Raw("127.0.0.1", port, rc.MQTT31) as r:  # MQIsdp, level 3
        assert r.connect("c31") == ConnAck(0, False)


@pytest.mark.parametrize(("level", "code"), [(4, rc.REFUSED_BAD_USERNAME_PASSWORD),
                                             (5, rc.BAD_USER_NAME_OR_PASSWORD)])
def test_N1_wrong_password_is_refused(port: int, level: int, code: int) -> None:
    with Raw("127.0.0.1", port, level) as r:
        ack = r.connect(client_id(), "guest", "wrong")
        assert isinstance(ack, ConnAck) and ack.reason_code == code
        assert r.closed()


@pytest.mark.parametrize(("level", "code"), [(4, rc.REFUSED_NOT_AUTHORIZED),
                                             (5, rc.NOT_AUTHORIZED)])
def test_N1_no_user_name_is_refused_unless_anonymous_is_configured(port: int, level: int,
                                                                   code: int) -> None:
    with Raw("127.0.0.1", port, level) as r:
        ack = r.connect(client_id(), None, None)
        assert isinstance(ack, ConnAck) and ack.reason_code == code
        assert r.closed()


def test_N1_vhost_colon_user_names_the_vhost(broker: BrokerProcess, port: int) -> None:
    """RabbitMQ's `vhost:user`: the connection opens vhost mqtt-vh; a user without access
    to it is refused with 5 (not authorized)."""
    sock = broker.data_dir / "ctl.sock"
    assert request(sock, "set_permissions", ["guest", ".*", ".*", ".*"],
                   vhost="mqtt-vh")["ok"]
    c = paho(port, user="mqtt-vh:guest")
    assert not c.connack[0].is_failure
    assert wait_for(lambda: any(x.get("vhost") == "mqtt-vh" and
                                x.get("protocol") == "MQTT 3.1.1"
                                for x in _http(broker, "/api/connections")))
    _stop(c)
    with Raw("127.0.0.1", port) as r:
        ack = r.connect(client_id(), "mqtt-vh:dev", "devpw")  # dev has no permissions there
        assert isinstance(ack, ConnAck) and ack.reason_code == rc.REFUSED_NOT_AUTHORIZED


def test_N1_anonymous_user_when_configured(tmp_path: Any) -> None:
    b = BrokerProcess(tmp_path / "d", "--mqtt-anonymous-user", "guest")
    b.start()
    try:
        with Raw("127.0.0.1", b.mqtt_port) as r:
            assert r.connect(client_id(), None, None) == ConnAck(0, False)
    finally:
        b.stop()


def test_N1_no_mqtt_means_no_listener(tmp_path: Any) -> None:
    b = BrokerProcess(tmp_path / "d", "--no-mqtt")
    b.start()
    try:
        assert b.mqtt_port == 0 and not any("mqtt://" in line for line in b.log)
    finally:
        b.stop()


# -- N2 topics on amq.topic --------------------------------------------------------------
def test_N2_paho_and_pika_exchange_messages_through_amq_topic(broker: BrokerProcess,
                                                               port: int) -> None:
    conn = _pika(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "sensors.*.temp")
    c = paho(port)
    c.subscribe("cmd/#", 1)
    time.sleep(0.3)
    c.publish("sensors/kitchen/temp", b"21.5", qos=1).wait_for_publish(10)
    got = None
    for _ in range(100):
        got = ch.basic_get(q, auto_ack=True)
        if got[0] is not None:
            break
        time.sleep(0.05)
    method, props, body = got
    assert body == b"21.5" and method.routing_key == "sensors.kitchen.temp"
    assert props.delivery_mode == 2 and props.headers["x-mqtt-publish-qos"] == 1
    ch.basic_publish("amq.topic", "cmd.light.on", b"go",
                     pika.BasicProperties(delivery_mode=2))
    assert wait_for(lambda: c.got)
    assert (c.got[0].topic, c.got[0].payload, c.got[0].qos) == ("cmd/light/on", b"go", 1)
    _stop(c)
    conn.close()


# -- N3 QoS --------------------------------------------------------------------------------
def test_N2_wildcard_filters_do_not_match_dollar_topics(port: int) -> None:
    """[MQTT-4.7.2-1]: a filter starting with `+` or `#` does not match a topic name
    starting with `$`; a filter naming the `$` level does (Paho's test_dollar_topics)."""
    wild = paho(port)
    wild.subscribe([("#", 1), ("+/+", 1)])
    share = paho(port, v5=True)
    share.subscribe("$share/g/+/+", 1)
    dollar = paho(port)
    dollar.subscribe("$dq/+", 1)
    time.sleep(0.3)
    pub = paho(port)
    pub.publish("$dq/b", b"dollar", qos=1).wait_for_publish(10)
    pub.publish("dq/b", b"plain", qos=1).wait_for_publish(10)
    assert wait_for(lambda: any(m.payload == b"plain" for m in wild.got))
    assert wait_for(lambda: any(m.payload == b"plain" for m in share.got))
    assert wait_for(lambda: len(dollar.got) == 1)
    assert [m.payload for m in wild.got if m.topic.startswith("$")] == []  # FIFO: it
    assert [m.payload for m in share.got] == [b"plain"]  # would have come first
    assert (dollar.got[0].topic, dollar.got[0].payload) == ("$dq/b", b"dollar")
    _stop(wild, share, dollar, pub)


def test_N3_delivery_qos_is_the_lower_of_published_and_subscribed(port: int) -> None:
    sub = paho(port)
    sub.subscribe([("q/one", 1), ("q/two", 2), ("q/zero", 0)])
    time.sleep(0.3)
    pub = paho(port)
    for topic in ("q/one", "q/two", "q/zero"):
        for qos in (0, 1, 2):
            pub.publish(topic, f"{topic}:{qos}".encode(), qos=qos).wait_for_publish(10)
    assert wait_for(lambda: len(sub.got) == 9)
    seen = {m.payload.decode(): m.qos for m in sub.got}
    for topic, granted in (("q/one", 1), ("q/two", 2), ("q/zero", 0)):
        for qos in (0, 1, 2):
            assert seen[f"{topic}:{qos}"] == min(qos, granted)
    _stop(sub, pub)


def test_N3_qos2_exactly_once_for_a_resent_publish(port: int) -> None:
    """A QoS 2 PUBLISH sent again with DUP before PUBREL is not routed twice; after
    PUBREL / PUBCOMP the packet id is free for a new message."""
    sub = paho(port)
    sub.subscribe("once/#", 2)
    time.sleep(0.3)
    with Raw("127.0.0.1", port) as r:
        r.connect(client_id())
        r.send(Publish("once/a", b"first", 2, False, False, 7))
        assert r.recv() == PubRec(7)
        r.send(Publish("once/a", b"first", 2, False, True, 7))
        assert r.recv() == PubRec(7)
        r.send(PubRel(7))
        assert r.recv() == PubComp(7)
        r.send(Publish("once/a", b"second", 2, False, False, 7))
        assert r.recv() == PubRec(7)
        r.send(PubRel(7))
        assert r.recv() == PubComp(7)
    assert wait_for(lambda: len(sub.got) >= 2)
    time.sleep(0.5)
    assert [m.payload for m in sub.got] == [b"first", b"second"]
    assert all(m.qos == 2 for m in sub.got)
    _stop(sub)



def test_N3_qos2_resend_without_dup_before_pubrel_is_no_copy(port: int) -> None:
    """Until its PUBREL the id is that message's (MQTT 4.3.3): a PUBLISH sent again
    without DUP (paho-mqtt did so after a power cut, docs/mqtt.md) is PUBRECed again
    and not routed."""
    sub = paho(port)
    sub.subscribe("nodup/#", 2)
    time.sleep(0.3)
    with Raw("127.0.0.1", port) as r:
        r.connect(client_id())
        r.send(Publish("nodup/a", b"first", 2, False, False, 9))
        assert r.recv() == PubRec(9)
        r.send(Publish("nodup/a", b"first", 2, False, False, 9))
        assert r.recv() == PubRec(9)
        r.send(PubRel(9))
        assert r.recv() == PubComp(9)
    assert wait_for(lambda: len(sub.got) >= 1)
    time.sleep(0.5)
    assert [m.payload for m in sub.got] == [b"first"]
    _stop(sub)

def test_N3_qos2_delivery_to_a_subscriber_pubrec_pubrel_pubcomp(port: int) -> None:
    with Raw("127.0.0.1", port) as r:
        r.connect(client_id())
        r.send(Subscribe(1, [("two/x", SubOptions(2))]))
        assert r.recv() == SubAck(1, [2])
        pub = paho(port)
        pub.publish("two/x", b"m", qos=2).wait_for_publish(10)
        p = r.recv()
        assert isinstance(p, Publish) and p.qos == 2 and p.payload == b"m"
        r.send(PubRec(p.packet_id))
        assert r.recv() == PubRel(p.packet_id)
        r.send(PubComp(p.packet_id))
        _stop(pub)


def test_N3_unacked_qos1_delivery_comes_again_with_dup(broker: BrokerProcess,
                                                      port: int) -> None:
    cid = client_id("dup")
    with Raw("127.0.0.1", port) as r:
        r.connect(cid, clean=False)
        r.send(Subscribe(1, [("dup/t", SubOptions(1))]))
        r.recv()
        pub = paho(port)
        pub.publish("dup/t", b"x", qos=1).wait_for_publish(10)
        p = r.recv()
        assert isinstance(p, Publish) and not p.dup  # never PUBACKed
    with Raw("127.0.0.1", port) as r:
        assert r.connect(cid, clean=False) == ConnAck(0, True)
        p = r.recv()
        assert isinstance(p, Publish) and p.dup and p.payload == b"x"
        r.send(PubAck(p.packet_id))
    with Raw("127.0.0.1", port) as r:
        r.connect(cid, clean=True)
    _stop(pub)


# -- N4 sessions -------------------------------------------------------------------------
def test_N4_persistent_session_keeps_subscriptions_and_messages(broker: BrokerProcess,
                                                                port: int) -> None:
    """3.1.1 clean session 0: its queue is RabbitMQ's `mqtt-subscription-<id>qos1`, durable;
    what is published while it is away waits there; session present on return."""
    cid = client_id("keep")
    c = paho(port, cid, clean=False)
    assert c.connack[1].session_present is False
    c.subscribe("away/#", 1)
    time.sleep(0.3)
    _stop(c)
    pub = paho(port)
    for i in range(3):
        pub.publish("away/x", b"%d" % i, qos=1).wait_for_publish(10)
    conn = _pika(broker)
    ok = conn.channel().queue_declare(f"mqtt-subscription-{cid}qos1", passive=True)
    assert ok.method.message_count == 3
    conn.close()
    c = paho(port, cid, clean=False)
    assert c.connack[1].session_present is True
    assert wait_for(lambda: len(c.got) == 3)
    assert [m.payload for m in c.got] == [b"0", b"1", b"2"]
    _stop(c, pub)
    c = paho(port, cid, clean=True)  # a clean session drops it
    assert c.connack[1].session_present is False
    _stop(c)
    conn = _pika(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        conn.channel().queue_declare(f"mqtt-subscription-{cid}qos1", passive=True)
    conn.close()


def test_N4_session_takeover_disconnects_the_old_connection(port: int) -> None:
    cid = client_id("take")
    with Raw("127.0.0.1", port, V5) as old:
        old.connect(cid)
        with Raw("127.0.0.1", port, V5) as new:
            assert isinstance(new.connect(cid), ConnAck)
            d = old.recv()
            assert isinstance(d, Disconnect) and d.reason_code == rc.SESSION_TAKEN_OVER
            assert old.closed()


def test_N4_v5_session_expiry_is_the_queues_x_expires(broker: BrokerProcess,
                                                      port: int) -> None:
    cid = client_id("exp")
    c = paho(port, cid, v5=True, clean=False, session_expiry=300)
    c.subscribe("exp/t", 1)
    time.sleep(0.3)
    _stop(c)
    qs = _http(broker, "/api/queues/%2F")
    q = next(q for q in qs if q["name"] == f"mqtt-subscription-{cid}qos1")
    assert q["durable"] is True and q["arguments"]["x-expires"] == 300_000
    c = paho(port, cid, v5=True, clean=True)
    _stop(c)


# -- N5 retained --------------------------------------------------------------------------
def test_N5_retained_message_to_exact_and_wildcard_subscribers_and_cleared(port: int) -> None:
    pub = paho(port)
    pub.publish("ret/room1/temp", b"20", qos=1, retain=True).wait_for_publish(10)
    for flt in ("ret/room1/temp", "ret/+/temp", "ret/#"):
        s = paho(port)
        s.subscribe(flt, 1)
        assert wait_for(lambda s=s: s.got), flt
        m = s.got[0]
        assert (m.topic, m.payload, m.retain, m.qos) == ("ret/room1/temp", b"20", True, 1)
        _stop(s)
    pub.publish("ret/room1/temp", b"", qos=1, retain=True).wait_for_publish(10)
    s = paho(port)
    s.subscribe("ret/#", 1)
    time.sleep(0.5)
    assert s.got == []
    _stop(s, pub)


# -- N6 wills ----------------------------------------------------------------------------
def test_N6_will_is_published_when_the_connection_drops_not_on_disconnect(port: int) -> None:
    s = paho(port)
    s.subscribe("will/#", 1)
    time.sleep(0.3)
    r = Raw("127.0.0.1", port)
    r.connect(client_id(), will=Will("will/a", b"gone", 1))
    r.close()  # no DISCONNECT
    assert wait_for(lambda: s.got)
    assert (s.got[0].topic, s.got[0].payload) == ("will/a", b"gone")
    with Raw("127.0.0.1", port) as r:
        r.connect(client_id(), will=Will("will/b", b"never", 1))
        r.send(Disconnect())
    time.sleep(0.5)
    assert [m.topic for m in s.got] == ["will/a"]
    _stop(s)


def test_N6_v5_will_delay_and_reconnect_within_it_cancels_the_will(port: int) -> None:
    s = paho(port)
    s.subscribe("wd/#", 1)
    time.sleep(0.3)
    cid = client_id("wd")
    will = Will("wd/x", b"late", 1, False, {"will_delay_interval": 1})
    r = Raw("127.0.0.1", port, V5)
    r.connect(cid, will=will, properties={"session_expiry_interval": 60})
    r.close()
    time.sleep(0.3)
    assert s.got == []  # not yet
    assert wait_for(lambda: s.got, 5)
    r = Raw("127.0.0.1", port, V5)
    r.connect(cid, will=Will("wd/y", b"cancelled", 1, False, {"will_delay_interval": 2}),
              properties={"session_expiry_interval": 60}, clean=False)
    r.close()
    with Raw("127.0.0.1", port, V5) as again:  # back within the delay
        again.connect(cid, clean=False, properties={"session_expiry_interval": 0})
        time.sleep(3)
        assert [m.payload for m in s.got] == [b"late"]
        again.send(Disconnect())
    _stop(s)


# -- N7 MQTT 5 -----------------------------------------------------------------------------
def test_N7_shared_subscription_gives_each_message_to_one_member(port: int) -> None:
    a, b = paho(port, v5=True), paho(port, v5=True)
    for c in (a, b):
        c.subscribe("$share/workers/jobs/#", 1)
    time.sleep(0.3)
    pub = paho(port, v5=True)
    for i in range(20):
        pub.publish("jobs/x", b"%d" % i, qos=1).wait_for_publish(10)
    assert wait_for(lambda: len(a.got) + len(b.got) == 20)
    time.sleep(0.3)
    bodies = sorted(int(m.payload) for m in a.got + b.got)
    assert bodies == list(range(20)) and a.got and b.got
    _stop(a, b, pub)


def test_N7_user_properties_are_amqp_headers_both_ways(broker: BrokerProcess,
                                                       port: int) -> None:
    conn = _pika(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "props.#")
    sub = paho(port, v5=True)
    sub.subscribe("props/back", 1)
    time.sleep(0.3)
    pub = paho(port, v5=True)
    p = Properties(PacketTypes.PUBLISH)
    p.UserProperty = [("site", "north"), ("unit", "C")]
    p.ContentType = "text/plain"
    p.ResponseTopic = "props/back"
    p.CorrelationData = b"req-1"
    p.MessageExpiryInterval = 60
    pub.publish("props/out", b"x", qos=1, properties=p).wait_for_publish(10)
    got = None
    for _ in range(100):
        got = ch.basic_get(q, auto_ack=True)
        if got[0] is not None:
            break
        time.sleep(0.05)
    _, props, _ = got
    assert props.headers["site"] == "north" and props.headers["unit"] == "C"
    assert props.content_type == "text/plain" and props.correlation_id == "req-1"
    assert props.reply_to == "props.back" and props.expiration == "60000"
    # the reply, from AMQP: the MQTT requester sees its correlation data and headers
    ch.basic_publish("amq.topic", props.reply_to, b"pong", pika.BasicProperties(
        correlation_id=props.correlation_id, headers={"status": "ok"}))
    assert wait_for(lambda: sub.got)
    m = sub.got[0]
    assert m.payload == b"pong" and m.properties.CorrelationData == b"req-1"
    assert ("status", "ok") in m.properties.UserProperty
    _stop(sub, pub)
    conn.close()


def test_N7_topic_alias_and_subscription_identifier(port: int) -> None:
    with Raw("127.0.0.1", port, V5) as r:
        ack = r.connect(client_id())
        assert isinstance(ack, ConnAck) and ack.properties["topic_alias_maximum"] > 0
        r.send(Subscribe(1, [("alias/t", SubOptions(1))], {"subscription_identifier": [42]}))
        assert r.recv() == SubAck(1, [1])
        r.send(Publish("alias/t", b"one", 1, False, False, 2, {"topic_alias": 1}))
        r.send(Publish("", b"two", 1, False, False, 3, {"topic_alias": 1}))
        seen: list[Any] = []
        while len([p for p in seen if isinstance(p, Publish)]) < 2:
            seen.append(r.recv())
        pubs = [p for p in seen if isinstance(p, Publish)]
        assert [(p.topic, p.payload) for p in pubs] == [("alias/t", b"one"), ("alias/t", b"two")]
        assert all(p.properties["subscription_identifier"] == [42] for p in pubs)
        r.send(Publish("", b"three", 0, False, False, 0, {"topic_alias": 9}))
        d = r.recv()
        while not isinstance(d, Disconnect):
            d = r.recv()
        assert d.reason_code == rc.PROTOCOL_ERROR


def test_N7_subscription_ids_follow_subscribe_and_unsubscribe(port: int) -> None:
    """A delivery carries the ids of the subscriptions that match it now: one added or
    removed changes the next delivery's ids (the broker keeps the matching subscriptions
    per topic; each change must drop what it kept)."""
    cid = client_id()
    topic, wild = f"ids/{cid}/x", f"ids/{cid}/+"
    with Raw("127.0.0.1", port, V5) as r:
        r.connect(cid)

        def ids_of_next(payload: bytes, pid: int) -> list[int]:
            r.send(Publish(topic, payload, 1, False, False, pid))
            while not isinstance(p := r.recv(), Publish):
                pass
            r.send(PubAck(p.packet_id))
            assert p.payload == payload
            return sorted(p.properties.get("subscription_identifier", []))

        r.send(Subscribe(1, [(wild, SubOptions(1))], {"subscription_identifier": [7]}))
        assert r.recv() == SubAck(1, [1])
        assert ids_of_next(b"a", 2) == [7]
        r.send(Subscribe(3, [(topic, SubOptions(1))], {"subscription_identifier": [8]}))
        while not isinstance(r.recv(), SubAck):
            pass
        assert ids_of_next(b"b", 4) == [7, 8]
        r.send(Unsubscribe(5, [wild]))
        while not isinstance(r.recv(), UnsubAck):
            pass
        assert ids_of_next(b"c", 6) == [8]


def test_N7_reason_codes_on_unsubscribe_and_for_no_subscribers(port: int) -> None:
    with Raw("127.0.0.1", port, V5) as r:
        r.connect(client_id())
        r.send(Unsubscribe(1, ["never/subscribed"]))
        assert r.recv() == UnsubAck(1, [rc.NO_SUBSCRIPTION_EXISTED])
        r.send(Publish("nobody/listens", b"x", 1, False, False, 2))
        assert r.recv() == PubAck(2, rc.NO_MATCHING_SUBSCRIBERS)
        r.send(Subscribe(3, [("bad/#/filter", SubOptions(0))]))
        d = r.recv()  # 0x8F is for a filter "correctly formed": this one is malformed
        assert isinstance(d, Disconnect) and d.reason_code == rc.MALFORMED_PACKET


# -- N8 bad input --------------------------------------------------------------------------
def test_N7_receive_maximum_told_and_one_more_is_disconnect_0x93(port: int) -> None:
    """[MQTT-3.3.4-7]: the server's Receive Maximum is in CONNACK; a client with more QoS 1
    and 2 PUBLISHes unanswered by PUBACK / PUBCOMP gets DISCONNECT 0x93 (Paho's
    test_flow_control2, which sends one more than the CONNACK says)."""
    with Raw("127.0.0.1", port, V5) as r:
        ack = r.connect(client_id())
        assert isinstance(ack, ConnAck)
        most = ack.properties["receive_maximum"]
        assert 20 <= most <= 65535
        topic = "rm/" + client_id()
        r.sendraw(b"".join(encode(Publish(topic, b"x", 2, packet_id=i), V5)
                           for i in range(1, most + 2)))  # no PUBREL: none completes
        got = []
        while not isinstance(got[-1:] and got[-1], Disconnect):
            got.append(r.recv())
        assert got[-1].reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED, got[-1]
        # PUBRECs of those confirmed before the one too many was read, if any
        assert [p.packet_id for p in got[:-1]] == list(range(1, len(got)))
        assert all(isinstance(p, PubRec) for p in got[:-1])
        assert r.closed()


def test_N7_message_expiry_interval_is_what_is_left_of_it(port: int) -> None:
    """[MQTT-3.3.2-6]: the Message Expiry Interval a subscriber gets is the published one
    minus the time the message waited in the server (Paho's test_publication_expiry)."""
    cid = client_id()
    sub = paho(port, cid, v5=True, clean=True, session_expiry=300)
    sub.subscribe("expiry/left", 1)
    time.sleep(0.3)
    _stop(sub)
    pub = paho(port, v5=True)
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 20
    pub.publish("expiry/left", b"m", qos=1, properties=props).wait_for_publish(10)
    _stop(pub)
    time.sleep(2.5)
    sub = paho(port, cid, v5=True, clean=False, session_expiry=300)
    assert wait_for(lambda: len(sub.got) == 1)
    left = sub.got[0].properties.MessageExpiryInterval
    assert 0 < left <= 18, left
    _stop(sub)


def test_N8_malformed_packet_v5_disconnect_0x81_then_close(port: int) -> None:
    with Raw("127.0.0.1", port, V5) as r:
        r.connect(client_id())
        r.sendraw(b"\x36\x05\x00\x01a\x00\x01")  # PUBLISH QoS 3
        d = r.recv()
        assert isinstance(d, Disconnect) and d.reason_code == rc.MALFORMED_PACKET
        assert r.closed()


def test_N8_v3_malformed_packet_closes(port: int) -> None:
    with Raw("127.0.0.1", port) as r:
        r.connect(client_id())
        r.sendraw(b"\x36\x05\x00\x01a\x00\x01")
        assert r.closed()


def test_N8_wildcard_in_a_published_topic_is_a_protocol_error(port: int) -> None:
    with Raw("127.0.0.1", port, V5) as r:
        r.connect(client_id())
        r.send(Publish("a/+", b"x", 0))
        d = r.recv()
        assert isinstance(d, Disconnect) and d.reason_code == rc.PROTOCOL_ERROR


def test_N8_unsupported_protocol_level_connack_1(port: int) -> None:
    with Raw("127.0.0.1", port) as r:
        r.sendraw(b"\x10\x0d\x00\x04MQTT\x07\x02\x00\x3c\x00\x01c")
        assert r.recv() == ConnAck(rc.REFUSED_PROTOCOL_VERSION)
        assert r.closed()


def test_N8_first_packet_not_connect_closes(port: int) -> None:
    with Raw("127.0.0.1", port) as r:
        r.send(Subscribe(1, [("a", SubOptions(0))]))
        assert r.closed()


def test_N8_keep_alive_expiry_closes_and_sends_the_will(port: int) -> None:
    s = paho(port)
    s.subscribe("ka/#", 1)
    time.sleep(0.3)
    r = Raw("127.0.0.1", port, V5)
    r.connect(client_id(), keep_alive=1, will=Will("ka/dead", b"x", 1))
    d = r.recv(5)  # silent for 1.5 s
    assert isinstance(d, Disconnect) and d.reason_code == rc.KEEP_ALIVE_TIMEOUT
    assert wait_for(lambda: s.got)
    r.close()
    _stop(s)


# -- N9 visible ------------------------------------------------------------------------------
def test_N9_connections_listed_with_rabbitmqs_protocol_names(broker: BrokerProcess,
                                                             port: int) -> None:
    a, b = paho(port, "n9-v3"), paho(port, "n9-v5", v5=True)
    assert wait_for(lambda: {"MQTT 3.1.1", "MQTT 5-0"} <= {
        c.get("protocol") for c in _http(broker, "/api/connections")})
    metrics = urllib.request.urlopen(next(
        m.group(1) for line in broker.log if (m := re.search(r"(http://\S+:\d+)", line)))
        + "/metrics", timeout=10).read().decode()
    assert 'protocol="mqtt"' in metrics
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir",
                          str(broker.data_dir), "list_connections", "protocol"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "MQTT 3.1.1" in out and "MQTT 5-0" in out
    _stop(a, b)


def test_N1_mqtt_listener_from_the_config_file(tmp_path: Any) -> None:
    """RabbitMQ's key, mqtt.listeners.tcp.default; `mqtt.listeners.tcp = none` turns it off."""
    import argparse

    from ackmq.cli import _serve_args
    from ackmq.server.conffile import Option, load
    p = argparse.ArgumentParser()
    _serve_args(p)
    opts = [Option(a.dest, a.type or str, a.nargs == 0) for a in p._actions
            if a.dest not in ("help", "config")]
    conf = tmp_path / "ackmq.conf"
    conf.write_text("mqtt.listeners.tcp.default = 11883\n")
    assert load(conf, opts)["mqtt_port"] == 11883
    conf.write_text("mqtt.listeners.tcp = none\n")
    assert load(conf, opts)["no_mqtt"] is True


def test_N2_stomp_and_mqtt_exchange_messages(broker: BrokerProcess, port: int) -> None:
    """STOMP's /topic/a.b is amq.topic's a.b: an MQTT subscriber of a/b gets a STOMP SEND,
    a STOMP subscriber of /topic/stomp.* an MQTT PUBLISH."""
    import stomp
    got: list[Any] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            got.append(frame)

    conn = stomp.Connection12([("127.0.0.1", broker.stomp_port)])
    conn.set_listener("l", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/topic/stomp.*", id="s1")
    c = paho(port)
    c.subscribe("from/stomp", 1)
    time.sleep(0.3)
    conn.send("/topic/from.stomp", b"hello mqtt", headers={"persistent": "true"})
    c.publish("stomp/side", b"hello stomp", qos=1).wait_for_publish(10)
    assert wait_for(lambda: c.got and got)
    assert (c.got[0].topic, c.got[0].payload) == ("from/stomp", b"hello mqtt")
    assert got[0].body == "hello stomp" and got[0].headers["destination"] == "/topic/stomp.side"
    assert got[0].headers["x-mqtt-publish-qos"] == "1"
    conn.disconnect()
    _stop(c)


def test_N5_v5_retain_handling_1_and_2(port: int) -> None:
    """Retain handling 2: never sent on subscribe; 1: only when the subscription is new."""
    pub = paho(port)
    pub.publish("rh/t", b"kept", qos=1, retain=True).wait_for_publish(10)
    with Raw("127.0.0.1", port, V5) as r:
        r.connect(client_id())
        r.send(Subscribe(1, [("rh/#", SubOptions(1, retain_handling=2))]))
        assert r.recv() == SubAck(1, [1])
        with pytest.raises(TimeoutError):
            r.recv(1)
        r.send(Unsubscribe(2, ["rh/#"]))
        r.recv()
        r.send(Subscribe(3, [("rh/#", SubOptions(1, retain_handling=1))]))
        assert r.recv() == SubAck(3, [1])
        p = r.recv()
        assert isinstance(p, Publish) and p.retain and p.payload == b"kept"
        r.send(PubAck(p.packet_id))
        r.send(Subscribe(4, [("rh/#", SubOptions(1, retain_handling=1))]))  # not new
        assert r.recv() == SubAck(4, [1])
        with pytest.raises(TimeoutError):
            r.recv(1)
    pub.publish("rh/t", b"", qos=1, retain=True).wait_for_publish(10)
    _stop(pub)


def test_N1_topic_permissions_apply_to_publish_and_subscribe(broker: BrokerProcess,
                                                             port: int) -> None:
    """RabbitMQ's topic permissions on amq.topic, checked on the routing key (the MQTT
    topic as mapped): a refused PUBLISH is 5.0's PUBACK 0x87, a refused filter SUBACK
    0x87 (3.1.1: 0x80), and a 3.1.1 connection that publishes where it may not is closed."""
    sock = broker.data_dir / "ctl.sock"
    assert request(sock, "add_user", ["sensor", "pw"])["ok"]
    assert request(sock, "set_permissions", ["sensor", ".*", ".*", ".*"])["ok"]
    assert request(sock, "set_topic_permissions",
                   ["sensor", "amq.topic", "^sensors\\..*", "^cmd\\..*"])["ok"]
    with Raw("127.0.0.1", port, V5) as r:
        ack = r.connect(client_id(), "sensor", "pw")
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        r.send(Publish("sensors/t1", b"ok", 1, False, False, 1))
        assert r.recv().reason_code in (rc.SUCCESS, rc.NO_MATCHING_SUBSCRIBERS)
        r.send(Publish("other/t1", b"no", 1, False, False, 2))
        ack = r.recv()
        assert isinstance(ack, PubAck) and ack.reason_code == rc.NOT_AUTHORIZED
        r.send(Subscribe(3, [("cmd/#", SubOptions(1)), ("other/#", SubOptions(1))]))
        assert r.recv() == SubAck(3, [1, rc.NOT_AUTHORIZED])
    with Raw("127.0.0.1", port) as r:
        r.connect(client_id(), "sensor", "pw")
        r.send(Subscribe(1, [("other/#", SubOptions(1))]))
        assert r.recv() == SubAck(1, [0x80])
        r.send(Publish("other/t1", b"no", 1, False, False, 2))
        assert r.closed()


def test_N3_qos2_pubrel_goes_again_after_a_reconnect(port: int) -> None:
    """[MQTT-4.4.0-1]: a persistent session's QoS 2 delivery PUBRECed but not PUBCOMPed
    gets its PUBREL again when the client comes back, and the message is not sent again."""
    cid = client_id("rel")
    with Raw("127.0.0.1", port) as r:
        r.connect(cid, clean=False)
        r.send(Subscribe(1, [("rel/x", SubOptions(2))]))
        r.recv()
        pub = paho(port)
        pub.publish("rel/x", b"once", qos=2).wait_for_publish(10)
        p = r.recv()
        assert isinstance(p, Publish) and p.qos == 2
        r.send(PubRec(p.packet_id))
        assert r.recv() == PubRel(p.packet_id)  # no PUBCOMP: the connection drops
    with Raw("127.0.0.1", port) as r:
        assert r.connect(cid, clean=False) == ConnAck(0, True)
        assert r.recv() == PubRel(p.packet_id)
        r.send(PubComp(p.packet_id))
        with pytest.raises(TimeoutError):
            r.recv(1)
    with Raw("127.0.0.1", port) as r:
        r.connect(cid, clean=False)
        with pytest.raises(TimeoutError):
            r.recv(1)
        r.send(Disconnect())
    with Raw("127.0.0.1", port) as r:
        r.connect(cid, clean=True)
    _stop(pub)


# -- issue 36: the gaps ------------------------------------------------------------------
def _publishes(r: Raw, wait: float = 1.5) -> list[Publish]:
    """The PUBLISHes that come within `wait` s (each QoS 1 one PUBACKed)."""
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


def test_N7_no_local_is_applied(port: int) -> None:
    """[MQTT-3.8.3-3]: with No Local a client does not get what it published itself
    (what another client publishes it does get); another subscription of the same client
    without No Local that matches still brings it (Paho's test_subscribe_options)."""
    topic = "nolocal/" + client_id()
    with Raw("127.0.0.1", port, V5) as r, Raw("127.0.0.1", port, V5) as other:
        r.connect(client_id())
        other.connect(client_id())
        r.send(Subscribe(1, [(topic, SubOptions(1, no_local=True))]))
        assert r.recv() == SubAck(1, [1])
        r.send(Publish(topic, b"mine", 1, False, False, 2))
        other.send(Publish(topic, b"theirs", 1, False, False, 3))
        assert other.recv() == PubAck(3)
        got = _publishes(r)
        assert [p.payload for p in got] == [b"theirs"]
        r.send(Subscribe(4, [(topic.split("/")[0] + "/+", SubOptions(1))]))
        assert r.recv() == SubAck(4, [1])
        r.send(Publish(topic, b"mine again", 1, False, False, 5))
        assert [p.payload for p in _publishes(r)] == [b"mine again"]


def test_N7_retain_as_published_keeps_the_retain_flag(port: int) -> None:
    """Retain As Published: a message published with RETAIN is forwarded with it set
    ([MQTT-3.3.1-13]); without the option it is forwarded with it clear ([MQTT-3.3.1-12])."""
    topic = "rap/" + client_id()
    with Raw("127.0.0.1", port, V5) as a, Raw("127.0.0.1", port, V5) as b:
        a.connect(client_id())
        b.connect(client_id())
        a.send(Subscribe(1, [(topic, SubOptions(1, retain_as_published=True))]))
        b.send(Subscribe(1, [(topic, SubOptions(1))]))
        assert a.recv() == SubAck(1, [1]) and b.recv() == SubAck(1, [1])
        pub = paho(port)
        pub.publish(topic, b"r", qos=1, retain=True).wait_for_publish(10)
        pub.publish(topic, b"", qos=1, retain=True).wait_for_publish(10)
        _stop(pub)
        pa, pb = _publishes(a)[0], _publishes(b)[0]
        assert (pa.payload, pa.retain) == (b"r", True)
        assert (pb.payload, pb.retain) == (b"r", False)


def test_N1_topic_permission_variables_username_vhost_client_id(broker: BrokerProcess,
                                                                 port: int) -> None:
    """RabbitMQ's MQTT topic authorisation: `{username}`, `{vhost}` and `{client_id}` in a
    topic permission are the connection's, so each device may publish under its own
    client id only (the same rule for the will, published with the session's)."""
    sock = broker.data_dir / "ctl.sock"
    assert request(sock, "add_user", ["device", "pw"])["ok"]
    assert request(sock, "set_permissions", ["device", ".*", ".*", ".*"], "mqtt-vh")["ok"]
    assert request(sock, "set_topic_permissions",
                   ["device", "amq.topic", "^{vhost}\\.{username}\\.{client_id}\\.",
                    "^cmd\\.{client_id}$"], "mqtt-vh")["ok"]
    cid = client_id("dev")
    with Raw("127.0.0.1", port, V5) as r:
        ack = r.connect(cid, "mqtt-vh:device", "pw")
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        r.send(Publish(f"mqtt-vh/device/{cid}/temp", b"ok", 1, False, False, 1))
        assert r.recv().reason_code in (rc.SUCCESS, rc.NO_MATCHING_SUBSCRIBERS)
        r.send(Publish("mqtt-vh/device/someone-else/temp", b"no", 1, False, False, 2))
        p = r.recv()
        assert isinstance(p, PubAck) and p.reason_code == rc.NOT_AUTHORIZED
        r.send(Subscribe(3, [(f"cmd/{cid}", SubOptions(1)), ("cmd/other", SubOptions(1))]))
        assert r.recv() == SubAck(3, [1, rc.NOT_AUTHORIZED])


def test_N8_server_keep_alive_caps_the_clients(tmp_path: Any) -> None:
    """`--mqtt-max-keep-alive 2`: an MQTT 5 client asking 60 s (or 0, none) is told Server
    Keep Alive 2 in CONNACK and held to it ([MQTT-3.2.2-21]: silent for 1.5 × 2 s, it
    gets DISCONNECT 0x8D); one asking 1 s keeps its own and is told nothing (Paho's
    test_server_keep_alive)."""
    b = BrokerProcess(tmp_path / "d", "--mqtt-max-keep-alive", "2")
    b.start()
    try:
        for asked in (60, 0):
            with Raw("127.0.0.1", b.mqtt_port, V5) as r:
                ack = r.connect(client_id(), keep_alive=asked)
                assert isinstance(ack, ConnAck) and ack.properties["server_keep_alive"] == 2
        with Raw("127.0.0.1", b.mqtt_port, V5) as r:
            ack = r.connect(client_id(), keep_alive=60)
            d = r.recv(15)
            assert isinstance(d, Disconnect) and d.reason_code == rc.KEEP_ALIVE_TIMEOUT
        with Raw("127.0.0.1", b.mqtt_port, V5) as r:
            ack = r.connect(client_id(), keep_alive=1)
            assert isinstance(ack, ConnAck) and "server_keep_alive" not in ack.properties
    finally:
        b.stop()


def test_N7_topic_aliases_from_the_server_up_to_the_clients_maximum(port: int) -> None:
    """The client's Topic Alias Maximum (CONNECT): deliveries use aliases, the first with
    the topic name and the alias, later ones with the alias and an empty name
    ([MQTT-3.3.2-9]); no more aliases than it allows, and none without it (Paho's
    test_server_topic_alias)."""
    base = "talias/" + client_id()
    with Raw("127.0.0.1", port, V5) as r, Raw("127.0.0.1", port, V5) as plain:
        r.connect(client_id(), properties={"topic_alias_maximum": 1})
        plain.connect(client_id())
        for c in (r, plain):
            c.send(Subscribe(1, [(base + "/#", SubOptions(1))]))
            assert c.recv() == SubAck(1, [1])
        pub = paho(port)
        for t in ("a", "a", "b", "a"):
            pub.publish(f"{base}/{t}", t.encode(), qos=1).wait_for_publish(10)
        _stop(pub)
        got = [(p.topic, p.payload, p.properties.get("topic_alias")) for p in _publishes(r)]
        assert got == [(f"{base}/a", b"a", 1), ("", b"a", 1), (f"{base}/b", b"b", None),
                       ("", b"a", 1)]
        assert [(p.topic, p.properties.get("topic_alias")) for p in _publishes(plain)] == \
            [(f"{base}/{t}", None) for t in ("a", "a", "b", "a")]
