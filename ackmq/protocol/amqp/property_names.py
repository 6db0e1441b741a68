"""The one map between RabbitMQ's names for the basic properties and pamqp's.

RabbitMQ's management API, its UI publish form, STOMP headers and Spark's schema call
the property `type` (and spell it so in JSON); pamqp's `Basic.Properties` calls it
`message_type`. Every other name is the same. Passing RabbitMQ's names straight to
`Basic.Properties(**…)` fails on `type` ("unexpected keyword argument"), so every
place that turns RabbitMQ-named properties into pamqp ones goes through here.
"""

from __future__ import annotations

from typing import Any

from ackmq.protocol.amqp.properties import FIELDS

# pamqp's name -> RabbitMQ's, in the content header's wire order (properties.FIELDS)
PAMQP_TO_RABBIT: dict[str, str] = {name: ("type" if name == "message_type" else name)
                                   for _flag, name, _kind in FIELDS}
RABBIT_NAMES: tuple[str, ...] = tuple(PAMQP_TO_RABBIT.values())
RABBIT_TO_PAMQP: dict[str, str] = {v: k for k, v in PAMQP_TO_RABBIT.items()}


def to_pamqp(props: dict[str, Any]) -> dict[str, Any]:
    """RabbitMQ-named properties as pamqp keyword arguments; an unknown name raises
    KeyError naming it (the caller answers 400 with RabbitMQ's text)."""
    return {RABBIT_TO_PAMQP[k]: v for k, v in props.items()}


def to_rabbit(props: dict[str, Any]) -> dict[str, Any]:
    """pamqp-named properties (e.g. `Basic.Properties` attributes) under RabbitMQ's names."""
    return {PAMQP_TO_RABBIT[k]: v for k, v in props.items()}
