"""The AMQP 1.0 shovel ends in-process (V2, issue 38's speed): a destination's
disposition range settles the source in one disposition, and the kept conversions give
byte for byte what the full conversion gives, whatever the body holds."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import pytest

from ackmq.protocol.amqp.properties import encode_fields
from ackmq.protocol.amqp10 import decode_message
from ackmq.protocol.amqp10.amqp_map import from_amqp091, to_amqp091
from ackmq.protocol.amqp10.kept import trailing_data
from ackmq.shovel.ends import Dest10, Source10
from ackmq.shovel.worker import _Move


class _Peer:
    """What the ends call on a Peer10: sends and settlements, recorded."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.settled: list[tuple[int, int, int, str]] = []
        self.on_message: Any = None
        self.on_outcome: Any = None

    def send(self, payload: bytes) -> int:
        self.sent.append(payload)
        return len(self.sent) - 1

    def settle(self, first: int, last: int, count: int, outcome: str) -> None:
        self.settled.append((first, last, count, outcome))


PROPS = [encode_fields({"delivery_mode": 2}),
         encode_fields({"message_id": "m1", "headers": {"a": 1, "x-b": "y"}}),
         encode_fields({"content_type": "message/vnd.rabbitmq.amqp"})]
BODIES = [b"", b"x" * 100, b"\x00\x53\x75\xa0\x03abc", os.urandom(300),
          b"\x00Su\xa0\x05" * 70, b"y" * 70000]


@pytest.mark.parametrize("props", PROPS, ids=["durable", "id-and-headers", "amqp-sections"])
def test_V2_amqp10_kept_conversions_equal_the_full_ones(props: bytes) -> None:
    peer = _Peer()
    src, dest = Source10(peer), Dest10(peer, {}, {}, {})  # type: ignore[arg-type]
    got: list[tuple[str, str, bytes, bytes]] = []
    src.deliver = lambda t, x, k, p, b: got.append((x, k, p, b))
    for body in BODIES:
        for _ in range(2):  # the second time from what was kept
            payload = from_amqp091(props, body, "ex", "rk").encode()
            got.clear()
            src._message(1, payload, False)
            m = decode_message(payload)
            p, b = to_amqp091(m)
            assert got == [("ex", "rk", p, b)]
            assert dest.message("e2", "k2", p, b) == from_amqp091(p, b, "e2", "k2").encode()
    assert src._to091._kept and dest._from091._kept


def test_V2_amqp10_trailing_data_is_found_or_refused() -> None:
    payload = from_amqp091(PROPS[0], b"z" * 300, "", "q").encode()
    at, head = trailing_data(payload)
    assert (head, payload[at + head:]) == (8, b"z" * 300)
    assert trailing_data(payload[:-1]) == (-1, 0)


def test_V2_amqp10_disposition_range_settles_the_source_in_one() -> None:
    """Three transfers accepted by one disposition first=0 last=2: one disposition at
    the source (first 10, last 12), not three."""
    src_peer, dest_peer = _Peer(), _Peer()
    src, dest = Source10(src_peer), Dest10(dest_peer, {}, {}, {})  # type: ignore[arg-type]
    move = _Move.__new__(_Move)
    move.source, move.dest, move.pending = src, dest, OrderedDict()
    move.w = type("W", (), {"moved": 0})()  # type: ignore[assignment]
    move.done, move.published, move.limit, move.ended = 0, 3, None, _Never()  # type: ignore[assignment]
    move.pending.update({1: 10, 2: 11, 3: 12})
    dest.on_confirm(move.confirmed)
    dest_peer.on_outcome(0, 2, True)
    assert src_peer.settled == [(10, 12, 3, "accepted")]
    assert not move.pending and move.done == 3


class _Never:
    def done(self) -> bool:
        return False

    def set_result(self, _: Any) -> None:  # pragma: no cover - not reached
        raise AssertionError
