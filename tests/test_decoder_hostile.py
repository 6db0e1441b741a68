"""Hostile input to the AMQP decoder (SPEC B1): deeply nested field tables and mutated
frame streams get a protocol answer, never a traceback, and never cost the good frames
read ahead of them.

Why: a table nested a few hundred levels deep used to raise RecursionError out of the
decoder (pamqp's recursive table decoding, our property scan): asyncio logged "Fatal
error on transport", dropped the socket without connection.close and lost the publishes
decoded earlier in the same read. ackmq now bounds nesting at MAX_TABLE_DEPTH (100)
levels and answers deeper with 502 "SYNTAX_ERROR - field table nested deeper than 100
levels" (class and method of the frame that carried it).

RabbitMQ 3.10 (observed on 127.0.0.1:5672 with tests/support/rawamqp.py) has no bound but
frame-max: it accepts queue.declare arguments 18,000 tables deep (and arrays 20,000 deep)
and takes and delivers a message whose headers nest 18,000 deep, which pamqp, pika and
aio-pika consumers then cannot decode (RecursionError past ~450 levels). That is the one
deliberate difference: the socket tests below run against ackmq only (own broker, for its
log). RabbitMQ agrees on the depth-100 cases being accepted.
"""

from __future__ import annotations

import datetime
import decimal
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from support.rawamqp import PROTOCOL_HEADER, RawConnection, body_frame, method_frame, raw_frame

from ackmq.protocol.amqp import (
    Content,
    Decoder,
    FrameError,
    Method,
    PropertiesView,
    Publish,
    decode_table,
    encode_ack,
    encode_deliver,
    encode_get_ok,
    encode_return,
)
from ackmq.protocol.amqp.properties import (
    _FIELDS,
    MAX_TABLE_DEPTH,
    check_properties,
    peek_routing_fields,
)
from tools.robustness.fuzz import KINDS, every_type_table, mutate, nested_tables
from tools.robustness.fuzz import every_property as _every_property

DEEP_TEXT = f"SYNTAX_ERROR - field table nested deeper than {MAX_TABLE_DEPTH} levels"
_U32 = struct.Struct(">I")


# ---- building blocks ------------------------------------------------------------------

def nested_arrays(depth: int) -> bytes:
    """A table (level 1) whose one value is an array `depth - 1` arrays deep."""
    value = b"t\x01"
    for _ in range(depth - 1):
        value = b"A" + _U32.pack(len(value)) + value
    entry = b"\x01k" + value
    return _U32.pack(len(entry)) + entry


NESTERS = {"tables": nested_tables, "arrays": nested_arrays}


