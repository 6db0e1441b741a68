"""MQTT topic names and filters, and their place on `amq.topic` as RabbitMQ's MQTT plugin
puts them: `/` <-> `.`, `+` <-> `*`, `#` <-> `#` (so an AMQP, STOMP or AMQP 1.0 client
publishing with routing key `a.b` reaches MQTT subscribers of `a/b`, and the other way
round). As RabbitMQ's, the mapping is lossy for a `.` inside an MQTT topic level."""

from __future__ import annotations

from dataclasses import dataclass

SHARE_PREFIX = "$share/"


class TopicError(ValueError):
    """A topic name or filter the specification forbids."""


def check_name(topic: str) -> None:
    """A PUBLISH topic: not empty, no wildcard ([MQTT-3.3.2-2])."""
    if not topic:
        raise TopicError("the topic name is empty")
    if "+" in topic or "#" in topic:
        raise TopicError(f"the topic name {topic[:100]!r} contains a wildcard")


def check_filter(flt: str) -> None:
    """A SUBSCRIBE filter: `#` alone in the last level, `+` alone in its level."""
    if not flt:
        raise TopicError("the topic filter is empty")
    levels = flt.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise TopicError(f"'#' must be the last level alone in {flt[:100]!r}")
        if "+" in level and level != "+":
            raise TopicError(f"'+' must be alone in its level in {flt[:100]!r}")


@dataclass(frozen=True, slots=True)
class Filter:
    """A subscription's filter: `share` the group of a `$share/<group>/<filter>`."""

    text: str  # as the client wrote it
    topic: str  # without the $share/<group>/ prefix
    share: str | None = None


def parse_filter(text: str) -> Filter:
    if text.startswith(SHARE_PREFIX):
        group, sep, rest = text[len(SHARE_PREFIX):].partition("/")
        if not sep or not group or "+" in group or "#" in group or not rest:
            raise TopicError(f"{text[:100]!r} is not $share/<group>/<filter>")
        check_filter(rest)
        return Filter(text, rest, group)
    check_filter(text)
    return Filter(text, text)


def to_amqp(topic: str) -> str:
    """An MQTT topic or filter as an amq.topic routing / binding key."""
    return topic.replace("/", ".").replace("+", "*")


def from_amqp(routing_key: str) -> str:
    """An amq.topic routing key as the MQTT topic a subscriber sees."""
    return routing_key.replace(".", "/").replace("*", "+")


def matches(flt: str, topic: str) -> bool:
    """Does MQTT filter `flt` match topic name `topic`? A topic starting with `$` is not
    matched by a wildcard in the first level ([MQTT-4.7.2-1])."""
    f = flt.split("/")
    t = topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)
