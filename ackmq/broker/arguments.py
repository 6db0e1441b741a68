"""Queue and exchange arguments: RabbitMQ 3.10's checks, error texts and equivalence keys.

Checks run when a queue or exchange is created (not on redeclare, not on recovery), in
RabbitMQ's order (rabbit_amqqueue:check_declare_arguments), and the first failure is
reported: `x-queue-type`'s value; the values of the arguments the queue's type takes;
then any argument only another type takes (`x-max-age` on a classic queue, …). On
redeclare only the arguments the queue's type takes are compared (plus ackmq's own); any
other `x-` argument may differ.
"""

from __future__ import annotations

import datetime
import decimal
import re
from typing import Any

from ackmq.broker.errors import (
    INTERNAL_ERROR,
    PRECONDITION_FAILED,
    HardError,
    SoftError,
    erl_string,
)
from ackmq.broker.retry import RETRY_ARGS, check_retry_argument
from ackmq.protocol.amqp.constants import SEQ_HEADER

MAX_EXPIRY_MS = 315_360_000_000  # ten years: RabbitMQ's bound for TTLs and expiration
MAX_PRIORITY = 255

# ackmq's opt-in delivery headers, asked for by a queue argument or a basic.consume argument
SEQ_ARG = SEQ_HEADER                   # every delivery carries x-ackmq-seq (S2)
DELIVERY_COUNT_ARG = "x-ackmq-delivery-count"  # redeliveries carry x-delivery-count (D10)

# each type's arguments (RabbitMQ 3.10's capabilities, queue_arguments), in its order,
# which is also the order a redeclare compares them in
CLASSIC_ARGS = (
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
    "x-queue-version", "x-single-active-consumer", "x-queue-type", "x-queue-master-locator")
QUORUM_ARGS = (
    "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
    "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
    "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
    "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
    "x-queue-leader-locator")
STREAM_ARGS = (
    "x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator")
TYPE_ARGS = {"classic": CLASSIC_ARGS, "quorum": QUORUM_ARGS, "stream": STREAM_ARGS}
ALL_TYPE_ARGS = frozenset(CLASSIC_ARGS + QUORUM_ARGS + STREAM_ARGS)
# ackmq's own arguments on classic and quorum queues, checked and compared after
# RabbitMQ's: a delivery limit on every such queue (D10), the consumer timeout (H2), the
# opt-in delivery headers
ACKMQ_ARGS = ("x-delivery-limit", "x-consumer-timeout", SEQ_ARG, DELIVERY_COUNT_ARG,
              *RETRY_ARGS, "x-delayed-delivery")  # last: delays (delayed.py)
# the master locators a classic queue starts with; RabbitMQ 3.10 crashes on others
MASTER_LOCATORS = ("min-masters", "client-local", "random")
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
DLX_STRATEGIES = ("at-most-once", "at-least-once")
UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000,
           "h": 3_600_000, "m": 60_000, "s": 1000}
_AGE = re.compile(r"([0-9]*)(.*)", re.S)


def declared_type(args: dict[str, Any]) -> str:
    """The `x-queue-type` a declaration names ("classic" when none)."""
    return as_text(args.get("x-queue-type")) or "classic"


def type_module(qtype: str) -> str:
    """RabbitMQ's module for a queue type, as its texts name it."""
    return f"rabbit_{qtype}_queue"


def equivalence_keys(qtype: str) -> tuple[str, ...]:
    """What a redeclare of a classic or quorum queue compares, in order."""
    own = ACKMQ_ARGS if qtype == "classic" else ACKMQ_ARGS[1:]
    return TYPE_ARGS.get(qtype, CLASSIC_ARGS) + own


QUEUE_EQUIVALENCE_KEYS = equivalence_keys("classic")
EXCHANGE_EQUIVALENCE_KEYS = ("alternate-exchange", "x-delayed-delivery")  # 2nd: ackmq's


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def opt_in(args: dict[str, Any], key: str) -> bool:
    """An opt-in argument is on when true: an AMQP bool (pika, aio-pika send True so), or
    1 / "true" from clients that cannot send a bool."""
    v = args.get(key)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return v is True or (type(v) is int and v == 1) or (isinstance(v, str) and v.lower() == "true")


def check_dlx_type(args: dict[str, Any], qname: str, vhost: str) -> None:
    """RabbitMQ checks the dead-letter exchange's type before any other argument."""
    if "x-dead-letter-exchange" in args and as_text(args["x-dead-letter-exchange"]) is None:
        raise SoftError(PRECONDITION_FAILED,
                           f"invalid type '{type_name(args['x-dead-letter-exchange'])}' for "
                           f"arg 'x-dead-letter-exchange' in queue '{qname}' in vhost '{vhost}'")


