"""AMQP 0-9-1 wire constants and reply codes (names as in the spec's constant table)."""

from __future__ import annotations

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_HEADER_SIZE = 7  # type(1) + channel(2) + size(4)
FRAME_OVERHEAD = 8  # header + frame-end octet
FRAME_MIN_SIZE = 4096  # spec: frame-max may not be negotiated below this
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_MAX_DEFAULT = 131072  # the frame-max a server proposes and a client asks (RabbitMQ's)

# ackmq's opt-in delivery headers (S2, D10): the queue/consume arguments asking for them
# and the headers a delivery then carries
SEQ_HEADER = "x-ackmq-seq"  # the per-queue sequence number (S2)
DELIVERY_COUNT_HEADER = "x-delivery-count"  # redeliveries so far (D10, RabbitMQ's name)

# Class ids used by the codec.
CLASS_CONNECTION = 10
CLASS_CHANNEL = 20
CLASS_EXCHANGE = 40
CLASS_QUEUE = 50
CLASS_BASIC = 60
CLASS_CONFIRM = 85
CLASS_TX = 90

# (class id << 16) | method id of the frames with hand-written fast paths (decoder, client)
BASIC_PUBLISH = 0x003C0028
BASIC_RETURN = 0x003C0032
BASIC_DELIVER = 0x003C003C
BASIC_GET_OK = 0x003C0047
BASIC_ACK = 0x003C0050
BASIC_REJECT = 0x003C005A
BASIC_NACK = 0x003C0078

# Reply codes.
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

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
