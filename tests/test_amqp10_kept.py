"""The kept AMQP 1.0 conversions (protocol/amqp10/kept.py, issue 39) in process: over
property sets x bodies, from the first message and from what was kept, every output
is byte for byte what the full conversion gives (decode_message + to_amqp091 for a
transfer in, from_amqp091 + encode for a delivery out), and what cannot be kept
(no trailing data section, a footer, several data sections) is converted in full."""

from __future__ import annotations

import os
from typing import Any

import pytest
from proton import Message, symbol, ulong

from ackmq.protocol.amqp.properties import encode_fields
from ackmq.protocol.amqp10 import decode_message
from ackmq.protocol.amqp10.amqp_map import from_amqp091, to_amqp091
from ackmq.protocol.amqp10.kept import KEPT_BYTES, From091, To091, data_section
from ackmq.protocol.amqp10.message import DATA, encode_body

BODIES = [b"", b"x" * 100, b"\x00\x53\x75\xa0\x03abc", os.urandom(255), os.urandom(256),
          b"\x00Su\xa0\x05" * 70, b"y" * 70000]


def _proton(body: bytes, **kw: Any) -> bytes:
    m = Message(body=body, **kw)
    m.inferred = True  # bytes as a data section
    return bytes(m.encode())


NATIVE: list[Any] = [
    lambda b: _proton(b),
    lambda b: _proton(b, durable=True, priority=7, ttl=5.0, id="m-1", subject="s",
                      reply_to="/queues/r", correlation_id=ulong(9),
                      content_type="text/plain", user_id=b"guest",
                      properties={"k": "v", "n": 3},
                      annotations={symbol("x-opt-a"): "b"}),
    lambda b: _proton(b, id=ulong(5), creation_time=1700000000.0, group_id="g"),
    lambda b: _proton(b, priority=1, properties={"x": None}),
]
NATIVE_IDS = ["bare", "everything", "typed-ids", "null-property"]


@pytest.mark.parametrize("make", NATIVE, ids=NATIVE_IDS)
def test_amqp10_kept_transfer_conversion_equals_the_full_one(make: Any) -> None:
    conv = To091()
    for body in BODIES:
        for turn in range(2):  # the second time from what was kept
            payload = make(body)
            m, props, got_body = conv.convert(payload)
            full = decode_message(payload)
            assert (props, got_body) == to_amqp091(full)
            assert m.properties == full.properties
            assert m.message_annotations == full.message_annotations
            assert m.application_properties == full.application_properties
            if turn:
                assert m.body == []  # the kept one: no body of another message
    assert conv._kept


@pytest.mark.parametrize("payload", [
    # an amqp-value whose binary ends like a data section: not a trailing data section
    b"\x00\x53\x77\xa0\x08" + b"\x00\x53\x75\xa0\x03abc",
    # two data sections: the body is both
    data_section(b"one") + data_section(b"two"),
    # a footer after the data section
    data_section(b"body") + b"\x00\x53\x78\xc1\x01\x00",
], ids=["amqp-value", "two-data", "footer"])
def test_amqp10_kept_transfer_not_kept_when_not_one_trailing_data(payload: bytes) -> None:
    conv = To091()
    for _ in range(2):
        _, props, body = conv.convert(payload)
        assert (props, body) == to_amqp091(decode_message(payload))
    assert not conv._kept


PROPS = [encode_fields({}), encode_fields({"delivery_mode": 2, "priority": 3}),
         encode_fields({"message_id": "m1", "expiration": "6000",
                        "headers": {"a": 1, "x-b": "y", "x-delivery-count": 2}}),
         encode_fields({"content_type": "message/vnd.rabbitmq.amqp"})]


@pytest.mark.parametrize("props", PROPS, ids=["none", "durable", "id-and-headers",
                                              "amqp-sections"])
def test_amqp10_kept_delivery_conversion_equals_the_full_one(props: bytes) -> None:
    """Keyed as the front end keys it: the redelivery fields change the header."""
    conv = From091()
    for body in BODIES + [b"\x00\x53\x77\xa1\x02hi"]:
        for count, first in ((0, True), (0, True), (2, False), (2, False)):
            got = conv.payload((props, "ex", "rk", count, first), props, body,
                               lambda b, c=count, f=first: from_amqp091(
                                   props, b, "ex", "rk", c, f).encode())
            assert got == from_amqp091(props, body, "ex", "rk", count, first).encode()


def test_amqp10_data_section_is_the_codecs() -> None:
    for body in BODIES:
        assert data_section(body) == encode_body([(DATA, body)])


def test_amqp10_kept_not_for_large_sections() -> None:
    """Sections before the body larger than KEPT_BYTES are converted each time, not
    kept (what a link keeps stays bounded); the output is the same."""
    big = {"k": "v" * KEPT_BYTES}
    payload = _proton(b"body", properties=big)
    conv = To091()
    for _ in range(2):
        _, props, body = conv.convert(payload)
        assert (props, body) == to_amqp091(decode_message(payload))
    assert not conv._kept
    props = encode_fields({"headers": big})
    out = From091()
    for _ in range(2):
        got = out.payload((props, "", "q"), props, b"b",
                          lambda b: from_amqp091(props, b, "", "q").encode())
        assert got == from_amqp091(props, b"b", "", "q").encode()
    assert not out._kept
