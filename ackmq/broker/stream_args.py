"""Stream queues' declare and consume arguments, checked as RabbitMQ 3.10 checks them
(rabbit_amqqueue:check_declare_arguments / check_consume_arguments with the stream
type's capabilities, rabbit_stream_queue:declare/consume), with its codes and texts.

Where RabbitMQ 3.10 crashes on a value (an `x-max-age` or `x-stream-offset` string with
no leading digits, an offset of another type) the client sees 541 INTERNAL_ERROR and
its connection closes: ackmq answers the same, without the crash.
"""

from __future__ import annotations

import calendar
import datetime
import re
import time
from typing import Any

from ackmq.broker.arguments import as_text, check_dlx_type, type_name
from ackmq.broker.errors import (
    INTERNAL_ERROR,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    HardError,
    SoftError,
    erl_string,
)

TYPE_NAME = "rabbit_stream_queue"
MAX_SEGMENT_SIZE = 3_000_000_000
LEADER_LOCATORS = ("client-local", "random", "least-leaders", "balanced")
# what other queue types take and a stream refuses (3.10's capabilities, all types
# together, minus the stream's own)
INVALID_DECLARE_ARGS = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
    "x-single-active-consumer", "x-queue-master-locator", "x-dead-letter-strategy",
    "x-max-in-memory-length", "x-max-in-memory-bytes", "x-quorum-initial-group-size",
    "x-delivery-limit"))
INVALID_CONSUME_ARGS = frozenset(("x-priority", "x-cancel-on-ha-failover"))
# compared on redeclare, in RabbitMQ's order (the stream type's queue_arguments)
EQUIVALENCE_KEYS = ("x-max-length-bytes", "x-queue-type", "x-max-age",
                    "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
                    "x-queue-leader-locator")
UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000,
           "h": 3_600_000, "m": 60_000, "s": 1000}
_AGE = re.compile(r"([0-9]*)(.*)", re.S)


def internal_error() -> HardError:
    """What a client sees when RabbitMQ's channel crashes: 541, the bare code name."""
    e = HardError(INTERNAL_ERROR, "")
    e.text = "INTERNAL_ERROR"
    return e


def rs(qname: str, vhost: str) -> str:
    """rabbit_misc:rs/1 of a queue."""
    return f"queue '{qname}' in vhost '{vhost}'"


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


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _non_neg(v: Any) -> str | None:
    if not _int(v):
        return erl_string(f"expected integer, got {type_name(v)}")
    return f"{{value_negative,{v}}}" if v < 0 else None


def _max_age(v: Any) -> str | None:
    s = as_text(v)
    if s is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    return "invalid_max_age" if max_age_ms(s) is None else None


def _cluster_size(v: Any) -> str | None:
    err = _non_neg(v)
    return err if err is not None else ("{value_zero,0}" if v == 0 else None)


def _locator(v: Any) -> str | None:
    s = as_text(v)
    if s is None:
        return f"{{unacceptable_type,{type_name(v)}}}"
    return None if s in LEADER_LOCATORS else "invalid_queue_locator_arg"


_VALIDATORS = (("x-max-length-bytes", _non_neg), ("x-max-age", _max_age),
               ("x-stream-max-segment-size-bytes", _non_neg),
               ("x-initial-cluster-size", _cluster_size),
               ("x-queue-leader-locator", _locator))


def check_declare(args: dict[str, Any], qname: str, vhost: str, durable: bool,
                  exclusive: bool, auto_delete: bool) -> None:
    """A new stream's declaration, in RabbitMQ's order: argument values, arguments other
    types take, then auto-delete / exclusive / non-durable, then the segment size cap."""
    check_dlx_type(args, qname, vhost)
    for key, check in _VALIDATORS:
        if key in args:
            err = check(args[key])
            if err is not None:
                raise SoftError(PRECONDITION_FAILED,
                                f"invalid arg '{key}' for {rs(qname, vhost)}: {err}")
    for key in args:
        if key in INVALID_DECLARE_ARGS:
            raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for "
                                                 f"{rs(qname, vhost)} of queue type {TYPE_NAME}")
    for bad, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                      (not durable, "non-durable")):
        if bad:
            raise SoftError(PRECONDITION_FAILED,
                            f"invalid property '{prop}' for {rs(qname, vhost)}")
    seg = args.get("x-stream-max-segment-size-bytes")
    if _int(seg) and seg > MAX_SEGMENT_SIZE:
        raise SoftError(PRECONDITION_FAILED,
                        "Exceeded max value for x-stream-max-segment-size-bytes")


def _erl_bin(s: str) -> str:
    return "<<" + erl_string(s) + ">>"


def check_consume(args: dict[str, Any], qname: str, vhost: str, no_ack: bool,
                  prefetch: int) -> None:
    """basic.consume on a stream, in RabbitMQ's order: the offset's value, arguments
    other types take, the consumer's prefetch (required), manual acks (required)."""
    off = args.get("x-stream-offset")
    s = as_text(off)
    if s is not None and s not in ("first", "last", "next") and max_age_ms(s) is None:
        raise SoftError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for "
                                             f"{rs(qname, vhost)}: {{invalid_stream_offset_arg,"
                                             f"{{longstr,{_erl_bin(s)}}}}}")
    for key in args:
        if key in INVALID_CONSUME_ARGS:
            raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for "
                                                 f"{rs(qname, vhost)} of queue type {TYPE_NAME}")
    if not prefetch:
        raise SoftError(PRECONDITION_FAILED, "consumer prefetch count is not set for "
                                             f"'{rs(qname, vhost)}'")
    if no_ack:
        raise HardError(NOT_IMPLEMENTED, "automatic acknowledgement not supported by "
                                         f"stream queues {rs(qname, vhost)}")
    if off is not None and s is None and not _int(off) \
            and not isinstance(off, datetime.datetime):
        raise internal_error()  # RabbitMQ's reader crashes on a bool, table, array…


def timestamp_ms(v: datetime.datetime) -> int:
    """An AMQP timestamp (seconds; naive means UTC, as pika sends it) in ms."""
    if v.tzinfo is None:
        return calendar.timegm(v.utctimetuple()) * 1000
    return int(v.timestamp()) * 1000


def start_spec(args: dict[str, Any]) -> tuple[str, int]:
    """The consumer's start, checked already: ("first"|"last"|"next", 0),
    ("offset", n) or ("timestamp", ms)."""
    off = args.get("x-stream-offset")
    if off is None:
        return "next", 0
    s = as_text(off)
    if s is not None:
        if s in ("first", "last", "next"):
            return s, 0
        ms = max_age_ms(s)
        assert ms is not None
        return "timestamp", int(time.time() * 1000) - ms
    if isinstance(off, datetime.datetime):
        return "timestamp", timestamp_ms(off)
    return "offset", off


def from_stomp(value: str | None) -> Any:
    """A SUBSCRIBE's `x-stream-offset` header as RabbitMQ's STOMP plugin reads it:
    first / last / next, `offset=N` (a long), `timestamp=N` (seconds); anything else is
    no offset (next). None for none; ValueError for a number that is not one."""
    if value in ("first", "last", "next"):
        return value
    if value is not None and value.startswith("offset="):
        return int(value[7:])
    if value is not None and value.startswith("timestamp="):
        return datetime.datetime.fromtimestamp(int(value[10:]), tz=datetime.UTC)
    return None
