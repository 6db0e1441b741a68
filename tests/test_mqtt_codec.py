"""The sans-IO MQTT codec (protocol/mqtt): it encodes byte for byte what paho-mqtt encodes
(paho's own packets captured off a socket, paho's property packer), decodes them back,
and meets hostile bytes with its own error carrying the specification's reason code,
never another exception (N8)."""

from __future__ import annotations

import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ackmq.protocol.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    MQTTError,
    PingReq,
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
    encode_properties,
)
from ackmq.protocol.mqtt import constants as rc
from ackmq.protocol.mqtt.codec import decode_varint, encode_varint
from ackmq.protocol.mqtt.topics import check_filter, from_amqp, matches, parse_filter, to_amqp


# -- against paho ---------------------------------------------------------------------------
class _Capture:
    """A one-connection TCP server that answers CONNECT with CONNACK and records every
    byte paho writes."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.data = bytearray()
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn, _ = self.srv.accept()
        self.conn = conn
        dec = Decoder()
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            self.data += chunk
            for p in dec.feed(chunk):
                if isinstance(p, Connect):
                    conn.sendall(encode(ConnAck(0, False), self.level))
                elif isinstance(p, Subscribe):
                    conn.sendall(encode(SubAck(p.packet_id, [o.qos for _, o in p.topics]),
                                        self.level))

    def packets(self, n: int, timeout: float = 5.0) -> list[bytes]:
        """The first n packets paho wrote, as their raw bytes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out, pos, buf = [], 0, bytes(self.data)
            while pos + 2 <= len(buf):
                got = decode_varint(buf, pos + 1)
                if got is None or got[1] + got[0] > len(buf):
                    break
                out.append(buf[pos:got[1] + got[0]])
                pos = got[1] + got[0]
            if len(out) >= n:
                return out[:n]
            time.sleep(0.02)
        raise AssertionError(f"paho wrote {len(self.data)} bytes, fewer than {n} packets")


def _paho_packets(v5: bool) -> tuple[list[bytes], int]:
    level = rc.MQTT5 if v5 else rc.MQTT311
    cap = _Capture(level)
    proto = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="codec-test", protocol=proto,
                    **({} if v5 else {"clean_session": False}))
    c.username_pw_set("vh:user", "secret")
    wprops = None
    if v5:
        wprops = Properties(PacketTypes.WILLMESSAGE)
        wprops.WillDelayInterval = 30
        wprops.ContentType = "text/plain"
    c.will_set("dead/device", b"gone", qos=1, retain=True, properties=wprops)
    cprops = None
    if v5:
        cprops = Properties(PacketTypes.CONNECT)
        cprops.SessionExpiryInterval = 3600
        cprops.ReceiveMaximum = 20
    c.connect("127.0.0.1", cap.port, keepalive=42, properties=cprops,
              **({"clean_start": False} if v5 else {}))
    c.loop_start()
    try:
        time.sleep(0.2)
        pprops = None
        if v5:
            pprops = Properties(PacketTypes.PUBLISH)
            pprops.UserProperty = [("k", "v"), ("k", "w")]
            pprops.ResponseTopic = "reply/here"
            pprops.CorrelationData = b"\x00\x01"
            pprops.MessageExpiryInterval = 60
        c.publish("a/b", b"payload", qos=1, retain=False, properties=pprops)
        time.sleep(0.1)
        c.subscribe([("s/+/t", 2), ("x/#", 0)])
        time.sleep(0.1)
        c.unsubscribe("x/#")
        time.sleep(0.1)
        c.disconnect()
        return cap.packets(5), level
    finally:
        c.loop_stop()
        cap.srv.close()


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_N8_codec_encodes_what_paho_encodes(v5: bool) -> None:
    """paho's CONNECT (will, user name, password, properties), PUBLISH, SUBSCRIBE,
    UNSUBSCRIBE and DISCONNECT: ackmq's codec decodes each and encodes the same packet
    to exactly paho's bytes."""
    raw, level = _paho_packets(v5)
    dec = Decoder()
    packets = [dec.feed(b)[0] for b in raw]
    connect, publish, subscribe, unsubscribe, disconnect = packets
    assert isinstance(connect, Connect) and connect.level == level
    assert connect.client_id == "codec-test" and connect.keep_alive == 42
    assert connect.username == "vh:user" and connect.password == b"secret"
    assert connect.clean_start is False
    assert connect.will == Will("dead/device", b"gone", 1, True, {
        "will_delay_interval": 30, "content_type": "text/plain"} if v5 else {})
    assert isinstance(publish, Publish) and (publish.topic, publish.payload, publish.qos) == \
        ("a/b", b"payload", 1)
    assert isinstance(subscribe, Subscribe)
    assert [(t, o.qos) for t, o in subscribe.topics] == [("s/+/t", 2), ("x/#", 0)]
    assert isinstance(unsubscribe, Unsubscribe) and unsubscribe.topics == ["x/#"]
    assert isinstance(disconnect, Disconnect)
    if v5:
        assert connect.properties == {"session_expiry_interval": 3600, "receive_maximum": 20}
        assert publish.properties["user_property"] == [("k", "v"), ("k", "w")]
        assert publish.properties["correlation_data"] == b"\x00\x01"
    for b, p in zip(raw, packets, strict=True):
        assert encode(p, level) == b, type(p).__name__


