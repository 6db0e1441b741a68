"""In-process tests of the AMQP field-table codec (protocol/amqp/table.py) and of the
property splices and readers in properties.py that stand on it, against pamqp's own
encoder and decoder: the grammar every module (dedup, streams, Spark, STOMP) now uses."""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from ackmq.protocol.amqp.properties import (
    FIELDS,
    FLAGS,
    PropertiesView,
    encode_fields,
    header_value,
    properties_with_header,
    properties_with_headers,
    read_into,
    read_plan,
)
from ackmq.protocol.amqp.table import (
    MAX_TABLE_DEPTH,
    TableTooDeep,
    decode_table,
    encode_table,
    encode_value,
    find_value,
    read_value,
    skip_table,
    table_entries,
)

_U32 = struct.Struct(">I")


def _table(entries: bytes) -> bytes:
    return _U32.pack(len(entries)) + entries


def _entry(key: str, value: bytes) -> bytes:
    k = key.encode()
    return bytes((len(k),)) + k + value


# One hand-encoded value per AMQP 0-9-1 field type RabbitMQ knows (and pamqp reads).
EVERY_TYPE: dict[str, bytes] = {
    "t": b"t\x01",
    "b": b"b" + struct.pack(">b", -5),
    "B": b"B\xfe",
    "s": b"s" + struct.pack(">h", -300),
    "u": b"u" + struct.pack(">H", 65000),
    "I": b"I" + struct.pack(">i", -70000),
    "i": b"i" + struct.pack(">I", 4_000_000_000),
    "l": b"l" + struct.pack(">q", -(2**40)),
    "L": b"L" + struct.pack(">q", 2**50),
    "f": b"f" + struct.pack(">f", 1.5),
    "d": b"d" + struct.pack(">d", -2.25),
    "D": b"D" + struct.pack(">Bi", 2, 12345),
    "S": b"S" + _U32.pack(5) + b"hello",
    "x": b"x" + _U32.pack(3) + b"\x00\xff\x01",
    "A": b"A" + _U32.pack(3) + b"t\x00V",
    "F": b"F" + _table(_entry("k", b"S" + _U32.pack(1) + b"v")),
    "T": b"T" + struct.pack(">Q", 1_700_000_000),
    "V": b"V",
}


@pytest.mark.parametrize("tag", sorted(EVERY_TYPE))
def test_every_field_type_decodes_as_pamqp(tag: str) -> None:
    raw = _table(_entry("v", EVERY_TYPE[tag]))
    expected = pamqp_decode.field_table(raw)[1]
    assert decode_table(raw) == expected
    assert decode_table(raw, lenient=True) == expected
    assert skip_table(raw, 0) == len(raw)
    at = find_value(raw, 0, b"v")
    assert at == 4 + 2 and read_value(raw, at, len(raw))[0] == expected["v"]


def test_a_table_of_every_type_decodes_skips_and_splits_as_pamqp() -> None:
    raw = _table(b"".join(_entry(f"k{tag}", v) for tag, v in sorted(EVERY_TYPE.items())))
    expected = pamqp_decode.field_table(raw)[1]
    assert decode_table(raw) == expected
    assert skip_table(raw, 0) == len(raw)
    assert [k for k, _ in table_entries(raw, 0, len(raw))] == [k.encode() for k in expected]
    for key, value in expected.items():  # find steps over every other type
        at = find_value(raw, 0, key.encode())
        assert at is not None and read_value(raw, at, len(raw))[0] == value
    assert find_value(raw, 0, b"absent") is None


# Values pamqp encodes without loss (its floats are 32-bit, so only those that fit).
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0.5, -1.25, 1024.0]),
    st.text(max_size=20),
    st.binary(max_size=10).map(bytearray),
    st.none(),
    st.integers(0, 2**31).map(lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)),
    st.tuples(st.integers(0, 5), st.integers(-(2**31), 2**31 - 1)).map(
        lambda p: decimal.Decimal(p[1]).scaleb(-p[0])),
)
keys = st.text(min_size=1, max_size=12).filter(lambda k: len(k.encode()) <= 255)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(keys, inner, max_size=3), max_leaves=12)
tables = st.dictionaries(keys, values, max_size=6)


