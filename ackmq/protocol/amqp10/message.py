"""AMQP 1.0 message sections (part 3.2): a transfer's payload is a sequence of described
values, in this order, each optional except the body:

    0x70 header                  list (durable, priority, ttl, first-acquirer, delivery-count)
    0x71 delivery-annotations    map
    0x72 message-annotations     map
    0x73 properties              list (message-id ... reply-to-group-id)
    0x74 application-properties  map (string keys, simple values)
    body: one or more 0x75 data (binary), or one or more 0x76 amqp-sequence (list),
          or one 0x77 amqp-value (any value)
    0x78 footer                  map

`decode_message(payload)` -> `Message10`; `Message10.encode()` -> payload (in the order
above). A section twice (but data / amqp-sequence), mixed body kinds or an unknown
descriptor are DecodeErrors; the order is not checked (see decode_message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ackmq.protocol.amqp10.composite import Composite, from_fields
from ackmq.protocol.amqp10.types import DecodeError, Described, decode, encode

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = (
    0x74, 0x75, 0x76, 0x77, 0x78)
BODY_KINDS = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
_SYMBOLIC = {
    "amqp:header:list": HEADER, "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS, "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES, "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE, "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}


@dataclass(slots=True)
class Message10:
    header: Composite | None = None
    delivery_annotations: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    properties: Composite | None = None
    application_properties: dict[Any, Any] | None = None
    # (DATA, bytes) ..., (AMQP_SEQUENCE, list) ..., or one (AMQP_VALUE, value)
    body: list[tuple[int, Any]] = field(default_factory=list)
    footer: dict[Any, Any] | None = None

    def encode(self) -> bytes:
        out = []
        if self.header is not None:
            out.append(self.header.encode_amqp())
        for code, m in ((DELIVERY_ANNOTATIONS, self.delivery_annotations),
                        (MESSAGE_ANNOTATIONS, self.message_annotations)):
            if m is not None:
                out.append(b"\x00\x53" + bytes((code,)) + encode(m))
        if self.properties is not None:
            out.append(self.properties.encode_amqp())
        if self.application_properties is not None:
            out.append(b"\x00\x53\x74" + encode(self.application_properties))
        out.append(encode_body(self.body))
        if self.footer is not None:
            out.append(b"\x00\x53\x78" + encode(self.footer))
        return b"".join(out)

    @property
    def data(self) -> bytes | None:
        """The body as bytes when it is one data section, else None."""
        if len(self.body) == 1 and self.body[0][0] == DATA:
            return bytes(self.body[0][1])
        return None


def encode_body(body: list[tuple[int, Any]]) -> bytes:
    return b"".join(b"\x00\x53" + bytes((code,)) + encode(v) for code, v in body)


def section_code(descriptor: Any) -> int | None:
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return int(descriptor) if HEADER <= descriptor <= FOOTER else None
    if isinstance(descriptor, str):
        return _SYMBOLIC.get(descriptor)
    return None


def decode_sections(payload: Any, starts: list[int] | None = None) -> list[tuple[int, Any]]:
    """(section code, value) of each section, in order; DecodeError if malformed.
    `starts`: each section's offset in the payload is appended there."""
    out = []
    pos, n = 0, len(payload)
    while pos < n:
        if starts is not None:
            starts.append(pos)
        v, pos = decode(payload, pos)
        if not isinstance(v, Described):
            raise DecodeError("a message section is not a described value")
        code = section_code(v.descriptor)
        if code is None:
            raise DecodeError(f"unknown message section {v.descriptor!r}")
        out.append((code, v.value))
    return out


def decode_message(payload: Any, starts: list[int] | None = None) -> Message10:
    """Sections in any order are read (RabbitMQ 4 reads them so, and
    rabbitmq-amqp-python-client 1.0 writes a null amqp-value ahead of its properties);
    a section other than data/amqp-sequence twice, or mixed body kinds, is refused.
    `starts`: as decode_sections'."""
    m = Message10()
    seen: set[int] = set()
    for code, value in decode_sections(payload, starts):
        if code in BODY_KINDS:
            if m.body and (m.body[0][0] != code or code == AMQP_VALUE):
                raise DecodeError("mixed or repeated body sections")
            _check_kind(code, value)
            m.body.append((code, value))
            continue
        if code in seen:
            raise DecodeError("a message section repeated")
        seen.add(code)
        if code == HEADER:
            m.header = from_fields("header", value)
        elif code == PROPERTIES:
            m.properties = from_fields("properties", value)
        else:
            if value is not None and not isinstance(value, dict):
                raise DecodeError("an annotations or properties section is not a map")
            if code == DELIVERY_ANNOTATIONS:
                m.delivery_annotations = value
            elif code == MESSAGE_ANNOTATIONS:
                m.message_annotations = value
            elif code == APPLICATION_PROPERTIES:
                m.application_properties = value
            else:
                m.footer = value
    return m


def _check_kind(code: int, value: Any) -> None:
    if code == DATA and not isinstance(value, bytes):
        raise DecodeError("a data section is not binary")
    if code == AMQP_SEQUENCE and not isinstance(value, list):
        raise DecodeError("an amqp-sequence section is not a list")
