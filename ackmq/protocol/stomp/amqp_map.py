"""STOMP headers <-> AMQP 0-9-1 basic properties, as RabbitMQ's STOMP plugin maps them
(`rabbit_stomp_util:message_properties/1` and `message_headers/1`, RabbitMQ 3.10), so a
message sent by STOMP reads the same to a pika consumer as it does on RabbitMQ, and back.

SEND -> properties:
    content-type, content-encoding, correlation-id, reply-to, expiration, type, user-id,
    app-id -> the property of that name; amqp-message-id -> message-id;
    persistent:true -> delivery-mode 2; priority, timestamp -> integers;
    every other header -> an application header (longstr), except `destination` and,
    unlike RabbitMQ, the frame's own `receipt`, `transaction` and `content-length`
    (RabbitMQ copies those three into the message; they mean nothing to a consumer).
    ActiveMQ's `expires` (absolute ms since the epoch, 0 = never) becomes an
    `expiration` when no `expiration` is given, and stays an application header.
properties -> MESSAGE headers (after subscription, destination, message-id,
    redelivered, ack): application headers whose values are text or integers (others
    are dropped, as RabbitMQ drops them), then app-id, user-id, type, timestamp,
    amqp-message-id, expiration, reply-to (prefixed `/reply-queue/` unless it already
    names a destination), correlation-id, priority, persistent (`true` for
    delivery-mode 2, else the mode's number, as RabbitMQ writes it), content-encoding,
    content-type, in that order.
"""

from __future__ import annotations

import time
from typing import Any

from ackmq.protocol.amqp.properties import PropertiesView, encode_fields
from ackmq.protocol.amqp.property_names import RABBIT_TO_PAMQP
from ackmq.protocol.stomp.codec import StompError
from ackmq.protocol.stomp.destinations import DEST_PREFIXES

# STOMP header -> the shortstr property it sets (RabbitMQ's name, `_` for `-`, except
# amqp-message-id), under pamqp's name; wire order and flag bits are properties.py's
_SHORTSTR_PROPS = {
    header: RABBIT_TO_PAMQP["message_id" if header == "amqp-message-id"
                            else header.replace("-", "_")]
    for header in ("content-type", "content-encoding", "correlation-id", "reply-to",
                   "expiration", "amqp-message-id", "type", "user-id", "app-id")}

# headers that become properties (or are the frame's own), never application headers
NOT_APPLICATION = frozenset((
    "content-type", "content-encoding", "persistent", "priority", "correlation-id",
    "reply-to", "expiration", "amqp-message-id", "timestamp", "type", "user-id", "app-id",
    "destination", "receipt", "transaction", "content-length"))


def _shortstr(name: str, value: str) -> str:
    if len(value.encode("utf-8")) > 255:
        raise StompError("Bad header", f"'{name}' is longer than 255 bytes, the most an "
                                       "AMQP property holds")
    return value


def _integer(name: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    try:
        n = int(text)
    except ValueError:
        raise StompError("Bad header", f"'{name}' must be an integer, got {value[:40]!r}") \
            from None
    if not low <= n <= high:
        raise StompError("Bad header", f"'{name}' must be between {low} and {high}, got {n}")
    return n


def properties_from_headers(headers: dict[str, str], now_ms: int | None = None) -> bytes:
    """Raw AMQP basic properties for a SEND frame's headers (see the module doc).
    Headers are checked in the properties' wire order (the first bad one is reported)."""
    props: dict[str, Any] = {}
    get = headers.get

    def shortstr(name: str, value: str | None) -> None:
        if value is not None:
            props[_SHORTSTR_PROPS[name]] = _shortstr(name, value)

    shortstr("content-type", get("content-type"))
    shortstr("content-encoding", get("content-encoding"))
    app: dict[str, Any] = {}
    for k, v in headers.items():
        if k not in NOT_APPLICATION:
            if len(k.encode("utf-8")) > 255:
                raise StompError("Bad header", f"header name longer than 255 bytes: "
                                               f"{k[:40]!r}...")
            app[k] = v
    if app:
        props["headers"] = app
    if get("persistent") in ("true", "True"):
        props["delivery_mode"] = 2
    prio = get("priority")
    if prio is not None:
        props["priority"] = _integer("priority", prio, 0, 255)
    expiration = get("expiration")
    if expiration is None:
        expires = get("expires")
        if expires is not None and expires.strip().isdigit() and int(expires) > 0:
            now = int(time.time() * 1000) if now_ms is None else now_ms
            expiration = str(max(0, int(expires) - now))
    shortstr("correlation-id", get("correlation-id"))
    shortstr("reply-to", get("reply-to"))
    shortstr("expiration", expiration)
    shortstr("amqp-message-id", get("amqp-message-id"))
    stamp = get("timestamp")
    if stamp is not None:
        props["timestamp"] = _integer("timestamp", stamp, 0, (1 << 63) - 1)
    for name in ("type", "user-id", "app-id"):
        shortstr(name, get(name))
    return encode_fields(props)


def _text(v: Any) -> str | None:
    """An application header's value as STOMP text, or None when RabbitMQ drops it."""
    if isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return None


def message_headers(raw: bytes, skip: frozenset[str] | set[str] = frozenset()) \
        -> list[tuple[str, str]]:
    """MESSAGE headers for raw AMQP properties (see the module doc). Application headers
    named in `skip` (the ones the MESSAGE already has) are left out."""
    if raw == b"\x00\x00":
        return []
    p = PropertiesView(raw)
    out: list[tuple[str, str]] = []
    headers = p.headers
    if headers:
        for k, v in headers.items():
            if k in skip or not k:
                continue
            t = _text(v)
            if t is not None:
                out.append((k, t))
    for name, value in (("app-id", p.app_id), ("user-id", p.user_id),
                        ("type", p.message_type)):
        if value is not None:
            out.append((name, value))
    ts = p.timestamp
    if ts is not None:
        # past datetime's range (year 9999) the view keeps the integer as sent
        out.append(("timestamp", str(ts if isinstance(ts, int) else int(ts.timestamp()))))
    for name, value in (("amqp-message-id", p.message_id), ("expiration", p.expiration)):
        if value is not None:
            out.append((name, value))
    reply_to = p.reply_to
    if reply_to is not None:
        if not reply_to.startswith(DEST_PREFIXES):
            reply_to = "/reply-queue/" + reply_to
        out.append(("reply-to", reply_to))
    if p.correlation_id is not None:
        out.append(("correlation-id", p.correlation_id))
    if p.priority is not None:
        out.append(("priority", str(p.priority)))
    mode = p.delivery_mode
    if mode is not None:
        out.append(("persistent", "true" if mode == 2 else str(mode)))
    for name, value in (("content-encoding", p.content_encoding),
                        ("content-type", p.content_type)):
        if value is not None:
            out.append((name, value))
    return out
