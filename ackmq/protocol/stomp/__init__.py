"""Sans-IO STOMP 1.0/1.1/1.2: the frame codec (`Decoder`, `encode_frame`), destination
names (RabbitMQ's and ActiveMQ's) and the header <-> AMQP property mapping. No sockets,
no asyncio, no broker: the server's STOMP connection drives the broker with these."""

from .amqp_map import message_headers, properties_from_headers
from .codec import (
    MAX_BODY,
    MAX_HEADERS,
    MAX_LINE,
    VERSIONS,
    Decoder,
    Frame,
    HeartBeat,
    StompError,
    encode_frame,
    escape,
)
from .destinations import (
    Destination,
    DestinationError,
    format_destination,
    parse_destination,
)

__all__ = [
    "MAX_BODY",
    "MAX_HEADERS",
    "MAX_LINE",
    "VERSIONS",
    "Decoder",
    "Destination",
    "DestinationError",
    "Frame",
    "HeartBeat",
    "StompError",
    "encode_frame",
    "escape",
    "format_destination",
    "message_headers",
    "parse_destination",
    "properties_from_headers",
]
