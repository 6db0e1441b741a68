"""The client's flat parser for hot frames (confirms, basic.deliver + header + body) sees
exactly what the shared Decoder sees, however the bytes are split, and answers broken
content framing with a connection-level protocol error (never a traceback)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from ackmq.client.core import Chan, Core
from ackmq.client.errors import ConnectionLost
from ackmq.client.options import Options
from ackmq.protocol.amqp import (
    Content,
    Decoder,
    Method,
    encode_ack,
    encode_deliver,
    encode_method,
    encode_nack,
)
from ackmq.protocol.amqp.client_codec import encode_basic_properties


class _Recorder:
    """A session stand-in: what the channel hands up."""

    def __init__(self, log: list) -> None:
        self.log = log

    def on_deliver(self, content: Content) -> None:
        d = content.method
        self.log.append(("deliver", content.channel, d.delivery_tag, d.redelivered,
                         d.exchange, d.routing_key, content.properties, content.body))

    def on_cancel(self, consumer_tag: str) -> None:
        self.log.append(("cancel", consumer_tag))

    def on_failed(self, error: Any) -> None:
        pass


def _core(frame_max: int, log: list) -> Core:
    core = Core(Options(), lambda: None)
    core.out.clear()
    core.frame_max = frame_max
    core._payload_max = frame_max - 8
    core.decoder.frame_max = frame_max
    session = Chan(core, 1)
    session.listener = _Recorder(log)
    session.on_confirm = lambda ack, tag, multiple: log.append(  # type: ignore[method-assign]
        ("confirm", 1, tag, multiple, ack))
    raw = Chan(core, 2)
    raw.raw_deliver = lambda tag, redelivered, body: log.append(
        ("raw", 2, tag, redelivered, body))
    raw.raw_confirm = lambda tag, multiple, ack: log.append(("confirm", 2, tag, multiple, ack))
    core.channels = {1: session, 2: raw}
    return core


def _expected(data: bytes, frame_max: int) -> list:
    """The reference: the shared Decoder's events, as the channels should see them."""
    out: list = []
    for ev in Decoder(frame_max=frame_max, expect_header=False).feed(data):
        if isinstance(ev, Content):
            d = ev.method
            if ev.channel == 1:
                out.append(("deliver", 1, d.delivery_tag, d.redelivered, d.exchange,
                            d.routing_key, ev.properties, ev.body))
            else:
                out.append(("raw", 2, d.delivery_tag, d.redelivered, ev.body))
        elif isinstance(ev, Method):
            m = ev.method
            if isinstance(m, commands.Basic.Ack | commands.Basic.Nack):
                out.append(("confirm", ev.channel, m.delivery_tag, m.multiple,
                            isinstance(m, commands.Basic.Ack)))
            elif isinstance(m, commands.Basic.Cancel) and ev.channel == 1:
                out.append(("cancel", m.consumer_tag))
    return out


props = st.builds(lambda h, mid: encode_basic_properties(headers=h, message_id=mid,
                                                         delivery_mode=2),
                  st.one_of(st.none(), st.dictionaries(st.text(max_size=8),
                                                       st.integers(-5, 5), max_size=3)),
                  st.one_of(st.none(), st.text(max_size=20)))
deliver = st.builds(lambda ch, tag, red, p, body: ("d", ch, tag, red, p, body),
                    st.sampled_from([1, 2]), st.integers(1, 2**64 - 1), st.booleans(), props,
                    st.one_of(st.binary(max_size=50), st.binary(min_size=200, max_size=700)))
confirm = st.builds(lambda ch, ack, tag, mult: ("c", ch, ack, tag, mult),
                    st.sampled_from([1, 2]), st.booleans(), st.integers(1, 2**64 - 1),
                    st.booleans())
cancel = st.just(("x",))


def _encode(items: list, frame_max: int) -> bytes:
    parts = []
    for it in items:
        if it[0] == "d":
            _, ch, tag, red, p, body = it
            parts.append(encode_deliver(ch, "ctag", tag, red, "amq.direct", "rk", p, body,
                                        frame_max))
        elif it[0] == "c":
            _, ch, ack, tag, mult = it
            parts.append(encode_ack(ch, tag, mult) if ack else encode_nack(ch, tag, mult, False))
        else:
            parts.append(encode_method(1, commands.Basic.Cancel(consumer_tag="ctag")))
    return b"".join(parts)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(deliver, confirm, cancel), max_size=12),
       st.sampled_from([128, 300, 4096, 131072]), st.lists(st.integers(1, 400), max_size=30))
