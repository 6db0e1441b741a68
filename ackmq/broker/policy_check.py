"""A policy's fields and definition as RabbitMQ 3.10 validates them (rabbit_policy,
rabbit_policies, rabbit_mirror_queue_misc), with its texts: the management API and
`rabbitmqctl set_policy` answer "Validation failed\\n\\n<text>\\n". Values are rendered
as Erlang's ~p renders the JSON RabbitMQ decoded (<<"a">>, #{...}, true, null).

Differences, on purpose: apply-to also takes RabbitMQ 4's `classic_queues`,
`quorum_queues` and `streams`; `consumer-timeout` is taken (RabbitMQ 3.12+), and the redelivery back-off's
`delayed-retry-type/-min/-max` (RabbitMQ 4.3's policy keys for its `x-delayed-retry-*`
arguments) with ackmq's `delayed-retry-multiplier` (SPEC L6); an invalid
`max-age` is refused with a text (3.10 crashes on it: 500); patterns are Python `re` (see `compile_pattern`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ackmq.broker.arguments import max_age_ms
from ackmq.broker.retry import check_retry_argument
from ackmq.protocol.amqp.erlang import erl_string

APPLY_TO = ("queues", "exchanges", "all", "classic_queues", "quorum_queues", "streams")
# what an operator policy may set (RabbitMQ 3.10's operator_policy_validator)
OPERATOR_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes",
                 "max-in-memory-length", "max-in-memory-bytes", "delivery-limit")
HA_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
           "ha-promote-on-shutdown", "ha-promote-on-failure")


class PolicyError(ValueError):
    """A refused policy: `text` is RabbitMQ's reason (the API's 400 `reason`)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def erl_term(v: Any) -> str:
    """A decoded JSON value as Erlang's ~p prints it in RabbitMQ's texts."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return f"<<{erl_string(v)}>>"
    if isinstance(v, list):
        return "[" + ",".join(erl_term(x) for x in v) + "]"
    if isinstance(v, dict):
        return "#{" + ",".join(f"{erl_term(k)} => {erl_term(x)}" for k, x in v.items()) + "}"
    return str(v)


def _failed(text: str) -> PolicyError:
    return PolicyError(f"Validation failed\n\n{text}\n")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _nonneg(what: str) -> Callable[[Any, dict[str, Any]], str | None]:
    def check(v: Any, d: dict[str, Any]) -> str | None:
        return None if _int(v) and v >= 0 else f"{erl_term(v)} is not a valid {what}"
    return check


def _positive(what: str) -> Callable[[Any, dict[str, Any]], str | None]:
    def check(v: Any, d: dict[str, Any]) -> str | None:
        return None if _int(v) and v >= 1 else f"{erl_term(v)} is not a valid {what}"
    return check


def _text(what: str) -> Callable[[Any, dict[str, Any]], str | None]:
    def check(v: Any, d: dict[str, Any]) -> str | None:
        return None if isinstance(v, str) else f"{erl_term(v)} is not a valid {what}"
    return check


def _choice(choices: tuple[str, ...], text: str) -> Callable[[Any, dict[str, Any]], str | None]:
    def check(v: Any, d: dict[str, Any]) -> str | None:
        return None if v in choices and isinstance(v, str) else text.format(erl_term(v))
    return check


def _retry(key: str, what: str) -> Callable[[Any, dict[str, Any]], str | None]:
    """A back-off key, by the rule its `x-` argument has (retry.check_retry_argument:
    one rule), in a policy's words; a delay must also be positive here (0 would turn
    the back-off off, which a policy does by not setting it)."""
    def check(v: Any, d: dict[str, Any]) -> str | None:
        args = {"x-" + k: x for k, x in d.items() if k.startswith("delayed-retry-")}
        err = check_retry_argument("x-" + key, v, args)
        if err is not None and err.startswith("{max_less_than_min"):
            return f"delayed-retry-max {v} is less than delayed-retry-min {d[_MIN]}"
        if err is not None or (key != "delayed-retry-multiplier" and v == 0):
            return f"{erl_term(v)} is not a valid {what}"
        return None
    return check


_MIN = "delayed-retry-min"


def _max_age(v: Any, d: dict[str, Any]) -> str | None:
    ok = isinstance(v, str) and _AGE_OK.match(v) is not None and max_age_ms(v) is not None
    return None if ok else f"{erl_term(v)} is not a valid max age"


_AGE_OK = re.compile(r"[0-9]+")


def _ha_mode(v: Any, d: dict[str, Any]) -> str | None:
    if v not in ("all", "exactly", "nodes"):
        return f"{erl_term(v)} is not a valid ha-mode value"
    p: Any = d.get("ha-params")
    if v == "exactly" and not (isinstance(p, int) and not isinstance(p, bool) and p > 0):
        return ('ha-mode="exactly" takes an integer, '
                f"{'none' if p is None else erl_term(p)} given")
    if v == "nodes":
        if not isinstance(p, list):
            return f'ha-mode="nodes" takes a list, {"none" if p is None else erl_term(p)} given'
        if not p:
            return 'ha-mode="nodes" list must be non-empty'
        if not all(isinstance(n, str) for n in p):
            return f'ha-mode="nodes" takes a list of strings, {erl_term(p)} given'
    if v == "all" and p is not None:
        return 'ha-mode="all" does not take parameters'
    return None


def _ha_needs_mode(v: Any, d: dict[str, Any]) -> str | None:
    if "ha-mode" not in d:
        return ("ha-mode must be specified to specify ha-params, ha-sync-mode or "
                "ha-promote-on-shutdown")
    return None


def _ha_choice(key: str, choices: tuple[str, str]) -> Callable[[Any, dict[str, Any]], str | None]:
    def check(v: Any, d: dict[str, Any]) -> str | None:
        err = _ha_needs_mode(v, d)
        if err is None and v not in choices:
            err = f'{key} must be "{choices[0]}" or "{choices[1]}", got {erl_term(v)}'
        return err
    return check


def _ha_batch(v: Any, d: dict[str, Any]) -> str | None:
    err = _ha_needs_mode(v, d)
    if err is None and not (_int(v) and v > 0):
        err = f"ha-sync-batch-size takes an integer greater than 0, {erl_term(v)} given"
    return err


# every key a policy may set, with its check (RabbitMQ 3.10's texts); checked in key order
KEYS: dict[str, Callable[[Any, dict[str, Any]], str | None]] = {
    "alternate-exchange": _text("alternate exchange name"),
    "consumer-timeout": _nonneg("consumer timeout"),
    "dead-letter-exchange": _text("dead letter exchange name"),
    "dead-letter-routing-key": _text("dead letter routing key"),
    "dead-letter-strategy": _choice(("at-most-once", "at-least-once"),
                                    "{} is not a valid dead letter strategy"),
    "delayed-retry-max": _retry("delayed-retry-max", "delayed retry maximum delay"),
    "delayed-retry-min": _retry(_MIN, "delayed retry minimum delay"),
    "delayed-retry-multiplier": _retry("delayed-retry-multiplier",
                                       "delayed retry multiplier"),
    "delayed-retry-type": _retry("delayed-retry-type", "delayed retry type"),
    "delivery-limit": _nonneg("delivery limit"),
    "expires": _positive("queue expiry"),
    "ha-mode": _ha_mode,
    "ha-params": _ha_needs_mode,
    "ha-promote-on-failure": _ha_choice("ha-promote-on-failure", ("always", "when-synced")),
    "ha-promote-on-shutdown": _ha_choice("ha-promote-on-shutdown", ("always", "when-synced")),
    "ha-sync-batch-size": _ha_batch,
    "ha-sync-mode": _ha_choice("ha-sync-mode", ("manual", "automatic")),
    "initial-cluster-size": _nonneg("cluster size"),
    "max-age": _max_age,
    "max-in-memory-bytes": _nonneg("maximum memory in bytes"),
    "max-in-memory-length": _nonneg("maximum memory in bytes"),
    "max-length": _nonneg("maximum length"),
    "max-length-bytes": _nonneg("maximum length in bytes"),
    "message-ttl": _nonneg("message TTL"),
    "overflow": _choice(("drop-head", "reject-publish", "reject-publish-dlx"),
                        "{} is not a valid overflow value"),
    "queue-leader-locator": _choice(("client-local", "balanced"),
                                    "{} is not a valid queue leader locator value"),
    "queue-master-locator": _choice(("min-masters", "client-local", "random"),
                                    "{} invalid queue-master-locator value"),
    "queue-mode": _choice(("default", "lazy"), "{} is not a valid queue-mode value"),
    "queue-version": lambda v, d: None if v in (1, 2) and _int(v)
    else f"{erl_term(v)} is not a valid queue-version value",
    "stream-max-segment-size-bytes": _nonneg("segment size"),
}


def check_definition(definition: Any, operator: bool = False) -> dict[str, Any]:
    """The definition as RabbitMQ checks it: an object, not empty, every key known
    (those an operator policy may set, for one), then each value, in key order."""
    if not isinstance(definition, dict):
        raise _failed(f"{erl_term(definition)} is not a valid policy definition")
    if not definition:
        raise _failed("no policy provided")
    allowed = OPERATOR_KEYS if operator else KEYS
    unknown = [(k, v) for k, v in definition.items() if k not in allowed]
    if unknown:
        terms = ",".join(f"{{{erl_term(k)},{erl_term(v)}}}" for k, v in unknown)
        raise _failed(f"[{terms}] are not recognised policy settings")
    for key in sorted(definition):
        err = KEYS[key](definition[key], definition)
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
        term = f"{{{erl_string(text)},{pos}}}"
        if len(_PREFIX) + len(term) > 80:  # ~p breaks a term that does not fit the line
            term = f"{{{erl_string(text)},\n{' ' * (len(_PREFIX) + 1)}{pos}}}"
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

