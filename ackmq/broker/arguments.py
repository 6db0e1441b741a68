"""Queue and exchange arguments: RabbitMQ 3.10's checks, error texts and equivalence keys.

Checks run when a queue or exchange is created (not on redeclare, not on recovery), in
RabbitMQ's order, and the first failure is reported. On redeclare only the arguments
RabbitMQ knows are compared (plus ackmq's own); any other `x-` argument may differ.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from ackmq.broker.errors import PRECONDITION_FAILED, SoftError, erl_string
from ackmq.protocol.amqp.constants import SEQ_HEADER

MAX_EXPIRY_MS = 315_360_000_000  # ten years: RabbitMQ's bound for TTLs and expiration
MAX_PRIORITY = 255

# ackmq's opt-in delivery headers, asked for by a queue argument or a basic.consume argument
SEQ_ARG = SEQ_HEADER                   # every delivery carries x-ackmq-seq (S2)
DELIVERY_COUNT_ARG = "x-ackmq-delivery-count"  # redeliveries carry x-delivery-count (D10)

# compared on queue redeclare, in this order (RabbitMQ's declare_args, then ackmq's own)
QUEUE_EQUIVALENCE_KEYS = (
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-single-active-consumer",
    "x-queue-type", "x-quorum-initial-group-size", "x-max-age",
    "x-stream-max-segment-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator",
    "x-queue-master-locator", "x-dead-letter-strategy", "x-delivery-limit",
    "x-consumer-timeout", SEQ_ARG, DELIVERY_COUNT_ARG,
)
EXCHANGE_EQUIVALENCE_KEYS = ("alternate-exchange",)


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


_QUEUE_CHECKS = (
    ("x-expires", _expires),
    ("x-message-ttl", _message_ttl),
    ("x-dead-letter-exchange", _dlx_name),
    ("x-dead-letter-routing-key", _dlx_routing_key),
    ("x-max-length", _non_neg_int),
    ("x-max-length-bytes", _non_neg_int),
    ("x-max-priority", _max_priority),
    ("x-overflow", _overflow),
    ("x-queue-mode", _queue_mode),
    ("x-single-active-consumer", _bool),
    ("x-queue-type", _queue_type),
    # ackmq's own (RabbitMQ has x-delivery-limit on quorum queues only)
    ("x-delivery-limit", _non_neg_int),
    ("x-consumer-timeout", _non_neg_int),
    (SEQ_ARG, _bool),
    (DELIVERY_COUNT_ARG, _bool),
    ("x-message-deduplication", _bool),  # the message-deduplication plugin's (dedup.py)
)


def _int(v: Any, args: dict[str, Any]) -> str | None:
    return _int_error(v)


_CONSUME_CHECKS = (("x-priority", _int), ("x-cancel-on-ha-failover", _bool))


def check_consume_arguments(args: dict[str, Any], qname: str, vhost: str) -> None:
    """basic.consume's arguments as RabbitMQ 3.10's rabbit_amqqueue checks them (others
    are ignored): 406 on the first bad one."""
    for key, check in _CONSUME_CHECKS:
        if key in args:
            err = check(args[key], args)
            if err is not None:
                raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue "
                                                     f"'{qname}' in vhost '{vhost}': {err}")
    if "x-stream-offset" in args:
        raise SoftError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for queue "
                                             f"'{qname}' in vhost '{vhost}' of queue type "
                                             "rabbit_classic_queue")


def check_queue_arguments(args: dict[str, Any], qname: str, vhost: str) -> None:
    """A new queue's arguments, as RabbitMQ 3.10 checks them: 406 on the first bad one."""
    if not args:
        return
    check_dlx_type(args, qname, vhost)
    for key, check in _QUEUE_CHECKS:
        if key in args:
            err = check(args[key], args)
            if err is not None:
                raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue "
                                                        f"'{qname}' in vhost '{vhost}': {err}")
