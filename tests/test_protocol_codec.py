"""Decoder framing rules, error codes (as RabbitMQ 3.10 answers them) and properties."""

from __future__ import annotations

import datetime
import inspect
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from ackmq.protocol.amqp import (
    EMPTY_PROPERTIES,
    HEARTBEAT,
    PROTOCOL_HEADER,
    BadProtocolHeader,
    ChannelFault,
    Content,
    Decoder,
    FrameError,
    Heartbeat,
    Method,
    PropertiesView,
    ProtocolHeader,
    Publish,
    constants,
    decode_properties,
    decode_table,
    encode_ack,
    encode_deliver,
    encode_method,
    encode_properties,
    encode_publish,
    encode_table,
    properties_with_headers,
)

PUB = encode_method(1, commands.Basic.Publish(exchange="", routing_key="x"))
QOS = encode_method(1, commands.Basic.Qos(0, 1))


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def header(body_size: int, props: bytes = EMPTY_PROPERTIES, class_id: int = 60,
           weight: int = 0, channel: int = 1) -> bytes:
    return raw_frame(2, channel, struct.pack(">HHQ", class_id, weight, body_size) + props)


def body(data: bytes, channel: int = 1) -> bytes:
    return raw_frame(3, channel, data)


def norm(event):
    """Comparable form of an event (pamqp method objects compare by identity)."""
    if isinstance(event, Method | Content):
        rest = (event.properties, event.body) if isinstance(event, Content) else ()
        return (type(event).__name__, event.channel, event.method.name, dict(event.method),
                *rest)
    return event


PROPS = encode_properties(commands.Basic.Properties(
    content_type="text/plain", headers={"k": "v", "n": 5}, delivery_mode=2,
    message_id="m-1", timestamp=datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)))
STREAM = b"".join([
    PROTOCOL_HEADER,
    encode_method(0, commands.Connection.StartOk(response="\0guest\0guest")),
    encode_publish(1, "amq.direct", "rk-é", True, False, PROPS, bytes(range(256)) * 40, 4096),
    encode_publish(2, "", "q", False, False, EMPTY_PROPERTIES, b"", 4096),
    HEARTBEAT,
    encode_ack(1, 2**64 - 1, True),
    encode_method(1, commands.Basic.Nack(7, False, True)),
    encode_method(3, commands.Queue.Declare(queue="q", durable=True,
                                            arguments={"x-max-length": 10})),
])


def test_stream_decodes_to_expected_events():
    events = Decoder(frame_max=4096).feed(STREAM)
    assert [type(e).__name__ for e in events] == [
        "ProtocolHeader", "Method", "Publish", "Publish", "Heartbeat", "Method", "Method",
        "Method"]
    assert events[2] == Publish(1, "amq.direct", "rk-é", True, False, PROPS,
                                bytes(range(256)) * 40)
    assert events[3] == Publish(2, "", "q", False, False, EMPTY_PROPERTIES, b"")
    assert events[5].method.delivery_tag == 2**64 - 1 and events[5].method.multiple
    assert events[7].method.arguments == {"x-max-length": 10} and events[7].method.durable


def test_split_feeds_at_every_byte_boundary_give_the_same_events():
    expected = [norm(e) for e in Decoder(frame_max=4096).feed(STREAM)]
    for cut in range(len(STREAM) + 1):
        dec = Decoder(frame_max=4096)
        got = dec.feed(STREAM[:cut]) + dec.feed(STREAM[cut:])
        assert [norm(e) for e in got] == expected, cut


def test_byte_by_byte_feed_gives_the_same_events():
    expected = [norm(e) for e in Decoder(frame_max=4096).feed(STREAM)]
    dec = Decoder(frame_max=4096)
    got = [e for i in range(len(STREAM)) for e in dec.feed(STREAM[i : i + 1])]
    assert [norm(e) for e in got] == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_random_chunkings_give_the_same_events(cuts):
    expected = [norm(e) for e in Decoder(frame_max=4096).feed(STREAM)]
    bounds = [0, *sorted(cuts), len(STREAM)]
    dec = Decoder(frame_max=4096)
    got = [e for a, b in zip(bounds, bounds[1:], strict=False) for e in dec.feed(STREAM[a:b])]
    assert [norm(e) for e in got] == expected


