"""A stream-protocol message <-> the model's record (raw 0-9-1 properties + body), so what
one protocol appends every other reads (X2). Stream clients send AMQP 1.0 encoded
messages (RabbitMQ's stream format): they go through RabbitMQ's 1.0 <-> 0-9-1 mapping
(protocol/amqp10/amqp_map.py), marked durable (a stream keeps everything, and a confirm
means fsynced: P5c). A payload that is not an AMQP 1.0 message (a client may send any
bytes) is kept as the body with the header `x-ackmq-stream-raw` and given back to stream
consumers byte for byte.
"""

from __future__ import annotations

from ackmq.protocol.amqp.properties import encode_fields
from ackmq.protocol.amqp10 import Composite, DecodeError, decode_message
from ackmq.protocol.amqp10.amqp_map import from_amqp091, to_amqp091

RAW_HEADER = "x-ackmq-stream-raw"
_RAW_PROPERTIES = encode_fields({"delivery_mode": 2, "headers": {RAW_HEADER: True}})


def to_record(data: bytes | memoryview) -> tuple[bytes, bytes]:
    """(properties, body) to append for a published message."""
    try:
        m = decode_message(data)
    except (DecodeError, ValueError, TypeError, IndexError):
        return _RAW_PROPERTIES, bytes(data)
    if m.header is None:
        m.header = Composite("header", durable=True)
    else:
        m.header.durable = True
    return to_amqp091(m)


def from_record(properties: bytes, body: bytes, exchange: str, routing_key: str) -> bytes:
    """A stored record as the message a stream consumer gets."""
    if properties == _RAW_PROPERTIES:
        return body
    return from_amqp091(properties, body, exchange, routing_key).encode()
