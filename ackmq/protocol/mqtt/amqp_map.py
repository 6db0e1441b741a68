"""An MQTT message as an AMQP 0-9-1 message and back, as RabbitMQ's MQTT plugin maps it
(3.10 for 3.1.1: delivery mode 2 from QoS 1 up, headers `x-mqtt-publish-qos` and
`x-mqtt-dup`; 3.13 for the MQTT 5 properties): content type <-> content_type, correlation
data <-> correlation_id (in a header when it is not short UTF-8), response topic <->
reply_to (as an amq.topic routing key), message expiry interval <-> expiration (ms), user
properties <-> headers, payload format indicator <-> header `x-mqtt-payload-format`."""

from __future__ import annotations

from typing import Any

from ackmq.protocol.amqp.properties import PropertiesView, encode_fields, header_value

from .topics import from_amqp, to_amqp

PUBLISH_QOS = "x-mqtt-publish-qos"
DUP = "x-mqtt-dup"
PAYLOAD_FORMAT = "x-mqtt-payload-format"
CORRELATION = "x-correlation-id"  # correlation data that is no short UTF-8 string
# the publishing client id, only while its session has a No Local subscription (5.0)
PUBLISHER = "x-mqtt-client-id"
RETAIN = "x-mqtt-retain"  # published with the retain flag (for Retain As Published)
OWN = frozenset((PUBLISH_QOS, DUP, PAYLOAD_FORMAT, CORRELATION, PUBLISHER, RETAIN))

_PLAIN: dict[tuple[int, bool], bytes] = {}  # (qos, dup) -> properties: the usual case
_PLAIN_QOS: dict[bytes, int] = {}  # and back: a delivery's QoS without a header peek


def properties_for(qos: int, dup: bool, props: dict[str, Any], retain: bool = False,
                   publisher: str | None = None) -> bytes:
    """Raw AMQP properties for a PUBLISH (its MQTT 5 properties in `props`); `retain`
    and `publisher` (the client id, for No Local) become headers only when given."""
    if not props and not retain and publisher is None:
        raw = _PLAIN.get((qos, dup))
        if raw is None:
            raw = _PLAIN[(qos, dup)] = encode_fields(
                {"delivery_mode": 2 if qos else 1, "headers": {PUBLISH_QOS: qos, DUP: dup}})
            _PLAIN_QOS[raw] = qos
        return raw
    headers: dict[str, Any] = {PUBLISH_QOS: qos, DUP: dup}
    if retain:
        headers[RETAIN] = True
    if publisher is not None:
        headers[PUBLISHER] = publisher
    for name, value in props.get("user_property", ()):
        headers[name] = value  # the last of a repeated name, as AMQP has one per name
    fields: dict[str, Any] = {"delivery_mode": 2 if qos else 1, "headers": headers}
    if "payload_format_indicator" in props:
        headers[PAYLOAD_FORMAT] = props["payload_format_indicator"]
    if "content_type" in props and len(props["content_type"].encode()) <= 255:
        fields["content_type"] = props["content_type"]
    corr = props.get("correlation_data")
    if corr is not None:
        try:
            text = corr.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(corr) <= 255:
            fields["correlation_id"] = text
        else:
            headers[CORRELATION] = corr
    rt = props.get("response_topic")
    if rt is not None and len(rt.encode()) <= 255:
        fields["reply_to"] = to_amqp(rt)
    if "message_expiry_interval" in props:
        fields["expiration"] = str(props["message_expiry_interval"] * 1000)
    return encode_fields(fields)


def publish_qos(raw: bytes) -> int | None:
    """The QoS the message was published with, when an MQTT client published it."""
    q = _PLAIN_QOS.get(raw)
    if q is not None:
        return q
    v = header_value(raw, PUBLISH_QOS)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def header_of(raw: bytes, name: str) -> Any:
    """One header of a message (None for a plain MQTT message: it has none of ours)."""
    return None if raw in _PLAIN_QOS else header_value(raw, name)


def mqtt5_properties(raw: bytes, remaining_ms: int | None) -> dict[str, Any]:
    """The MQTT 5 PUBLISH properties of an AMQP message (from any protocol);
    `remaining_ms`: what is left of its expiry, if it has one."""
    if remaining_ms is None and raw in _PLAIN_QOS:
        return {}  # published over MQTT without properties: nothing to parse
    view: Any = PropertiesView(raw)
    out: dict[str, Any] = {}
    headers = view.headers or {}
    pfi = headers.get(PAYLOAD_FORMAT)
    if isinstance(pfi, int) and pfi in (0, 1):
        out["payload_format_indicator"] = pfi
    if remaining_ms is not None:
        out["message_expiry_interval"] = max(0, (remaining_ms + 999) // 1000)
    if view.content_type:
        out["content_type"] = view.content_type
    if view.reply_to:
        out["response_topic"] = from_amqp(view.reply_to)
    corr = headers.get(CORRELATION)
    if isinstance(corr, bytes | bytearray):
        out["correlation_data"] = bytes(corr)
    elif view.correlation_id:
        out["correlation_data"] = view.correlation_id.encode("utf-8")
    users = []
    for k, v in headers.items():
        if k in OWN:
            continue
        if isinstance(v, bytes | bytearray):
            v = bytes(v).decode("utf-8", "replace")
        elif isinstance(v, bool):
            v = "true" if v else "false"
        elif not isinstance(v, str | int | float):
            continue
        users.append((str(k), str(v)))
    if users:
        out["user_property"] = users
    return out