def test_channels_interleave_content_frames():
    data = (PUB + encode_method(2, commands.Basic.Publish(exchange="", routing_key="y"))
            + header(3, channel=2) + header(2) + body(b"ab") + body(b"xyz", channel=2))
    events = Decoder(expect_header=False).feed(data)
    assert events == [Publish(1, "", "x", False, False, EMPTY_PROPERTIES, b"ab"),
                      Publish(2, "", "y", False, False, EMPTY_PROPERTIES, b"xyz")]


def test_client_side_content_events():
    data = encode_deliver(5, "ctag", 9, True, "ex", "rk", PROPS, b"hello", 4096)
    data += encode_method(5, commands.Basic.Return(312, "NO_ROUTE", "ex", "rk"))
    data += header(0, channel=5)
    (deliver, ret) = Decoder(expect_header=False).feed(data)
    assert isinstance(deliver, Content) and isinstance(deliver.method, commands.Basic.Deliver)
    assert (deliver.method.consumer_tag, deliver.method.delivery_tag,
            deliver.method.redelivered) == ("ctag", 9, True)
    assert (deliver.properties, deliver.body) == (PROPS, b"hello")
    assert isinstance(ret.method, commands.Basic.Return) and ret.body == b""


def test_protocol_header_waits_for_eight_bytes_then_is_emitted_once():
    dec = Decoder()
    assert dec.feed(PROTOCOL_HEADER[:5]) == []
    assert dec.feed(PROTOCOL_HEADER[5:] + HEARTBEAT) == [ProtocolHeader(), Heartbeat()]


def test_bad_protocol_header_raises():
    with pytest.raises(BadProtocolHeader) as info:
        Decoder().feed(b"AMQP\x00\x00\x08\x00")
    assert info.value.received == b"AMQP\x00\x00\x08\x00"
    with pytest.raises(BadProtocolHeader):
        Decoder().feed(b"GET / HTTP/1.1\r\n")