def depth_of(value: object) -> int:
    """Nesting levels of a decoded table or array (iterative: it may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in children if isinstance(c, dict | list))
    return deepest


def declare_frame(channel: int, queue: str, arguments: bytes, durable: bool = False) -> bytes:
    """queue.declare with a raw arguments table (pamqp cannot encode a deep one)."""
    name = queue.encode()
    payload = (struct.pack(">HHH", 50, 10, 0) + bytes((len(name),)) + name
               + bytes((2 if durable else 0,)) + arguments)
    return raw_frame(1, channel, payload)


def headers_properties(table: bytes) -> bytes:
    """Raw property list holding only `headers`."""
    return struct.pack(">H", 0x2000) + table


def publish_frames(channel: int, routing_key: str, properties: bytes, body: bytes,
                   exchange: str = "") -> bytes:
    """basic.publish + a content header with raw properties + one body frame."""
    header = raw_frame(2, channel, struct.pack(">HHQ", 60, 0, len(body)) + properties)
    return (method_frame(channel, commands.Basic.Publish(exchange=exchange,
                                                         routing_key=routing_key))
            + header + body_frame(channel, body))


def read_all(view: PropertiesView) -> dict[str, object]:
    """Every property of a view (what the broker may read: routing, x-death, CC/BCC)."""
    return {name: getattr(view, name) for _, name, _ in _FIELDS}


# ---- the bound, sans-IO ---------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(NESTERS))
def test_B1_method_arguments_nested_to_the_bound_decode(kind: str) -> None:
    dec = Decoder(expect_header=False)
    (event,) = dec.feed(declare_frame(1, "q", NESTERS[kind](MAX_TABLE_DEPTH)))
    assert isinstance(event, Method)
    assert depth_of(event.method.arguments) == MAX_TABLE_DEPTH


@pytest.mark.parametrize("kind", sorted(NESTERS))
@pytest.mark.parametrize("depth", [MAX_TABLE_DEPTH + 1, 500, 1000, 18000])
def test_B1_method_arguments_nested_past_the_bound_are_502(kind: str, depth: int) -> None:
    """500 and 1000 levels were the RecursionError of the issue; 18,000 fills a frame."""
    dec = Decoder(expect_header=False)
    with pytest.raises(FrameError) as info:
        dec.feed(declare_frame(1, "q", NESTERS[kind](depth)))
    err = info.value
    assert (err.reply_code, err.reply_text) == (502, DEEP_TEXT)
    assert (err.class_id, err.method_id) == (50, 10)


@pytest.mark.parametrize("kind", sorted(NESTERS))
@pytest.mark.parametrize("split", [False, True], ids=["one-read", "header-alone"])
def test_B1_headers_nested_to_the_bound_are_accepted_and_readable(kind: str,
                                                                  split: bool) -> None:
    """Both decoder paths (publish + header + body in one read, or the header arriving
    alone); the broker may read such headers later: the view must decode them."""
    data = publish_frames(1, "q", headers_properties(NESTERS[kind](MAX_TABLE_DEPTH)), b"x")
    dec = Decoder(expect_header=False)
    cut = len(method_frame(1, commands.Basic.Publish(routing_key="q"))) + 1 if split else 0
    events = dec.feed(data[:cut]) + dec.feed(data[cut:])
    (event,) = events
    assert isinstance(event, Publish) and event.body == b"x"
    view = PropertiesView(event.properties)
    assert depth_of(read_all(view)["headers"]) == MAX_TABLE_DEPTH


@pytest.mark.parametrize("kind", sorted(NESTERS))
@pytest.mark.parametrize("depth", [MAX_TABLE_DEPTH + 1, 1000, 18000])
@pytest.mark.parametrize("split", [False, True], ids=["one-read", "header-alone"])
def test_B1_headers_nested_past_the_bound_are_502(kind: str, depth: int, split: bool) -> None:
    good = publish_frames(1, "q", b"\x00\x00", b"ok")
    bad = publish_frames(1, "q", headers_properties(NESTERS[kind](depth)), b"x")
    dec = Decoder(expect_header=False)
    events: list[object] = []
    with pytest.raises(FrameError) as info:
        if split:
            events += dec.feed(good + bad[:20])
            events += dec.feed(bad[20:])
        else:
            dec.feed(good + bad)
    err = info.value
    assert (err.reply_code, err.reply_text) == (502, DEEP_TEXT)
    assert (err.class_id, err.method_id) == (60, 40)
    handed = events + err.events  # type: ignore[attr-defined]
    assert [e.body for e in handed if isinstance(e, Publish)] == [b"ok"]


def test_B1_check_properties_bounds_depth_without_recursion_error() -> None:
    """The scan behind every publish with headers: a full frame of nesting is a plain
    ValueError (TableTooDeep), not RecursionError."""
    check_properties(headers_properties(nested_tables(MAX_TABLE_DEPTH)))
    with pytest.raises(ValueError, match="nested deeper than 100 levels"):
        check_properties(headers_properties(nested_arrays(20000)))


_leaves = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, width=32),
    st.text(max_size=10), st.binary(max_size=10).map(bytearray), st.none(),
    st.builds(lambda m, scale: decimal.Decimal(m).scaleb(-scale),
              st.integers(-(2**31), 2**31 - 1), st.integers(0, 8)),
    st.integers(0, 2**31).map(lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)),
)
_tables = st.dictionaries(
    st.text(max_size=8),
    st.recursive(_leaves, lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12),
    max_size=5)


@settings(max_examples=300, deadline=None)
@given(table=_tables)
def test_decode_table_matches_pamqp(table: dict) -> None:
    """Whatever pamqp encodes, our bounded decoder reads as pamqp does (same values and
    types: the broker's argument checks and header matching depend on them)."""
    from pamqp import decode as pamqp_decode
    from pamqp import encode as pamqp_encode
    raw = pamqp_encode.field_table(table)
    assert decode_table(raw) == pamqp_decode.field_table(raw)[1]
    assert decode_table(raw, lenient=True) == pamqp_decode.field_table(raw)[1]


def test_decode_table_matches_pamqp_for_every_field_type() -> None:
    """Our bounded table decoder yields pamqp 4's value types (the broker relies on them)."""
    from pamqp import decode as pamqp_decode
    raw = every_type_table()
    assert decode_table(raw) == pamqp_decode.field_table(raw)[1]


def _table(entries: bytes) -> bytes:
    return _U32.pack(len(entries)) + entries


# What the property test found on the code before it (each raised out of PropertiesView,
# i.e. inside the broker when it read the message: headers exchange, CC, dead-lettering).
# RabbitMQ 3.10 takes all of these and dead-letters them unchanged.
ODD_PROPERTIES = {
    "content-type not UTF-8": (struct.pack(">H", 0x8000) + b"\x02\xff\xfe",
                               "content_type", "\udcff\udcfe"),
    "reply-to not UTF-8": (struct.pack(">H", 0x0200) + b"\x03a\xc3(", "reply_to", "a\udcc3("),
    "timestamp past time_t": (struct.pack(">H", 0x0040) + b"\xff" * 8,
                              "timestamp", 2**64 - 1),  # was OverflowError
    "timestamp past year 9999": (struct.pack(">H", 0x0040) + struct.pack(">Q", 10**15),
                                 "timestamp", 10**15),  # was ValueError / OSError
    "header key not UTF-8": (headers_properties(_table(b"\x02\xff\xfet\x01")),
                             "headers", {"\udcff\udcfe": True}),
    "header timestamp out of range": (headers_properties(_table(b"\x01tT" + b"\xff" * 8)),
                                      "headers", {"t": 2**64 - 1}),
}


@pytest.mark.parametrize("name", sorted(ODD_PROPERTIES))
def test_B1_accepted_properties_read_back_without_raising(name: str) -> None:
    """Octets RabbitMQ accepts decode losslessly (surrogateescape text; a timestamp no
    datetime holds stays an integer) instead of raising inside the broker."""
    raw, field, expected = ODD_PROPERTIES[name]
    (event,) = Decoder(expect_header=False).feed(publish_frames(1, "q", raw, b"x"))
    assert isinstance(event, Publish)
    values = read_all(PropertiesView(event.properties))
    assert values[field] == expected


def test_method_arguments_stay_strict() -> None:
    """In method arguments a non-UTF-8 key or an out-of-range timestamp is still 501
    "cannot decode" (as with pamqp before); a type-0 value, which pamqp took as void and
    RabbitMQ drops the connection over, is now 501 too."""
    for entries in (b"\x01\xfft\x01", b"\x01kT" + b"\xff" * 8, b"\x01k\x00"):
        with pytest.raises(FrameError) as info:
            Decoder(expect_header=False).feed(declare_frame(1, "q", _table(entries)))
        assert info.value.reply_code == 501
        assert info.value.reply_text.startswith("FRAME_ERROR - cannot decode")


# ---- over a socket, against ackmq -----------------------------------------------------

@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """An ackmq of this module's own: its log must stay free of tracebacks."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("ackmq only: RabbitMQ takes any depth; needs the broker's log")
    broker = BrokerProcess(tmp_path_factory.mktemp("hostile"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def url(own_broker: BrokerProcess) -> Iterator[str]:
    """After each test: no traceback in its part of the log, and a fresh connection is
    served."""
    seen = len(own_broker.log)
    yield own_broker.url
    time.sleep(0.1)  # let the log drain
    log = "".join(own_broker.log[seen:])
    assert "Traceback" not in log and "Fatal error" not in log, log[-3000:]
    conn = RawConnection.open(own_broker.url)
    try:
        conn.open_channel(1)
        ok = conn.rpc(1, commands.Queue.Declare(exclusive=True), commands.Queue.DeclareOk)
        conn.publish(1, "", ok.queue, b"still serving")
        got = conn.rpc(1, commands.Basic.Get(queue=ok.queue, no_ack=True),
                       commands.Basic.GetOk)
        assert got.body == b"still serving"
    finally:
        conn.close()


def _queue(url: str, name: str, arguments: dict | None = None) -> None:
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.rpc(1, commands.Queue.Declare(queue=name, arguments=arguments),
                 commands.Queue.DeclareOk)
    finally:
        conn.close()


def _depth(url: str, name: str) -> int:
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        return conn.rpc(1, commands.Queue.Declare(queue=name, passive=True),
                        commands.Queue.DeclareOk).message_count
    finally:
        conn.close()


def _until_close(conn: RawConnection, timeout: float = 5.0
                 ) -> tuple[list[tuple[int, object]], commands.Connection.Close | None]:
    """Frames up to the connection.close (answered), and the close (None on bare EOF)."""
    frames: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ch, value = conn.recv(max(deadline - time.monotonic(), 0.001))
            if isinstance(value, commands.Connection.Close):
                conn.send(0, commands.Connection.CloseOk())
                return frames, value
            frames.append((ch, value))
    except ConnectionError:
        return frames, None


def _acked(frames: list[tuple[int, object]]) -> set[int]:
    done: set[int] = set()
    for _, value in frames:
        if isinstance(value, commands.Basic.Ack):
            done.update(range(1, value.delivery_tag + 1) if value.multiple
                        else (value.delivery_tag,))
    return done


@pytest.mark.parametrize("kind", sorted(NESTERS))
def test_B1_declare_arguments_at_the_bound_over_a_socket(url: str, kind: str) -> None:
    """Depth 100 is declare-ok (as RabbitMQ); 101 is a 502 connection.close naming the
    problem with queue.declare's ids (RabbitMQ: declare-ok)."""
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.send_raw(declare_frame(1, f"hostile.args.{kind}",
                                    NESTERS[kind](MAX_TABLE_DEPTH)))
        conn.expect(commands.Queue.DeclareOk, channel=1)
        conn.send_raw(declare_frame(1, f"hostile.args.{kind}.2",
                                    NESTERS[kind](MAX_TABLE_DEPTH + 1)))
        _, close = _until_close(conn)
    finally:
        conn.abort()
    assert close is not None, "socket dropped without connection.close"
    assert (close.reply_code, close.reply_text) == (502, DEEP_TEXT)
    assert (close.class_id, close.method_id) == (50, 10)


@pytest.mark.parametrize("kind", sorted(NESTERS))
def test_B1_headers_at_the_bound_over_a_socket(url: str, kind: str) -> None:
    """A message whose headers nest 100 deep is queued and comes back whole; 101 deep is
    a 502 connection.close with basic.publish's ids."""
    queue = f"hostile.headers.{kind}"
    _queue(url, queue)
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.send_raw(publish_frames(1, queue, headers_properties(
            NESTERS[kind](MAX_TABLE_DEPTH)), b"deep"))
        got = conn.rpc(1, commands.Basic.Get(queue=queue, no_ack=True), commands.Basic.GetOk)
        assert got.body == b"deep"
        assert depth_of(got.properties.headers) == MAX_TABLE_DEPTH
        conn.send_raw(publish_frames(1, queue, headers_properties(
            NESTERS[kind](MAX_TABLE_DEPTH + 1)), b"deeper"))
        _, close = _until_close(conn)
    finally:
        conn.abort()
    assert close is not None, "socket dropped without connection.close"
    assert (close.reply_code, close.reply_text) == (502, DEEP_TEXT)
    assert (close.class_id, close.method_id) == (60, 40)
    assert _depth(url, queue) == 0


@pytest.mark.parametrize("bad", ["headers", "arguments"])
def test_B1_P4_confirmed_publishes_ahead_of_a_deep_table_count(url: str, bad: str) -> None:
    """Two confirmed publishes and, in the same write, a frame 1,000 levels deep (the
    issue's RecursionError): both are queued and acked before the 502 close."""
    queue = f"hostile.ahead.{bad}"
    _queue(url, queue)
    bystander = RawConnection.open(url)  # connected all along: must not notice
    bystander.open_channel(1)
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        deep = nested_tables(1000)
        tail = (publish_frames(1, queue, headers_properties(deep), b"3") if bad == "headers"
                else declare_frame(1, queue + ".x", deep))
        conn.send_raw(publish_frames(1, queue, b"\x00\x00", b"1")
                      + publish_frames(1, queue, b"\x00\x00", b"2") + tail)
        frames, close = _until_close(conn)
    finally:
        conn.abort()
    assert close is not None, "socket dropped without connection.close"
    assert (close.reply_code, close.reply_text) == (502, DEEP_TEXT)
    assert _acked(frames) == {1, 2}
    assert _depth(url, queue) == 2
    bystander.rpc(1, commands.Queue.Declare(queue=queue, passive=True),
                  commands.Queue.DeclareOk)
    bystander.close()


def test_B1_durable_arguments_at_the_bound_survive_a_restart(tmp_path: Path) -> None:
    """Depth 100 is safe all the way: stored (the definitions log is JSON, which has its
    own recursion limit), recovered, and equivalent to the same declare after restart."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("restarts an ackmq of its own")
    frames = {f"hostile.durable.{kind}": NESTERS[kind](MAX_TABLE_DEPTH) for kind in NESTERS}
    for attempt in range(2):
        broker = BrokerProcess(tmp_path)
        url = broker.start()
        try:
            conn = RawConnection.open(url)
            conn.open_channel(1)
            for name, table in frames.items():
                if attempt:  # recovered, not declared anew
                    conn.rpc(1, commands.Queue.Declare(queue=name, passive=True),
                             commands.Queue.DeclareOk)
                conn.send_raw(declare_frame(1, name, table, durable=True))
                ok = conn.expect(commands.Queue.DeclareOk, channel=1)  # equivalent
                assert ok.queue == name, attempt
            conn.close()
        finally:
            broker.stop()
        log = "".join(broker.log)
        assert "Traceback" not in log and "inequivalent" not in log, log[-3000:]


def test_B1_broker_reads_headers_at_the_bound(url: str) -> None:
    """What the broker decodes itself: a headers exchange routes a message whose headers
    nest 100 deep, and dead-lettering it (x-death spliced in) works."""
    queue, dead = "hostile.routed", "hostile.dead"
    _queue(url, dead)
    _queue(url, queue, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.rpc(1, commands.Queue.Bind(queue=queue, exchange="amq.headers",
                                        arguments={"x-match": "any", "k": "v"}),
                 commands.Queue.BindOk)
        entries = b"\x01kS\x00\x00\x00\x01v" + b"\x04deepF" + nested_tables(MAX_TABLE_DEPTH - 1)
        table = _U32.pack(len(entries)) + entries
        conn.send_raw(publish_frames(1, "", headers_properties(table), b"m",
                                     exchange="amq.headers"))
        got = conn.rpc(1, commands.Basic.Get(queue=queue), commands.Basic.GetOk)
        assert depth_of(got.properties.headers) == MAX_TABLE_DEPTH
        conn.send(1, commands.Basic.Reject(got.delivery_tag, requeue=False))
        deadline = time.monotonic() + 5
        while _depth(url, dead) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        again = conn.rpc(1, commands.Basic.Get(queue=dead, no_ack=True),
                         commands.Basic.GetOk)
    finally:
        conn.close()
    assert again.properties.headers["x-death"][0]["queue"] == queue
    assert depth_of(again.properties.headers["deep"]) == MAX_TABLE_DEPTH - 1


def test_B1_broker_routes_messages_with_odd_headers(url: str) -> None:
    """Headers exchange and CC read every header of a message: keys that are not UTF-8
    and timestamps past year 9999 (which RabbitMQ routes) route instead of raising."""
    queue, cc = "hostile.odd", "hostile.odd.cc"
    _queue(url, queue)
    _queue(url, cc)
    odd = b"\x02\xff\xfet\x01" + b"\x01tT" + b"\xff" * 8
    routed = b"\x01kS\x00\x00\x00\x01v" + odd
    with_cc = odd + b"\x02CCA" + _U32.pack(len(cc) + 5) + b"S" + _U32.pack(len(cc)) + cc.encode()
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.rpc(1, commands.Queue.Bind(queue=queue, exchange="amq.headers",
                                        arguments={"x-match": "any", "k": "v"}),
                 commands.Queue.BindOk)
        conn.rpc(1, commands.Queue.Bind(queue=cc, exchange="amq.direct", routing_key=cc),
                 commands.Queue.BindOk)
        conn.send_raw(publish_frames(1, "", headers_properties(_table(routed)), b"h",
                                     exchange="amq.headers")
                      + publish_frames(1, "nowhere", headers_properties(_table(with_cc)),
                                       b"c", exchange="amq.direct"))
        conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # both handled
    finally:
        conn.close()
    assert (_depth(url, queue), _depth(url, cc)) == (1, 1)


@pytest.mark.parametrize("name", sorted(ODD_PROPERTIES))
def test_B1_D6_dead_lettering_keeps_messages_with_odd_properties(url: str, name: str) -> None:
    """Rejected into a DLX, such a message is dead-lettered (RabbitMQ 3.10: the same),
    never lost to an exception while its properties are rewritten."""
    pytest.importorskip("ackmq.broker.dead_letter",
                        reason="needs dead-lettering by splice (main c136f39): the pamqp "
                               "re-encoding before it cannot write these octets back")
    raw, _, _ = ODD_PROPERTIES[name]
    src, dead = f"hostile.dl.{name}".replace(" ", "-"), "hostile.dl.dead"
    _queue(url, dead)
    _queue(url, src, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    conn = RawConnection.open(url)
    try:
        conn.open_channel(1)
        conn.send_raw(publish_frames(1, src, raw, b"odd"))
        conn.send(1, commands.Basic.Get(queue=src))
        conn.read_raw(0.3)  # the get-ok: pamqp cannot decode these properties
        conn.send(1, commands.Basic.Reject(1, requeue=False))
        conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
        deadline = time.monotonic() + 5
        while _depth(url, dead) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        conn.close()
    assert (_depth(url, src), _depth(url, dead)) == (0, 1)
    purge = RawConnection.open(url)
    purge.open_channel(1)
    purge.rpc(1, commands.Queue.Purge(queue=dead), commands.Queue.PurgeOk)
    purge.close()


@pytest.mark.parametrize("planted", [b"\x01\xfft\x01", b"\x01zT" + b"\xff" * 8],
                         ids=["key-not-utf8", "timestamp-past-9999"])
def test_B1_D6_dead_lettering_a_message_with_an_odd_x_death(tmp_path: Path,
                                                            planted: bytes) -> None:
    """An x-death entry ackmq could not re-encode (a key that is not UTF-8, a timestamp
    past year 9999) is carried as its bytes came, as RabbitMQ 3.10 does: the message is
    dead-lettered, not lost."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("needs an ackmq of its own (its log)")
    broker = BrokerProcess(tmp_path, "--no-persistence")
    url = broker.start()
    src, dead = "hostile.xd", "hostile.xd.dead"
    try:
        _queue(url, dead)
        _queue(url, src, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
        death = _table(b"\x05queueS" + _U32.pack(len(src)) + src.encode()
                       + b"\x06reasonS" + _U32.pack(8) + b"rejected"
                       + b"\x05countl" + struct.pack(">q", 1) + planted)
        x_death = b"F" + death
        headers = _table(b"\x07x-deathA" + _U32.pack(len(x_death)) + x_death)
        conn = RawConnection.open(url)
        try:
            conn.open_channel(1)
            conn.send_raw(publish_frames(1, src, headers_properties(headers), b"x"))
            conn.send(1, commands.Basic.Get(queue=src))
            conn.read_raw(0.3)  # the get-ok: pamqp cannot decode these properties
            conn.send(1, commands.Basic.Reject(1, requeue=False))
            conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
        finally:
            conn.abort()
        deadline = time.monotonic() + 3
        while _depth(url, dead) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _depth(url, dead) == 1
        assert "Traceback" not in "".join(broker.log)
    finally:
        broker.stop()


# ---- property test: mutated valid sessions --------------------------------------------

def _session(split_body: bool) -> bytes:
    """A client's side of a whole session, as a real client writes it: handshake,
    declares with argument tables of every field type, publishes with all properties,
    confirms, acks, a transaction, a consumer, heartbeats, closes."""
    args = every_type_table()
    props = _every_property()
    big = b"b" * 300
    out = [PROTOCOL_HEADER]

    def m(channel: int, method: object) -> None:
        out.append(frame.marshal(method, channel))

    m(0, commands.Connection.StartOk(client_properties={"product": "fuzz",
                                                        "capabilities": {"x": True}},
                                     response="\0guest\0guest"))
    m(0, commands.Connection.TuneOk(2047, 131072, 60))
    m(0, commands.Connection.Open("/"))
    m(1, commands.Channel.Open())
    out.append(declare_frame(1, "fz.q", args))
    out.append(raw_frame(1, 1, struct.pack(">HHH", 40, 10, 0) + b"\x04fz.x\x06direct\x00"
                         + args))
    m(1, commands.Queue.Bind(queue="fz.q", exchange="fz.x", routing_key="k",
                             arguments={"a": 1, "b": [1, "x"]}))
    m(1, commands.Basic.Qos(0, 10, False))
    m(1, commands.Confirm.Select())
    out.append(publish_frames(1, "fz.q", props, b"hello", exchange=""))
    out.append(frame.marshal(commands.Basic.Publish(exchange="fz.x", routing_key="k",
                                                    mandatory=True), 1))
    out.append(raw_frame(2, 1, struct.pack(">HHQ", 60, 0, len(big)) + props))
    if split_body:
        out += [body_frame(1, big[:100]), body_frame(1, big[100:])]
    else:
        out.append(body_frame(1, big))
    m(1, commands.Basic.Publish(exchange="", routing_key="fz.q"))
    out.append(frame.marshal(ContentHeader(0, 0, commands.Basic.Properties(
        content_type="t", delivery_mode=2, headers={"h": {"n": [1, 2.5, None]}})), 1))
    m(1, commands.Basic.Consume(queue="fz.q", consumer_tag="c1",
                                arguments={"x-priority": 5}))
    out.append(struct.pack(">BHI", 8, 0, 0) + b"\xce")
    m(1, commands.Basic.Ack(1, False))
    m(1, commands.Basic.Nack(2, True, True))
    m(1, commands.Basic.Reject(3, False))
    m(2, commands.Channel.Open())
    m(2, commands.Tx.Select())
    out.append(frame.marshal(commands.Basic.Publish(routing_key="fz.q"), 2)
               + frame.marshal(ContentHeader(0, 3, commands.Basic.Properties(
                   message_id="m", timestamp=datetime.datetime(2030, 1, 1,
                                                               tzinfo=datetime.UTC))), 2)
               + frame.marshal(ContentBody(b"abc"), 2))
    m(2, commands.Tx.Commit())
    m(1, commands.Basic.Cancel("c1"))
    m(1, commands.Queue.Delete(queue="fz.q"))
    m(1, commands.Channel.Close(200, "bye", 0, 0))
    m(0, commands.Connection.Close(200, "bye", 0, 0))
    return b"".join(out)


def _deep_session() -> bytes:
    """Tables at the bound, so that mutations land on both sides of it."""
    return b"".join((
        PROTOCOL_HEADER,
        declare_frame(1, "fz.deep", nested_tables(MAX_TABLE_DEPTH)),
        publish_frames(1, "fz.deep", headers_properties(nested_arrays(MAX_TABLE_DEPTH)), b"a"),
        declare_frame(1, "fz.deep2", nested_arrays(MAX_TABLE_DEPTH - 1)),
        publish_frames(1, "fz.deep", headers_properties(nested_tables(MAX_TABLE_DEPTH - 1)),
                       b"b"),
    ))


def _server_session() -> bytes:
    """The other direction (ackmq's own clients decode it): deliveries, get-ok, a return,
    confirms, with all properties and bodies split over frames."""
    props = _every_property()
    return b"".join((
        frame.marshal(commands.Connection.Tune(2047, 131072, 60), 0),
        frame.marshal(commands.Channel.OpenOk(), 1),
        encode_deliver(1, "ctag", 2**64 - 1, True, "fz.x", "k", props, b"d" * 500, 200),
        encode_get_ok(1, 7, False, "", "fz.q", 3, props, b"g", 131072),
        encode_return(1, 312, "NO_ROUTE", "fz.x", "k", b"\x00\x00", b"", 131072),
        encode_ack(1, 5, True),
        frame.marshal(commands.Queue.DeclareOk("fz.q", 1, 0), 1),
    ))


SESSIONS = [_session(False), _session(True), _deep_session(), _server_session()]
SERVER_SIDE = {3}  # streams without the protocol header

# A mutation: (kind, where as a fraction of the stream, a value).
mutations = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.floats(0, 1, allow_nan=False),
        st.integers(0, 2**32 - 1),
        st.binary(max_size=8),
    ),
    min_size=1, max_size=4,
)
def _check_events(events: list[object]) -> None:
    """Content the decoder accepted must be readable by the broker without raising."""
    for event in events:
        if isinstance(event, Publish | Content):
            read_all(PropertiesView(event.properties))
            peek_routing_fields(event.properties)


