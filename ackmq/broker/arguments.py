"""Queue and exchange arguments: RabbitMQ 3.10's checks, error texts and equivalence keys.

Checks run when a queue or exchange is created (not on redeclare, not on recovery), in
RabbitMQ's order (rabbit_amqqueue:check_declare_arguments), and the first failure is
reported: `x-queue-type`'s value; the values of the arguments the queue's type takes;
then any argument only another type takes (`x-max-age` on a classic queue, …). On
redeclare only the arguments the queue's type takes are compared (plus ackmq's own); any
other `x-` argument may differ. Which arguments, their checks and their order are
declared once, in argument_table.py; this module runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ackmq.broker import argument_table as table
from ackmq.broker.argument_table import (  # noqa: F401 - the model reads them here
    MAX_EXPIRY_MS,
    MAX_PRIORITY,
    ArgCheck,
    as_text,
    internal_error,
    max_age_ms,
    type_name,
)
from ackmq.broker.errors import PRECONDITION_FAILED, SoftError
from ackmq.protocol.amqp.constants import SEQ_HEADER

# ackmq's opt-in delivery headers, asked for by a queue argument or a basic.consume argument
SEQ_ARG = SEQ_HEADER                   # every delivery carries x-ackmq-seq (S2)
DELIVERY_COUNT_ARG = "x-ackmq-delivery-count"  # redeliveries carry x-delivery-count (D10)


def declared_type(args: dict[str, Any]) -> str:
    """The `x-queue-type` a declaration names ("classic" when none)."""
    return as_text(args.get("x-queue-type")) or "classic"


def type_module(qtype: str) -> str:
    """RabbitMQ's module for a queue type, as its texts name it."""
    return f"rabbit_{qtype}_queue"


def equivalence_keys(qtype: str) -> tuple[str, ...]:
    """What a redeclare of a queue of this type compares, in order: the type's arguments
    in RabbitMQ's order, then ackmq's own (argument_table)."""
    eq = table.INDEX.equivalence
    return eq.get(qtype) or eq["classic"]


QUEUE_EQUIVALENCE_KEYS = equivalence_keys("classic")
EXCHANGE_EQUIVALENCE_KEYS = table.INDEX.exchange_equivalence


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


def check_consume_arguments(args: dict[str, Any], qname: str, vhost: str,
                            qtype: str = "classic") -> None:
    """basic.consume's arguments on a classic or quorum queue as RabbitMQ 3.10's
    rabbit_amqqueue checks them (others are ignored): 406 on the first bad value, then
    on the first argument only another type takes; then ackmq's own (L6, L7)."""
    ix = table.INDEX
    if qtype not in ix.consumer_args:
        qtype = "classic"
    keys = ix.consumer_args[qtype]
    _run(tuple(c for c in ix.consume_checks if c[0] in keys), args, qname, vhost)
    others = {k for ks in ix.consumer_args.values() for k in ks}
    _refuse_other_types(args, others.difference(keys), qname, vhost, qtype)
    if qtype != "stream":
        _run(ix.own_consume_checks, args, qname, vhost)


def _run(checks: tuple[tuple[str, ArgCheck], ...], args: Mapping[str, Any], qname: str,
         vhost: str) -> None:
    """406 on the first argument of `checks` (in their order) whose value is refused."""
    for key, check in checks:
        if key in args:
            err = check(args[key], args)
            if err is not None:
                raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue "
                                                     f"'{qname}' in vhost '{vhost}': {err}")


def _refuse_other_types(args: Mapping[str, Any], invalid: frozenset[str] | set[str],
                        qname: str, vhost: str, qtype: str) -> None:
    for key in args:
        if key in invalid:
            raise SoftError(PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{qname}' "
                                                 f"in vhost '{vhost}' of queue type "
                                                 f"{type_module(qtype)}")


def check_declare_arguments(args: dict[str, Any], qname: str, vhost: str) -> str:
    """A new queue's arguments as RabbitMQ 3.10 checks them for its type (406 on the
    first bad one): the dead-letter exchange's type, `x-queue-type`, the values of the
    arguments the type takes, then ackmq's own, then any argument only another type
    takes. Returns the type."""
    ix = table.INDEX
    check_dlx_type(args, qname, vhost)
    _run(tuple(c for c in ix.declare_checks if c[0] == "x-queue-type"), args, qname,
         vhost)  # first, to pick the type
    qtype = declared_type(args)
    _run(ix.type_checks[qtype], args, qname, vhost)
    if qtype != "stream":
        _run(ix.own_checks, args, qname, vhost)
    _refuse_other_types(args, ix.invalid[qtype], qname, vhost, qtype)
    return qtype


def check_queue_arguments(args: dict[str, Any], qname: str, vhost: str) -> None:
    """A new classic or quorum queue's arguments (see `check_declare_arguments`); a
    classic queue's master locator RabbitMQ 3.10 has no module for crashes its channel
    (541), after every check."""
    if not args:
        return
    qtype = check_declare_arguments(args, qname, vhost)
    if qtype == "classic" and "x-queue-master-locator" in args \
            and as_text(args["x-queue-master-locator"]) not in table.MASTER_LOCATORS:
        raise internal_error()
