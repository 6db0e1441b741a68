"""Connection options, ack modes, the redelivery policy and destinations, parsed from the
URLs ActiveMQ users write (SPEC J9)."""

from __future__ import annotations

import datetime
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlsplit

from .tls import TLS_KEYS, TlsOptions, tls_options


class AckMode(enum.IntEnum):
    """JMS acknowledge modes (values as javax.jms.Session / ActiveMQSession)."""

    SESSION_TRANSACTED = 0
    AUTO = 1
    CLIENT = 2
    DUPS_OK = 3
    INDIVIDUAL = 4


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class RedeliveryPolicy:
    """ActiveMQ's RedeliveryPolicy (same defaults; delays in milliseconds, as ActiveMQ).

    A message whose redelivery count goes past `maximum_redeliveries` (-1: never) is
    poisoned: sent to the dead-letter queue with the cause, then acked.
    """

    maximum_redeliveries: int = 6
    initial_redelivery_delay: int = 1000
    redelivery_delay: int = 1000
    use_exponential_back_off: bool = False
    back_off_multiplier: float = 5.0
    maximum_redelivery_delay: int = -1

    _URL_NAMES: ClassVar[dict[str, tuple[str, Callable[[str], object]]]] = {
        "maximumRedeliveries": ("maximum_redeliveries", int),
        "initialRedeliveryDelay": ("initial_redelivery_delay", int),
        "redeliveryDelay": ("redelivery_delay", int),
        "useExponentialBackOff": ("use_exponential_back_off", _bool),
        "backOffMultiplier": ("back_off_multiplier", float),
        "maximumRedeliveryDelay": ("maximum_redelivery_delay", int),
    }

    def next_delay(self, previous: int) -> int:
        """ActiveMQ's getNextRedeliveryDelay (ms)."""
        delay = self.redelivery_delay
        if previous > 0 and self.use_exponential_back_off and self.back_off_multiplier > 1:
            delay = int(previous * self.back_off_multiplier)
            if self.maximum_redelivery_delay != -1 and delay > self.maximum_redelivery_delay:
                delay = max(self.maximum_redelivery_delay, self.redelivery_delay)
        return delay

    def delay_for(self, redelivery_count: int) -> float:
        """Seconds to hold a message back before its `redelivery_count`-th redelivery
        reaches the application: the initial delay, then next_delay applied count-1 times
        (as ActiveMQMessageConsumer.rollback computes it)."""
        if redelivery_count <= 0:
            return 0.0
        delay = self.initial_redelivery_delay
        for _ in range(redelivery_count - 1):
            delay = self.next_delay(delay)
        return max(0, delay) / 1000.0

    def broker_arguments(self) -> dict[str, str | int | float] | None:
        """L6: the same delays as basic.consume arguments for ackmq's broker-side
        back-off (x-delayed-retry-*, type all: a nack or a lost connection), so a failed
        message waits at the broker, not in this consumer's prefetch. None when the policy
        has no delay, or one the broker's rule cannot express (then the client holds
        redeliveries back itself, as against RabbitMQ)."""
        first, cap = self.initial_redelivery_delay, self.maximum_redelivery_delay
        if self.use_exponential_back_off and self.back_off_multiplier > 1:
            if first <= 0 or (cap != -1 and max(cap, self.redelivery_delay) < first):
                return None
            args: dict[str, str | int | float] = {
                "x-delayed-retry-type": "all", "x-delayed-retry-min": first,
                "x-delayed-retry-multiplier": self.back_off_multiplier}
            if cap != -1:
                args["x-delayed-retry-max"] = max(cap, self.redelivery_delay)
            return args
        if first != self.redelivery_delay or first <= 0:
            return None
        return {"x-delayed-retry-type": "all", "x-delayed-retry-min": first,
                "x-delayed-retry-multiplier": 1}

    def exceeded(self, redelivery_count: int) -> bool:
        """True when a message with this many redeliveries must be poisoned."""
        return 0 <= self.maximum_redeliveries < redelivery_count


