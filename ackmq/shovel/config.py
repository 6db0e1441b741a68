"""A dynamic shovel's definition (the `value` of /api/parameters/shovel/<vhost>/<name>),
checked as RabbitMQ 3.10's rabbit_shovel_parameters checks it, with its texts: the
source and destination rules first, then each key's check in reverse order of its
table (rabbit_parameter_validation:proplist prepends), unrecognised keys first of those.
Values in the texts are printed as Erlang's ~p prints them (`<<"x">>`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp10", "amqp091")
# ackmq's one key of its own (V4 replay): each message back to its x-first-death-queue
# (by the default exchange); one without goes by the exchange and routing key it came with
BACK_KEY = "ackmq-dest-x-first-death-queue"


def erl(v: Any) -> str:
    """A JSON value as Erlang's ~p shows the decoded term."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return '<<"' + v.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ",".join(erl(x) for x in v) + "]"
    if isinstance(v, dict):
        return "#{" + ",".join(f"{erl(k)} => {erl(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _number(key: str, v: Any) -> str | None:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return None
    return f"{key} should be a number, actually was {erl(v)}"


def _binary(key: str, v: Any) -> str | None:
    return None if isinstance(v, str) else f"{key} should be binary, actually was {erl(v)}"


def _boolean(key: str, v: Any) -> str | None:
    return None if isinstance(v, bool) else f"{key} should be boolean, actually was {erl(v)}"


def _enum(choices: tuple[str, ...]) -> Any:
    def check(key: str, v: Any) -> str | None:
        if v in choices:
            return None
        listed = "[" + ",".join(erl(c) for c in choices) + "]"
        return f"{key} should be one of {listed}, actually was {erl(v)}"
    return check


def _table(key: str, v: Any) -> str | None:
    if isinstance(v, dict):
        return None
    return f"{key} should be a JSON object, actually was {erl(v)}"


_PROPERTY_TYPES = [("content_type", "s"), ("content_encoding", "s"), ("headers", ""),
                   ("delivery_mode", "n"), ("priority", "n"), ("correlation_id", "s"),
                   ("reply_to", "s"), ("expiration", "s"), ("message_id", "s"),
                   ("timestamp", "n"), ("type", "s"), ("user_id", "s"), ("app_id", "s"),
                   ("cluster_id", "s")]


def _binary_map(key: str, v: Any) -> str | None:
    """An AMQP 1.0 destination's dest-properties, dest-application-properties,
    dest-message-annotations: string values (RabbitMQ 3.10 checks them as a proplist of
    binaries; a value that is neither an object nor a list crashes its validator: 500)."""
    if isinstance(v, list):
        return None if not v else f"Unrecognised terms [{','.join(erl(x) for x in v)}] in {key}"
    if not isinstance(v, dict):
        return f"{key} should be a JSON object, actually was {erl(v)}"
    bad = [f"{k} should be binary, actually was {erl(x)}" for k, x in v.items()
           if not isinstance(x, str)]
    return bad[-1] if bad else None


def _properties(key: str, v: Any) -> str | None:
    """dest-publish-properties as RabbitMQ's validate_properties: a proplist of the basic
    properties, strings and numbers; its first complaint."""
    if not isinstance(v, dict):
        return f"{key} not a list {erl(v)}"
    rest = dict(v)
    found: list[str] = []
    for name, kind in _PROPERTY_TYPES:
        if name in rest:
            x = rest.pop(name)
            bad = _binary(name, x) if kind == "s" else _number(name, x) if kind == "n" \
                else None
            if bad:
                found.insert(0, bad)
    if rest:
        terms = ",".join(f"{{{erl(k)},{erl(x)}}}" for k, x in rest.items())
        found.insert(0, f"Unrecognised terms [{terms}] in {key}")
    return found[0] if found else None


def _delete_after(key: str, v: Any) -> str | None:
    if v in ("never", "queue-length") or (isinstance(v, int) and not isinstance(v, bool)
                                          and v >= 0):
        return None
    return (f'{key} should be a number greater than or equal to 0, "never" or '
            f'"queue-length", actually was {erl(v)}')


def uri_error(uri: str) -> str | None:
    """amqp_uri:parse's refusal of one URI, as the shovel's text shows it."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in ("amqp", "amqps"):
        return (f'"{uri}" not a valid URI: {{{{unexpected_uri_scheme,"{scheme}"}},'
                f'"{uri}"}}')
    try:
        port = urlsplit(uri).port
    except ValueError as e:
        if "Port" not in str(e):
            return None  # RabbitMQ takes it (and cannot connect): so does ackmq
        digits = uri.rsplit(":", 1)[-1].split("/", 1)[0]
        port = int(digits) if digits.isdigit() else -1
    if port is not None and not 0 < port < 65536:
        return (f'"{uri}" not a valid URI: {{{{port_out_of_range,{port}}},'
                f'"{uri}"}}')
    return None


def _uri(key: str, v: Any) -> str | None:
    uris = [v] if isinstance(v, str) else v
    if not isinstance(uris, list):
        return f"{key} should be list, actually was {erl(v)}"
    for u in uris:
        if not isinstance(u, str):
            return f"{key} should be binary, actually was {erl(u)}"
        bad = uri_error(u)
        if bad:
            return bad
    return None


_SHOVEL = [("reconnect-delay", _number, False), ("ack-mode", _enum(ACK_MODES), False),
           ("src-protocol", _enum(PROTOCOLS), False), ("dest-protocol", _enum(PROTOCOLS), False)]
_SRC_091 = [("src-uri", _uri, True), ("src-exchange", _binary, False),
            ("src-exchange-key", _binary, False), ("src-queue", _binary, False),
            ("src-queue-args", _table, False), ("src-consumer-args", _table, False),
            ("prefetch-count", _number, False), ("src-prefetch-count", _number, False),
            ("delete-after", _delete_after, False), ("src-delete-after", _delete_after, False)]
_DEST_091 = [("dest-uri", _uri, True), ("dest-exchange", _binary, False),
             ("dest-exchange-key", _binary, False), ("dest-queue", _binary, False),
             ("dest-queue-args", _table, False), ("add-forward-headers", _boolean, False),
             ("dest-add-forward-headers", _boolean, False),
             ("add-timestamp-header", _boolean, False),
             ("dest-add-timestamp-header", _boolean, False),
             ("publish-properties", _properties, False),
             ("dest-publish-properties", _properties, False),
             (BACK_KEY, _boolean, False)]
_SRC_10 = [("src-uri", _uri, True), ("src-address", _binary, True),
           ("src-prefetch-count", _number, False), ("src-delete-after", _delete_after, False)]
_DEST_10 = [("dest-uri", _uri, True), ("dest-address", _binary, True),
            ("dest-add-forward-headers", _boolean, False),
            ("dest-add-timestamp-header", _boolean, False),
            ("dest-application-properties", _binary_map, False),
            ("dest-message-annotations", _binary_map, False),
            ("dest-properties", _binary_map, False)]


def _two(d: dict[str, Any], a: str, b: str) -> int:
    return (a in d) + (b in d)


def validate(name: str, value: Any) -> list[str]:
    """RabbitMQ's validation texts for a shovel's value ([] when it is good)."""
    if not isinstance(value, dict):
        return [f"{name} should be a JSON object, actually was {erl(value)}"]
    d = value
    src10 = d.get("src-protocol") == "amqp10"
    dest10 = d.get("dest-protocol") == "amqp10"
    errors: list[str] = []
    if not src10:
        n = _two(d, "src-exchange", "src-queue")
        if n == 0:
            errors.append("Must specify 'src-exchange' or 'src-queue'")
        elif n == 2:
            errors.append("Cannot specify 'src-exchange' and 'src-queue'")
        if _two(d, "src-delete-after", "delete-after") == 2:
            errors.append("Cannot specify 'delete-after' and 'src-delete-after'")
        if _two(d, "src-prefetch-count", "prefetch-count") == 2:
            errors.append("Cannot specify 'prefetch-count' and 'src-prefetch-count'")
    if not dest10:
        if _two(d, "dest-exchange", "dest-queue") == 2:
            errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
        if d.get(BACK_KEY) is True and _two(d, "dest-exchange", "dest-queue"):
            errors.append(f"Cannot specify '{BACK_KEY}' and 'dest-exchange' or "
                          "'dest-queue'")
        if _two(d, "dest-add-forward-headers", "add-forward-headers") == 2:
            errors.append("Cannot specify 'add-forward-headers' and "
                          "'dest-add-forward-headers'")
        if _two(d, "dest-add-timestamp-header", "add-timestamp-header") == 2:
            errors.append("Cannot specify 'add-timestamp-header' and "
                          "'dest-add-timestamp-header'")
    table = _SHOVEL + (_SRC_10 if src10 else _SRC_091) + (_DEST_10 if dest10 else _DEST_091)
    rest = dict(d)
    results: list[str] = []
    for key, check, mandatory in table:
        if key in rest:
            bad = check(key, rest.pop(key))
            if bad:
                results.insert(0, bad)
        elif mandatory:
            results.insert(0, f'Key "{key}" not found in {name}')
    if rest:
        terms = ",".join(f"{{{erl(k)},{erl(v)}}}" for k, v in rest.items())
        results.insert(0, f"Unrecognised terms [{terms}] in {name}")
    return errors + results


@dataclass
class Endpoint:
    uris: list[str]
    queue: str | None = None
    exchange: str | None = None
    exchange_key: str | None = None
    queue_args: dict[str, Any] = field(default_factory=dict)
    address: str | None = None  # AMQP 1.0: src-address / dest-address
    amqp10: bool = False  # src-protocol / dest-protocol amqp10

    @property
    def protocol(self) -> str:
        return "amqp10" if self.amqp10 else "amqp091"


@dataclass
class ShovelConfig:
    """A checked definition, with RabbitMQ's defaults."""

    vhost: str
    name: str
    value: dict[str, Any]
    src: Endpoint
    dest: Endpoint
    ack_mode: str = "on-confirm"
    prefetch: int = 1000
    reconnect_delay: float = 5.0
    delete_after: str | int = "never"
    forward_headers: bool = False
    timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    consumer_args: dict[str, Any] = field(default_factory=dict)
    back_to_death_queue: bool = False
    # an AMQP 1.0 destination's dest-properties, dest-application-properties,
    # dest-message-annotations: set on every message
    dest_properties: dict[str, Any] = field(default_factory=dict)
    dest_application_properties: dict[str, Any] = field(default_factory=dict)
    dest_message_annotations: dict[str, Any] = field(default_factory=dict)


def _delay(v: Any) -> float:
    """reconnect-delay in seconds, within 0..3600 (NaN: the default 5)."""
    f = float(v)
    return 5.0 if f != f else min(max(f, 0.0), 3600.0)


def _first(d: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    return default


def _uris(v: Any) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def parse(vhost: str, name: str, value: dict[str, Any]) -> ShovelConfig:
    """A validated value as a ShovelConfig (call `validate` first)."""
    d = value
    src = Endpoint(_uris(d["src-uri"]), d.get("src-queue"), d.get("src-exchange"),
                   d.get("src-exchange-key"), dict(d.get("src-queue-args") or {}))
    dest = Endpoint(_uris(d["dest-uri"]), d.get("dest-queue"), d.get("dest-exchange"),
                    d.get("dest-exchange-key"), dict(d.get("dest-queue-args") or {}))
    if d.get("src-protocol") == "amqp10":
        src.address, src.amqp10 = d.get("src-address"), True
    if d.get("dest-protocol") == "amqp10":
        dest.address, dest.amqp10 = d.get("dest-address"), True
    prefetch = int(_first(d, "src-prefetch-count", "prefetch-count", default=1000))
    return ShovelConfig(
        vhost, name, value, src, dest, str(d.get("ack-mode", "on-confirm")),
        max(1, min(prefetch, 65535)) if prefetch > 0 else 1000,
        _delay(d.get("reconnect-delay", 5)),
        _first(d, "src-delete-after", "delete-after", default="never"),
        bool(_first(d, "dest-add-forward-headers", "add-forward-headers", default=False)),
        bool(_first(d, "dest-add-timestamp-header", "add-timestamp-header", default=False)),
        dict(_first(d, "dest-publish-properties", "publish-properties", default={}) or {}),
        dict(d.get("src-consumer-args") or {}),
        d.get(BACK_KEY) is True,
        dict(d.get("dest-properties") or {}), dict(d.get("dest-application-properties") or {}),
        dict(d.get("dest-message-annotations") or {}))


def redact(uri: str) -> str:
    """A URI as RabbitMQ's status and x-shovelled show it: without the credentials."""
    scheme, sep, rest = uri.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc:
        return uri
    return f"{scheme}://{netloc.rsplit('@', 1)[1]}{slash}{path}"
