"""What a client of another protocol sent first: the first bytes on a port named, so a
broker that cannot speak them can log one line a person understands ("an MQTT CONNECT")
instead of a byte string, and answer at once instead of waiting for a handshake that
will never come. Sans-IO: bytes in, a phrase (or None) out.
"""

from __future__ import annotations

_HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ",
                 b"CONNECT ", b"TRACE ", b"PRI * HTTP/2")
STOMP_FRAME = "a STOMP frame"
_STREAM_OPENERS = {0x0011: "peer-properties", 0x0012: "SASL handshake"}


def _mqtt_connect(head: bytes) -> bool:
    """An MQTT CONNECT: packet type 1, a remaining length (1-4 bytes, varint), then the
    protocol name "MQTT" (3.1.1, 5) or "MQIsdp" (3.1) as a length-prefixed string."""
    if not head or head[0] != 0x10:
        return False
    i = 1
    while i < len(head) and i <= 4 and head[i] & 0x80:
        i += 1
    rest = head[i + 1:]
    return rest.startswith((b"\x00\x04MQTT", b"\x00\x06MQIsdp"))


def _stream_frame(head: bytes) -> str | None:
    """RabbitMQ's stream protocol: a 4-byte size, then key and version (2 bytes each); a
    client opens with peer-properties or a SASL handshake, version 1 or 2."""
    if len(head) < 8:
        return None
    size = int.from_bytes(head[:4], "big")
    key = int.from_bytes(head[4:6], "big")
    version = int.from_bytes(head[6:8], "big")
    if 0 < size < 1 << 20 and key in _STREAM_OPENERS and version in (1, 2):
        return _STREAM_OPENERS[key]
    return None


def describe(head: bytes) -> str | None:
    """A phrase naming the protocol `head` (the first bytes a client sent) belongs to,
    or None when it is none this module knows."""
    if len(head) >= 3 and head[0] == 0x16 and head[1] == 0x03:
        return "a TLS ClientHello"
    if head.startswith(_HTTP_METHODS):
        return "an HTTP request"
    if _mqtt_connect(head):
        return "an MQTT CONNECT"
    stream = _stream_frame(head)
    if stream is not None:
        return f"a RabbitMQ stream protocol {stream} frame"
    if head.startswith(b"AMQP") and len(head) >= 8:
        return "an AMQP protocol header for version " + "-".join(str(b) for b in head[4:8])
    if head.lstrip(b"\r\n").startswith((b"CONNECT\n", b"CONNECT\r\n", b"STOMP\n",
                                        b"STOMP\r\n")):
        return STOMP_FRAME
    return None


def name_bytes(head: bytes) -> str:
    """`describe(head)` with the first bytes shown, or the bytes alone: one log line's
    worth (at most 16 bytes)."""
    what = describe(head)
    shown = repr(bytes(head[:16]))
    return f"{what} ({shown})" if what else f"bytes {shown}"