@settings(max_examples=300, deadline=None)
@given(tables)
def test_pamqp_encoded_tables_decode_as_pamqp_decodes_them(table: dict) -> None:
    raw = pamqp_encode.field_table(table)
    assert decode_table(raw) == pamqp_decode.field_table(raw)[1]
    assert skip_table(raw, 0) == len(raw)


@settings(max_examples=300, deadline=None)
@given(tables)
def test_our_encoding_round_trips_through_pamqp_and_ours(table: dict) -> None:
    raw = encode_table(table)
    decoded = pamqp_decode.field_table(raw)[1]
    assert decoded == table  # (floats go as 'd', RabbitMQ's choice: exact both ways)
    assert decode_table(raw) == decoded


@pytest.mark.parametrize("value", ["text", True, False, None, bytearray(b"\x01\x02"),
                                   {"a": "b"}, ["x", True],
                                   datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC),
                                   decimal.Decimal("12.34")])
def test_values_of_the_types_pamqp_also_picks_encode_byte_equal(value: object) -> None:
    assert encode_value(value) == pamqp_encode.encode_table_value(value)


@pytest.mark.parametrize("value", [0, 1, -1, 127, 70000, 2**40, -(2**63)])
def test_integers_are_signed_64_bit_as_rabbitmq_writes_them(value: int) -> None:
    assert encode_value(value) == b"l" + struct.pack(">q", value)


# ---- depth limit ------------------------------------------------------------------------

def _nested_tables(depth: int) -> bytes:
    """A table at level 1 holding tables down to level `depth`."""
    raw = _table(_entry("leaf", b"t\x01"))
    for _ in range(depth - 1):
        raw = _table(_entry("n", b"F" + raw))
    return raw


def _nested_arrays(depth: int) -> bytes:
    """A table (level 1) whose one value is an array `depth - 1` arrays deep."""
    value = b"t\x01"
    for _ in range(depth - 1):
        value = b"A" + _U32.pack(len(value)) + value
    return _table(_entry("a", value))


@pytest.mark.parametrize("nest", [_nested_tables, _nested_arrays])
def test_depth_limit_is_max_table_depth(nest) -> None:
    ok = nest(MAX_TABLE_DEPTH)
    assert decode_table(ok) == pamqp_decode.field_table(ok)[1]
    assert skip_table(ok, 0) == len(ok)
    deep = nest(MAX_TABLE_DEPTH + 1)
    with pytest.raises(TableTooDeep):
        decode_table(deep)
    with pytest.raises(TableTooDeep):
        decode_table(deep, lenient=True)
    with pytest.raises(TableTooDeep):
        skip_table(deep, 0)


# ---- strict vs lenient decoding ---------------------------------------------------------

def test_lenient_decodes_a_non_utf8_key_losslessly_strict_refuses_it() -> None:
    raw = _table(b"\x02\xff\xfe" + b"t\x01")
    with pytest.raises(ValueError):
        decode_table(raw)
    (key,) = decode_table(raw, lenient=True)
    assert key.encode("utf-8", "surrogateescape") == b"\xff\xfe"


def test_lenient_gives_an_out_of_range_timestamp_as_its_integer() -> None:
    stamp = 2**63 - 1
    raw = _table(_entry("t", b"T" + struct.pack(">Q", stamp)))
    with pytest.raises(ValueError):
        decode_table(raw)
    assert decode_table(raw, lenient=True) == {"t": stamp}


