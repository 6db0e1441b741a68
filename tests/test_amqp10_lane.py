"""AMQP 1.0's fast lane (server/amqp10/transfers.py): a read's plain transfers are taken
straight from the bytes, and the first frame that is anything else, or not all there,
goes with the rest of the read through the Decoder. These cases mix the two within one
read, over a real socket (RawPeer writes the bytes as given): every transfer is
published once, in order, and answered; an error mid-read keeps what came before it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pytest
from conftest import BrokerProcess
from support.amqp10help import RawPeer, uniq

from ackmq.protocol.amqp10 import Composite, encode_frame
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.message import DATA, Message10
from ackmq.protocol.amqp10.types import UInt


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("lane"), "--no-stomp", "--no-mqtt")
    b.start()
    yield b
    b.stop()


def _declare(b: BrokerProcess, q: str) -> None:
    c = pika.BlockingConnection(pika.URLParameters(b.url))
    c.channel().queue_declare(q, durable=True)
    c.close()


def _drain(b: BrokerProcess, q: str) -> list[bytes]:
    c = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = c.channel()
    out = []
    while True:
        _, _, body = ch.basic_get(q, auto_ack=True)
        if body is None:
            break
        out.append(body)
    c.close()
    return out


def _sender(p: RawPeer, q: str, channel: int = 1) -> None:
    p.send(encode_frame(channel, Composite("begin", next_outgoing_id=UInt(0),
                                           incoming_window=UInt(10000),
                                           outgoing_window=UInt(10000)))
           + encode_frame(channel, Composite(
               "attach", name="s", handle=UInt(0), role=False, snd_settle_mode=2,
               source=Composite("source"), target=Composite("target", address=f"/queues/{q}"),
               initial_delivery_count=UInt(0))))
    p.read(until=lambda g: any(getattr(getattr(e, "performative", None), "link_credit", None)
                               for e in g))


@contextmanager
def _publisher(b: BrokerProcess, prefix: str) -> Iterator[tuple[str, RawPeer]]:
    """A durable queue and a logged-in RawPeer with a sender attached to it (channel 1)."""
    q = uniq(prefix)
    _declare(b, q)
    p = RawPeer(b.port)
    try:
        p.login()
        _sender(p, q)
        yield q, p
    finally:
        p.close()


def _transfer(did: int, body: bytes, channel: int = 1, handle: int = 0, more: bool = False,
              first: bool = True) -> bytes:
    payload = Message10(header=Composite("header", durable=True), body=[(DATA, body)]).encode()
    return encode_frame(channel, Composite(
        "transfer", handle=UInt(handle), delivery_id=UInt(did) if first else None,
        delivery_tag=bytes([did]) if first else None, message_format=UInt(0), more=more),
        payload)


def _parts(did: int, body: bytes) -> tuple[bytes, bytes]:
    """One delivery as two transfer frames (more=true, then the rest)."""
    payload = Message10(header=Composite("header", durable=True), body=[(DATA, body)]).encode()
    half = len(payload) // 2
    head = encode_frame(1, Composite("transfer", handle=UInt(0), delivery_id=UInt(did),
                                     delivery_tag=bytes([did]), message_format=UInt(0),
                                     more=True), payload[:half])
    tail = encode_frame(1, Composite("transfer", handle=UInt(0)), payload[half:])
    return head, tail


def _settled(p: RawPeer) -> set[int]:
    done: set[int] = set()
    for e in p.got:
        d = getattr(e, "performative", None)
        if d is not None and d.kind == "disposition" and d.state.descriptor == 0x24:
            done.update(range(d.first, (d.last if d.last is not None else d.first) + 1))
    return done


def test_A3_transfers_mixed_with_other_frames_and_split_reads_are_all_published(
        broker: BrokerProcess) -> None:
    """One write: two plain transfers, a flow asking for an echo, a delivery in two
    frames (more), the first bytes of another transfer; a second write: the rest and one
    more. All five published once in order and accepted; the echo answered."""
    with _publisher(broker, "lane-mix") as (q, p):
        flow = encode_frame(1, Composite(
            "flow", next_incoming_id=UInt(0), incoming_window=UInt(10000),
            next_outgoing_id=UInt(2), outgoing_window=UInt(10000), handle=UInt(0),
            delivery_count=UInt(2), link_credit=UInt(0), echo=True))
        head, tail = _parts(2, b"m2" * 300)
        t3 = _transfer(3, b"m3")
        flows_before = len([e for e in p.got if getattr(e, "performative", None) is not None
                            and e.performative.kind == "flow"])
        p.send(_transfer(0, b"m0") + _transfer(1, b"m1") + flow + head + tail + t3[:11])
        p.send(t3[11:] + _transfer(4, b"m4"))
        p.read(until=lambda g: _settled(p) >= {0, 1, 2, 3, 4})
        assert _settled(p) == {0, 1, 2, 3, 4}
        flows = [e for e in p.got if getattr(e, "performative", None) is not None
                 and e.performative.kind == "flow"]
        assert len(flows) > flows_before  # the echo
        assert _drain(broker, q) == [b"m0", b"m1", b"m2" * 300, b"m3", b"m4"]


def test_A9_transfer_on_a_channel_without_session_mid_read_closes_after_the_ones_before(
        broker: BrokerProcess) -> None:
    """A read whose third transfer names a channel with no session: the two before it
    are published, then the connection closes with amqp:not-allowed (as a transfer read
    on its own would close it); the broker serves on."""
    with _publisher(broker, "lane-nosession") as (q, p):
        p.send(_transfer(0, b"a") + _transfer(1, b"b") + _transfer(2, b"c", channel=7)
               + _transfer(3, b"d"))
        p.read(until=lambda g: p.performative("close") is not None)
        close = p.performative("close")
        assert close is not None and close.error.condition == F.NOT_ALLOWED
        assert "channel 7" in close.error.description
    assert _drain(broker, q) == [b"a", b"b"]


def test_A9_transfer_on_an_unattached_handle_mid_read_ends_that_session_only(
        broker: BrokerProcess) -> None:
    """A read: a good transfer, one on a handle never attached, a good one on a second
    session. The first is published; the first session ends with
    amqp:session:unattached-handle; the second session's transfer is published and
    accepted: the connection stays open."""
    q = uniq("lane-handle")
    _declare(broker, q)
    p = RawPeer(broker.port)
    try:
        p.login()
        _sender(p, q, channel=1)
        p.got.clear()
        _sender(p, q, channel=2)
        p.got.clear()
        p.send(_transfer(0, b"one") + _transfer(1, b"bad", handle=9)
               + _transfer(0, b"two", channel=2))
        p.read(until=lambda g: p.performative("end") is not None and 0 in _settled(p)
               and any(e.channel == 2 for e in g
                       if getattr(e, "performative", None) is not None
                       and e.performative.kind == "disposition"))
        end = p.performative("end")
        assert end is not None and end.error.condition == F.UNATTACHED_HANDLE
        assert p.performative("close") is None
    finally:
        p.close()
    assert _drain(broker, q) == [b"one", b"two"]


def test_A9_transfer_on_a_receiving_link_mid_read_closes_and_reads_no_further(
        broker: BrokerProcess) -> None:
    """A read: a good transfer, one on the handle of a link the client receives on
    (amqp:not-allowed closes the connection), another good one. The first is published;
    nothing after the error is (a closing connection only waits for the peer's close)."""
    with _publisher(broker, "lane-closing") as (q, p):
        p.send(encode_frame(1, Composite(
            "attach", name="r", handle=UInt(1), role=True, rcv_settle_mode=0,
            source=Composite("source", address=f"/queues/{q}"), target=Composite("target"))))
        p.read(until=lambda g: sum(1 for e in g if getattr(e, "performative", None)
                                   is not None and e.performative.kind == "attach") >= 2)
        p.send(_transfer(0, b"first") + _transfer(1, b"x", handle=1) + _transfer(2, b"after"))
        p.read(until=lambda g: p.performative("close") is not None)
        close = p.performative("close")
        assert close is not None and close.error.condition == F.NOT_ALLOWED
    assert _drain(broker, q) == [b"first"]
