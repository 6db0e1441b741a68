"""The sans-IO STOMP codec, byte for byte: framing, escaping per version, limits, the
destination names and the header <-> AMQP property mapping (no sockets here)."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from ackmq.protocol.amqp import decode_properties, encode_properties
from ackmq.protocol.amqp.properties import encode_fields
from ackmq.protocol.stomp import (
    Decoder,
    Destination,
    DestinationError,
    Frame,
    HeartBeat,
    StompError,
    encode_frame,
    format_destination,
    message_headers,
    parse_destination,
    properties_from_headers,
)


def decoded(data: bytes, version: str | None = "1.2", **limits: int) -> list:
    d = Decoder(version=version, **limits)
    return d.feed(data)


def every_split(data: bytes, version: str | None = "1.2") -> list[list]:
    """The events of `data` fed in two pieces, for every cut point, and byte by byte."""
    results = []
    for cut in range(len(data) + 1):
        d = Decoder(version=version)
        results.append(d.feed(data[:cut]) + d.feed(data[cut:]))
    d = Decoder(version=version)
    results.append([ev for i in range(len(data)) for ev in d.feed(data[i:i + 1])])
    return results


# -- framing --------------------------------------------------------------------------

def test_a_frame_is_command_headers_blank_line_body_nul() -> None:
    assert decoded(b"SEND\ndestination:/queue/a\n\nhello\x00") == [
        Frame("SEND", {"destination": "/queue/a"}, b"hello")]


def test_frames_decode_the_same_however_tcp_splits_them() -> None:
    data = (b"SEND\r\ndestination:/queue/a\r\ncontent-length:3\r\n\r\na\x00b\x00\r\n\n"
            b"ACK\nid:1\n\n\x00\n")
    want = [Frame("SEND", {"destination": "/queue/a", "content-length": "3"}, b"a\x00b"),
            HeartBeat(), HeartBeat(), Frame("ACK", {"id": "1"}, b""), HeartBeat()]
    for got in every_split(data):
        assert got == want


def test_crlf_and_lf_line_ends_mix_freely() -> None:
    assert decoded(b"SEND\r\na:1\nb:2\r\n\n\x00") == [Frame("SEND", {"a": "1", "b": "2"})]


def test_heartbeats_are_eols_between_frames_one_event_each() -> None:
    assert decoded(b"\n") == [HeartBeat()]
    assert decoded(b"\r\n\n\r\n") == [HeartBeat()] * 3
    assert decoded(b"\n\nBEGIN\ntransaction:t\n\n\x00\n") == [
        HeartBeat(), HeartBeat(), Frame("BEGIN", {"transaction": "t"}), HeartBeat()]


def test_a_cr_waits_for_its_lf_and_a_bare_cr_between_frames_is_an_error() -> None:
    d = Decoder(version="1.2")
    assert d.feed(b"\r") == []
    assert d.feed(b"\n") == [HeartBeat()]
    with pytest.raises(StompError, match="CR not followed by LF"):
        decoded(b"\rX")


def test_nuls_between_frames_are_skipped_as_rabbitmq_does() -> None:
    assert decoded(b"\x00\x00ACK\nid:1\n\n\x00") == [Frame("ACK", {"id": "1"})]


def test_repeated_headers_first_one_wins() -> None:
    assert decoded(b"SEND\nfoo:first\nfoo:second\n\n\x00")[0].headers == {"foo": "first"}


def test_values_may_hold_colons_after_the_first() -> None:
    assert decoded(b"SEND\nurl:http://x:80/\n\n\x00")[0].headers == {"url": "http://x:80/"}


def test_content_length_body_may_hold_nuls() -> None:
    f = decoded(b"SEND\ncontent-length:5\n\n\x00\x01\x00\x02\x00\x00")[0]
    assert f.body == b"\x00\x01\x00\x02\x00"


def test_content_length_zero_and_padded() -> None:
    assert decoded(b"SEND\ncontent-length:0\n\n\x00")[0].body == b""
    assert decoded(b"SEND\ncontent-length: 2\n\nab\x00")[0].body == b"ab"


def test_W9_body_longer_than_content_length_is_an_error() -> None:
    with pytest.raises(StompError) as e:
        decoded(b"SEND\ncontent-length:2\n\nabc\x00")
    assert "body longer than content-length 2" in e.value.detail


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "", "٣"])
def test_W9_content_length_must_be_a_number(value: str) -> None:
    with pytest.raises(StompError, match="content-length is not a number"):
        decoded(f"SEND\ncontent-length:{value}\n\n\x00".encode())


def test_W9_missing_nul_is_only_waited_for_up_to_the_body_limit() -> None:
    d = Decoder(version="1.2", max_body=10)
    assert d.feed(b"SEND\n\n0123456789") == []     # 10 bytes, a NUL may still come
    with pytest.raises(StompError) as e:
        d.feed(b"A")
    assert e.value.message == "Frame too large" and "limit of 10 bytes" in e.value.detail


def test_W9_declared_body_over_the_limit_is_refused_before_it_arrives() -> None:
    d = Decoder(version="1.2", max_body=100)
    with pytest.raises(StompError, match="body of 101 bytes is over the limit of 100"):
        d.feed(b"SEND\ncontent-length:101\n\n")


def test_W9_header_line_limit_applies_before_the_line_ends() -> None:
    d = Decoder(version="1.2", max_line=16)
    assert d.feed(b"SEND\nh:" + b"x" * 14 + b"\n\n\x00")  # 16 bytes: fine
    d = Decoder(version="1.2", max_line=16)
    with pytest.raises(StompError, match="header line longer than 16 bytes"):
        d.feed(b"SEND\nh:" + b"x" * 30)  # no LF yet: refused all the same
    with pytest.raises(StompError, match="command line longer than 16 bytes"):
        Decoder(max_line=16).feed(b"X" * 40)


def test_W9_too_many_headers() -> None:
    frame = b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(4)) + b"\n\x00"
    assert decoded(frame, max_headers=4)
    with pytest.raises(StompError, match="more than 3 headers in a SEND frame"):
        decoded(frame, max_headers=3)


@pytest.mark.parametrize("line,problem", [
    (b"novalue", "without a colon"),
    (b":v", "empty name"),
    (b"h:\xff\xfe", "not valid UTF-8"),
])
def test_W9_bad_header_lines(line: bytes, problem: str) -> None:
    with pytest.raises(StompError, match=problem):
        decoded(b"SEND\n" + line + b"\n\n\x00")


def test_W9_error_keeps_the_frames_before_it_and_the_decoder_stays_dead() -> None:
    d = Decoder(version="1.2")
    with pytest.raises(StompError) as e:
        d.feed(b"ACK\nid:1\n\n\x00SEND\nbad\n\n\x00")
    assert e.value.frames == [Frame("ACK", {"id": "1"})]
    with pytest.raises(StompError):
        d.feed(b"ACK\nid:2\n\n\x00")


# -- escaping -----------------------------------------------------------------------

def test_1_2_escapes_are_resolved() -> None:
    f = decoded(b"SEND\na\\cb:1\\r\\n2\\c3\\\\4\n\n\x00", "1.2")[0]
    assert f.headers == {"a:b": "1\r\n2:3\\4"}


def test_1_1_escapes_and_rabbitmqs_cr() -> None:
    f = decoded(b"SEND\nk:a\\nb\\cc\\\\d\\re\n\n\x00", "1.1")[0]
    assert f.headers == {"k": "a\nb:c\\d\re"}


def test_1_0_has_no_escaping() -> None:
    f = decoded(b"SEND\nk:a\\nb\\t\n\n\x00", "1.0")[0]
    assert f.headers == {"k": "a\\nb\\t"}


@pytest.mark.parametrize("version", ["1.1", "1.2"])
@pytest.mark.parametrize("raw", [b"a\\tb", b"ab\\"])
def test_W9_undefined_escapes_are_errors(version: str, raw: bytes) -> None:
    with pytest.raises(StompError) as e:
        decoded(b"SEND\nk:" + raw + b"\n\n\x00", version)
    assert e.value.message == "Bad escape"


def test_connect_is_never_unescaped_and_the_decoder_waits_for_the_version() -> None:
    d = Decoder()
    data = (b"CONNECT\nlogin:dom\\user\npasscode:a\\tb\n\n\x00"
            b"SEND\nk:x\\cy\n\n\x00")
    assert d.feed(data) == [Frame("CONNECT", {"login": "dom\\user", "passcode": "a\\tb"})]
    assert d.paused and d.feed(b"") == []
    d.negotiated("1.2")
    assert d.feed(b"") == [Frame("SEND", {"k": "x:y"})]


def test_the_same_pipelined_bytes_after_a_1_0_connect_are_not_unescaped() -> None:
    d = Decoder()
    d.feed(b"STOMP\naccept-version:1.0\n\n\x00SEND\nk:x\\cy\n\n\x00")
    d.negotiated("1.0")
    assert d.feed(b"") == [Frame("SEND", {"k": "x\\cy"})]


# -- encoder --------------------------------------------------------------------------

def test_encode_is_byte_exact_with_content_length_and_trailing_lf() -> None:
    assert encode_frame("MESSAGE", [("destination", "/queue/a"), ("k:1", "a\nb\\c\r")],
                        b"hi") == (b"MESSAGE\ndestination:/queue/a\nk\\c1:a\\nb\\\\c\\r\n"
                                   b"content-length:2\n\nhi\x00\n")


def test_encode_empty_body_has_no_content_length_and_own_content_length_is_dropped() -> None:
    assert encode_frame("RECEIPT", [("receipt-id", "r"), ("content-length", "9")]) == \
        b"RECEIPT\nreceipt-id:r\n\n\x00\n"


def test_encode_connected_and_1_0_are_not_escaped() -> None:
    assert encode_frame("CONNECTED", [("server", "a:b\\c")]) == \
        b"CONNECTED\nserver:a:b\\c\n\n\x00\n"
    assert encode_frame("MESSAGE", [("k", "a:b\\c\nd")], version="1.0") == \
        b"MESSAGE\nk:a:b\\c d\n\n\x00\n"


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(headers=st.dictionaries(_text.filter(lambda s: s and s != "content-length"), _text,
                               max_size=6),
       body=st.binary(max_size=40), version=st.sampled_from(["1.1", "1.2"]))
def test_encode_then_decode_gives_back_headers_and_body(headers: dict[str, str], body: bytes,
                                                        version: str) -> None:
    data = encode_frame("MESSAGE", list(headers.items()), body, version)
    frames = [ev for ev in decoded(data, version) if isinstance(ev, Frame)]
    got = dict(frames[0].headers)
    if body:
        assert got.pop("content-length") == str(len(body))
    assert got == headers and frames[0].body == body


def _escaped_each(command: str, headers: list[tuple[str, str]], body: bytes,
                  version: str) -> bytes:
    """encode_frame as written before its one-count fast path: each name and value
    escaped on its own."""
    from ackmq.protocol.stomp.codec import escape
    parts = [command, "\n"]
    for name, value in headers:
        if name != "content-length":
            parts += (escape(name, version, command), ":", escape(value, version, command),
                      "\n")
    if body:
        parts += ("content-length:", str(len(body)), "\n")
    return ("".join(parts) + "\n").encode() + body + b"\x00\n"


@settings(max_examples=400, deadline=None)
@given(headers=st.lists(st.tuples(st.sampled_from(["k", "a:b", "x\\y", "n\nl", "c\rr",
                                                   "content-length", "plain"]) | _text,
                                  st.sampled_from(["v", "1:2", "\\", "\n", "\r", ""]) | _text),
                        max_size=6),
       body=st.binary(max_size=10),
       command=st.sampled_from(["MESSAGE", "RECEIPT", "ERROR", "CONNECTED"]),
       version=st.sampled_from(["1.0", "1.1", "1.2"]))
def test_encode_frame_escapes_as_each_header_escaped_alone(
        headers: list[tuple[str, str]], body: bytes, command: str, version: str) -> None:
    want = _escaped_each(command, headers, body, version)
    assert encode_frame(command, headers, body, version) == want
    assert encode_frame(command, iter(headers), body, version) == want  # any iterable


# -- destinations (RabbitMQ's texts) --------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("/queue/a", Destination("queue", "a")),
    ("/queue/a%2Fb", Destination("queue", "a/b")),
    ("/amq/queue/a", Destination("amqqueue", "a")),
    ("/topic/a.*.c", Destination("topic", "a.*.c")),
    ("/exchange/amq.direct", Destination("exchange", "amq.direct")),
    ("/exchange/amq.direct/k.1", Destination("exchange", "amq.direct", "k.1")),
    ("/temp-queue/r1", Destination("temp_queue", "r1")),
    ("/reply-queue/amq.gen-x/y", Destination("reply_queue", "amq.gen-x/y")),
    ("plain", Destination("queue", "plain")),
    ("queue://orders", Destination("queue", "orders", activemq=True)),
    ("topic://prices.>", Destination("topic", "prices.#", activemq=True)),
])
def test_W3_destination_forms(text: str, want: Destination) -> None:
    assert parse_destination(text) == want


@pytest.mark.parametrize("text,detail", [
    ("/queue/bah/baz", "'/bah/baz' is not a valid queue destination\n"),
    ("/queue", "'' is not a valid queue destination\n"),
    ("/topic/bah/baz", "'/bah/baz' is not a valid topic destination\n"),
    ("/exchange", "'' is not a valid exchange destination\n"),
    ("/exchange//foo", "'//foo' is not a valid exchange destination\n"),
    ("/exchange/bah/baz/boo", "'/bah/baz/boo' is not a valid exchange destination\n"),
])
def test_W3_invalid_destinations_worded_as_rabbitmq(text: str, detail: str) -> None:
    with pytest.raises(DestinationError) as e:
        parse_destination(text)
    assert (e.value.message, e.value.detail) == ("Invalid destination", detail)


def test_W3_unknown_destination() -> None:
    with pytest.raises(DestinationError) as e:
        parse_destination("/something/interesting")
    assert e.value.message == "Unknown destination"
    assert e.value.detail.startswith("'/something/interesting' is not a valid destination.\n")


def test_W3_message_destination_formatted_as_rabbitmq() -> None:
    assert format_destination("", "a/b%c") == "/queue/a%2Fb%25c"
    assert format_destination("amq.topic", "x.y") == "/topic/x.y"
    assert format_destination("ex", "") == "/exchange/ex"
    assert format_destination("ex", "k\x01é") == "/exchange/ex/k%01%C3%A9"


# -- header <-> AMQP property mapping -------------------------------------------------

def test_W3_send_headers_to_properties_match_what_pamqp_encodes() -> None:
    headers = {"destination": "/queue/a", "receipt": "r1", "content-type": "text/plain",
               "content-encoding": "gzip", "foo": "bar", "persistent": "true",
               "priority": "3", "correlation-id": "c", "reply-to": "/queue/r",
               "expiration": "60000", "amqp-message-id": "m1", "timestamp": "1234",
               "type": "t", "user-id": "guest", "app-id": "a", "x-q": "1",
               "content-length": "5", "transaction": "tx"}
    want = commands.Basic.Properties(
        content_type="text/plain", content_encoding="gzip",
        headers={"foo": "bar", "x-q": "1"}, delivery_mode=2, priority=3,
        correlation_id="c", reply_to="/queue/r", expiration="60000", message_id="m1",
        timestamp=datetime.datetime.fromtimestamp(1234, tz=datetime.UTC),
        message_type="t", user_id="guest", app_id="a")
    assert properties_from_headers(headers) == encode_properties(want)


def test_W3_no_headers_is_empty_properties_and_persistent_false_is_absent() -> None:
    assert properties_from_headers({"destination": "/queue/a"}) == b"\x00\x00"
    assert properties_from_headers({"persistent": "false"}) == b"\x00\x00"


def test_W3_activemq_expires_becomes_a_ttl() -> None:
    raw = properties_from_headers({"expires": "10500"}, now_ms=10000)
    props = decode_properties(raw)
    assert props.expiration == "500" and props.headers == {"expires": "10500"}
    assert decode_properties(properties_from_headers({"expires": "0"})).expiration is None


@pytest.mark.parametrize("headers,problem", [
    ({"priority": "high"}, "'priority' must be an integer"),
    ({"priority": "256"}, "between 0 and 255"),
    ({"timestamp": "-1"}, "'timestamp' must be between"),
    ({"correlation-id": "x" * 256}, "longer than 255 bytes"),
])
def test_W9_bad_property_headers(headers: dict[str, str], problem: str) -> None:
    with pytest.raises(StompError, match=problem):
        properties_from_headers(headers)


def test_W3_properties_to_message_headers_in_rabbitmq_order() -> None:
    raw = encode_properties(commands.Basic.Properties(
        content_type="ct", content_encoding="ce",
        headers={"h1": "v", "i": 5, "b": True, "l": [1], "destination": "/queue/zzz"},
        delivery_mode=1, priority=2, correlation_id="co", reply_to="rq",
        expiration="100000", message_id="mid",
        timestamp=datetime.datetime.fromtimestamp(77, tz=datetime.UTC),
        message_type="ty", user_id="guest", app_id="ap"))
    assert message_headers(raw, skip={"destination"}) == [
        ("h1", "v"), ("i", "5"), ("app-id", "ap"), ("user-id", "guest"), ("type", "ty"),
        ("timestamp", "77"), ("amqp-message-id", "mid"), ("expiration", "100000"),
        ("reply-to", "/reply-queue/rq"), ("correlation-id", "co"), ("priority", "2"),
        ("persistent", "1"), ("content-encoding", "ce"), ("content-type", "ct")]


def test_W3_timestamp_past_year_9999_is_the_integer_as_sent() -> None:
    """A publisher's timestamp beyond datetime's range reaches a STOMP subscriber as the
    seconds it sent (it used to raise AttributeError on the int the lenient read keeps)."""
    raw = encode_fields({"timestamp": 1 << 40})
    assert message_headers(raw) == [("timestamp", str(1 << 40))]


def test_W3_persistent_reply_to_destination_kept() -> None:
    raw = encode_properties(commands.Basic.Properties(delivery_mode=2, reply_to="/queue/r"))
    assert message_headers(raw) == [("reply-to", "/queue/r"), ("persistent", "true")]


def _fed(data: bytes, whole: bool, version: str = "1.2", **limits: int) -> list:
    """Events (or the error's text) of `data` fed at once or byte by byte: at once the
    header block is read in one piece, byte by byte line by line."""
    d = Decoder(version=version, **limits)
    out: list = []
    try:
        for piece in [data] if whole else [data[i:i + 1] for i in range(len(data))]:
            out += d.feed(piece)
    except StompError as e:
        out.append(("error", e.message, e.detail))
    return out


_line_text = st.text(st.sampled_from("ab:\\c\rn\xe9 "), max_size=8)


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.tuples(_line_text, _line_text), max_size=6),
       eol=st.sampled_from([b"\n", b"\r\n"]), command=st.sampled_from(["SEND", "CONNECT"]),
       body=st.binary(max_size=5).filter(lambda b: b"\x00" not in b),
       limits=st.sampled_from([{}, {"max_headers": 2}, {"max_line": 6}]))
def test_a_header_block_read_whole_is_read_as_line_by_line(
        lines: list[tuple[str, str]], eol: bytes, command: str, body: bytes,
        limits: dict[str, int]) -> None:
    head = eol.join([command.encode()] + [f"{k}:{v}".encode() for k, v in lines])
    data = head + eol + eol + body + b"\x00\n"
    assert _fed(data, True, **limits) == _fed(data, False, **limits)
