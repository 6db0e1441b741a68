"""What a client needs beyond the shared codec: basic properties built from Python
values without pamqp's per-call validation (every publish pays for this), and a copy
of raw properties with a different headers table (dead-lettering from the client)."""

from __future__ import annotations

import datetime
import struct
from typing import Any

from .properties import PropertiesView
from .table import encode_table

_U16 = struct.Struct(">H").pack
_U64 = struct.Struct(">Q").pack


def _short(value: str | bytes, name: str) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    if len(data) > 255:
        raise ValueError(f"property {name} longer than 255 bytes")
    return bytes((len(data),)) + data


def encode_basic_properties(
    *,
    content_type: str | None = None,
    content_encoding: str | None = None,
    headers: dict[str, Any] | None = None,
    delivery_mode: int | None = None,
    priority: int | None = None,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    expiration: str | None = None,
    message_id: str | None = None,
    timestamp: datetime.datetime | int | None = None,
    message_type: str | None = None,
    user_id: str | None = None,
    app_id: str | None = None,
) -> bytes:
    """Raw content-header properties (flags + property list), as the broker keeps them."""
    flags = 0
    parts: list[bytes] = []
    if content_type is not None:
        flags |= 0x8000
        parts.append(_short(content_type, "content_type"))
    if content_encoding is not None:
        flags |= 0x4000
        parts.append(_short(content_encoding, "content_encoding"))
    if headers:
        flags |= 0x2000
        parts.append(encode_table(headers))
    if delivery_mode is not None:
        flags |= 0x1000
        parts.append(bytes((delivery_mode,)))
    if priority is not None:
        flags |= 0x0800
        parts.append(bytes((priority,)))
    if correlation_id is not None:
        flags |= 0x0400
        parts.append(_short(correlation_id, "correlation_id"))
    if reply_to is not None:
        flags |= 0x0200
        parts.append(_short(reply_to, "reply_to"))
    if expiration is not None:
        flags |= 0x0100
        parts.append(_short(str(expiration), "expiration"))
    if message_id is not None:
        flags |= 0x0080
        parts.append(_short(message_id, "message_id"))
    if timestamp is not None:
        flags |= 0x0040
        if isinstance(timestamp, datetime.datetime):
            timestamp = int(timestamp.timestamp())
        parts.append(_U64(timestamp))
    if message_type is not None:
        flags |= 0x0020
        parts.append(_short(message_type, "message_type"))
    if user_id is not None:
        flags |= 0x0010
        parts.append(_short(user_id, "user_id"))
    if app_id is not None:
        flags |= 0x0008
        parts.append(_short(app_id, "app_id"))
    return _U16(flags) + b"".join(parts)


PROPERTY_NAMES = ("content_type", "content_encoding", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                  "message_type", "user_id", "app_id")


def properties_dict(raw: bytes) -> dict[str, Any]:
    """The present basic properties of raw property bytes, headers left out."""
    view = PropertiesView(raw)
    return {name: getattr(view, name) for name in PROPERTY_NAMES if name in view}


def with_headers(raw: bytes, headers: dict[str, Any]) -> bytes:
    """Raw properties with the headers table replaced by `headers` (other fields as
    they were). The slow path: re-encodes the property list."""
    values = properties_dict(raw)
    return encode_basic_properties(headers=headers, **values)