def _positive_ms(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"negative duration {text}")
    return value


@dataclass(frozen=True)
class Options:
    """Everything a connection needs; built from the URL by `parse_url`, overridable by
    keyword arguments of `connect()`."""

    host: str = "127.0.0.1"
    port: int = 5672
    vhost: str = "/"
    username: str = "guest"
    password: str = "guest"
    heartbeat: int = 60                    # seconds proposed; 0 = off
    connect_timeout: float = 10.0          # seconds, TCP connect + AMQP handshake
    queue_prefetch: int = 1000             # J4
    topic_prefetch: int = 1000
    optimize_acknowledge: bool = False     # J3
    optimize_acknowledge_timeout: int = 300  # ms, ActiveMQ's default
    send_timeout: int = 30000              # ms a send()/commit()/RPC waits; never 0
    close_timeout: float = 5.0             # seconds
    max_outstanding_confirms: int = 10000  # publish() blocks (sync) above this
    reconnect: bool = False
    reconnect_timeout: float = 30.0        # seconds a reconnect keeps trying
    # idempotent producers: messages carry x-deduplication-header = message id, and with
    # reconnect unconfirmed publishes are re-sent after a reconnect (None: on against
    # ackmq with reconnect)
    idempotent: bool | None = None
    redelivery_policy: RedeliveryPolicy = field(default_factory=RedeliveryPolicy)
    connection_name: str | None = None     # client_properties.connection_name (tools show it)
    tls: TlsOptions | None = None          # amqps:// (tls.py): RabbitMQ's URI TLS keys

    def with_(self, **changes: Any) -> Options:
        return replace(self, **changes)


_JMS_OPTIONS: dict[str, tuple[str, Callable[[str], object]]] = {
    "prefetchPolicy.queuePrefetch": ("queue_prefetch", int),
    "prefetchPolicy.topicPrefetch": ("topic_prefetch", int),
    "optimizeAcknowledge": ("optimize_acknowledge", _bool),
    "optimizeAcknowledgeTimeOut": ("optimize_acknowledge_timeout", _positive_ms),
    "sendTimeout": ("send_timeout", _positive_ms),
}
_PLAIN_OPTIONS: dict[str, tuple[str, Callable[[str], object]]] = {
    "heartbeat": ("heartbeat", int),
    "connection_timeout": ("connect_timeout", float),
    "reconnect": ("reconnect", _bool),
    "idempotent": ("idempotent", _bool),
}