# (case, bytes, reply code, text fragment, class id, method id). RabbitMQ 3.10's own
# answers are quoted in ackmq/protocol/amqp/decoder.py.
ERROR_CASES = [
    ("frame larger than frame_max", raw_frame(3, 1, b"x" * 5000)[:7], 501,
     "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,5000,4088}", 0, 0),
    ("bad frame end", raw_frame(1, 1, struct.pack(">HH", 20, 40), end=0), 501,
     "FRAME_ERROR - type 1, all octets = <<0,20,0,40>>: {invalid_frame_end_marker,0}", 0, 0),
    ("unknown frame type", raw_frame(9, 1, b"abc"), 501,
     'FRAME_ERROR - type 9, all octets = <<"abc">>: unknown_frame', 0, 0),
    ("heartbeat on channel 1", raw_frame(8, 1, b""), 505,
     "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0),
    ("unknown class", raw_frame(1, 1, struct.pack(">HH", 99, 10)), 540,
     "NOT_IMPLEMENTED - unknown method {99,10}", 99, 10),
    ("unknown method", raw_frame(1, 1, struct.pack(">HH", 60, 99)), 540,
     "NOT_IMPLEMENTED - unknown method {60,99}", 60, 99),
    ("truncated queue.declare", raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x05ab"),
     501, "FRAME_ERROR - cannot decode <<0,0,5,97,98>>", 50, 10),
    ("trailing bytes after basic.qos",
     raw_frame(1, 1, struct.pack(">HHIHB", 60, 10, 0, 1, 0) + b"zz"), 501,
     "FRAME_ERROR - cannot decode <<0,0,0,0,0,1,0,122,122>>", 60, 10),
    ("truncated basic.publish", raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x03ab"),
     501, "FRAME_ERROR - cannot decode", 60, 40),
    ("truncated basic.ack", raw_frame(1, 1, struct.pack(">HHI", 60, 80, 1)), 501,
     "FRAME_ERROR - cannot decode", 60, 80),
    ("header with no method", header(5), 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    ("body with no method", body(b"hello"), 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    ("method while awaiting header", PUB + QOS, 505,
     "UNEXPECTED_FRAME - expected content header for class 60, got non content header "
     "frame instead", 60, 40),
    ("body while awaiting header", PUB + body(b"x"), 505,
     "UNEXPECTED_FRAME - expected content header for class 60, got non content header "
     "frame instead", 60, 40),
    ("method while awaiting body", PUB + header(5) + QOS, 505,
     "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40),
    ("second header while awaiting body", PUB + header(5) + header(5), 505,
     "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40),
    ("body bigger than declared", PUB + header(5) + body(b"hello!"), 505,
     "UNEXPECTED_FRAME - content body exceeds declared size", 60, 40),
    ("bodies bigger than declared", PUB + header(5) + body(b"hel") + body(b"lo!"), 505,
     "UNEXPECTED_FRAME - content body exceeds declared size", 60, 40),
    ("header class mismatch", PUB + header(5, class_id=50), 505,
     "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
     60, 40),
    ("header weight non-zero", PUB + header(5, weight=1), 505,
     "UNEXPECTED_FRAME - expected content header for class 60, got non content header "
     "frame instead", 60, 40),
    ("truncated content header", PUB + raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 5)), 501,
     "FRAME_ERROR - cannot decode content header", 60, 40),
    ("bad property list", PUB + header(5, struct.pack(">H", 0x8000) + b"\x09ab"), 501,
     "FRAME_ERROR - cannot decode content header properties", 60, 40),
    ("trailing property bytes", PUB + header(5, struct.pack(">H", 0x1000) + b"\x02zz"), 501,
     "FRAME_ERROR - cannot decode content header properties", 60, 40),
    ("continuation flag word", PUB + header(5, struct.pack(">HH", 0x1001, 0) + b"\x02"), 501,
     "FRAME_ERROR - cannot decode content header properties", 60, 40),
    ("malformed headers table",
     PUB + header(5, struct.pack(">HI", 0x2000, 5) + b"\x01kZ\x00\x00"), 501,
     "FRAME_ERROR - cannot decode content header properties", 60, 40),
]


@pytest.mark.parametrize(("data", "code", "text", "class_id", "method_id"),
                         [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_frame_errors_match_rabbitmq(data, code, text, class_id, method_id):
    dec = Decoder(frame_max=4096, expect_header=False)
    with pytest.raises(FrameError) as info:
        dec.feed(data)
    err = info.value
    assert (err.reply_code, err.class_id, err.method_id) == (code, class_id, method_id)
    assert err.reply_text.startswith(text), err.reply_text
    assert err.reply_text.startswith(constants.REPLY_TEXT[code] + " - ")
    with pytest.raises(FrameError):  # dead from now on
        dec.feed(HEARTBEAT)


def test_frame_error_text_fits_a_shortstr():
    with pytest.raises(FrameError) as info:
        Decoder(expect_header=False).feed(raw_frame(9, 1, "é".encode() * 1000))
    assert len(info.value.reply_text.encode()) <= 255


def test_frame_max_is_settable_after_tune():
    data = body(b"x" * 5000, channel=1)
    dec = Decoder(frame_max=131072, expect_header=False)
    dec.frame_max = 4096
    with pytest.raises(FrameError) as info:
        dec.feed(data)
    assert info.value.reply_code == 501
    dec = Decoder(frame_max=4096, expect_header=False)
    dec.frame_max = 0  # no limit
    assert dec.feed(PUB + header(5000) + data)[0].body == b"x" * 5000


def test_oversize_message_is_a_channel_fault_and_its_body_is_skipped():
    dec = Decoder(max_message_size=10, expect_header=False)
    data = (PUB + header(11) + body(b"12345") + body(b"678901")
            + encode_ack(1, 3, False) + PUB + header(10) + body(b"1234567890"))
    events = dec.feed(data)
    assert events[0] == ChannelFault(
        1, 406, "PRECONDITION_FAILED - message size 11 is larger than configured max size 10",
        60, 40)
    assert norm(events[1]) == ("Method", 1, "Basic.Ack", {"delivery_tag": 3, "multiple": False})
    assert events[2] == Publish(1, "", "x", False, False, EMPTY_PROPERTIES, b"1234567890")
    assert len(events) == 3


def test_oversize_fault_abandoned_by_next_method():
    """After the server closes the channel over an oversize content, the client's next
    method on that channel (its channel.close-ok) abandons the skipped body."""
    dec = Decoder(max_message_size=10, expect_header=False)
    events = dec.feed(PUB + header(11) + QOS)
    assert isinstance(events[0], ChannelFault)
    assert isinstance(events[1], Method)


def test_oversize_fault_still_enforces_body_framing():
    dec = Decoder(max_message_size=10, expect_header=False)
    with pytest.raises(FrameError) as info:
        dec.feed(PUB + header(11) + body(b"x" * 12))
    assert info.value.reply_code == 505


# ------------------------------------------------------------------ properties

header_values = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=10), st.none(),
    st.floats(allow_nan=False), st.binary(max_size=5),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=2),
)
tables = st.dictionaries(st.text(min_size=1, max_size=12), header_values, max_size=5)
short_text = st.text(max_size=30)
pamqp_properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short_text,
    content_encoding=st.none() | short_text,
    headers=st.none() | st.dictionaries(st.text(min_size=1, max_size=8),
                                        st.integers(-1000, 1000) | st.text(max_size=8),
                                        max_size=4),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | short_text,
    reply_to=st.none() | short_text,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    message_id=st.none() | short_text,
    timestamp=st.none() | st.integers(0, 2**31).map(
        lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)),
    message_type=st.none() | short_text,
    user_id=st.none() | short_text,
    app_id=st.none() | short_text,
)
FIELDS = ["content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
          "reply_to", "expiration", "message_id", "timestamp", "message_type", "user_id",
          "app_id"]


