"""N3/N4/N5 durability: PUBACK and PUBREC only after the fsync (in process, with a slowed
fdatasync), and what was acknowledged survives `kill -9` of the broker: QoS 1 messages
queued for a persistent session, the QoS 2 packet ids received (a resent PUBLISH after
the crash is not a second copy), persistent sessions' subscriptions, retained messages."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess
from support.mqtthelp import Closed, Raw, client_id, paho, wait_for
from support.slowfsync import SlowFsync

import ackmq
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
    encode,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[ackmq.EmbeddedBroker, SlowFsync]]:
    s = SlowFsync(0.15)
    monkeypatch.setattr(os, "fdatasync", s)
    with ackmq.EmbeddedBroker(data_dir=tmp_path / "d") as b:
        yield b, s


@pytest.mark.parametrize("qos", [1, 2])
def test_N3_puback_and_pubrec_come_after_the_fsync(slow: tuple[ackmq.EmbeddedBroker,
                                                               SlowFsync], qos: int) -> None:
    b, s = slow
    with Raw("127.0.0.1", b.mqtt_port) as sub:  # a persistent session: a durable queue
        sub.connect("fsync-sub", clean=False)
        sub.send(Subscribe(1, [("f/#", SubOptions(1))]))
        sub.recv()
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect(client_id())
            s.done.clear()
            sent = time.monotonic()
            # 40 at once: one turn, one group commit on the store's sync thread
            r.sendraw(b"".join(encode(Publish("f/x", b"durable", qos, False, False, pid))
                               for pid in range(1, 41)))
            ack = r.recv()
            got = time.monotonic()
            assert ack == (PubAck(1) if qos == 1 else PubRec(1))
            assert s.done and sent < s.done[0] <= got, "acknowledged before the fsync"
            assert got - sent >= 0.15
            acks = [ack] + [r.recv() for _ in range(39)]
            assert [a.packet_id for a in acks] == list(range(1, 41))



def test_N3_pubcomp_comes_after_the_release_is_durable(
        slow: tuple[ackmq.EmbeddedBroker, SlowFsync]) -> None:
    """The client may reuse a released id at once, and must resend that new message with
    DUP after a crash: had the release not reached the disk, the old id would take it
    for a duplicate and lose it (docs/mqtt.md, "QoS 2 across a power cut")."""
    b, s = slow
    with Raw("127.0.0.1", b.mqtt_port) as r:
        r.connect(client_id())
        r.send(Publish("f/y", b"once", 2, False, False, 1))
        assert r.recv() == PubRec(1)
        s.done.clear()
        sent = time.monotonic()
        r.send(PubRel(1))
        assert r.recv() == PubComp(1)
        got = time.monotonic()
        assert s.done and sent < s.done[0] <= got, "PUBCOMP before the release's fsync"

@pytest.mark.parametrize("v5", [False, True])
def test_N3_qos2_message_reaches_a_subscriber_only_after_its_fsync(
        slow: tuple[ackmq.EmbeddedBroker, SlowFsync], v5: bool) -> None:
    """A subscriber connected when QoS 2 PUBLISHes arrive gets them only once the
    group commit that writes them (and their packet ids) is fsynced: handed over
    before, a power cut would undo messages and ids, the publisher would resend them,
    and the subscriber would get them twice (docs/mqtt.md, "QoS 2 across a power cut").
    40 PUBLISHes in one write: one turn, whose commit goes to the store's sync thread
    (a lone one is synced inline, before the turn's writes leave anyway). The
    subscription is QoS 1, so paho hands a message over on its PUBLISH."""
    b, s = slow
    arrived: list[float] = []
    sub = paho(b.mqtt_port, client_id("hold-sub"), v5=v5, clean=False,
               session_expiry=60)
    try:
        sub.on_message = lambda client, userdata, msg: arrived.append(time.monotonic())
        subscribed = threading.Event()
        sub.on_subscribe = lambda *a: subscribed.set()
        sub.subscribe("hold/#", 1)
        assert subscribed.wait(10)
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect(client_id("hold-pub"))
            time.sleep(0.5)  # the subscription's own commits are over
            s.done.clear()
            sent = time.monotonic()
            r.sendraw(b"".join(encode(Publish("hold/x", b"once", 2, False, False, pid))
                               for pid in range(1, 41)))
            assert wait_for(lambda: arrived, 10), "not delivered"
            done = list(s.done)
            assert done and sent < done[0] <= arrived[0], \
                f"delivered {arrived[0] - sent:.3f} s after the PUBLISH, before its fsync"
            assert [r.recv().packet_id for _ in range(40)] == list(range(1, 41))  # PUBRECs
            assert wait_for(lambda: len(arrived) >= 40, 10)
            time.sleep(0.3)
            assert len(arrived) == 40
    finally:
        sub.disconnect()
        sub.loop_stop()


def _drain(port: int, cid: str, level: int = 4) -> list[bytes]:
    """Everything queued for the persistent session `cid`, each PUBACKed."""
    bodies = []
    with Raw("127.0.0.1", port, level) as r:
        ack = r.connect(cid, clean=False)
        assert isinstance(ack, ConnAck) and ack.session_present, ack
        while True:
            try:
                p = r.recv(2.0)
            except TimeoutError:
                return bodies
            if isinstance(p, Publish):
                bodies.append(p.payload)
                if p.qos == 1:
                    r.send(PubAck(p.packet_id))
                elif p.qos == 2:
                    r.send(PubRec(p.packet_id))


def _publisher(port: int, name: str, acked: list[bytes], stop: threading.Event) -> None:
    try:
        with Raw("127.0.0.1", port) as r:
            r.connect(client_id(name))
            n = 0
            while not stop.is_set():
                body = f"{name}-{n}".encode()
                pid = n % 65535 + 1
                r.send(Publish("crash/t", body, 1, False, False, pid))
                assert r.recv() == PubAck(pid)
                acked.append(body)
                n += 1
    except (Closed, OSError, TimeoutError):  # the kill
        return


def test_N3_N4_pubacked_qos1_messages_survive_kill_9(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        sub = "crash-sub"
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect(sub, clean=False)
            r.send(Subscribe(1, [("crash/#", SubOptions(1))]))
            r.recv()
            r.send(Disconnect())
        acked: list[list[bytes]] = [[], [], []]
        stop = threading.Event()
        threads = [threading.Thread(target=_publisher, args=(b.mqtt_port, f"p{i}", acked[i],
                                                             stop)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        b.kill()
        stop.set()
        for t in threads:
            t.join(10)
        confirmed = [m for a in acked for m in a]
        assert len(confirmed) > 20, "too few PUBACKs before the kill to say anything"
        b.start()
        got = _drain(b.mqtt_port, sub)
        missing = set(confirmed) - set(got)
        assert not missing, f"{len(missing)} PUBACKed messages lost, e.g. {sorted(missing)[:5]}"
        assert len(got) == len(set(got)), "a message came twice"
    finally:
        b.stop()


def test_N3_qos2_state_survives_kill_9_no_second_copy(tmp_path: Path) -> None:
    """PUBLISH QoS 2 id 9 -> PUBREC; kill -9; the client, reconnecting, sends the PUBLISH
    again with DUP (it never got PUBCOMP): PUBREC, no second copy; PUBREL -> PUBCOMP."""
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect("q2-sub", clean=False)
            r.send(Subscribe(1, [("q2/#", SubOptions(2))]))
            r.recv()
            r.send(Disconnect())
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect("q2-pub", clean=False)
            r.send(Publish("q2/t", b"exactly-once", 2, False, False, 9))
            assert r.recv() == PubRec(9)
            b.kill()
        b.start()
        with Raw("127.0.0.1", b.mqtt_port) as r:
            assert r.connect("q2-pub", clean=False) == ConnAck(0, False)
            r.send(Publish("q2/t", b"exactly-once", 2, False, True, 9))
            assert r.recv() == PubRec(9)
            r.send(PubRel(9))
            assert r.recv() == PubComp(9)
        assert _drain(b.mqtt_port, "q2-sub") == [b"exactly-once"]
    finally:
        b.stop()


def test_N4_N5_sessions_and_retained_messages_survive_kill_9(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect("kept", clean=False)
            r.send(Subscribe(1, [("k/+/v", SubOptions(1))]))
            r.recv()
            r.send(Disconnect())
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect(client_id())
            r.send(Publish("k/a/v", b"queued", 1, False, False, 1))
            assert r.recv() == PubAck(1)
            r.send(Publish("state/lamp", b"on", 1, True, False, 2))
            assert r.recv() == PubAck(2)
        b.kill()
        b.start()
        with Raw("127.0.0.1", b.mqtt_port) as r:  # the subscription is still there
            r.connect(client_id())
            r.send(Publish("k/b/v", b"after", 1, False, False, 1))
            assert r.recv() == PubAck(1)
        assert _drain(b.mqtt_port, "kept") == [b"queued", b"after"]
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect(client_id())
            r.send(Subscribe(1, [("state/#", SubOptions(1))]))
            r.recv()
            p = r.recv()
            assert isinstance(p, Publish) and (p.topic, p.payload, p.retain) == \
                ("state/lamp", b"on", True)
    finally:
        b.stop()


def test_N3_qos2_pubrel_owed_survives_kill_9(tmp_path: Path) -> None:
    """A QoS 2 delivery the client PUBRECed: after a kill -9 the PUBREL comes again (the
    client, e.g. paho, hands the message to its application only then), no second copy."""
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        with Raw("127.0.0.1", b.mqtt_port) as r:
            r.connect("rel-sub", clean=False)
            r.send(Subscribe(1, [("rel/#", SubOptions(2))]))
            r.recv()
            with Raw("127.0.0.1", b.mqtt_port) as pub:
                pub.connect(client_id())
                pub.send(Publish("rel/a", b"m", 2, False, False, 1))
                assert pub.recv() == PubRec(1)
                pub.send(PubRel(1))
                assert pub.recv() == PubComp(1)
            p = r.recv()
            assert isinstance(p, Publish) and p.qos == 2
            r.send(PubRec(p.packet_id))
            assert r.recv() == PubRel(p.packet_id)
            b.kill()
        b.start()
        with Raw("127.0.0.1", b.mqtt_port) as r:
            assert r.connect("rel-sub", clean=False) == ConnAck(0, True)
            assert r.recv() == PubRel(p.packet_id)
            r.send(PubComp(p.packet_id))
            with pytest.raises(TimeoutError):
                r.recv(2)
    finally:
        b.stop()


def test_N4_N7_subscription_options_and_ids_survive_a_restart(tmp_path: Path) -> None:
    """A persistent MQTT 5 session's subscriptions come back after a restart with their
    options (No Local, Retain As Published, Retain Handling) and subscription identifier,
    kept in their bindings' `x-mqtt-subscription-opts` as RabbitMQ 3.13 keeps them."""
    b = BrokerProcess(tmp_path / "d")
    b.start()
    expiry = {"session_expiry_interval": 600}
    try:
        with Raw("127.0.0.1", b.mqtt_port, 5) as r:
            r.connect("opts", clean=False, properties=dict(expiry))
            r.send(Subscribe(1, [("o/t", SubOptions(1, no_local=True, retain_as_published=True,
                                                     retain_handling=2))],
                             {"subscription_identifier": [77]}))
            assert r.recv() == SubAck(1, [1])
            r.send(Disconnect())
        b.kill()
        b.start()
        with Raw("127.0.0.1", b.mqtt_port, 5) as r, Raw("127.0.0.1", b.mqtt_port, 5) as o:
            ack = r.connect("opts", clean=False, properties=dict(expiry))
            assert isinstance(ack, ConnAck) and ack.session_present
            o.connect(client_id())
            r.send(Publish("o/t", b"mine", 1, False, False, 1))  # No Local: not back to r
            o.send(Publish("o/t", b"theirs", 1, True, False, 2))  # retained: RAP keeps it
            assert o.recv() == PubAck(2)
            got = []
            while len(got) < 1:
                p = r.recv()
                if isinstance(p, Publish):
                    got.append(p)
                    r.send(PubAck(p.packet_id))
            with pytest.raises(TimeoutError):
                while True:
                    p = r.recv(1.5)
                    assert not isinstance(p, Publish), p
            assert (got[0].payload, got[0].retain) == (b"theirs", True)
            assert got[0].properties["subscription_identifier"] == [77]
            # retain handling 2 came back too: subscribing again sends no retained message
            r.send(Subscribe(3, [("o/t", SubOptions(1, no_local=True, retain_as_published=True,
                                                     retain_handling=2))]))
            assert r.recv() == SubAck(3, [1])
            with pytest.raises(TimeoutError):
                r.recv(1.5)
            o.send(Publish("o/t", b"", 1, True, False, 3))
    finally:
        b.stop()


def test_N4_session_expiry_changed_by_connect_and_disconnect_is_the_queues(
        tmp_path: Path) -> None:
    """[MQTT-3.1.2-11] / 3.14.2.2.2: a later CONNECT, or a DISCONNECT, sets another
    Session Expiry Interval; the session's queues' x-expires follow it and keep it across
    a restart (Paho's test_session_expiry). A DISCONNECT that sets one where CONNECT had 0
    is a protocol error, 0x82 ([MQTT-3.14.2-2])."""
    import json
    import urllib.request
    from base64 import b64encode
    b = BrokerProcess(tmp_path / "d")
    b.start()

    def x_expires() -> object:
        import re
        url = next(m.group(1) for line in reversed(b.log)  # this run's port
                   if (m := re.search(r"(http://\S+:\d+)", line)))
        req = urllib.request.Request(url + "/api/queues/%2F/mqtt-subscription-seqos1", headers={
            "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())["arguments"].get("x-expires")

    try:
        with Raw("127.0.0.1", b.mqtt_port, 5) as r:
            r.connect("se", clean=True, properties={"session_expiry_interval": 300})
            r.send(Subscribe(1, [("se/t", SubOptions(1))]))
            r.recv()
            assert x_expires() == 300_000
            r.send(Disconnect(0, {"session_expiry_interval": 60}))
            assert r.closed()
        assert x_expires() == 60_000
        with Raw("127.0.0.1", b.mqtt_port, 5) as r:
            r.connect("se", clean=False, properties={"session_expiry_interval": 120})
            assert x_expires() == 120_000
            r.send(Disconnect())
        b.stop()
        b.start()
        assert x_expires() == 120_000
        with Raw("127.0.0.1", b.mqtt_port, 5) as r:
            r.connect(client_id(), properties={"session_expiry_interval": 0})
            r.send(Disconnect(0, {"session_expiry_interval": 30}))
            d = r.recv()
            assert isinstance(d, Disconnect) and d.reason_code == 0x82
    finally:
        b.stop()