def test_N8_properties_encode_as_paho_packs_them() -> None:
    """Every property type (byte, two- and four-byte integers, variable byte integer,
    UTF-8 string, binary, string pair) as paho's Properties.pack() writes it."""
    p = Properties(PacketTypes.PUBLISH)
    p.PayloadFormatIndicator = 1
    p.MessageExpiryInterval = 70000
    p.ContentType = "application/json"
    p.ResponseTopic = "r/t"
    p.CorrelationData = b"\xff\x00corr"
    p.SubscriptionIdentifier = 268435455
    p.TopicAlias = 513
    p.UserProperty = [("a", "1"), ("b", "ü")]
    ours = {"payload_format_indicator": 1, "message_expiry_interval": 70000,
            "content_type": "application/json", "response_topic": "r/t",
            "correlation_data": b"\xff\x00corr", "subscription_identifier": [268435455],
            "topic_alias": 513, "user_property": [("a", "1"), ("b", "ü")]}
    packed = p.pack()
    # paho writes them in its own identifier order: compare as decoded sets and length
    assert len(encode_properties(ours)) == len(packed)
    from ackmq.protocol.mqtt.codec import _Reader
    assert _Reader(packed).properties(rc.PUBLISH) == ours
    assert _Reader(encode_properties(ours)).properties(rc.PUBLISH) == ours


def test_N8_varint_boundaries() -> None:
    for n, b in ((0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"),
                 (16384, b"\x80\x80\x01"), (268435455, b"\xff\xff\xff\x7f")):
        assert encode_varint(n) == b
        assert decode_varint(b, 0) == (n, len(b))
    with pytest.raises(ValueError):
        encode_varint(268435456)


def test_N8_every_packet_round_trips_in_every_version() -> None:
    for level in (rc.MQTT31, rc.MQTT311, rc.MQTT5):
        v5 = level == rc.MQTT5
        packets = [
            Connect("c", level, False, 10, Will("w", b"x", 2, False), "u", b"p"),
            ConnAck(0, True), Publish("t/1", b"", 2, True, True, 65535),
            PubAck(1), PubRec(2), PubRel(3), PubComp(4),
            Subscribe(5, [("a/#", SubOptions(1))]), SubAck(5, [1, 0x80]),
            Unsubscribe(6, ["a/#"]), UnsubAck(6, [0, 17] if v5 else []), PingReq(),
            Disconnect(4 if v5 else 0)]
        data = b"".join(encode(p, level) for p in packets)
        dec = Decoder(level=level)
        out = []
        for i in range(len(data)):  # one byte at a time: no packet split loses anything
            out += dec.feed(data[i:i + 1])
        assert out == packets


# -- hostile input --------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "code"), [
    (b"\x10\xff\xff\xff\xff\x01", rc.MALFORMED_PACKET),  # remaining length of 5 bytes
    (b"\x10\x80\x00", rc.MALFORMED_PACKET),  # a length in a longer form than needed
    (b"\x36\x05\x00\x01a\x00\x01", rc.MALFORMED_PACKET),  # PUBLISH QoS 3
    (b"\x38\x03\x00\x01a", rc.MALFORMED_PACKET),  # DUP at QoS 0
    (b"\x82\x06\x00\x00\x00\x01a\x00", rc.MALFORMED_PACKET),  # packet id 0
    (b"\x80\x06\x00\x01\x00\x01a\x00", rc.MALFORMED_PACKET),  # SUBSCRIBE flags not 0010
    (b"\x00\x00", rc.MALFORMED_PACKET),  # packet type 0
    (b"\x30\x04\x00\x02\xc3\x28", rc.MALFORMED_PACKET),  # topic not UTF-8
    (b"\x30\x04\x00\x02a\x00", rc.MALFORMED_PACKET),  # U+0000 in a string
    (b"\xc0\x01\x00", rc.MALFORMED_PACKET),  # PINGREQ with a body
    (b"\x10\x0a\x00\x04MQTT\x06\x02\x00\x3c", rc.UNSUPPORTED_PROTOCOL_VERSION),
    (b"\x10\x0a\x00\x04MQTX\x04\x02\x00\x3c", rc.PROTOCOL_ERROR),
    (b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01c", rc.MALFORMED_PACKET),  # reserved bit
])
def test_N8_malformed_packets_get_their_reason_code(data: bytes, code: int) -> None:
    with pytest.raises(MQTTError) as e:
        Decoder().feed(data)
    assert e.value.reason_code == code, e.value.text