def blank(value):
    return None if value == "" else value


@settings(max_examples=300, deadline=None)
@given(pamqp_properties)
def test_properties_view_matches_pamqp(props):
    raw = encode_properties(props)
    view = PropertiesView(raw)
    reference = decode_properties(raw)
    for name in FIELDS:
        assert getattr(view, name) == blank(getattr(reference, name)), name
    assert view.headers == (reference.headers or {})


def test_properties_view_declares_one_property_per_flag_field():
    """The view's fields are written out (typed) rather than generated from the flag
    table: the two must name the same fields, in wire order."""
    from ackmq.protocol.amqp.properties import FIELDS as TABLE
    # a property, or compiled (mypyc) a getset descriptor, as its attributes are too
    attributes = set(getattr(PropertiesView, "__mypyc_attrs__", ()))
    declared = [n for n, v in vars(PropertiesView).items()
                if (isinstance(v, property) or inspect.isgetsetdescriptor(v)) and n not in attributes]
    assert declared == [name for _flag, name, _kind in TABLE]


def test_properties_view_of_empty_properties():
    view = PropertiesView(EMPTY_PROPERTIES)
    assert view.headers == {} and view.delivery_mode is None and view.expiration is None
    assert "headers" not in view


@settings(max_examples=300, deadline=None)
@given(pamqp_properties, tables)
def test_properties_with_headers_merges_and_keeps_other_fields(props, extra):
    raw = encode_properties(props)
    spliced = properties_with_headers(raw, extra)
    reference, result = decode_properties(raw), decode_properties(spliced)
    for name in FIELDS:
        assert getattr(result, name) == getattr(reference, name), name
    expected = dict(reference.headers or {})
    expected.update({k: bytearray(v) if isinstance(v, bytes) else v for k, v in extra.items()})
    if expected or reference.headers is not None:
        assert result.headers == expected
    assert PropertiesView(spliced).headers == expected


def test_properties_with_headers_keeps_existing_entries_byte_for_byte():
    # 'B' (unsigned octet) is a type pamqp never writes; it must survive the splice.
    table = b"\x01a" + b"B\xff" + b"\x01b" + b"S\x00\x00\x00\x01z"
    raw = struct.pack(">HI", 0x2000 | 0x1000, len(table)) + table + b"\x02"
    spliced = properties_with_headers(raw, {"b": "new", "x-death": [{"count": 1}]})
    assert spliced.startswith(struct.pack(">H", 0x3000))
    assert b"\x01aB\xff" in spliced and spliced.endswith(b"\x02")
    assert spliced.count(b"\x01bS") == 1  # the overridden entry is replaced, not repeated
    assert PropertiesView(spliced).headers == {"a": 255, "b": "new", "x-death": [{"count": 1}]}
    assert PropertiesView(spliced).delivery_mode == 2


def test_encode_table_uses_rabbitmq_types():
    data = encode_table({"count": 1, "reason": "expired", "ok": True})
    assert data == (struct.pack(">I", len(data) - 4) + b"\x05countl" + struct.pack(">q", 1)
                    + b"\x06reasonS\x00\x00\x00\x07expired" + b"\x02okt\x01")
    assert decode_table(data) == {"count": 1, "reason": "expired", "ok": True}
