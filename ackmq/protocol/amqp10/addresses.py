"""AMQP 1.0 node addresses (SPEC A2). Two families coexist, told apart by their first
segment, so no address means two things:

    RabbitMQ 4 (v2)  /queues/:queue              the queue (must exist: amqp:not-found)
                     /exchanges/:exchange        the exchange; routing key = subject
                     /exchanges/:exchange/:key   the exchange with that routing key
                     segments percent-encoded (RFC 3986), as RabbitMQ 4's clients write them
    RabbitMQ 3 (v1)  /queue/:q, /amq/queue/:q, /topic/:key, /exchange/:x/:key,
    and ActiveMQ     queue://name, topic://name, and a bare name (a queue)
                     -- exactly STOMP's destination names (protocol/stomp/destinations.py,
                     one grammar, one place), with their rules: /queue/ and queue:// and a
                     bare name declare a durable queue on first use; /topic/ and
                     /exchange/ as a source give the link its own exclusive queue

The plural prefixes are RabbitMQ 4's own and none of v1's or ActiveMQ's names starts
with them, so a v2 address is v2; anything else is read as v1/ActiveMQ. `null` (no
address) on a target is the anonymous terminus: each message's `to` names its node.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from ackmq.protocol.stomp.destinations import (
    AMQQUEUE,
    EXCHANGE,
    QUEUE,
    TOPIC,
    DestinationError,
    parse_destination,
)

V2_QUEUE = "v2_queue"  # /queues/q: never declared
V2_EXCHANGE = "v2_exchange"  # /exchanges/x[/key]


class AddressError(ValueError):
    """An address no rule reads (amqp:invalid-field)."""


@dataclass(slots=True, frozen=True)
class Address:
    kind: str  # V2_QUEUE, V2_EXCHANGE, or STOMP's QUEUE, AMQQUEUE, TOPIC, EXCHANGE
    name: str  # queue name, exchange name, or (TOPIC) the routing key
    key: str | None = None  # exchange addresses: the routing key, None = the subject's

    @property
    def declares(self) -> bool:
        """Is the queue declared (durable) on first use?"""
        return self.kind == QUEUE

    @property
    def is_queue(self) -> bool:
        return self.kind in (V2_QUEUE, QUEUE, AMQQUEUE)

    def routing(self, subject: str | None) -> tuple[str, str]:
        """(exchange, routing key) a message sent to this address is published with."""
        if self.is_queue:
            return "", self.name
        if self.kind == TOPIC:
            return "amq.topic", self.name
        return self.name, self.key if self.key is not None else (subject or "")

    def fixed_routing(self) -> tuple[str, str] | None:
        """`routing` when no message's subject changes it (kept per link), else None."""
        if self.is_queue or self.kind == TOPIC or self.key is not None:
            return self.routing(None)
        return None


def parse_address(text: str) -> Address:
    if text.startswith("/queues/"):
        name = unquote(text[len("/queues/"):])
        if not name or "/" in text[len("/queues/"):]:
            raise AddressError(f"invalid address '{text}'")
        return Address(V2_QUEUE, name)
    if text.startswith("/exchanges/"):
        parts = text[len("/exchanges/"):].split("/")
        if not parts[0] or len(parts) > 2:
            raise AddressError(f"invalid address '{text}'")
        x = unquote(parts[0])
        if x == "amq.default":  # RabbitMQ 4 refuses the default exchange by name
            raise AddressError(f"invalid address '{text}'")
        return Address(V2_EXCHANGE, x, unquote(parts[1]) if len(parts) == 2 else None)
    try:
        d = parse_destination(text)
    except DestinationError as e:
        raise AddressError(e.detail.strip()) from None
    if d.kind not in (QUEUE, AMQQUEUE, TOPIC, EXCHANGE):
        raise AddressError(f"invalid address '{text}'")
    if d.kind == EXCHANGE:
        return Address(EXCHANGE, d.name, d.key)
    return Address(d.kind, d.name)