def _run(data: bytes, cuts: list[int], frame_max: int = 131072, header: bool = True
         ) -> tuple[list[object], tuple | None]:
    """Feed `data` cut at `cuts`; the events and the error (code, text, ids) if any.
    Only FrameError (BadProtocolHeader is one) may come out of feed."""
    dec = Decoder(frame_max=frame_max, expect_header=header)
    events: list[object] = []
    pos = 0
    try:
        for cut in [*sorted(cuts), len(data)]:
            events += dec.feed(data[pos:cut])
            pos = cut
    except FrameError as err:
        events += getattr(err, "events", [])
        return events, (type(err), err.reply_code, err.reply_text, err.class_id,
                        err.method_id)
    return events, None


def _same(a: list[object], b: list[object]) -> bool:
    """Events equal by value (pamqp method objects compare by identity)."""
    def key(e: object) -> object:
        if isinstance(e, Method):
            return ("M", e.channel, type(e.method), repr(vars_or_slots(e.method)))
        if isinstance(e, Content):
            return ("C", e.channel, type(e.method), e.properties, e.body)
        return e
    return [key(e) for e in a] == [key(e) for e in b]


def vars_or_slots(obj: object) -> dict[str, object]:
    slots = getattr(type(obj), "__slots__", ())
    return {s: getattr(obj, s, None) for s in slots} or dict(vars(obj))


