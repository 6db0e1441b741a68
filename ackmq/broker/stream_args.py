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
import time
from typing import Any

from ackmq.broker import argument_table as table
from ackmq.broker.arguments import (  # noqa: F401 - internal_error: for stream.py
    as_text,
    check_declare_arguments,
    equivalence_keys,
    internal_error,
    max_age_ms,
)
from ackmq.broker.errors import (
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    HardError,
    SoftError,
)
from ackmq.protocol.amqp.erlang import Atom, reason

TYPE_NAME = "rabbit_stream_queue"
MAX_SEGMENT_SIZE = 3_000_000_000
# compared on redeclare, in RabbitMQ's order (the stream type's queue_arguments)
EQUIVALENCE_KEYS = equivalence_keys("stream")


def rs(qname: str, vhost: str) -> str:
    """rabbit_misc:rs/1 of a queue."""
    return f"queue '{qname}' in vhost '{vhost}'"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_declare(args: dict[str, Any], qname: str, vhost: str, durable: bool,
                  exclusive: bool, auto_delete: bool) -> None:
    """A new stream's declaration, in RabbitMQ's order: argument values, arguments other
    types take (arguments.check_declare_arguments), then auto-delete / exclusive /
    non-durable, then the segment size cap."""
    check_declare_arguments(args, qname, vhost)
    for bad, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                      (not durable, "non-durable")):
        if bad:
            raise SoftError(PRECONDITION_FAILED,
                            f"invalid property '{prop}' for {rs(qname, vhost)}")
    seg: Any = args.get("x-stream-max-segment-size-bytes")
    if _int(seg) and seg > MAX_SEGMENT_SIZE:
        raise SoftError(PRECONDITION_FAILED,
                        "Exceeded max value for x-stream-max-segment-size-bytes")


def check_consume(args: dict[str, Any], qname: str, vhost: str, no_ack: bool,
                  prefetch: int) -> None:
    """basic.consume on a stream, in RabbitMQ's order: the offset's value, arguments
    other types take, the consumer's prefetch (required), manual acks (required)."""
    off = args.get("x-stream-offset")
    s = as_text(off)
    if s is not None and s not in ("first", "last", "next") and max_age_ms(s) is None:
        raise SoftError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for "
                                             f"{rs(qname, vhost)}: "
                                             + reason("invalid_stream_offset_arg",
                                                      (Atom("longstr"), s)))
    takes = table.INDEX.consumer_args
    invalid = {k for ks in takes.values() for k in ks}.difference(takes["stream"])
    for key in args:
        if key in invalid:
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
