"""STOMP destination names, as RabbitMQ's STOMP plugin reads and writes them, plus
ActiveMQ's `queue://` and `topic://` spellings.

Parsing follows `rabbit_routing_util:parse_endpoint/1` (RabbitMQ 3.10) so the same
names mean the same things and bad ones get the same ERROR texts:

    /queue/N          queue N (created durable on first use)
    /amq/queue/N      existing queue N (never created)
    /topic/K          amq.topic, routing key K (each subscription its own queue)
    /exchange/E[/K]   exchange E, routing key / binding pattern K
    /temp-queue/N     a reply queue of this connection (only in `reply-to`)
    /reply-queue/Q    queue Q, the rest taken verbatim (names may hold slashes)
    N                 no slash at all: queue N
    queue://N         ActiveMQ: queue N, as /queue/N
    topic://K         ActiveMQ: as /topic/K, with ActiveMQ's `>` wildcard read as `#`

`%2F` in a name stands for `/` (RabbitMQ's escaping; `format_destination` writes it).
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUE, AMQQUEUE, TOPIC, EXCHANGE, TEMP_QUEUE, REPLY_QUEUE = (
    "queue", "amqqueue", "topic", "exchange", "temp_queue", "reply_queue")

# RabbitMQ's list in its "Unknown destination" text, then ActiveMQ's two
VALID_PREFIXES = ("/temp-queue", "/exchange", "/topic", "/queue", "/amq/queue", "/reply-queue/",
                  "queue://", "topic://")
# reply-to values starting with one of these are destinations already (RabbitMQ)
DEST_PREFIXES = ("/exchange", "/topic", "/queue", "/amq/queue", "/reply-queue/")


class DestinationError(Exception):
    """A destination that cannot be parsed: `message` and `detail` as RabbitMQ words them."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(f"{message}: {detail}")
        self.message = message
        self.detail = detail


@dataclass(slots=True, frozen=True)
class Destination:
    kind: str                 # one of QUEUE, AMQQUEUE, TOPIC, EXCHANGE, TEMP_QUEUE, REPLY_QUEUE
    name: str                 # queue name, topic routing key, exchange name or temp-queue id
    key: str | None = None    # /exchange/E/K: K
    activemq: bool = False    # given as queue:// or topic:// (ActiveMQ's rules apply)

    def routing(self) -> tuple[str, str]:
        """(exchange, routing key) a SEND to this destination is published with."""
        if self.kind == TOPIC:
            return "amq.topic", self.name
        if self.kind == EXCHANGE:
            return self.name, self.key or ""
        return "", self.name


def _unescape(text: str) -> str:
    return text.replace("%2F", "/")


def _to_url(rest: list[str]) -> str:
    return "/" + "/".join(rest) if rest else ""


def _invalid(kind: str, content: str) -> DestinationError:
    return DestinationError("Invalid destination", f"'{content}' is not a valid {kind} "
                                                   "destination\n")


def parse_destination(text: str) -> Destination:
    """A destination header's value; DestinationError for one RabbitMQ would refuse."""
    if text.startswith("queue://"):
        name = text[len("queue://"):]
        if not name:
            raise _invalid(QUEUE, text)
        return Destination(QUEUE, name, activemq=True)
    if text.startswith("topic://"):
        key = text[len("topic://"):]
        if not key:
            raise _invalid(TOPIC, text)
        return Destination(TOPIC, activemq_topic_key(key), activemq=True)
    parts = text.split("/")
    if len(parts) == 1:
        return Destination(QUEUE, _unescape(text))
    if parts[0] == "" and len(parts) >= 2:
        kind = parts[1]
        if kind in ("exchange", "queue", "topic", "temp-queue"):
            return _parse_typed(kind.replace("-", "_"), parts[2:])
        if kind == "amq" and len(parts) >= 3 and parts[2] == "queue":
            return _parse_typed(AMQQUEUE, parts[3:])
        if kind == "reply-queue" and len(parts) >= 3:
            return Destination(REPLY_QUEUE, text[len("/reply-queue/"):])
    raise DestinationError("Unknown destination",
                           f"'{text}' is not a valid destination.\n"
                           f"Valid destination types are: {', '.join(VALID_PREFIXES)}.\n")


def _parse_typed(kind: str, rest: list[str]) -> Destination:
    if kind == EXCHANGE:
        if not rest or rest[0] == "" or len(rest) > 2:
            raise _invalid(kind, _to_url(rest))
        key = _unescape(rest[1]) if len(rest) == 2 else None
        return Destination(EXCHANGE, _unescape(rest[0]), key)
    if len(rest) == 1 and rest[0]:
        return Destination(kind, _unescape(rest[0]))
    raise _invalid(kind, _to_url(rest))


def activemq_topic_key(name: str) -> str:
    """ActiveMQ's topic wildcards to AMQP's: `>` (the rest) is `#`; `*` is the same."""
    if ">" not in name:
        return name
    return ".".join("#" if w == ">" else w for w in name.split("."))


def _escape(text: str) -> str:
    """RabbitMQ's escaping of a name in a MESSAGE's destination: `/`, `%` and bytes
    outside 32..127 as %XX."""
    out = []
    for b in text.encode("utf-8"):
        if b == 0x2F:
            out.append("%2F")
        elif b == 0x25:
            out.append("%25")
        elif b < 32 or b > 127:
            out.append(f"%{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def _escape_fast(text: str) -> str:
    if text.isascii() and text.isprintable() and "/" not in text and "%" not in text:
        return text
    return _escape(text)


def format_destination(exchange: str, routing_key: str) -> str:
    """The `destination` header of a MESSAGE, from where the message was published."""
    if exchange == "":
        return "/queue/" + _escape_fast(routing_key)
    if exchange == "amq.topic":
        return "/topic/" + _escape_fast(routing_key)
    if routing_key == "":
        return "/exchange/" + _escape_fast(exchange)
    return "/exchange/" + _escape_fast(exchange) + "/" + _escape_fast(routing_key)
