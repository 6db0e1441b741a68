"""Sans-IO AMQP 0-9-1 codec: `Decoder` turns bytes into events, `encode_*` turn
arguments into bytes. No sockets, no asyncio; shared by the server and the clients."""

from . import constants
from .constants import FRAME_END, PROTOCOL_HEADER, REPLY_TEXT
from .decoder import Decoder
from .encoder import (
    HEARTBEAT,
    build_method,
    encode_ack,
    encode_deliver,
    encode_get_ok,
    encode_method,
    encode_nack,
    encode_publish,
    encode_reject,
    encode_return,
)
from .events import (
    BadProtocolHeader,
    ChannelFault,
    Content,
    Event,
    FrameError,
    Heartbeat,
    Method,
    ProtocolHeader,
    Publish,
)
from .properties import (
    EMPTY_PROPERTIES,
    PropertiesView,
    check_properties,
    decode_properties,
    encode_properties,
    properties_with_headers,
)
from .table import decode_table, encode_table

__all__ = [
    "BadProtocolHeader",
    "build_method",
    "ChannelFault",
    "Content",
    "Decoder",
    "EMPTY_PROPERTIES",
    "Event",
    "FRAME_END",
    "FrameError",
    "HEARTBEAT",
    "Heartbeat",
    "Method",
    "PROTOCOL_HEADER",
    "PropertiesView",
    "ProtocolHeader",
    "Publish",
    "REPLY_TEXT",
    "check_properties",
    "constants",
    "decode_properties",
    "decode_table",
    "encode_ack",
    "encode_deliver",
    "encode_get_ok",
    "encode_method",
    "encode_nack",
    "encode_properties",
    "encode_publish",
    "encode_reject",
    "encode_return",
    "encode_table",
    "properties_with_headers",
]
