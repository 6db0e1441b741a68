"""AMQP 0-9-1 wire constants and reply codes (names as in the spec's constant table)."""

from __future__ import annotations

from typing import Final

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_END_BYTE: Final = b"\xce"
FRAME_HEADER_SIZE: Final = 7  # type(1) + channel(2) + size(4)
FRAME_OVERHEAD: Final = 8  # header + frame-end octet
FRAME_MIN_SIZE: Final = 4096  # spec: frame-max may not be negotiated below this
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
FRAME_MAX_DEFAULT: Final = 131072  # the frame-max a server proposes and a client asks (RabbitMQ's)

# ackmq's opt-in delivery headers (S2, D10): the queue/consume arguments asking for them
# and the headers a delivery then carries
SEQ_HEADER: Final = "x-ackmq-seq"  # the per-queue sequence number (S2)
DELIVERY_COUNT_HEADER: Final = "x-delivery-count"  # redeliveries so far (D10, RabbitMQ's name)

# Class ids used by the codec.
CLASS_CONNECTION: Final = 10
CLASS_CHANNEL: Final = 20
CLASS_EXCHANGE: Final = 40
CLASS_QUEUE: Final = 50
CLASS_BASIC: Final = 60
CLASS_CONFIRM: Final = 85
CLASS_TX: Final = 90

# (class id << 16) | method id of the frames with hand-written fast paths (decoder, client)
BASIC_PUBLISH: Final = 0x003C0028
BASIC_RETURN: Final = 0x003C0032
BASIC_DELIVER: Final = 0x003C003C
BASIC_GET_OK: Final = 0x003C0047
BASIC_ACK: Final = 0x003C0050
BASIC_REJECT: Final = 0x003C005A
BASIC_NACK: Final = 0x003C0078

# Reply codes.
REPLY_SUCCESS: Final = 200
CONTENT_TOO_LARGE: Final = 311
NO_ROUTE: Final = 312
NO_CONSUMERS: Final = 313
CONNECTION_FORCED: Final = 320
INVALID_PATH: Final = 402
ACCESS_REFUSED: Final = 403
NOT_FOUND: Final = 404
RESOURCE_LOCKED: Final = 405
PRECONDITION_FAILED: Final = 406
FRAME_ERROR: Final = 501
SYNTAX_ERROR: Final = 502
COMMAND_INVALID: Final = 503
CHANNEL_ERROR: Final = 504
UNEXPECTED_FRAME: Final = 505
RESOURCE_ERROR: Final = 506
NOT_ALLOWED: Final = 530
NOT_IMPLEMENTED: Final = 540
INTERNAL_ERROR: Final = 541

REPLY_TEXT: dict[int, str] = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


def fit_shortstr(text: str) -> str:
    """Reply texts are shortstrs: cut to 255 bytes with "..." as RabbitMQ does."""
    data = text.encode("utf-8", "surrogateescape")  # a client's non-UTF-8 octets quoted
    if len(data) <= 255:
        return text
    return data[:252].decode("utf-8", "ignore") + "..."


def reply_text(code: int, detail: str) -> str:
    """RabbitMQ's reply text "NAME - detail", cut to fit a shortstr."""
    return fit_shortstr(f"{REPLY_TEXT.get(code, str(code))} - {detail}")