def test_fast_path_sees_what_the_decoder_sees(items: list, frame_max: int,
                                               cuts: list[int]) -> None:
    data = _encode(items, frame_max)
    log: list = []
    core = _core(frame_max, log)
    pos = 0
    for cut in cuts:  # arbitrary read boundaries, then the rest
        core.feed(data[pos:pos + cut])
        pos += cut
    core.feed(data[pos:])
    assert core.error is None
    assert log == _expected(data, frame_max)


def test_split_byte_by_byte() -> None:
    p = encode_basic_properties(message_id="m1", delivery_mode=2)
    data = (encode_deliver(1, "c", 7, True, "", "q", p, b"x" * 300, 128) +
            encode_ack(2, 9, True) + encode_deliver(2, "c", 8, False, "", "q", p, b"", 128))
    log: list = []
    core = _core(128, log)
    for i in range(len(data)):
        core.feed(data[i:i + 1])
    assert log == [("deliver", 1, 7, True, "", "q", p, b"x" * 300),
                   ("confirm", 2, 9, True, True), ("raw", 2, 8, False, b"")]


def _lost_after(data: bytes) -> ConnectionLost:
    log: list = []
    core = _core(131072, log)
    core.feed(data)
    assert isinstance(core.error, ConnectionLost), log
    return core.error


def test_body_longer_than_declared_is_a_protocol_error() -> None:
    good = encode_deliver(2, "c", 1, False, "", "q", b"\x00\x00", b"abc", 131072)
    # the header says 3 bytes; send a body frame of 4
    bad = good[:-11] + b"\x03\x00\x02\x00\x00\x00\x04abcd\xce"
    err = _lost_after(bad)
    assert "exceeds declared size" in str(err)


def test_method_instead_of_body_is_a_protocol_error() -> None:
    good = encode_deliver(1, "c", 1, False, "", "q", b"\x00\x00", b"abc", 131072)
    cut = good[:-11]  # deliver + header, no body
    err = _lost_after(cut + encode_ack(1, 1, False))
    assert "expected content body" in str(err)


def test_bad_frame_end_keeps_the_decoders_answer() -> None:
    frame = bytearray(encode_ack(1, 5, False))
    frame[-1] = 0x00
    err = _lost_after(bytes(frame))
    assert err.code == 501 and "invalid_frame_end_marker" in str(err)


def test_bad_properties_for_a_session_consumer_are_a_protocol_error() -> None:
    bad_props = b"\x20\x00\x00\x00\x00\x09"  # headers flag, table length 9, nothing there
    err = _lost_after(encode_deliver(1, "c", 1, False, "", "q", bad_props, b"x", 131072))
    assert "cannot decode content header properties" in str(err)


# --- CLIENT-mode acknowledge: O(acked), not O(prefetched) --------------------------------


class _Counted:
    """A message whose state reads are counted (what ack_where's scan touches)."""

    reads = 0

    def __init__(self, tag: int, state: int) -> None:
        self.delivery_tag = tag
        self._state = state

    @property
    def state(self) -> int:
        _Counted.reads += 1
        return self._state

    @state.setter
    def state(self, value: int) -> None:
        self._state = value


def test_client_acknowledge_scans_the_delivered_not_the_prefetched() -> None:
    """A CLIENT consumer that acknowledges each message while 1,000 more sit prefetched:
    every acknowledge() must touch only what it acks (the hot path is O(1) per ack)."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from ackmq.client.message import BUFFERED, DELIVERED, SETTLED
    from ackmq.client.session import BaseSession

    written: list[bytes] = []
    unsettled: OrderedDict[int, Any] = OrderedDict(
        (t, _Counted(t, BUFFERED)) for t in range(1, 1001))
    s = SimpleNamespace(unsettled=unsettled, n_delivered=0,
                        chan=SimpleNamespace(number=1, write=written.append),
                        conn=SimpleNamespace(forget_redelivery=lambda m: None))
    for tag in range(1, 201):  # receive() then acknowledge(), one by one
        unsettled[tag].state = DELIVERED
        s.n_delivered += 1
        _Counted.reads = 0
        assert BaseSession.ack_where(s, lambda m: True) == 1  # type: ignore[arg-type]
        assert _Counted.reads <= 2, f"ack {tag} read {_Counted.reads} states"
        assert written[-1] == encode_ack(1, tag, False)
    assert len(unsettled) == 800 and s.n_delivered == 0
    # out of order (a second consumer's message delivered later): still all acked
    unsettled[203].state = DELIVERED
    unsettled[201].state = DELIVERED
    s.n_delivered += 2
    assert BaseSession.ack_where(s, lambda m: True) == 2  # type: ignore[arg-type]
    assert 201 not in unsettled and 203 not in unsettled and 202 in unsettled
    assert s.n_delivered == 0 and unsettled[202].state == BUFFERED != SETTLED
