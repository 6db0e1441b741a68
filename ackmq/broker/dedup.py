"""Idempotent publishing: the interface of RabbitMQ's message-deduplication plugin
(github noxdafox/rabbitmq-message-deduplication), kept durable by the segment log.

A producer that lost its connection before a confirm cannot know whether the broker
stored the message; it re-sends with the same `x-deduplication-header` value and the
broker drops the copy (and still confirms it, so the producer stops retrying).

- Exchange level: exchange type `x-message-deduplication` (routes as fanout), arguments
  `x-cache-size` (required, > 0), `x-cache-ttl` (ms), `x-cache-persistence`
  (`memory` | `disk`); a message whose header value is in the cache is routed nowhere.
  `DedupCache`: a bounded insertion-ordered map, O(1) per publish.
- Queue level: queue argument `x-message-deduplication: true`; a message whose header
  value belongs to a message still in the queue (ready or unacked) is not enqueued.
  `QueueIds`: two dicts (id -> seq, seq -> id), O(1) per publish and per settle.

Durability: the ids are message headers, so they are in the log with the messages; at
start a dedup queue (and a queue bound to a dedup exchange) reads its stored messages
back and re-registers their ids (broker/queue.py), so a re-send after kill -9 or power
loss is still caught. docs/dedup.md says what differs from the plugin.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from ackmq.broker.errors import PRECONDITION_FAILED, SoftError
from ackmq.broker.exchange import EXCHANGE_CLASSES, Exchange
from ackmq.broker.message import Message
from ackmq.protocol.amqp.properties import header_value

EXCHANGE_TYPE = "x-message-deduplication"
HEADER = "x-deduplication-header"   # the message's id
TTL_HEADER = "x-cache-ttl"          # per message: how long its id is remembered (ms)
QUEUE_ARG = "x-message-deduplication"


def message_id(message: Message) -> Any:
    """The message's dedup id (strings as bytes; other scalars as they are), or None when
    it has none: such a message is never checked, as with the plugin. Tables and arrays
    are not ids (the plugin does not handle them either)."""
    raw = message.properties
    if b"x-deduplication-header" not in raw:
        return None  # the common case: no parse of the headers table
    v = header_value(raw, HEADER)  # the first such entry, nothing else decoded
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    if v is None or isinstance(v, (dict, list)):
        return None
    return v


def _positive_int(v: Any) -> int | None:
    """The plugin takes an integer > 0 or a string holding one."""
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, str):
        try:
            v = int(v.strip(), 10)
        except ValueError:
            return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return None
    return v


def check_exchange_arguments(args: dict[str, Any]) -> None:
    """The plugin's `validate/1`, in its order and with its texts (406)."""
    if _positive_int(args.get("x-cache-size")) is None:
        raise SoftError(PRECONDITION_FAILED, "Missing or invalid argument, "
                        "'x-cache-size' must be an integer greater than 0")
    if "x-cache-ttl" in args and _positive_int(args["x-cache-ttl"]) is None:
        raise SoftError(PRECONDITION_FAILED, "Invalid argument, "
                        "'x-cache-ttl' must be an integer greater than 0")
    if "x-cache-persistence" in args:
        p = args["x-cache-persistence"]
        if isinstance(p, bytes):
            p = p.decode("utf-8", "replace")
        if p not in ("disk", "memory"):
            raise SoftError(PRECONDITION_FAILED, "Invalid argument, "
                            "'x-cache-persistence' must be either 'disk' or 'memory'")


class DedupCache:
    """Ids seen, each with its expiry (monotonic seconds, or None: until evicted).

    Full: the oldest entry goes (the plugin drops an unspecified one). Expired entries are
    dropped from the front as new ones come in and ignored wherever they are."""

    __slots__ = ("size", "ttl_ms", "_ids")

    def __init__(self, size: int, ttl_ms: int | None = None) -> None:
        self.size = size
        self.ttl_ms = ttl_ms
        self._ids: OrderedDict[Any, float | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def insert(self, key: Any, ttl_ms: int | None = None, now: float | None = None) -> bool:
        """Remember `key`; False when it is already remembered (a duplicate)."""
        ids = self._ids
        if now is None:
            now = time.monotonic()
        due = ids.get(key, 0.0)
        if due is None or due > now:
            return False
        if due:  # present but expired: remembered afresh, at the back
            del ids[key]
        self._trim(now)
        ttl = ttl_ms if ttl_ms is not None else self.ttl_ms
        ids[key] = now + ttl / 1000.0 if ttl is not None else None
        return True

    def _trim(self, now: float) -> None:
        ids = self._ids
        while ids:
            key, due = next(iter(ids.items()))
            if len(ids) < self.size and (due is None or due > now):
                return
            del ids[key]

    def __contains__(self, key: Any) -> bool:
        due = self._ids.get(key, 0.0)
        return due is None or due > time.monotonic()

    def clear(self) -> None:
        self._ids.clear()


class DedupExchange(Exchange):
    """`x-message-deduplication`: a fanout that routes a message whose id it has seen
    nowhere (the channel still confirms it)."""

    type = EXCHANGE_TYPE

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        args = self.arguments
        self.cache = DedupCache(_positive_int(args.get("x-cache-size")) or 1,
                                _positive_int(args.get("x-cache-ttl")))
        self.duplicates = 0  # dropped so far (introspection, tests)

    @staticmethod
    def validate(args: dict[str, Any]) -> None:
        check_exchange_arguments(args)

    def route(self, routing_key: str, message: Message) -> list[Any]:
        key = message_id(message)
        if key is not None and not self.cache.insert(key, _message_ttl(message)):
            self.duplicates += 1
            return []
        return [b.destination for b in self.bindings.values()]

    def seed(self, message: Message) -> None:
        """A stored message found at start: its id is remembered again (from now on)."""
        key = message_id(message)
        if key is not None:
            self.cache.insert(key, _message_ttl(message))


def _message_ttl(message: Message) -> int | None:
    if b"x-cache-ttl" not in message.properties:
        return None
    return _positive_int(message.headers.get(TTL_HEADER))


class QueueIds:
    """A dedup queue's ids: those of the messages it holds, ready or unacked. An id
    leaves when its message leaves (ack, drop, expiry, dead-lettering, purge)."""

    __slots__ = ("_by_id", "_by_seq", "duplicates")

    def __init__(self) -> None:
        self._by_id: dict[Any, int] = {}
        self._by_seq: dict[int, Any] = {}
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, key: Any) -> bool:
        return key in self._by_id

    def add(self, key: Any, seq: int) -> None:
        self._by_id[key] = seq
        self._by_seq[seq] = key

    def discard_seq(self, seq: int) -> None:
        key = self._by_seq.pop(seq, None)
        if key is not None and self._by_id.get(key) == seq:
            del self._by_id[key]

    def clear(self) -> None:
        self._by_id.clear()
        self._by_seq.clear()


EXCHANGE_CLASSES[EXCHANGE_TYPE] = DedupExchange
