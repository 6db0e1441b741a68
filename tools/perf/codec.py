"""Codec throughput: fast paths vs pure pamqp (not a test; prints figures).

    python -m tools.perf.codec [count]

Decode: `count` back-to-back basic.publish + header + 100-byte body with typical
properties (content-type, delivery-mode 2, message-id, timestamp), fed in 64 KiB chunks.
Encode: `count` basic.deliver + header + body, and `count` basic.ack.
"""

from __future__ import annotations

import datetime
import sys
import time

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from ackmq.protocol.amqp import (
    Decoder,
    encode_ack,
    encode_deliver,
    encode_properties,
    encode_publish,
)
from ackmq.protocol.amqp.constants import FRAME_MAX_DEFAULT

FRAME_MAX = FRAME_MAX_DEFAULT
BODY = b"x" * 100
PROPS = commands.Basic.Properties(
    content_type="application/json",
    delivery_mode=2,
    message_id="msg-000001",
    timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
)


def _rate(count: int, fn, repeat: int = 5) -> float:
    """Best of `repeat` runs: the machine is shared, the minimum is the codec's cost."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def _publishes(count: int) -> bytes:
    raw = encode_properties(PROPS)
    one = encode_publish(1, "amq.direct", "orders", False, False, raw, BODY, FRAME_MAX)
    return one * count


def decode_fast(data: bytes, count: int) -> float:
    def run() -> None:
        dec = Decoder(expect_header=False)
        got = 0
        for i in range(0, len(data), 65536):
            got += len(dec.feed(data[i : i + 65536]))
        assert got == count, got

    return _rate(count, run)


def decode_pamqp(data: bytes, count: int) -> float:
    def run() -> None:
        buf = b""
        got = 0
        for i in range(0, len(data), 65536):
            buf += data[i : i + 65536]
            pos = 0
            while True:
                try:
                    used, _channel, value = frame.unmarshal(buf[pos:])
                except Exception:  # noqa: BLE001 - partial frame
                    break
                pos += used
                if isinstance(value, ContentBody):
                    got += 1
            buf = buf[pos:]
        assert got == count, got

    return _rate(count, run)


def encode_fast(count: int) -> float:
    raw = encode_properties(PROPS)

    def run() -> None:
        for tag in range(1, count + 1):
            encode_deliver(1, "ctag-1", tag, False, "amq.direct", "orders", raw, BODY, FRAME_MAX)

    return _rate(count, run)


def encode_pamqp(count: int) -> float:
    def run() -> None:
        for tag in range(1, count + 1):
            method = commands.Basic.Deliver("ctag-1", tag, False, "amq.direct", "orders")
            b"".join(
                (
                    frame.marshal(method, 1),
                    frame.marshal(ContentHeader(0, len(BODY), PROPS), 1),
                    frame.marshal(ContentBody(BODY), 1),
                )
            )

    return _rate(count, run)


def ack_fast(count: int) -> float:
    return _rate(count, lambda: [encode_ack(1, tag, False) for tag in range(count)])


def ack_pamqp(count: int) -> float:
    return _rate(
        count, lambda: [frame.marshal(commands.Basic.Ack(tag, False), 1) for tag in range(count)]
    )


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    data = _publishes(count)
    rows = [
        ("publish decode", decode_fast(data, count), decode_pamqp(data, count)),
        ("deliver encode", encode_fast(count), encode_pamqp(count)),
        ("ack encode", ack_fast(count), ack_pamqp(count)),
    ]
    acks = b"".join(encode_ack(1, tag, False) for tag in range(count))
    rows.append(("ack decode", decode_fast(acks, count), float("nan")))
    print(f"{'operation':16} {'fast/s':>12} {'pamqp/s':>12} {'speedup':>8}")
    for name, fast, slow in rows:
        print(f"{name:16} {fast:12,.0f} {slow:12,.0f} {fast / slow:8.1f}")


if __name__ == "__main__":
    main()
