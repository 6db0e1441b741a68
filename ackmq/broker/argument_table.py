"""Every queue, exchange and consume argument and every policy key, declared once (SPEC
C4): its name, the queue types that take it, the check of its value (RabbitMQ 3.10's
reason, or ackmq's in its style), whether a policy or an operator policy may set it and
how a policy folds into the argument, the UI's short label. Validation (arguments.py),
policy checks and application (policy_check.py, policy.py) and the UI read `INDEX`,
derived from `KEYS` at import and read at each call, so a key added to `KEYS` is known
to all of them; nothing else names a key's rules.

The table is data in RabbitMQ's order: the rows of RabbitMQ's queue arguments are in its
declare_args order (the order their values are checked, the first failure reported);
`types` gives each queue type's place for the key in that type's capability list (the
order a redeclare compares them in). ackmq's own arguments (`own`) follow RabbitMQ's,
checked and compared in table order on classic and quorum queues.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ackmq.broker.errors import INTERNAL_ERROR, HardError
from ackmq.protocol.amqp.constants import SEQ_HEADER
from ackmq.protocol.amqp.erlang import Atom, Chars, erl_term, reason

# an argument's check: None when fine, else RabbitMQ's reason (the text after "...: ")
ArgCheck = Callable[[Any, Mapping[str, Any]], str | None]
# a policy key's check of its value in a definition, given its own row: None when fine,
# else RabbitMQ's text ("... is not a valid ...")
PolicyCheck = Callable[[Any, Mapping[str, Any], "Key"], str | None]

MAX_EXPIRY_MS = 315_360_000_000  # ten years: RabbitMQ's bound for TTLs and expiration
MAX_PRIORITY = 255
MAX_DELAY_MS = 2**32 - 1  # ~49.7 days: any one back-off delay is capped there (L6)
UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000,
           "h": 3_600_000, "m": 60_000, "s": 1000}
_AGE = re.compile(r"([0-9]*)(.*)", re.S)
_AGE_OK = re.compile(r"[0-9]+")


# -- values as RabbitMQ sees them ----------------------------------------------------------
def type_name(v: Any) -> str:
    """The AMQP field-table type RabbitMQ names in its texts (as pika would encode v)."""
    if v is None:
        return "void"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint" if -2**31 <= v < 2**31 else "long"
    if isinstance(v, (str, bytes)):
        return "longstr"
    if isinstance(v, float):
        return "double"
    if isinstance(v, decimal.Decimal):
        return "decimal"
    if isinstance(v, datetime.datetime):
        return "timestamp"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, list):
        return "array"
    return type(v).__name__


def as_text(v: Any) -> str | None:
    """A string argument (AMQP longstr arrives as bytes); None if it is not one."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


def as_number(v: Any) -> float | None:
    """An AMQP number: int, double, or decimal (pika sends a Decimal for 1.5)."""
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def internal_error() -> HardError:
    """What a client sees when RabbitMQ's channel crashes: 541, the bare code name."""
    e = HardError(INTERNAL_ERROR, "")
    e.text = "INTERNAL_ERROR"
    return e


def max_age_ms(text: str) -> int | None:
    """RabbitMQ's check_max_age: "7D", "12h", "1Y"… in ms; None when invalid; a value
    with no leading digits crashes RabbitMQ (541)."""
    m = _AGE.match(text)
    assert m is not None
    digits, unit = m.groups()
    if not digits:
        raise internal_error()
    n = int(digits)
    if n <= 0 or unit not in UNIT_MS:
        return None
    return n * UNIT_MS[unit]


# -- argument checks (RabbitMQ's reasons) -------------------------------------------------------
def _unacceptable(v: Any) -> str:
    return reason("unacceptable_type", Atom(type_name(v)))


def _integer(v: Any, args: Mapping[str, Any]) -> str | None:
    return None if _is_int(v) else erl_term(Chars(f"expected integer, got {type_name(v)}"))


def _non_neg(v: Any, args: Mapping[str, Any]) -> str | None:
    err = _integer(v, args)
    if err is None and v < 0:
        return reason("value_negative", v)
    return err


