"""The hand-written fast paths produce and accept exactly pamqp's bytes."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from ackmq.protocol.amqp import (
    Content,
    Decoder,
    Method,
    Publish,
    decode_properties,
    encode_ack,
    encode_deliver,
    encode_get_ok,
    encode_method,
    encode_nack,
    encode_properties,
    encode_publish,
    encode_reject,
    encode_return,
    properties_with_headers,
)

channels = st.integers(0, 65535)
short_text = st.text(max_size=60)  # <= 240 utf-8 bytes: always a valid shortstr
# pamqp validates exchange names against this alphabet; the codec does not care.
exchange_names = st.text(alphabet="abcXYZ0189-_.:@#,/+ ", max_size=127)
pamqp_tags = st.integers(0, 2**63 - 1)  # pamqp encodes longlong as signed
frame_maxes = st.one_of(st.just(0), st.integers(9, 600), st.just(131072))
bodies = st.binary(max_size=3000)
header_values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=20),
    st.none(),
    st.lists(st.integers(-100, 100), max_size=3),
)
headers = st.dictionaries(st.text(min_size=1, max_size=20), header_values, max_size=4)
# pamqp reads timestamps above 2**32 as milliseconds, so stay below for comparisons.
timestamps = st.integers(0, 2**31).map(
    lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)
)
pamqp_properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short_text,
    content_encoding=st.none() | short_text,
    headers=st.none() | headers,
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | short_text,
    reply_to=st.none() | short_text,
    expiration=st.none() | st.integers(0, 10**9).map(str),
    message_id=st.none() | short_text,
    timestamp=st.none() | timestamps,
    message_type=st.none() | short_text,
    user_id=st.none() | short_text,
    app_id=st.none() | short_text,
)


def pamqp_content(
    channel: int,
    method: commands.base.Frame,
    props: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> bytes:
    """Reference encoding: pamqp method + header + body frames of at most frame_max - 8."""
    parts = [
        frame.marshal(method, channel),
        frame.marshal(ContentHeader(0, len(body), props), channel),
    ]
    chunk = frame_max - 8 if frame_max else max(len(body), 1)
    for offset in range(0, len(body), chunk):
        parts.append(frame.marshal(ContentBody(body[offset : offset + chunk]), channel))
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(channels, short_text, pamqp_tags, st.booleans(), exchange_names, short_text,
       pamqp_properties, bodies, frame_maxes)
def test_encode_deliver_equals_pamqp(channel, ctag, tag, redelivered, exchange, rkey,
                                     props, body, frame_max):
    method = commands.Basic.Deliver(ctag, tag, redelivered, exchange, rkey)
    raw = encode_properties(props)
    expected = pamqp_content(channel, method, props, body, frame_max)
    got = encode_deliver(channel, ctag, tag, redelivered, exchange, rkey, raw, body, frame_max)
    assert got == expected
    # str or pre-encoded bytes give the same frames
    assert got == encode_deliver(channel, ctag.encode(), tag, redelivered, exchange.encode(),
                                 rkey.encode(), raw, body, frame_max)


@settings(max_examples=200, deadline=None)
@given(channels, pamqp_tags, st.booleans(), exchange_names, short_text,
       st.integers(0, 2**32 - 1), pamqp_properties, bodies, frame_maxes)
def test_encode_get_ok_equals_pamqp(channel, tag, redelivered, exchange, rkey, count, props,
                                    body, frame_max):
    method = commands.Basic.GetOk(tag, redelivered, exchange, rkey, count)
    expected = pamqp_content(channel, method, props, body, frame_max)
    got = encode_get_ok(channel, tag, redelivered, exchange, rkey, count,
                        encode_properties(props), body, frame_max)
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(channels, st.sampled_from([311, 312, 313]), short_text, exchange_names, short_text,
       pamqp_properties, bodies, frame_maxes)
def test_encode_return_equals_pamqp(channel, code, text, exchange, rkey, props, body,
                                    frame_max):
    method = commands.Basic.Return(code, text, exchange, rkey)
    expected = pamqp_content(channel, method, props, body, frame_max)
    got = encode_return(channel, code, text, exchange, rkey, encode_properties(props), body,
                        frame_max)
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(channels, exchange_names, short_text, st.booleans(), st.booleans(), pamqp_properties,
       bodies, frame_maxes)
def test_encode_publish_equals_pamqp(channel, exchange, rkey, mandatory, immediate, props,
                                     body, frame_max):
    method = commands.Basic.Publish(0, exchange, rkey, mandatory, immediate)
    expected = pamqp_content(channel, method, props, body, frame_max)
    got = encode_publish(channel, exchange, rkey, mandatory, immediate,
                         encode_properties(props), body, frame_max)
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(channels, pamqp_tags, st.booleans(), st.booleans())
def test_encode_ack_nack_reject_equal_pamqp(channel, tag, multiple, requeue):
    assert encode_ack(channel, tag, multiple) == frame.marshal(
        commands.Basic.Ack(tag, multiple), channel)
    assert encode_nack(channel, tag, multiple, requeue) == frame.marshal(
        commands.Basic.Nack(tag, multiple, requeue), channel)
    assert encode_reject(channel, tag, requeue) == frame.marshal(
        commands.Basic.Reject(tag, requeue), channel)


def test_P10_ack_tags_use_all_64_bits():
    top = 2**64 - 1
    data = encode_ack(1, top, True) + encode_nack(1, top, False, True) + encode_reject(1, top, False)
    assert data[11:19] == b"\xff" * 8
    events = Decoder(expect_header=False).feed(data)
    assert [e.method.delivery_tag for e in events] == [top, top, top]
    assert [e.method.name for e in events] == ["Basic.Ack", "Basic.Nack", "Basic.Reject"]


def test_P10_deliver_and_get_ok_tags_use_all_64_bits():
    top = 2**64 - 1
    data = encode_deliver(1, "c", top, True, "x", "k", b"\x00\x00", b"b", 4096)
    data += encode_get_ok(2, top, False, "x", "k", 7, b"\x00\x00", b"", 4096)
    events = Decoder(expect_header=False).feed(data)
    assert [type(e) for e in events] == [Content, Content]
    assert [e.method.delivery_tag for e in events] == [top, top]
    assert events[1].method.message_count == 7


def normalized(props: commands.Basic.Properties) -> dict:
    """pamqp leaves '' fields off the wire, so '' and None mean the same."""
    return {k: (None if v == "" else v) for k, v in props}


def decode_all(data: bytes) -> list:
    return Decoder(frame_max=0, expect_header=False).feed(data)


@settings(max_examples=300, deadline=None)
@given(channels, exchange_names, short_text, st.booleans(), st.booleans(), pamqp_properties,
       bodies, frame_maxes)
def test_decode_publish_equals_pamqp(channel, exchange, rkey, mandatory, immediate, props,
                                     body, frame_max):
    method = commands.Basic.Publish(0, exchange, rkey, mandatory, immediate)
    data = pamqp_content(channel, method, props, body, frame_max)
    assert decode_all(data) == [
        Publish(channel, exchange, rkey, mandatory, immediate, props.marshal(), body)
    ]
    # and the raw properties decode back to what pamqp sent
    (event,) = decode_all(data)
    assert normalized(decode_properties(event.properties)) == normalized(props)


@settings(max_examples=300, deadline=None)
@given(channels, pamqp_tags, st.booleans(), st.booleans())
def test_decode_ack_nack_reject_equal_pamqp(channel, tag, multiple, requeue):
    sent = [
        commands.Basic.Ack(tag, multiple),
        commands.Basic.Nack(tag, multiple, requeue),
        commands.Basic.Reject(tag, requeue),
    ]
    data = b"".join(frame.marshal(m, channel) for m in sent)
    events = decode_all(data)
    assert all(type(e) is Method and e.channel == channel for e in events)
    for event, method in zip(events, sent, strict=True):
        assert type(event.method) is type(method)
        _, _, reference = frame.unmarshal(frame.marshal(method, channel))
        assert dict(event.method) == dict(reference)


@settings(max_examples=100, deadline=None)
@given(channels, short_text, pamqp_tags, st.booleans(), exchange_names, short_text,
       pamqp_properties, bodies)
def test_decode_deliver_equals_pamqp(channel, ctag, tag, redelivered, exchange, rkey, props,
                                     body):
    method = commands.Basic.Deliver(ctag, tag, redelivered, exchange, rkey)
    (event,) = decode_all(pamqp_content(channel, method, props, body, 4096))
    assert type(event) is Content and event.channel == channel
    assert dict(event.method) == dict(method)
    assert event.properties == props.marshal() and event.body == body


SLOW_PATH_METHODS = [
    commands.Connection.Start(server_properties={"product": "ackmq", "capabilities": {
        "publisher_confirms": True}}, mechanisms="AMQPLAIN PLAIN", locales="en_US"),
    commands.Connection.Tune(2047, 131072, 60),
    commands.Connection.Close(320, "CONNECTION_FORCED - bye", 0, 0),
    commands.Channel.Close(406, "PRECONDITION_FAILED - unknown delivery tag 5", 60, 80),
    commands.Queue.Declare(0, "q", False, True, False, True, True, {"x-max-length": 5}),
    commands.Queue.DeclareOk("amq.gen-abc", 2**32 - 1, 3),
    commands.Exchange.Declare(0, "ex", "topic", True, False, False, False, False, {}),
    commands.Basic.Qos(0, 65535, True),
    commands.Basic.Consume(0, "q", "ctag", True, False, True, False, {"x-priority": 1}),
    commands.Basic.ConsumeOk("ctag"),
    commands.Basic.Nack(2**63 - 1, True, False),
    commands.Confirm.SelectOk(),
    commands.Tx.CommitOk(),
]


@pytest.mark.parametrize("method", SLOW_PATH_METHODS, ids=lambda m: m.name)
def test_encode_method_equals_pamqp_and_decodes_back(method):
    data = encode_method(3, method)
    assert data == frame.marshal(method, 3)
    (event,) = decode_all(data)
    assert event.channel == 3 and dict(event.method) == dict(method)


@settings(max_examples=300, deadline=None)
@given(props=pamqp_properties, seq=st.integers(0, 2**63 - 1))
def test_properties_with_seq_equals_the_general_splice(props, seq) -> None:
    from ackmq.protocol.amqp.properties import properties_with_header

    raw = encode_properties(props)
    assert properties_with_header(raw, "x-ackmq-seq", seq) == \
        properties_with_headers(raw, {"x-ackmq-seq": seq})


publishes = st.tuples(channels, exchange_names, short_text, st.booleans(), st.booleans(),
                      pamqp_properties, bodies)


@settings(max_examples=150, deadline=None)
@given(st.lists(publishes, min_size=1, max_size=6), st.lists(st.integers(0, 5), max_size=12),
       st.lists(st.integers(1, 9000), min_size=1, max_size=8), st.booleans())
def test_decode_publish_stream_with_repeats_equals_pamqp(distinct, order, cuts, big):
    """One decoder over a stream of pamqp publishes, repeated (the decoder remembers
    routing fields and valid property bytes) and cut anywhere (a carried-over partial
    frame, small or over 64 KiB), decodes each as pamqp encoded it."""
    sent = distinct + [distinct[i % len(distinct)] for i in order]
    c, x, rk, m, i, props, body = distinct[0]  # same routing fields, other bits
    sent += [(c, x, rk, not m, i, props, body), (c, x, rk, m, not i, props, body)]
    if big:  # a body frame larger than the small-carry threshold, split across reads
        c, x, rk, m, i, props, _ = sent[0]
        sent.append((c, x, rk, m, i, props, b"B" * 200_000))
    data = b"".join(pamqp_content(c, commands.Basic.Publish(0, x, rk, m, i), props, body,
                                  131072) for c, x, rk, m, i, props, body in sent)
    dec = Decoder(frame_max=131072, expect_header=False)
    got, pos, k = [], 0, 0
    while pos < len(data):
        step = cuts[k % len(cuts)] * (30 if big else 1)
        got += dec.feed(data[pos : pos + step])
        pos += step
        k += 1
    assert got == [Publish(c, x, rk, m, i, props.marshal(), body)
                   for c, x, rk, m, i, props, body in sent]
