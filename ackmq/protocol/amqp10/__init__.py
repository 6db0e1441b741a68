"""Sans-IO AMQP 1.0 codec: the type system (types.py), composite types and performatives
(composite.py), message sections (message.py) and framing (frames.py). Hand-written:
python-qpid-proton's codec comes with its engine (a C binding that owns the connection),
and uamqp is deprecated; tests prove this one reads and writes what proton does."""

from ackmq.protocol.amqp10.composite import Composite, error
from ackmq.protocol.amqp10.frames import (
    AMQP_HEADER,
    HEARTBEAT,
    SASL_HEADER,
    BadHeader,
    Decoder,
    Frame,
    FramingError,
    Heartbeat,
    ProtocolHeader,
    encode_frame,
    encode_frames,
)
from ackmq.protocol.amqp10.message import Message10, decode_message
from ackmq.protocol.amqp10.types import DecodeError, Described, Symbol, decode, encode

__all__ = [
    "AMQP_HEADER", "HEARTBEAT", "SASL_HEADER", "BadHeader", "Composite", "DecodeError",
    "Decoder", "Described", "Frame", "FramingError", "Heartbeat", "Message10",
    "ProtocolHeader", "Symbol", "decode", "decode_message", "encode", "encode_frame",
    "encode_frames", "error",
]
