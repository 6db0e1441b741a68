"""The per-message basic-property work, alone, for callgrind (deterministic: no I/O, no
timing): per round, four properties lists (none; delivery-mode; a text message with a
header; priority + expiration) each checked as the decoder does, peeked as the model
does and made a Message, one seq-header splice (a delivery) and one client encode.

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=out.cg \\
        python -m tools.perf.callgrind_properties N [model]

`model`: instead, per round, four publishes through the broker model (no store, no
sockets: three property lists into one queue, one to a consumer's queue) and one ack.
Per round = (total at N - total at 0) / N (docs/performance.md).
"""

from __future__ import annotations

import sys
from typing import Any

from ackmq.broker.message import Message
from ackmq.protocol.amqp.client_codec import encode_basic_properties
from ackmq.protocol.amqp.properties import (
    check_properties,
    peek_routing_fields,
    properties_with_header,
)


def main(n: int) -> None:
    raws = [b"\x00\x00", encode_basic_properties(delivery_mode=2),
            encode_basic_properties(content_type="text/plain", delivery_mode=2,
                                    message_id="m1", headers={"a": "b"}),
            encode_basic_properties(delivery_mode=1, priority=3, expiration="60000",
                                    correlation_id="c")]
    for _ in range(n):
        for raw in raws:
            check_properties(raw)
            peek_routing_fields(raw)
            Message("", "q", raw, b"x")
        properties_with_header(raws[1], "x-ackmq-seq", 5)
        encode_basic_properties(delivery_mode=2, message_id="m1")


class _Output:
    """A ChannelOutput that counts deliveries."""

    writable = True
    number = 1

    def __init__(self) -> None:
        self.n = 0

    def deliver(self, consumer: Any, delivery_tag: int, entry: Any) -> None:
        self.n += 1

    def unroutable(self, message: Any) -> None:
        pass

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        pass

    def consumer_cancelled(self, consumer_tag: str) -> None:
        pass

    def close(self, code: int, text: str) -> None:
        raise AssertionError(text)


def model(n: int) -> None:
    from ackmq.broker.broker import BrokerModel, NullScheduler

    b = BrokerModel(NullScheduler())
    b.start()
    vh = b.vhost("/")
    ch = b.open_channel(vh, "conn", _Output())
    vh.declare_queue("q", False, False, False, False, {"x-max-length": 10**9}, "conn")
    vh.declare_queue("d", False, False, False, False, {}, "conn")
    props = [b"\x00\x00", encode_basic_properties(delivery_mode=2, message_id="m"),
             encode_basic_properties(content_type="text/plain", headers={"a": "b"},
                                     priority=1, expiration="600000")]
    ch.basic_consume("d", "c", False, False, {})
    ch.start_consumer("c")
    for i in range(n):
        for p in props:
            ch.basic_publish("", "q", False, False, p, b"x" * 100)
        ch.basic_publish("", "d", False, False, props[1], b"y")
        ch.basic_ack(i + 1, False)
        if i % 50 == 0:
            b.end_of_turn()
    b.end_of_turn()


if __name__ == "__main__":
    (model if sys.argv[2:] == ["model"] else main)(int(sys.argv[1]))
