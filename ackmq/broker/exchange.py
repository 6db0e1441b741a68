"""Exchanges: where a routing key and headers become a set of destinations.

Destinations are queues or (for exchange-to-exchange bindings) other exchanges; the
vhost resolves the latter recursively. Each type keeps the index that makes its
routing cheap: a dict for direct, a set for fanout, a cache per routing key for topic.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from mypy_extensions import mypyc_attr

from ackmq.broker.message import Message

TYPES = ("direct", "fanout", "topic", "headers")


def args_key(arguments: dict[str, Any] | None) -> tuple:
    if not arguments:
        return ()
    return tuple(sorted((k, repr(v)) for k, v in arguments.items()))


class Binding:
    __slots__ = ("source", "destination", "routing_key", "arguments", "key")

    def __init__(self, source: Exchange, destination: Any, routing_key: str,
                 arguments: dict[str, Any] | None) -> None:
        self.source = source
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = dict(arguments or {})
        self.key = (id(destination), routing_key, args_key(arguments))


@mypyc_attr(allow_interpreted_subclasses=True)
class Exchange:
    """Base: bookkeeping of bindings; subclasses implement `route`."""

    type: ClassVar[str] = ""
    policy: str | None = None  # the policy in force (broker/policy.py sets it)

    def __init__(self, name: str, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[tuple, Binding] = {}
        # publishes to this exchange, and the queue deliveries they routed to (the
        # management API's publish_in / publish_out; bumped by the publishing channel)
        self.stat_in = 0
        self.stat_out = 0
        # RabbitMQ's alternate exchange: where what this exchange cannot route goes
        ae = self.arguments.get("alternate-exchange")
        if isinstance(ae, bytes):
            ae = ae.decode("utf-8", "replace")
        self.alternate: str | None = ae if isinstance(ae, str) and ae else None

    def bind(self, b: Binding) -> bool:
        if b.key in self.bindings:
            return False
        self.bindings[b.key] = b
        self._added(b)
        return True

    def unbind(self, key: tuple) -> Binding | None:
        b = self.bindings.pop(key, None)
        if b is not None:
            self._removed(b)
        return b

    def _added(self, b: Binding) -> None:
        pass

    def _removed(self, b: Binding) -> None:
        pass

    def declared(self, vhost: Any) -> None:
        """Made by `vhost` (a declare or recovery): a delaying exchange makes its timer
        store here (broker/delayed.py)."""

    def removed(self) -> None:
        """Deleted from its vhost (after its bindings)."""

    @staticmethod
    def validate(args: dict[str, Any]) -> None:
        """A new exchange's type-specific arguments (RabbitMQ's exchange-type `validate`):
        raises SoftError (406) on a bad one."""

    def route(self, routing_key: str, message: Message) -> list[Any]:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)  # broker/delayed.py's opt-in
class DirectExchange(Exchange):
    type = "direct"

    def __init__(self, name: str, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(name, durable, auto_delete, internal, arguments)
        self._by_key: dict[str, list[Any]] = {}

    def _added(self, b: Binding) -> None:
        self._by_key.setdefault(b.routing_key, []).append(b.destination)

    def _removed(self, b: Binding) -> None:
        dests = self._by_key.get(b.routing_key)
        if dests is not None:
            dests.remove(b.destination)
            if not dests:
                del self._by_key[b.routing_key]

    def route(self, routing_key: str, message: Message) -> list[Any]:
        return self._by_key.get(routing_key, [])


@mypyc_attr(allow_interpreted_subclasses=True)  # broker/delayed.py's opt-in
class FanoutExchange(Exchange):
    type = "fanout"

    def route(self, routing_key: str, message: Message) -> list[Any]:
        return [b.destination for b in self.bindings.values()]


def topic_match(pattern: list[str], words: list[str]) -> bool:
    """AMQP topic match: `*` is exactly one word, `#` zero or more."""
    pi = wi = 0
    star_p = star_w = -1
    # iterative matcher with backtracking on the last '#'
    while wi < len(words) or pi < len(pattern):
        if pi < len(pattern):
            p = pattern[pi]
            if p == "#":
                star_p, star_w = pi, wi
                pi += 1
                continue
            if wi < len(words) and (p == "*" or p == words[wi]):
                pi += 1
                wi += 1
                continue
        if star_p >= 0 and star_w < len(words):
            star_w += 1
            pi, wi = star_p + 1, star_w
            continue
        return False
    return True


@mypyc_attr(allow_interpreted_subclasses=True)  # broker/delayed.py's opt-in
class TopicExchange(Exchange):
    type = "topic"
    _CACHE_MAX: Final = 4096

    def __init__(self, name: str, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None) -> None:
        super().__init__(name, durable, auto_delete, internal, arguments)
        self._cache: dict[str, list[Any]] = {}

    def _added(self, b: Binding) -> None:
        self._cache.clear()

    def _removed(self, b: Binding) -> None:
        self._cache.clear()

    def route(self, routing_key: str, message: Message) -> list[Any]:
        hit = self._cache.get(routing_key)
        if hit is not None:
            return hit
        words = routing_key.split(".") if routing_key else []
        out = []
        for b in self.bindings.values():
            pattern = b.routing_key.split(".") if b.routing_key else []
            if topic_match(pattern, words):
                out.append(b.destination)
        if len(self._cache) >= self._CACHE_MAX:
            self._cache.clear()
        self._cache[routing_key] = out
        return out


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bytes):
        a = a.decode("utf-8", "replace")
    if isinstance(b, bytes):
        b = b.decode("utf-8", "replace")
    return a == b


def headers_match(args: dict[str, Any], headers: dict[str, Any]) -> bool:
    """x-match all/any (and RabbitMQ's all-with-x/any-with-x); void values test presence."""
    mode = args.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode()
    with_x = mode.endswith("-with-x")
    want_all = not mode.startswith("any")
    matched_any = False
    for k, v in args.items():
        if k == "x-match" or (k.startswith("x-") and not with_x):
            continue
        ok = k in headers and (v is None or _values_equal(v, headers[k]))
        if want_all and not ok:
            return False
        if ok:
            matched_any = True
            if not want_all:
                return True
    return want_all or matched_any


@mypyc_attr(allow_interpreted_subclasses=True)  # broker/delayed.py's opt-in
class HeadersExchange(Exchange):
    type = "headers"

    def route(self, routing_key: str, message: Message) -> list[Any]:
        if not self.bindings:
            return []
        headers = message.headers or {}
        return [b.destination for b in self.bindings.values()
                if headers_match(b.arguments, headers)]


@mypyc_attr(allow_interpreted_subclasses=True)  # broker/delayed.py's opt-in
class DefaultExchange(Exchange):
    """The nameless direct exchange: every queue is bound to it by its name."""

    type = "direct"

    def __init__(self, queues: dict[str, Any]) -> None:
        super().__init__("", durable=True)
        self._queues = queues

    def route(self, routing_key: str, message: Message) -> list[Any]:
        q = self._queues.get(routing_key)
        return [q] if q is not None else []


EXCHANGE_CLASSES: dict[str, type[Exchange]] = {
    "direct": DirectExchange, "fanout": FanoutExchange,
    "topic": TopicExchange, "headers": HeadersExchange,
}