def _expiry(v: int) -> str | None:
    if v < 0:
        return reason("value_negative", v)
    if v > MAX_EXPIRY_MS:
        return reason("value_too_large", v)
    return None


def _expires(v: Any, args: Mapping[str, Any]) -> str | None:
    err = _integer(v, args)
    if err is not None:
        return err
    return reason("value_zero", 0) if v == 0 else _expiry(v)


def _message_ttl(v: Any, args: Mapping[str, Any]) -> str | None:
    return _integer(v, args) or _expiry(v)


def _text(v: Any, args: Mapping[str, Any]) -> str | None:
    return None if as_text(v) is not None else _unacceptable(v)


def _dlx_routing_key(v: Any, args: Mapping[str, Any]) -> str | None:
    if as_text(v) is None:
        return _unacceptable(v)
    if "x-dead-letter-exchange" not in args:
        return "routing_key_but_no_dlx_defined"
    return None


def _max_priority(v: Any, args: Mapping[str, Any]) -> str | None:
    err = _non_neg(v, args)
    if err is None and v > MAX_PRIORITY:
        return reason("max_value_exceeded", v)
    return err


def _one_of(choices: tuple[str, ...], error: str | Callable[[str], str]) -> ArgCheck:
    """A string among `choices`; else `error` (or `error(value)`)."""
    def check(v: Any, args: Mapping[str, Any]) -> str | None:
        s = as_text(v)
        if s is None:
            return _unacceptable(v)
        if s in choices:
            return None
        return error if isinstance(error, str) else error(s)
    return check


def _bool(v: Any, args: Mapping[str, Any]) -> str | None:
    return None if isinstance(v, bool) else _unacceptable(v)


def _queue_version(v: Any, args: Mapping[str, Any]) -> str | None:
    err = _non_neg(v, args)
    if err is None and v not in (1, 2):
        return erl_term(Chars(f"unsupported queue version '{v}'"))
    return err


def _cluster_size(v: Any, args: Mapping[str, Any]) -> str | None:
    err = _non_neg(v, args)
    return err if err is not None else (reason("value_zero", 0) if v == 0 else None)


def _max_age(v: Any, args: Mapping[str, Any]) -> str | None:
    s = as_text(v)
    if s is None:
        return _unacceptable(v)
    return "invalid_max_age" if max_age_ms(s) is None else None


RETRY_TYPES = ("disabled", "all", "failed", "returned")


def _retry_delay(v: Any, args: Mapping[str, Any]) -> str | None:
    """x-delayed-retry-min/-max: ms, 0..MAX_DELAY_MS; the max not under the min."""
    if not _is_int(v):
        return _unacceptable(v)
    if v < 0:
        return reason("value_negative", v)
    if v > MAX_DELAY_MS:
        return reason("value_too_large", v)
    return None


def _retry_max(v: Any, args: Mapping[str, Any]) -> str | None:
    err = _retry_delay(v, args)
    lo = args.get("x-delayed-retry-min")
    if err is None and _is_int(lo) and v < lo:
        return reason("max_less_than_min", v, lo)
    return err


def _retry_multiplier(v: Any, args: Mapping[str, Any]) -> str | None:
    n = as_number(v)
    if n is None:
        return _unacceptable(v)
    if not math.isfinite(n):
        return reason("value_not_finite", v)
    return reason("value_too_small", v) if n < 1 else None