# ~2 ms an example: 3,000 take ~6 s. FUZZ_EXAMPLES=60000 for a longer campaign.
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "3000")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(session=st.sampled_from(range(len(SESSIONS))), ops=mutations,
       cuts=st.lists(st.integers(0, 4000), max_size=3),
       frame_max=st.sampled_from([131072, 4096, 0]))
@example(session=0, ops=[("len32", 0.0, 0, b"")], cuts=[], frame_max=131072)
def test_B1_mutated_sessions_give_events_or_a_frame_error(session: int, ops: list,
                                                          cuts: list[int],
                                                          frame_max: int) -> None:
    """Any mutation of a valid stream (either direction): the decoder returns events or
    raises FrameError (nothing else), the same whichever way TCP cut the bytes, and every
    content header it accepted reads back property by property without raising."""
    data = mutate(SESSIONS[session], ops)
    cuts = [c for c in cuts if c <= len(data)]
    header = session not in SERVER_SIDE
    whole, error = _run(data, [], frame_max, header)
    _check_events(whole)
    pieces, error_cut = _run(data, cuts, frame_max, header)
    assert error_cut == error
    assert _same(pieces, whole)


def test_the_seed_sessions_decode_cleanly() -> None:
    """The fuzz seeds are valid: every frame decodes (else mutations test little)."""
    for i, data in enumerate(SESSIONS):
        events, error = _run(data, [], header=i not in SERVER_SIDE)
        assert error is None
        if i in SERVER_SIDE:
            assert [type(e) for e in events] == [Method, Method, Content, Content, Content,
                                                 Method, Method]
            assert events[2].method.delivery_tag == 2**64 - 1
            continue
        if data is SESSIONS[2]:
            assert [type(e) for e in events[1:]] == [Method, Publish, Method, Publish]
            continue
        assert sum(isinstance(e, Publish) for e in events) == 4
        view = PropertiesView(next(e for e in events if isinstance(e, Publish)).properties)
        values = read_all(view)
        assert values["headers"]["k11"] == decimal.Decimal("123.45")
        assert values["headers"]["k10"] == -2.25
        assert values["cluster_id"] == "cluster"

