"""Queue and exchange arguments: the checks RabbitMQ 3.10 makes when a queue is created,
which arguments it compares on redeclare, and exclusivity on redeclare.

Every test passes against RabbitMQ 3.10 (ACKMQ_TEST_URL=amqp://...:5672/) unless marked
ackmq-only; reply codes and texts are RabbitMQ's.
"""

from __future__ import annotations

import pytest
from pika.adapters.blocking_connection import BlockingChannel
from support.pikahelp import closed_with

LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost "
          "'/'. It could be originally declared on another connection or the exclusive "
          "property value does not match that of the original declaration.")


def locked(q: str) -> str:
    text = LOCKED.format(q=q)
    return text if len(text) <= 255 else text[:252] + "..."



# ------------------------------------------------------------------ checks at declare

BAD_QUEUE_ARGS = [
    ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
    ({"x-max-priority": 300}, "x-max-priority", "{max_value_exceeded,300}"),
    ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
    ({"x-max-priority": "a"}, "x-max-priority", '"expected integer, got longstr"'),
    ({"x-max-priority": True}, "x-max-priority", '"expected integer, got bool"'),
    ({"x-max-priority": None}, "x-max-priority", '"expected integer, got void"'),
    ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key",
     "routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": "e", "x-dead-letter-routing-key": 1},
     "x-dead-letter-routing-key", "{unacceptable_type,signedint}"),
    ({"x-queue-mode": "bogus"}, "x-queue-mode", "\"unsupported queue mode 'bogus'\""),
    ({"x-queue-mode": 1}, "x-queue-mode", "{unacceptable_type,signedint}"),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-expires": -1}, "x-expires", "{value_negative,-1}"),
    ({"x-expires": 315360000001}, "x-expires", "{value_too_large,315360000001}"),
    ({"x-expires": "a"}, "x-expires", '"expected integer, got longstr"'),
    ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
    ({"x-message-ttl": 315360000001}, "x-message-ttl", "{value_too_large,315360000001}"),
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": "a"}, "x-max-length", '"expected integer, got longstr"'),
    ({"x-max-length-bytes": -5}, "x-max-length-bytes", "{value_negative,-5}"),
    ({"x-overflow": "bogus"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,signedint}"),
    ({"x-single-active-consumer": "a"}, "x-single-active-consumer",
     "{unacceptable_type,longstr}"),
    ({"x-queue-type": "bogus"}, "x-queue-type", "\"unsupported queue type 'bogus'\""),
    # several bad arguments: the first in RabbitMQ's order is reported
    ({"x-message-ttl": -1, "x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-max-priority": 300, "x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": -1, "x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key",
     "routing_key_but_no_dlx_defined"),
]


@pytest.mark.parametrize("args, key, reason", BAD_QUEUE_ARGS)
def test_invalid_queue_argument_406(channel: BlockingChannel, qname: str, args: dict,
                                    key: str, reason: str) -> None:
    closed_with(lambda: channel.queue_declare(qname, exclusive=True, arguments=args), 406,
                f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{qname}' in vhost "
                f"'/': {reason}")


@pytest.mark.parametrize("value, typ", [(1, "signedint"), (None, "void")])
def test_dead_letter_exchange_type_checked_first_406(channel: BlockingChannel, qname: str,
                                                     value: object, typ: str) -> None:
    args = {"x-expires": 0, "x-dead-letter-routing-key": "k", "x-dead-letter-exchange": value}
    closed_with(lambda: channel.queue_declare(qname, exclusive=True, arguments=args), 406,
                f"PRECONDITION_FAILED - invalid type '{typ}' for arg 'x-dead-letter-exchange' "
                f"in queue '{qname}' in vhost '/'")


@pytest.mark.parametrize("args", [
    {"x-max-priority": 255}, {"x-max-priority": 0}, {"x-queue-mode": "lazy"},
    {"x-queue-mode": "default"}, {"x-message-ttl": 315360000000}, {"x-max-length": 2**40},
    {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k"},
    {"x-single-active-consumer": False}, {"x-foo": "anything"},
])
def test_valid_queue_arguments_accepted(channel: BlockingChannel, qname: str,
                                        args: dict) -> None:
    channel.queue_declare(qname, exclusive=True, arguments=args)
    channel.queue_delete(qname)


def test_declare_checks_do_not_apply_to_redeclare(channel: BlockingChannel,
                                                  qname: str) -> None:
    """An existing queue is compared, not checked: an unknown argument is ignored."""
    channel.queue_declare(qname, exclusive=True)
    channel.queue_declare(qname, exclusive=True, arguments={"x-foo": -1})


# ------------------------------------------------------------------ redeclare

@pytest.mark.parametrize("first, second", [
    ({"x-foo": 1}, {"x-foo": 2}),
    ({"x-foo": 1}, {}),
    ({}, {"x-foo": 1}),
    ({"x-max-length": 5, "x-foo": "a"}, {"x-max-length": 5, "x-foo": "b"}),
])
def test_redeclare_unknown_argument_may_differ(channel: BlockingChannel, qname: str,
                                               first: dict, second: dict) -> None:
    """RabbitMQ compares only the arguments it knows."""
    channel.queue_declare(qname, exclusive=True, arguments=first)
    channel.queue_declare(qname, exclusive=True, arguments=second)
    assert channel.is_open


@pytest.mark.parametrize("key, first, second", [
    ("x-expires", 1000, 2000), ("x-message-ttl", 1, 2), ("x-max-length", 1, 2),
    ("x-max-length-bytes", 1, 2), ("x-max-priority", 1, 2),
    ("x-overflow", "drop-head", "reject-publish"), ("x-queue-mode", "default", "lazy"),
    ("x-single-active-consumer", True, False), ("x-dead-letter-exchange", "a", "b"),
])
def test_redeclare_known_argument_compared_406(channel: BlockingChannel, qname: str,
                                               key: str, first: object,
                                               second: object) -> None:
    def show(v: object) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    channel.queue_declare(qname, exclusive=True, arguments={key: first})
    closed_with(lambda: channel.queue_declare(qname, exclusive=True, arguments={key: second}),
                406, f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{qname}' in "
                     f"vhost '/': received '{show(second)}' but current is '{show(first)}'")


@pytest.mark.parametrize("key", ["x-delivery-limit", "x-consumer-timeout"])
def test_redeclare_ackmq_argument_compared_406(is_rabbitmq: bool, channel: BlockingChannel,
                                               qname: str, key: str) -> None:
    """ackmq-only: arguments ackmq acts on (RabbitMQ 3.10 has x-delivery-limit on quorum
    queues only and no x-consumer-timeout) are compared like RabbitMQ's own."""
    if is_rabbitmq:
        pytest.skip("ackmq's own queue arguments")
    channel.queue_declare(qname, exclusive=True, arguments={key: 1000})
    closed_with(lambda: channel.queue_declare(qname, exclusive=True, arguments={key: 2000}),
                406, f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{qname}' in "
                     "vhost '/': received '2000' but current is '1000'")


def test_redeclare_exclusive_queue_as_not_exclusive_405(channel: BlockingChannel,
                                                        qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    closed_with(lambda: channel.queue_declare(qname, exclusive=False), 405, locked(qname))


def test_redeclare_queue_as_exclusive_405(connection, qname: str) -> None:
    ch = connection.channel()
    ch.queue_declare(qname, auto_delete=True)
    ch.basic_consume(qname, lambda *a: None)  # auto-delete goes when this channel closes
    closed_with(lambda: connection.channel().queue_declare(qname, exclusive=True), 405,
                locked(qname))


def test_redeclare_exclusive_checked_before_durable(channel: BlockingChannel,
                                                    qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    closed_with(lambda: channel.queue_declare(qname, durable=True), 405, locked(qname))


# ------------------------------------------------------------------ recovery


def test_recovered_definitions_are_not_checked_again() -> None:
    """ackmq-only (model): a queue stored by an older, laxer ackmq still starts."""
    from ackmq.broker import BrokerModel, NullScheduler
    from ackmq.broker.message import Message

    broker = BrokerModel(NullScheduler())
    broker.start()
    vh = broker.vhosts["/"]
    q = vh.declare_queue("old", False, True, False, False,
                         {"x-max-priority": 300, "x-dead-letter-routing-key": "k",
                          "x-expires": 0, "x-queue-mode": "bogus", "x-overflow": 1},
                         None, check=False)
    assert (q.max_priority, q.expires, q.overflow, q.dlx) == (255, None, "drop-head", None)
    x = vh.declare_exchange("oldx", "direct", False, True, False, False,
                            {"alternate-exchange": 1}, check=False)
    assert x.name == "oldx"
    # a stored message with an expiration that is refused today: kept, without expiry
    raw = bytes([0x01, 0x00, 2]) + b"-1"
    assert Message("", "old", raw, b"x", trusted=True).expiration_ms is None
