"""C4: the basic-property flag layout is declared once (protocol/amqp/properties.py's
FIELDS) and every walk of it is derived from it: the generated straight-line walks the
hot path runs encode and read exactly what pamqp does, and no other module spells out a
flag bit."""

from __future__ import annotations

import ast
import datetime
import inspect
import pathlib
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from ackmq.protocol.amqp import properties as P
from ackmq.protocol.amqp.client_codec import PROPERTY_NAMES, encode_basic_properties
from ackmq.protocol.amqp.firehose import properties_table
from ackmq.protocol.amqp.property_names import RABBIT_NAMES

ROOT = pathlib.Path(__file__).resolve().parents[1] / "ackmq"
# pamqp leaves out an empty string (pika and the client, as before, send it) and sends an
# empty headers table (the client leaves it out): the comparison is over other values
short_text = st.text(min_size=1, max_size=40)
# (integers: pamqp picks the smallest field type, the table codec pika's; table.py's
# tests compare the codec; pamqp sorts the keys)
headers = st.dictionaries(st.text(min_size=1, max_size=12),
                          st.one_of(st.text(max_size=8), st.booleans()), min_size=1, max_size=1)
values = st.fixed_dictionaries({}, optional={
    "content_type": short_text, "content_encoding": short_text, "headers": headers,
    "delivery_mode": st.sampled_from([1, 2]), "priority": st.integers(0, 255),
    "correlation_id": short_text, "reply_to": short_text,
    "expiration": st.integers(0, 10**9).map(str), "message_id": short_text,
    "timestamp": st.integers(0, 2**31).map(
        lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)),
    "message_type": short_text, "user_id": short_text, "app_id": short_text,
})


@settings(max_examples=400, deadline=None)
@given(values)
def test_C4_generated_walks_equal_pamqp(v: dict[str, Any]) -> None:
    """The client's encoder gives pamqp's bytes; the broker's check accepts them and its
    peek and header offset read what pamqp reads."""
    props = commands.Basic.Properties(**v)
    raw = props.marshal()
    assert encode_basic_properties(**v) == raw
    P.check_properties(raw)
    assert P.peek_routing_fields(raw) == (props.delivery_mode, props.priority,
                                          props.expiration)
    spans = {name: (start, end) for _f, name, _k, start, end in P.spans(raw)}
    assert P._headers_at(raw) == (spans["headers"][0] if "headers" in spans else None)
    assert P.properties_with_header(raw, "x-ackmq-seq", 7) == \
        P.properties_with_headers(raw, {"x-ackmq-seq": 7})
    assert properties_table(raw)  # the firehose's walk reads it through


def test_C4_the_generated_walks_follow_fields() -> None:
    """Each generated walk tests the flags in FIELDS' order and no other bit (besides
    the unknown ones the check refuses and the peek's mask)."""
    order = [flag for flag, _n, _k in P.FIELDS]
    for fn in (P.check_properties, P._headers_at, P.properties_with_header,
               encode_basic_properties):
        steps = re.findall(r"    if flags & 0x([0-9a-f]{4}):|flags \|= 0x([0-9a-f]{4})$",
                           inspect.getsource(fn), re.M)
        flags = [int(a or b, 16) for a, b in steps]
        tested = [f for f in flags if f in order]
        assert tested, fn
        assert tested == sorted(set(tested), key=order.index)  # wire order, each once
    names = [n for _f, n, _k in P.FIELDS]
    assert list(inspect.signature(encode_basic_properties).parameters) == \
        [n for n in names if n != "cluster_id"]
    assert PROPERTY_NAMES == tuple(n for n in names if n not in ("headers", "cluster_id"))
    assert RABBIT_NAMES == tuple("type" if n == "message_type" else n for n in names)


def test_C4_no_module_but_properties_spells_a_flag_bit() -> None:
    """The flag bits as flag-word literals (0x8000 … 0x0004) appear only in FIELDS."""
    bits = {flag for flag, _n, _k in P.FIELDS}
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("protocol/amqp10/", "protocol/stream/")):
            continue  # AMQP 1.0's numbers (a short's bounds) and the stream protocol's
            # response bit (0x8000): other protocols' words, not 0-9-1's property flags
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, int) \
                    and not isinstance(node.value, bool) and node.value in bits:
                seg = ast.get_source_segment(path.read_text(), node) or ""
                if re.fullmatch(r"0x[0-9a-fA-F]{4}", seg):  # as flag words are written
                    found.append((rel, node.lineno, seg))
    assert [f for f in found if f[0] != "protocol/amqp/properties.py"] == []
    assert len([f for f in found if f[0] == "protocol/amqp/properties.py"]) == len(bits)