def parse_url(url: str, **overrides: Any) -> Options:
    """amqp://user:pass@host:port/vhost?jms.…=…  →  Options.

    Unknown options are an error (a typo must not silently fall back to a default).
    `jms.prefetchPolicy.all` sets both prefetches, as in ActiveMQ.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps", ""):
        raise ValueError(f"unsupported scheme {parts.scheme!r} (amqp:// or amqps://)")
    values: dict[str, Any] = {}
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.scheme == "amqps":
        values["tls"] = tls_options(query)
        values["port"] = 5671
    elif any(k in TLS_KEYS for k, _ in query):
        raise ValueError(f"the TLS options ({', '.join(TLS_KEYS)}) need an amqps:// URL")
    if parts.hostname:
        values["host"] = parts.hostname
    if parts.port:
        values["port"] = parts.port
    if parts.username is not None:
        values["username"] = unquote(parts.username)
    if parts.password is not None:
        values["password"] = unquote(parts.password)
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    values["vhost"] = unquote(path) if path else "/"
    policy: dict[str, Any] = {}
    for key, raw in query:
        if key in TLS_KEYS:
            continue
        try:
            if key.startswith("jms.redeliveryPolicy."):
                name = key[len("jms.redeliveryPolicy."):]
                if name not in RedeliveryPolicy._URL_NAMES:
                    raise KeyError(key)
                attr, conv = RedeliveryPolicy._URL_NAMES[name]
                policy[attr] = conv(raw)
            elif key == "jms.prefetchPolicy.all":
                values["queue_prefetch"] = values["topic_prefetch"] = int(raw)
            elif key.startswith("jms."):
                attr, conv = _JMS_OPTIONS[key[4:]]
                values[attr] = conv(raw)
            else:
                attr, conv = _PLAIN_OPTIONS[key]
                values[attr] = conv(raw)
        except KeyError:
            known = sorted(["jms." + k for k in _JMS_OPTIONS] + ["jms.prefetchPolicy.all"]
                           + ["jms.redeliveryPolicy." + k for k in RedeliveryPolicy._URL_NAMES]
                           + list(_PLAIN_OPTIONS) + list(TLS_KEYS))
            raise ValueError(f"unknown URL option {key!r}; known: {', '.join(known)}") from None
    if policy:
        values["redelivery_policy"] = RedeliveryPolicy(**policy)
    names = {f.name for f in fields(Options)}
    for key in overrides:
        if key not in names:
            raise TypeError(f"unknown option {key!r}")
    values.update(overrides)
    opts = Options(**values)
    if opts.send_timeout <= 0:
        raise ValueError("jms.sendTimeout must be > 0: every blocking call has a timeout")
    return opts


@dataclass(frozen=True)
class Destination:
    """A queue (`orders`, `queue://orders`) or a topic (`topic://k`, on amq.topic), with
    per-destination consumer options (`?consumer.prefetchSize=10`)."""

    kind: str  # "queue" | "topic"
    name: str
    prefetch: int | None = None
    exclusive: bool = False
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    stream_offset: Any = None  # consumer.streamOffset: where a stream consumer starts

    def __str__(self) -> str:
        return f"{self.kind}://{self.name}"


_DEST_OPTIONS: dict[str, tuple[str, Any]] = {
    "consumer.prefetchSize": ("prefetch", int),
    "consumer.exclusive": ("exclusive", _bool),
    "consumer.deadLetterExchange": ("dead_letter_exchange", str),
    "consumer.deadLetterRoutingKey": ("dead_letter_routing_key", str),
    "consumer.streamOffset": ("stream_offset", lambda t: stream_offset(t)),
}


def stream_offset(text: str) -> Any:
    """`consumer.streamOffset` as the `x-stream-offset` consume argument of RabbitMQ's
    streams: first | last | next, an offset (a number), an ISO-8601 time (an AMQP
    timestamp; naive means UTC) or an interval back from now ("1h", "7D", as x-max-age)."""
    t = text.strip()
    if t in ("first", "last", "next"):
        return t
    if t.lstrip("-").isdigit():
        return int(t)
    if t[:-1].isdigit() and t[-1:] in ("Y", "M", "D", "h", "m", "s") and int(t[:-1]) > 0:
        return t
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"consumer.streamOffset must be first, last, next, an offset, an "
                         f"ISO time or an interval like 1h, not {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def parse_destination(text: str) -> Destination:
    """`name[?options]`, `queue://name`, `topic://key` → Destination."""
    name, _, query = text.partition("?")
    kind = "queue"
    for prefix in ("queue://", "topic://"):
        if name.startswith(prefix):
            kind = prefix[:-3]
            name = name[len(prefix):]
    if not name:
        raise ValueError(f"empty destination name in {text!r}")
    values: dict[str, Any] = {}
    for key, raw in parse_qsl(query, keep_blank_values=True):
        if key not in _DEST_OPTIONS:
            raise ValueError(f"unknown destination option {key!r}; known: "
                             f"{', '.join(sorted(_DEST_OPTIONS))}")
        attr, conv = _DEST_OPTIONS[key]
        values[attr] = conv(raw)
    if values.get("prefetch", 0) < 0:
        raise ValueError("consumer.prefetchSize must be >= 0")
    return Destination(kind, name, **values)


def extended_prefetch(prefetch: int) -> int:
    """J8: CLIENT-mode window, prefetch + the 0.5 × prefetch a delivered ack may add."""
    return prefetch + math.ceil(prefetch / 2)