def test_N8_v5_property_errors() -> None:
    dec = Decoder(level=rc.MQTT5)
    # topic alias twice in a PUBLISH: protocol error; a CONNACK-only property: malformed
    body = b"\x00\x01a" + b"\x06\x23\x00\x01\x23\x00\x02"
    with pytest.raises(MQTTError) as e:
        dec.feed(b"\x30" + bytes((len(body),)) + body)
    assert e.value.reason_code == rc.PROTOCOL_ERROR
    body = b"\x00\x01a" + b"\x02\x24\x01"
    with pytest.raises(MQTTError) as e:
        Decoder(level=rc.MQTT5).feed(b"\x30" + bytes((len(body),)) + body)
    assert e.value.reason_code == rc.MALFORMED_PACKET


def test_N8_packet_too_large_is_refused_before_its_body_arrives() -> None:
    dec = Decoder(max_packet_size=1000)
    with pytest.raises(MQTTError) as e:
        dec.feed(b"\x30" + encode_varint(10_000_000))
    assert e.value.reason_code == rc.PACKET_TOO_LARGE


def test_N8_packets_before_a_bad_one_are_kept() -> None:
    good = encode(PingReq())
    with pytest.raises(MQTTError) as e:
        Decoder().feed(good + good + b"\x00\x00")
    assert e.value.packets == [PingReq(), PingReq()]


_VALID = b"".join(encode(p, rc.MQTT5) for p in [
    Connect("c", rc.MQTT5, True, 10, Will("w", b"x", 1, True, {"will_delay_interval": 1}),
            "u", b"p", {"session_expiry_interval": 5, "user_property": [("a", "b")]}),
    Publish("t", b"body", 1, False, False, 9, {"topic_alias": 3, "content_type": "x"}),
    Subscribe(2, [("a/+", SubOptions(2, True, True, 2))], {"subscription_identifier": [7]}),
    PubRel(9, 0x92, {"reason_string": "r"}), Disconnect(0x04, {"reason_string": "bye"})])


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.sampled_from([rc.MQTT31, rc.MQTT311, rc.MQTT5]))
def test_N8_random_bytes_raise_only_the_codec_error(data: bytes, level: int) -> None:
    try:
        Decoder(level=level, max_packet_size=4096).feed(data)
    except MQTTError:
        pass


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)),
                min_size=1, max_size=6),
       st.integers(1, 64))
def test_N8_mutated_valid_packets_raise_only_the_codec_error(
        edits: list[tuple[int, int]], chunk: int) -> None:
    data = bytearray(_VALID)
    for pos, value in edits:
        data[pos] = value
    dec = Decoder(max_packet_size=4096)
    try:
        for i in range(0, len(data), chunk):
            dec.feed(bytes(data[i:i + chunk]))
    except MQTTError:
        pass


# -- topics on amq.topic (N2) ---------------------------------------------------------------
def test_N2_topic_mapping_is_rabbitmqs() -> None:
    assert to_amqp("sensors/+/temp/#") == "sensors.*.temp.#"
    assert from_amqp("sensors.kitchen.temp") == "sensors/kitchen/temp"
    assert to_amqp("a/b") == "a.b" and from_amqp("a.b") == "a/b"


def test_N2_filters() -> None:
    assert matches("a/+/c", "a/b/c") and not matches("a/+/c", "a/b/d")
    assert matches("a/#", "a") and matches("a/#", "a/b/c") and matches("#", "a/b")
    assert not matches("+/x", "$SYS/x") and not matches("#", "$SYS/x")
    assert matches("$SYS/#", "$SYS/x")
    for bad in ("a/#/b", "a/b#", "a+/b", ""):
        with pytest.raises(ValueError):
            check_filter(bad)
    f = parse_filter("$share/g1/a/+")
    assert (f.share, f.topic) == ("g1", "a/+")
    with pytest.raises(ValueError):
        parse_filter("$share/g1")