def check_alternate_exchange_type(args: dict[str, Any], xname: str, vhost: str) -> None:
    if "alternate-exchange" in args and as_text(args["alternate-exchange"]) is None:
        raise SoftError(PRECONDITION_FAILED,
                           f"invalid type '{type_name(args['alternate-exchange'])}' for arg "
                           f"'alternate-exchange' in exchange '{xname}' in vhost '{vhost}'")


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


def _int_error(v: Any) -> str | None:
    if not _is_int(v):
        return erl_string(f"expected integer, got {type_name(v)}")
    return None


def _non_neg_int(v: Any, args: dict[str, Any]) -> str | None:
    err = _int_error(v)
    if err is None and v < 0:
        return f"{{value_negative,{v}}}"
    return err


def _expiry(v: int) -> str | None:
    if v < 0:
        return f"{{value_negative,{v}}}"
    if v > MAX_EXPIRY_MS:
        return f"{{value_too_large,{v}}}"
    return None


def _expires(v: Any, args: dict[str, Any]) -> str | None:
    err = _int_error(v)
    if err is not None:
        return err
    return "{value_zero,0}" if v == 0 else _expiry(v)


def _message_ttl(v: Any, args: dict[str, Any]) -> str | None:
    return _int_error(v) or _expiry(v)


def _dlx_name(v: Any, args: dict[str, Any]) -> str | None:
    return None if as_text(v) is not None else f"{{unacceptable_type,{type_name(v)}}}"


def _dlx_routing_key(v: Any, args: dict[str, Any]) -> str | None:
    if as_text(v) is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    if "x-dead-letter-exchange" not in args:
        return "routing_key_but_no_dlx_defined"
    return None


def _max_priority(v: Any, args: dict[str, Any]) -> str | None:
    err = _non_neg_int(v, args)
    if err is None and v > MAX_PRIORITY:
        return f"{{max_value_exceeded,{v}}}"
    return err


def _overflow(v: Any, args: dict[str, Any]) -> str | None:
    s = as_text(v)
    if s is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    return None if s in ("drop-head", "reject-publish", "reject-publish-dlx") \
        else "invalid_overflow"


def _queue_mode(v: Any, args: dict[str, Any]) -> str | None:
    s = as_text(v)
    if s is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    return None if s in ("default", "lazy") else erl_string(f"unsupported queue mode '{s}'")


def _queue_type(v: Any, args: dict[str, Any]) -> str | None:
    s = as_text(v)
    if s is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    return None if s in ("classic", "quorum", "stream") else erl_string(f"unsupported queue type '{s}'")


def _bool(v: Any, args: dict[str, Any]) -> str | None:
    return None if isinstance(v, bool) else f"{{unacceptable_type,{type_name(v)}}}"


def _one_of(choices: tuple[str, ...], error: str) -> Any:
    def check(v: Any, args: dict[str, Any]) -> str | None:
        s = as_text(v)
        if s is None:
            return f"{{unacceptable_type,{type_name(v)}}}"
        return None if s in choices else error
    return check


def _queue_version(v: Any, args: dict[str, Any]) -> str | None:
    err = _non_neg_int(v, args)
    if err is None and v not in (1, 2):
        return erl_string(f"unsupported queue version '{v}'")
    return err


def _cluster_size(v: Any, args: dict[str, Any]) -> str | None:
    err = _non_neg_int(v, args)
    return err if err is not None else ("{value_zero,0}" if v == 0 else None)


def _max_age(v: Any, args: dict[str, Any]) -> str | None:
    s = as_text(v)
    if s is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    return "invalid_max_age" if max_age_ms(s) is None else None


# RabbitMQ 3.10's declare_args, in its order; each type checks the ones it takes
_QUEUE_CHECKS = (
    ("x-expires", _expires),
    ("x-message-ttl", _message_ttl),
    ("x-dead-letter-exchange", _dlx_name),
    ("x-dead-letter-routing-key", _dlx_routing_key),
    ("x-dead-letter-strategy", _one_of(DLX_STRATEGIES, "invalid_dlx_strategy")),
    ("x-max-length", _non_neg_int),
    ("x-max-length-bytes", _non_neg_int),
    ("x-max-in-memory-length", _non_neg_int),
    ("x-max-in-memory-bytes", _non_neg_int),
    ("x-max-priority", _max_priority),
    ("x-overflow", _overflow),
    ("x-queue-mode", _queue_mode),
    ("x-queue-version", _queue_version),
    ("x-single-active-consumer", _bool),
    ("x-queue-type", _queue_type),
    ("x-quorum-initial-group-size", _cluster_size),
    ("x-max-age", _max_age),
    ("x-stream-max-segment-size-bytes", _non_neg_int),
    ("x-initial-cluster-size", _cluster_size),
    ("x-queue-leader-locator", _one_of(LEADER_LOCATORS, "invalid_queue_locator_arg")),
)
_TYPE_CHECKS = {t: tuple(c for c in _QUEUE_CHECKS if c[0] in keys)
                for t, keys in TYPE_ARGS.items()}