@pytest.mark.parametrize("raw", [
    b"\x00\x00\x00\x05\x01k",                       # entry without a value
    _table(_entry("k", b"S" + _U32.pack(99) + b"x")),  # string past the table
    _table(_entry("k", b"Z")),                       # unknown type
    _table(_entry("k", b"t\x01")) + b"\x00",         # trailing byte
    b"\x00\x00",                                     # truncated length
])
def test_malformed_tables_are_value_errors(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_table(raw)
    with pytest.raises(ValueError):
        decode_table(raw, lenient=True)


# ---- properties_with_header, encode_fields, read_into, header_value ----------------------

short_text = st.text(max_size=30).filter(lambda s: len(s.encode()) <= 255)
string_headers = st.dictionaries(st.text(min_size=1, max_size=12).filter(
    lambda k: k not in ("x-ackmq-seq", "x-stream-offset")), st.text(max_size=12), max_size=4)
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short_text,
    content_encoding=st.none() | short_text,
    headers=st.none() | string_headers,
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
)  # cluster_id: pamqp refuses a non-empty one
# Where pamqp also writes 'l' (beyond 32 bits): a broker seq is (epoch << 40) | n.
longs = st.integers(2**32, 2**63 - 1) | st.integers(-(2**63), -(2**31) - 1)


def _with(props: commands.Basic.Properties, **changes: object) -> commands.Basic.Properties:
    d = {name: getattr(props, name) for _, name, _ in FIELDS}
    d.update(changes)
    return commands.Basic.Properties(**d)


@settings(max_examples=300, deadline=None)
@given(properties, st.sampled_from(["x-ackmq-seq", "x-stream-offset", "k"]), longs)
def test_properties_with_header_is_byte_equal_to_pamqp(props, key, value) -> None:
    raw = props.marshal()
    headers = {**(props.headers or {}), key: value}
    expected = _with(props, headers=headers).marshal()
    got = properties_with_header(raw, key, value)
    if all(k < key for k in headers if k != key):  # pamqp writes keys sorted, we append
        assert got == expected
    else:
        assert PropertiesView(got).headers == PropertiesView(expected).headers
        assert got[:2] == expected[:2] and len(got) == len(expected)


@settings(max_examples=300, deadline=None)
@given(properties, st.sampled_from(["x-ackmq-seq", "x-stream-offset"]),
       st.integers(-(2**63), 2**63 - 1) | st.booleans() | st.text(max_size=5))
def test_properties_with_header_equals_the_general_splice(props, key, value) -> None:
    raw = props.marshal()
    assert properties_with_header(raw, key, value) == properties_with_headers(raw, {key: value})


@settings(max_examples=200, deadline=None)
@given(properties)
def test_encode_fields_is_byte_equal_to_pamqp(props) -> None:
    values = {name: getattr(props, name) for _, name, _ in FIELDS}
    # pamqp writes no empty shortstr; RabbitMQ (and encode_fields) would
    values = {k: (None if v == "" else v) for k, v in values.items()}
    if values["headers"] is not None:  # pamqp writes keys sorted
        values["headers"] = dict(sorted(values["headers"].items()))
    ts = values["timestamp"]
    if ts is not None:
        values["timestamp"] = int(ts.timestamp())
    assert encode_fields(values) == props.marshal()


@settings(max_examples=200, deadline=None)
@given(properties)
def test_read_into_and_header_value_read_as_the_view(props) -> None:
    raw = props.marshal()
    view = PropertiesView(raw)
    names = tuple(name for _, name, _ in FIELDS)
    got = read_into(raw, read_plan(names), [None] * len(names))
    assert got == [getattr(view, n) if n in view else None for n in names]
    for key in (props.headers or {}):
        assert header_value(raw, key) == view.headers[key]
    assert header_value(raw, "not-there") is None


def test_flags_are_the_amqp_bits_in_wire_order() -> None:
    bits = [flag for flag, _, _ in FIELDS]
    assert bits == [1 << (15 - i) for i in range(14)]
    assert FLAGS["headers"] == 0x2000 and FLAGS["user_id"] == 0x0010
    assert FLAGS["reply_to"] == 0x0200
