"""A policy's fields and definition as RabbitMQ 3.10 validates them (rabbit_policy,
rabbit_policies, rabbit_mirror_queue_misc), with its texts: the management API and
`rabbitmqctl set_policy` answer "Validation failed\\n\\n<text>\\n". Values are rendered
as Erlang's ~p renders the JSON RabbitMQ decoded (<<"a">>, #{...}, true, null).

Differences, on purpose: apply-to also takes RabbitMQ 4's `classic_queues`,
`quorum_queues` and `streams`; `consumer-timeout` is taken (RabbitMQ 3.12+), and the redelivery back-off's
`delayed-retry-type/-min/-max` (RabbitMQ 4.3's policy keys for its `x-delayed-retry-*`
arguments) with ackmq's `delayed-retry-multiplier` (SPEC L6); an invalid
`max-age` is refused with a text (3.10 crashes on it: 500); patterns are Python `re` (see `compile_pattern`).
The keys a definition may hold, and each one's check and text, are argument_table's.
"""

from __future__ import annotations

import re
from typing import Any

from ackmq.broker import argument_table as table
from ackmq.protocol.amqp.erlang import Chars, erl_term, pretty_pair

APPLY_TO = ("queues", "exchanges", "all", "classic_queues", "quorum_queues", "streams")


class PolicyError(ValueError):
    """A refused policy: `text` is RabbitMQ's reason (the API's 400 `reason`)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _failed(text: str) -> PolicyError:
    return PolicyError(f"Validation failed\n\n{text}\n")


def check_definition(definition: Any, operator: bool = False) -> dict[str, Any]:
    """The definition as RabbitMQ checks it: an object, not empty, every key known
    (those an operator policy may set, for one), then each value, in key order."""
    if not isinstance(definition, dict):
        raise _failed(f"{erl_term(definition)} is not a valid policy definition")
    if not definition:
        raise _failed("no policy provided")
    keys = table.INDEX.policy
    allowed = table.INDEX.operator if operator else keys
    unknown = [(k, v) for k, v in definition.items() if k not in allowed]
    if unknown:
        raise _failed(f"{erl_term(unknown)} are not recognised policy settings")
    for name in sorted(definition):
        key = keys[name]
        assert key.policy is not None
        err = key.policy(definition[name], definition, key)
        if err is not None:
            raise _failed(err)
    return dict(definition)


# Python `re` errors as PCRE (Erlang's re) words them, for the common mistakes
_PCRE_TEXTS = {"missing ), unterminated subpattern": "missing )",
               "unterminated character set": "missing terminating ] for character class",
               "nothing to repeat": "nothing to repeat",
               "min repeat greater than max repeat": "numbers out of order in {} quantifier",
               "missing >, unterminated name": "syntax error in subpattern name (missing "
                                               "terminator)"}
_AT_END = {"missing )", "missing terminating ] for character class"}
_PREFIX = "pattern should be regular expression but is invalid: "


def compile_pattern(pattern: Any) -> re.Pattern[str]:
    """A policy's pattern as a Python regex, searched (unanchored, as Erlang's re:run).
    Python's `re` is close to PCRE for what policies use (anchors, classes, alternation);
    PCRE-only syntax (\\Q...\\E, possessive quantifiers on older Pythons, (*VERBS)) is
    refused with Python's own error text."""
    if not isinstance(pattern, str):
        raise _failed(f"pattern should be a binary but was {erl_term(pattern)}")
    try:
        return re.compile(pattern)
    except re.error as e:
        text = _PCRE_TEXTS.get(e.msg, e.msg)
        pos = len(pattern) if text in _AT_END else (e.pos or 0)
        term = pretty_pair(len(_PREFIX), erl_term(Chars(text)), str(pos), 80)
        raise _failed(_PREFIX + term) from None


def check_priority(priority: Any) -> int | float:
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise _failed(f"priority should be a number, actually was {erl_term(priority)}")
    return priority


def check_apply_to(apply_to: Any) -> str:
    if apply_to not in APPLY_TO or not isinstance(apply_to, str):
        shown = apply_to if isinstance(apply_to, str) else erl_term(apply_to)
        raise _failed(f"apply-to '{shown}' unrecognised; should be 'queues', 'exchanges' "
                      "or 'all'")
    return apply_to