# -- policy checks (RabbitMQ's rabbit_policies texts) -------------------------------------------
def _p_nonneg(what: str) -> PolicyCheck:
    def check(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
        return None if _is_int(v) and v >= 0 else f"{erl_term(v)} is not a valid {what}"
    return check


def _p_positive(what: str) -> PolicyCheck:
    def check(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
        return None if _is_int(v) and v >= 1 else f"{erl_term(v)} is not a valid {what}"
    return check


def _p_text(what: str) -> PolicyCheck:
    def check(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
        return None if isinstance(v, str) else f"{erl_term(v)} is not a valid {what}"
    return check


def _p_choice(choices: tuple[Any, ...], text: str) -> PolicyCheck:
    """`text` with `{}` for the value; ints (queue-version) are taken as ints only."""
    def check(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
        ok = v in choices and type(v) is type(choices[0])
        return None if ok else text.format(erl_term(v))
    return check


def _p_retry(what: str) -> PolicyCheck:
    """A back-off key, by the rule its `x-` argument has (one rule), in a policy's
    words; a delay must also be positive here (0 would turn the back-off off, which a
    policy does by not setting it)."""
    def check(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
        args = {"x-" + k: x for k, x in d.items() if k.startswith("delayed-retry-")}
        err = key.check(v, args) if key.check is not None else None
        if err is not None and err.startswith("{max_less_than_min"):
            return f"delayed-retry-max {v} is less than delayed-retry-min {d['delayed-retry-min']}"
        if err is not None or (key.name != "x-delayed-retry-multiplier" and v == 0):
            return f"{erl_term(v)} is not a valid {what}"
        return None
    return check


def _p_max_age(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
    ok = isinstance(v, str) and _AGE_OK.match(v) is not None and max_age_ms(v) is not None
    return None if ok else f"{erl_term(v)} is not a valid max age"


def _p_ha_mode(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
    if v not in ("all", "exactly", "nodes"):
        return f"{erl_term(v)} is not a valid ha-mode value"
    p: Any = d.get("ha-params")
    if v == "exactly" and not (_is_int(p) and p > 0):
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


def _p_ha_needs_mode(v: Any, d: Mapping[str, Any], key: Key | None = None) -> str | None:
    if "ha-mode" not in d:
        return ("ha-mode must be specified to specify ha-params, ha-sync-mode or "
                "ha-promote-on-shutdown")
    return None


def _p_ha_choice(choices: tuple[str, str]) -> PolicyCheck:
    def check(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
        err = _p_ha_needs_mode(v, d)
        if err is None and v not in choices:
            err = f'{key.name} must be "{choices[0]}" or "{choices[1]}", got {erl_term(v)}'
        return err
    return check


def _p_ha_batch(v: Any, d: Mapping[str, Any], key: Key) -> str | None:
    err = _p_ha_needs_mode(v, d)
    if err is None and not (_is_int(v) and v > 0):
        err = f"ha-sync-batch-size takes an integer greater than 0, {erl_term(v)} given"
    return err


# -- the declaration ---------------------------------------------------------------------------
QUEUE, EXCHANGE, CONSUME, POLICY = "queue", "exchange", "consume", "policy"
LOWER, ARGUMENT = "lower", "argument"


@dataclass(frozen=True)
class Key:
    """One argument or policy key.

    name: the argument (`x-message-ttl`), or for a policy-only key the policy key.
    scope: QUEUE / EXCHANGE (an argument of x.declare, compared on redeclare) / CONSUME
      (of basic.consume) / POLICY (a policy key only).
    types: queue types whose declare (or consume) takes it -> its place in that type's
      capability list (RabbitMQ's queue_arguments / consumer_arguments).
    check: the argument's value; None when fine, else RabbitMQ's reason.
    exchange: also an argument of x.declare, compared on redeclare after RabbitMQ's.
    own: ackmq's own: checked after RabbitMQ's, on classic and quorum queues.
    consume: an `own` argument basic.consume also takes (overrides the queue's).
    compare: an `own` argument a redeclare compares.
    policy: a policy may set it, under `policy_key`, with this check.
    operator: an operator policy may set it (RabbitMQ 3.10's operator_policy_validator).
    merge: how a policy folds into the argument: LOWER (the lower value wins) or
      ARGUMENT (the queue's own argument wins); "" not at all.
    no_effect: a policy key that changes nothing on ackmq's one node.
    abbr: the UI's short label in a queue's features.
    """

    name: str
    scope: str = QUEUE
    types: Mapping[str, int] = field(default_factory=dict)
    check: ArgCheck | None = None
    exchange: bool = False
    own: bool = False
    consume: bool = False
    compare: bool = True
    policy: PolicyCheck | None = None
    operator: bool = False
    merge: str = ""
    no_effect: bool = False
    abbr: str = ""

    @property
    def policy_key(self) -> str:
        return self.name.removeprefix("x-")


_LEADERS = ("client-local", "balanced", "random", "least-leaders")
MASTER_LOCATORS = ("min-masters", "client-local", "random")
_PROMOTE = ("always", "when-synced")

KEYS: tuple[Key, ...] = (
    # RabbitMQ 3.10's queue arguments, in its declare_args order
    Key("x-expires", types={"classic": 1, "quorum": 4}, check=_expires,
        policy=_p_positive("queue expiry"), operator=True, merge=LOWER, abbr="Exp"),
    Key("x-message-ttl", types={"classic": 2, "quorum": 14}, check=_message_ttl,
        policy=_p_nonneg("message TTL"), operator=True, merge=LOWER, abbr="TTL"),
    Key("x-dead-letter-exchange", types={"classic": 3, "quorum": 1}, check=_text,
        policy=_p_text("dead letter exchange name"), merge=ARGUMENT, abbr="DLX"),
    Key("x-dead-letter-routing-key", types={"classic": 4, "quorum": 2}, check=_dlx_routing_key,
        policy=_p_text("dead letter routing key"), merge=ARGUMENT, abbr="DLK"),
    Key("x-dead-letter-strategy", types={"quorum": 3},
        check=_one_of(("at-most-once", "at-least-once"), "invalid_dlx_strategy"),
        policy=_p_choice(("at-most-once", "at-least-once"),
                         "{} is not a valid dead letter strategy"), merge=ARGUMENT),
    Key("x-max-length", types={"classic": 5, "quorum": 5}, check=_non_neg,
        policy=_p_nonneg("maximum length"), operator=True, merge=LOWER, abbr="Lim"),
    Key("x-max-length-bytes", types={"classic": 6, "quorum": 6, "stream": 1}, check=_non_neg,
        policy=_p_nonneg("maximum length in bytes"), operator=True, merge=LOWER,
        abbr="Lim B"),
    Key("x-max-in-memory-length", types={"quorum": 7}, check=_non_neg,
        policy=_p_nonneg("maximum memory in bytes"), operator=True, merge=LOWER,
        no_effect=True),
    Key("x-max-in-memory-bytes", types={"quorum": 8}, check=_non_neg,
        policy=_p_nonneg("maximum memory in bytes"), operator=True, merge=LOWER,
        no_effect=True),
    Key("x-max-priority", types={"classic": 7}, check=_max_priority, abbr="Pri"),
    Key("x-overflow", types={"classic": 8, "quorum": 9},
        check=_one_of(("drop-head", "reject-publish", "reject-publish-dlx"), "invalid_overflow"),
        policy=_p_choice(("drop-head", "reject-publish", "reject-publish-dlx"),
                         "{} is not a valid overflow value"), merge=ARGUMENT, abbr="Ovfl"),
    Key("x-queue-mode", types={"classic": 9},
        check=_one_of(("default", "lazy"),
                      lambda s: erl_term(Chars(f"unsupported queue mode '{s}'"))),
        policy=_p_choice(("default", "lazy"), "{} is not a valid queue-mode value"),
        merge=ARGUMENT, no_effect=True),
    Key("x-queue-version", types={"classic": 10}, check=_queue_version,
        policy=_p_choice((1, 2), "{} is not a valid queue-version value"),
        merge=ARGUMENT, no_effect=True),
    Key("x-single-active-consumer", types={"classic": 11, "quorum": 10}, check=_bool,
        abbr="SAC"),
    Key("x-queue-type", types={"classic": 12, "quorum": 11, "stream": 2},
        check=_one_of(("classic", "quorum", "stream"),
                      lambda s: erl_term(Chars(f"unsupported queue type '{s}'")))),
    Key("x-quorum-initial-group-size", types={"quorum": 12}, check=_cluster_size),
    Key("x-max-age", types={"stream": 3}, check=_max_age, policy=_p_max_age,
        merge=ARGUMENT),
    Key("x-stream-max-segment-size-bytes", types={"stream": 4}, check=_non_neg,
        policy=_p_nonneg("segment size"), merge=ARGUMENT),
    Key("x-initial-cluster-size", types={"stream": 5}, check=_cluster_size,
        policy=_p_nonneg("cluster size"), no_effect=True),
    Key("x-queue-leader-locator", types={"quorum": 15, "stream": 6},
        check=_one_of(_LEADERS, "invalid_queue_locator_arg"),
        policy=_p_choice(("client-local", "balanced"),
                         "{} is not a valid queue leader locator value"),
        merge=ARGUMENT, no_effect=True),
    # not checked by RabbitMQ 3.10 (a locator it has no module for crashes the channel)
    Key("x-queue-master-locator", types={"classic": 13},
        policy=_p_choice(MASTER_LOCATORS, "{} invalid queue-master-locator value"),
        merge=ARGUMENT, no_effect=True, abbr="ML"),
    # ackmq's own on classic and quorum queues, checked and compared in this order after
    # RabbitMQ's: a delivery limit on every such queue (D10; RabbitMQ's on quorum), the
    # consumer timeout (H2, L7), the opt-in delivery headers (S2, D10), deduplication (the
    # message-deduplication plugin's, dedup.py), x-delay on any route (delayed.py), the
    # redelivery back-off (L6: RabbitMQ 4.3's keys, the multiplier ackmq's)
    Key("x-delivery-limit", types={"quorum": 13}, check=_non_neg, own=True,
        policy=_p_nonneg("delivery limit"), operator=True, merge=LOWER, abbr="DlL"),
    Key("x-consumer-timeout", check=_non_neg, own=True, consume=True,
        policy=_p_nonneg("consumer timeout"), merge=LOWER),
    Key(SEQ_HEADER, check=_bool, own=True),
    Key("x-ackmq-delivery-count", check=_bool, own=True),
    Key("x-message-deduplication", check=_bool, own=True, compare=False),
    Key("x-delayed-delivery", check=_bool, own=True, exchange=True),
    Key("x-delayed-retry-type", check=_one_of(RETRY_TYPES, "invalid_delayed_retry_type"),
        own=True, consume=True, policy=_p_retry("delayed retry type"), merge=ARGUMENT),
    Key("x-delayed-retry-min", check=_retry_delay, own=True, consume=True,
        policy=_p_retry("delayed retry minimum delay"), merge=ARGUMENT),
    Key("x-delayed-retry-max", check=_retry_max, own=True, consume=True,
        policy=_p_retry("delayed retry maximum delay"), merge=ARGUMENT),
    Key("x-delayed-retry-multiplier", check=_retry_multiplier, own=True, consume=True,
        policy=_p_retry("delayed retry multiplier"), merge=ARGUMENT),
    # an exchange's (its type checked in vhost.py, before the rest)
    Key("alternate-exchange", scope=EXCHANGE, policy=_p_text("alternate exchange name"),
        abbr="AE"),
    # basic.consume's arguments (RabbitMQ's consumer_arguments), checked in this order
    Key("x-priority", scope=CONSUME, types={"classic": 2, "quorum": 1}, check=_integer),
    Key("x-cancel-on-ha-failover", scope=CONSUME, types={"classic": 1}, check=_bool),
    Key("x-credit", scope=CONSUME, types={"classic": 3, "quorum": 2, "stream": 2}),
    Key("x-stream-offset", scope=CONSUME, types={"stream": 1}),  # stream_args.py checks it
    # policy keys only (classic mirroring: refused as RabbitMQ 3.10 does, no effect)
    Key("ha-mode", scope=POLICY, policy=_p_ha_mode, no_effect=True),
    Key("ha-params", scope=POLICY, policy=_p_ha_needs_mode, no_effect=True),
    Key("ha-sync-mode", scope=POLICY, policy=_p_ha_choice(("manual", "automatic")),
        no_effect=True),
    Key("ha-sync-batch-size", scope=POLICY, policy=_p_ha_batch, no_effect=True),
    Key("ha-promote-on-shutdown", scope=POLICY, policy=_p_ha_choice(_PROMOTE), no_effect=True),
    Key("ha-promote-on-failure", scope=POLICY, policy=_p_ha_choice(_PROMOTE), no_effect=True),
)


@dataclass(frozen=True)
class Index:
    """What the readers look up, derived from a table of keys (`index`)."""

    keys: tuple[Key, ...]
    by_name: dict[str, Key]  # queue arguments (own included) by name
    declare_checks: tuple[tuple[str, ArgCheck], ...]  # RabbitMQ's, declare_args order
    type_checks: dict[str, tuple[tuple[str, ArgCheck], ...]]
    own_checks: tuple[tuple[str, ArgCheck], ...]
    own_consume_checks: tuple[tuple[str, ArgCheck], ...]
    type_args: dict[str, tuple[str, ...]]  # each type's, in its capability order
    invalid: dict[str, frozenset[str]]  # what each type refuses: other types' arguments
    equivalence: dict[str, tuple[str, ...]]  # compared on redeclare, by type
    exchange_equivalence: tuple[str, ...]
    consume_checks: tuple[tuple[str, ArgCheck], ...]
    consumer_args: dict[str, tuple[str, ...]]
    policy: dict[str, Key]  # by policy key
    operator: frozenset[str]  # policy keys an operator policy may set
    lower_wins: dict[str, str]  # policy key -> argument
    argument_wins: dict[str, str]
    no_effect: frozenset[str]
    abbr: dict[str, str]


QUEUE_TYPES = ("classic", "quorum", "stream")


def index(keys: tuple[Key, ...]) -> Index:
    """The lookups of `keys`."""
    queue = [k for k in keys if k.scope == QUEUE]
    rabbit = [k for k in queue if not k.own or k.types]
    own = [k for k in queue if k.own]
    checked = [(k.name, k.check) for k in queue if not k.own and k.check is not None]
    type_args = {t: tuple(k.name for k in sorted((k for k in rabbit if t in k.types),
                                                  key=lambda k: k.types[t]))
                 for t in QUEUE_TYPES}
    every = frozenset(k.name for k in rabbit)
    own_names = tuple(k.name for k in own if k.compare)
    consume = [k for k in keys if k.scope == CONSUME]
    policy = {k.policy_key: k for k in keys if k.policy is not None}
    return Index(
        keys=keys,
        by_name={k.name: k for k in queue},
        declare_checks=tuple(checked),
        type_checks={t: tuple(c for c in checked if c[0] in type_args[t]) for t in QUEUE_TYPES},
        own_checks=tuple((k.name, k.check) for k in own if k.check is not None),
        own_consume_checks=tuple((k.name, k.check) for k in own
                                 if k.consume and k.check is not None),
        type_args=type_args,
        invalid={t: every - set(type_args[t]) - ({k.name for k in own} if t != "stream"
                                                 else set())
                 for t in QUEUE_TYPES},
        equivalence={t: type_args[t] + tuple(n for n in own_names if n not in type_args[t])
                     if t != "stream" else type_args[t] for t in QUEUE_TYPES},
        exchange_equivalence=tuple(k.name for k in keys if k.scope == EXCHANGE)
        + tuple(k.name for k in keys if k.exchange),
        consume_checks=tuple((k.name, k.check) for k in consume if k.check is not None),
        consumer_args={t: tuple(k.name for k in sorted((k for k in consume if t in k.types),
                                                        key=lambda k: k.types[t]))
                       for t in QUEUE_TYPES},
        policy=policy,
        operator=frozenset(p for p, k in policy.items() if k.operator),
        lower_wins={p: k.name for p, k in policy.items() if k.merge == LOWER},
        argument_wins={p: k.name for p, k in policy.items() if k.merge == ARGUMENT},
        no_effect=frozenset(p for p, k in policy.items() if k.no_effect),
        abbr={k.name: k.abbr for k in keys if k.abbr},
    )


INDEX = index(KEYS)
"""The table's lookups; readers read it at each call (a test may swap in a larger one)."""