# ackmq's own, on classic and quorum queues (RabbitMQ has no checks for them)
_ACKMQ_CHECKS = (
    ("x-delivery-limit", _non_neg_int),
    ("x-consumer-timeout", _non_neg_int),
    (SEQ_ARG, _bool),
    (DELIVERY_COUNT_ARG, _bool),
    ("x-message-deduplication", _bool),  # the message-deduplication plugin's (dedup.py)
    ("x-delayed-delivery", _bool),  # x-delay honoured on any route to it (delayed.py)
    *((k, lambda v, a, k=k: check_retry_argument(k, v, a)) for k in RETRY_ARGS),  # L6 (last)
)
# ackmq's own basic.consume arguments on classic and quorum queues: the consumer's
# timeout (L7) and back-off (L6), which override the queue's
_ACKMQ_CONSUME_CHECKS = _ACKMQ_CHECKS[1:2] + _ACKMQ_CHECKS[-len(RETRY_ARGS):]
# what each type refuses: the arguments only other types take (a classic queue takes
# ackmq's delivery limit, D10)
_INVALID = {t: ALL_TYPE_ARGS - set(keys) - ({"x-delivery-limit"} if t == "classic" else set())
            for t, keys in TYPE_ARGS.items()}


def _int(v: Any, args: dict[str, Any]) -> str | None:
    return _int_error(v)


_CONSUME_CHECKS = (("x-priority", _int), ("x-cancel-on-ha-failover", _bool))
# basic.consume's arguments each type takes (its capabilities' consumer_arguments)
_CONSUMER_ARGS = {"classic": ("x-cancel-on-ha-failover", "x-priority", "x-credit"),
                  "quorum": ("x-priority", "x-credit"),
                  "stream": ("x-stream-offset", "x-credit")}
_ALL_CONSUMER_ARGS = frozenset(k for keys in _CONSUMER_ARGS.values() for k in keys)


def check_consume_arguments(args: dict[str, Any], qname: str, vhost: str,
                            qtype: str = "classic") -> None:
    """basic.consume's arguments on a classic or quorum queue as RabbitMQ 3.10's
    rabbit_amqqueue checks them (others are ignored): 406 on the first bad value, then
    on the first argument only another type takes; then ackmq's own (L6, L7)."""
    if qtype not in _CONSUMER_ARGS:
        qtype = "classic"
    keys = _CONSUMER_ARGS[qtype]
    for key, check in _CONSUME_CHECKS:
        if key in args and key in keys:
            err = check(args[key], args)
            if err is not None:
                raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue "
                                                     f"'{qname}' in vhost '{vhost}': {err}")
    for key in args:
        if key in _ALL_CONSUMER_ARGS and key not in keys:
            raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{qname}' "
                                                 f"in vhost '{vhost}' of queue type "
                                                 f"{type_module(qtype)}")
    if qtype != "stream":
        _run(_ACKMQ_CONSUME_CHECKS, args, qname, vhost)


def _run(checks: tuple[tuple[str, Any], ...], args: dict[str, Any], qname: str,
         vhost: str) -> None:
    for key, check in checks:
        if key in args:
            err = check(args[key], args)
            if err is not None:
                raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue "
                                                     f"'{qname}' in vhost '{vhost}': {err}")


def check_declare_arguments(args: dict[str, Any], qname: str, vhost: str) -> str:
    """A new queue's arguments as RabbitMQ 3.10 checks them for its type (406 on the
    first bad one): the dead-letter exchange's type, `x-queue-type`, the values of the
    arguments the type takes, then any argument only another type takes. Returns the
    type."""
    check_dlx_type(args, qname, vhost)
    _run((("x-queue-type", _queue_type),), args, qname, vhost)  # first, to pick the type
    qtype = declared_type(args)
    _run(_TYPE_CHECKS[qtype], args, qname, vhost)
    if qtype != "stream":
        _run(_ACKMQ_CHECKS, args, qname, vhost)
    invalid = _INVALID[qtype]
    for key in args:
        if key in invalid:
            raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{qname}' "
                                                 f"in vhost '{vhost}' of queue type "
                                                 f"{type_module(qtype)}")
    return qtype


def check_queue_arguments(args: dict[str, Any], qname: str, vhost: str) -> None:
    """A new classic or quorum queue's arguments (see `check_declare_arguments`); a
    classic queue's master locator RabbitMQ 3.10 has no module for crashes its channel
    (541), after every check."""
    if not args:
        return
    qtype = check_declare_arguments(args, qname, vhost)
    if qtype == "classic" and "x-queue-master-locator" in args \
            and as_text(args["x-queue-master-locator"]) not in MASTER_LOCATORS:
        raise internal_error()
