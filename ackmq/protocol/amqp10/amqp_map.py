"""AMQP 1.0 message <-> the model's message format (raw 0-9-1 properties + body), after
RabbitMQ 4's documented conversions (docs/conversions, "AMQP 1.0 -> AMQP 0.9.1" and back).
One table of rules, in both directions (SPEC A8):

    AMQP 1.0                         0-9-1 property / header
    header.durable                   delivery_mode 2 (true) / 1 (false or no header)
    header.priority                  priority
    header.ttl                       expiration (ms, as text)
    properties.message-id            message_id: a string as is; a uuid, ulong or binary
                                     as text, with header x-message-id-type (uuid|ulong|
                                     binary) so it comes back typed
    properties.correlation-id        correlation_id, the same way (x-correlation-id-type)
    properties.user-id               user_id (checked against the login, as 0-9-1's)
    properties.subject               type
    properties.reply-to              reply_to
    properties.content-type/-encoding content_type / content_encoding
    properties.creation-time (ms)    timestamp (s; the milliseconds are lost)
    properties.to, group-id, group-sequence, reply-to-group-id, absolute-expiry-time
                                     headers x-amqp-to, x-amqp-group-id, ... (kept, typed)
    application-properties           headers (simple values: string, integers, boolean,
                                     float, binary, null; symbols and timestamps as text)
    message-annotations "x-..."      headers of the same names (other annotations dropped)
    delivery-annotations, footer     dropped (for the next hop only, part 3.2)
    body: one data section           the body, byte for byte
    body: anything else              the encoded body sections, content_type
                                     message/vnd.rabbitmq.amqp (a 1.0 consumer gets the
                                     sections back exactly; others get AMQP-encoded bytes)

And back, for a 1.0 consumer of any message: the same table read right to left; app_id
and cluster_id become message-annotations x-basic-app-id / x-basic-cluster-id; headers
named x-... become message-annotations, the rest application-properties; a header whose
value is a table or an array (no AMQP 1.0 application-property can hold one) is dropped
(documented in docs/amqp10.md); the exchange and routing key are added as
message-annotations x-exchange and x-routing-key, as RabbitMQ 4 does.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

from ackmq.protocol.amqp.properties import PropertiesView, encode_fields
from ackmq.protocol.amqp10.composite import Composite
from ackmq.protocol.amqp10.message import (
    DATA,
    Message10,
    decode_sections,
    encode_body,
)
from ackmq.protocol.amqp10.types import Symbol, Timestamp, UByte, UInt, ULong

AMQP_CONTENT_TYPE = "message/vnd.rabbitmq.amqp"
_EXTRA = (("to", "x-amqp-to"), ("group_id", "x-amqp-group-id"),
          ("group_sequence", "x-amqp-group-sequence"),
          ("reply_to_group_id", "x-amqp-reply-to-group-id"),
          ("absolute_expiry_time", "x-amqp-absolute-expiry-time"))
_TYPED_IDS = (("message_id", "x-message-id-type"), ("correlation_id", "x-correlation-id-type"))


def _short(v: Any) -> str | None:
    """A shortstr, or None if it does not fit (RabbitMQ drops what does not)."""
    if not isinstance(v, str):
        return None
    return v if len(v.encode("utf-8")) <= 255 and "\x00" not in v else None


def _id_text(v: Any) -> tuple[str | None, str | None]:
    """(text, type) of a message-id or correlation-id."""
    if isinstance(v, uuid.UUID):
        return str(v), "uuid"
    if isinstance(v, ULong) or (isinstance(v, int) and not isinstance(v, bool)):
        return str(int(v)), "ulong"
    if isinstance(v, bytes):
        try:
            return _short(v.decode("utf-8")), "binary"
        except UnicodeDecodeError:
            return None, None
    return _short(v), None


def _header_value(v: Any) -> Any:
    """An application-property value as a field-table value (None: not expressible)."""
    if isinstance(v, Timestamp):
        return datetime.datetime.fromtimestamp(int(v) / 1000, datetime.UTC)
    if isinstance(v, (bool, int, float, bytes, str)) or v is None:
        return v if not isinstance(v, Symbol) else str(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    return None


def to_amqp091(m: Message10) -> tuple[bytes, bytes]:
    """(raw 0-9-1 properties, body) for a published 1.0 message."""
    f: dict[str, Any] = {}
    headers: dict[str, Any] = {}
    h = m.header
    f["delivery_mode"] = 2 if h is not None and h.durable else 1
    if h is not None:
        if h.priority is not None:
            f["priority"] = min(int(h.priority), 255)
        if h.ttl is not None:
            f["expiration"] = str(int(h.ttl))
    p = m.properties
    if p is not None:
        for name, type_header in _TYPED_IDS:
            text, kind = _id_text(getattr(p, name))
            if text is not None:
                f[name] = text
                if kind is not None:
                    headers[type_header] = kind
        if p.user_id is not None:
            try:
                f["user_id"] = _short(bytes(p.user_id).decode("utf-8"))
            except UnicodeDecodeError:
                pass
        f["message_type"] = _short(p.subject)
        f["reply_to"] = _short(p.reply_to)
        f["content_type"] = _short(p.content_type)
        f["content_encoding"] = _short(p.content_encoding)
        if p.creation_time is not None:
            f["timestamp"] = max(0, int(p.creation_time) // 1000)
        for name, header in _EXTRA:
            v = getattr(p, name)
            if v is not None:
                headers[header] = _header_value(v) if not isinstance(v, Timestamp) else int(v)
    for k, v in (m.message_annotations or {}).items():
        if isinstance(k, str) and k.startswith("x-") and _short(k):
            hv = _header_value(v)
            if hv is not None or v is None:
                headers[str(k)] = hv
    for k, v in (m.application_properties or {}).items():
        if isinstance(k, str) and _short(k):
            hv = _header_value(v)
            if hv is not None or v is None:
                headers[str(k)] = hv
    data = m.data
    if data is None:
        body = encode_body(m.body)
        f["content_type"] = AMQP_CONTENT_TYPE
    else:
        body = data
    if headers:
        f["headers"] = headers
    return encode_fields(f), body


def _annotation_value(v: Any) -> Any:
    if isinstance(v, (datetime.datetime,)):
        return Timestamp(int(v.timestamp() * 1000))
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (dict, list, tuple)):
        return None
    return v


def from_amqp091(properties: bytes, body: bytes, exchange: str, routing_key: str,
                 delivery_count: int = 0, first_acquirer: bool = True) -> Message10:
    """A delivery as an AMQP 1.0 message."""
    v = PropertiesView(properties)
    raw_headers = dict(v.headers or {})
    mode, prio, exp = v.delivery_mode, v.priority, v.expiration
    header = Composite("header", durable=mode == 2 or None,
                       priority=UByte(prio) if prio is not None else None,
                       ttl=UInt(int(exp)) if exp is not None and str(exp).isdigit() else None,
                       first_acquirer=None if first_acquirer else False,
                       delivery_count=UInt(delivery_count) if delivery_count else None)
    types = {name: _text(raw_headers.pop(th, None)) for name, th in _TYPED_IDS}
    props = Composite("properties")
    for name, _ in _TYPED_IDS:
        text = getattr(v, name)
        if text is not None:
            setattr(props, name, _typed_id(text, types[name]))
    uid = v.user_id
    if uid is not None:
        props.user_id = uid.encode("utf-8")
    props.subject = v.message_type
    props.reply_to = v.reply_to
    ctype = v.content_type
    props.content_encoding = _sym(v.content_encoding)
    ts = v.timestamp
    if ts is not None:
        props.creation_time = Timestamp(_seconds(ts) * 1000)
    for name, h in _EXTRA:
        if h in raw_headers:
            val = raw_headers.pop(h)
            if name == "group_sequence":
                val = UInt(val) if isinstance(val, int) else None
            elif name == "absolute_expiry_time":
                val = Timestamp(val) if isinstance(val, int) else None
            else:
                val = _text(val)
            setattr(props, name, val)
    annotations: dict[Any, Any] = {Symbol("x-exchange"): exchange,
                                   Symbol("x-routing-key"): routing_key}
    app = v.app_id
    if app is not None:
        annotations[Symbol("x-basic-app-id")] = app
    cluster = v.cluster_id
    if cluster is not None:
        annotations[Symbol("x-basic-cluster-id")] = cluster
    app_props: dict[str, Any] = {}
    for k, val in raw_headers.items():
        key = k.decode() if isinstance(k, bytes) else str(k)
        val = _annotation_value(val)
        if val is None and raw_headers[k] is not None:
            continue  # a table or an array: no AMQP 1.0 application-property holds one
        if key.startswith("x-"):
            annotations[Symbol(key)] = val
        else:
            app_props[key] = val
    sections: list[tuple[int, Any]]
    if ctype == AMQP_CONTENT_TYPE:
        try:
            sections = decode_sections(body)
            ctype = None
        except ValueError:
            sections = [(DATA, body)]
    else:
        sections = [(DATA, body)]
    props.content_type = _sym(ctype)
    any_props = any(x is not None for x in props.values)
    any_header = any(x is not None for x in header.values)
    return Message10(header=header if any_header else None,
                     message_annotations=annotations,
                     properties=props if any_props else None,
                     application_properties=app_props or None,
                     body=sections)


def _sym(v: Any) -> Symbol | None:
    return None if v is None else Symbol(v)


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _seconds(ts: Any) -> int:
    if isinstance(ts, datetime.datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=datetime.UTC)
        return int(ts.timestamp())
    return int(ts)


def _typed_id(text: str, kind: Any) -> Any:
    try:
        if kind == "uuid":
            return uuid.UUID(text)
        if kind == "ulong":
            return ULong(int(text))
        if kind == "binary":
            return text.encode("utf-8")
    except ValueError:
        pass
    return text
