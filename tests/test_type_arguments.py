"""Which queue type takes which declare argument (SPEC R1 for the stream-only ones), the
same declarations against ackmq and the reference RabbitMQ 3.10: a classic or quorum
queue refuses `x-max-age` and the other stream-only arguments, a classic queue the
quorum-only ones, a quorum queue the classic-only ones, with RabbitMQ's codes, texts and
order (rabbit_amqqueue:check_declare_arguments); a redeclare compares only the arguments
the queue's type takes.

ackmq's own deviation (SPEC D10): a classic queue takes `x-delivery-limit`, and ackmq
checks its value on any type; see test_arguments.py for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from conftest import rabbitmq_url


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def url(request: pytest.FixtureRequest, broker_url: str) -> str:
    if request.param == "ackmq":
        return broker_url
    return rabbitmq_url()


@pytest.fixture
def conn(url: str) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(pika.URLParameters(url))
    yield c
    if c.is_open:
        c.close()


def declare(url: str, args: dict[str, Any], name: str | None = None, durable: bool = True,
            exclusive: bool = False, auto_delete: bool = False) -> tuple[Any, ...]:
    """Declare on a fresh connection: ("ok",) (and delete it again) or (how it was
    refused, code, text) with the queue's name as Q."""
    c = pika.BlockingConnection(pika.URLParameters(url))
    q = f"t.ta.{uuid.uuid4().hex[:10]}" if name is None else name
    try:
        ok = c.channel().queue_declare(q, durable=durable, exclusive=exclusive,
                                       auto_delete=auto_delete, arguments=args)
        c.channel().queue_delete(ok.method.queue)
        return ("ok",)
    except pika.exceptions.ChannelClosedByBroker as e:
        return "channel", e.reply_code, e.reply_text.replace(f"'{q}'", "'Q'")
    except pika.exceptions.ConnectionClosedByBroker as e:
        return "connection", e.reply_code, e.reply_text
    finally:
        if c.is_open:
            c.close()


def other_type(key: str, qtype: str) -> tuple[str, int, str]:
    return ("channel", 406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue 'Q' in "
                            f"vhost '/' of queue type rabbit_{qtype}_queue")


def bad_value(key: str, err: str) -> tuple[str, int, str]:
    return ("channel", 406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue 'Q' in "
                            f"vhost '/': {err}")


TYPES = {"classic": {"x-queue-type": "classic"}, "default": {},
         "quorum": {"x-queue-type": "quorum"}}
STREAM_ONLY = [("x-max-age", "7D"), ("x-max-age", "5x"), ("x-max-age", "D"), ("x-max-age", 10),
               ("x-stream-max-segment-size-bytes", 1000),
               ("x-stream-max-segment-size-bytes", 3_000_000_001),
               ("x-initial-cluster-size", 3), ("x-initial-cluster-size", 0)]


@pytest.mark.parametrize("qtype", ["default", "classic", "quorum"])
@pytest.mark.parametrize("key,value", STREAM_ONLY)
def test_R1_stream_only_arguments_refused_on_other_types(url: str, qtype: str, key: str,
                                                         value: Any) -> None:
    """Whatever the value (even one RabbitMQ's stream would crash on): the type refuses
    the argument itself."""
    kind = "quorum" if qtype == "quorum" else "classic"
    assert declare(url, {**TYPES[qtype], key: value}) == other_type(key, kind)


@pytest.mark.parametrize("qtype", ["default", "classic"])
@pytest.mark.parametrize("key,value", [
    ("x-quorum-initial-group-size", 3), ("x-quorum-initial-group-size", 0),
    ("x-dead-letter-strategy", "at-least-once"), ("x-dead-letter-strategy", "bogus"),
    ("x-max-in-memory-length", 5), ("x-max-in-memory-length", -1),
    ("x-max-in-memory-bytes", 5), ("x-queue-leader-locator", "client-local"),
    ("x-queue-leader-locator", "bogus")])
def test_quorum_only_arguments_refused_on_classic(url: str, qtype: str, key: str,
                                                  value: Any) -> None:
    assert declare(url, {**TYPES[qtype], key: value}) == other_type(key, "classic")


@pytest.mark.parametrize("key,value", [
    ("x-max-priority", 5), ("x-queue-mode", "lazy"), ("x-queue-mode", "bogus"),
    ("x-queue-version", 2), ("x-queue-master-locator", "min-masters"),
    ("x-queue-master-locator", "bogus")])
def test_classic_only_arguments_refused_on_quorum(url: str, key: str, value: Any) -> None:
    assert declare(url, {**TYPES["quorum"], key: value}) == other_type(key, "quorum")


@pytest.mark.parametrize("args,want", [
    # a quorum queue's own arguments, and their values checked
    ({"x-quorum-initial-group-size": 3}, ("ok",)),
    ({"x-dead-letter-strategy": "at-most-once"}, ("ok",)),
    ({"x-max-in-memory-length": 5, "x-max-in-memory-bytes": 5}, ("ok",)),
    ({"x-queue-leader-locator": "balanced"}, ("ok",)),
    ({"x-quorum-initial-group-size": 0}, bad_value("x-quorum-initial-group-size", "{value_zero,0}")),
    ({"x-quorum-initial-group-size": "a"},
     bad_value("x-quorum-initial-group-size", '"expected integer, got longstr"')),
    ({"x-dead-letter-strategy": "bogus"}, bad_value("x-dead-letter-strategy", "invalid_dlx_strategy")),
    ({"x-dead-letter-strategy": 1},
     bad_value("x-dead-letter-strategy", "{unacceptable_type,signedint}")),
    ({"x-max-in-memory-bytes": -1}, bad_value("x-max-in-memory-bytes", "{value_negative,-1}")),
    ({"x-queue-leader-locator": "bogus"},
     bad_value("x-queue-leader-locator", "invalid_queue_locator_arg")),
    # values before arguments of other types, in RabbitMQ's order
    ({"x-max-priority": 5, "x-quorum-initial-group-size": 0},
     bad_value("x-quorum-initial-group-size", "{value_zero,0}")),
    ({"x-quorum-initial-group-size": 0, "x-dead-letter-strategy": "bogus"},
     bad_value("x-dead-letter-strategy", "invalid_dlx_strategy")),
    ({"x-max-in-memory-length": -1, "x-max-length": -1},
     bad_value("x-max-length", "{value_negative,-1}")),
    # several arguments of other types: the first as sent
    ({"x-max-priority": 5, "x-max-age": "1D"}, other_type("x-max-priority", "quorum")),
    ({"x-max-age": "1D", "x-max-priority": 5}, other_type("x-max-age", "quorum")),
])
def test_quorum_declare_arguments_as_rabbitmq(url: str, args: dict, want: tuple) -> None:
    assert declare(url, {**TYPES["quorum"], **args}) == want


@pytest.mark.parametrize("args,want", [
    ({"x-queue-version": 1}, ("ok",)), ({"x-queue-version": 2}, ("ok",)),
    ({"x-queue-version": 3}, bad_value("x-queue-version", "\"unsupported queue version '3'\"")),
    ({"x-queue-version": 0}, bad_value("x-queue-version", "\"unsupported queue version '0'\"")),
    ({"x-queue-version": "a"}, bad_value("x-queue-version", '"expected integer, got longstr"')),
    ({"x-queue-master-locator": "client-local"}, ("ok",)),
    ({"x-queue-master-locator": "random"}, ("ok",)),
    # a value check before an argument of another type, whatever the order sent
    ({"x-max-age": "7D", "x-max-length": -1}, bad_value("x-max-length", "{value_negative,-1}")),
    ({"x-max-age": "1D", "x-queue-version": 3},
     bad_value("x-queue-version", "\"unsupported queue version '3'\"")),
    ({"x-max-age": "1D", "x-queue-mode": "bogus"},
     bad_value("x-queue-mode", "\"unsupported queue mode 'bogus'\"")),
    ({"x-expires": 0, "x-quorum-initial-group-size": 3}, bad_value("x-expires", "{value_zero,0}")),
    # several arguments of other types: the first as sent
    ({"x-max-in-memory-length": 5, "x-max-age": "7D"}, other_type("x-max-in-memory-length", "classic")),
    ({"x-max-age": "7D", "x-max-in-memory-length": 5}, other_type("x-max-age", "classic")),
    # x-queue-type is checked first
    ({"x-max-length": -1, "x-queue-type": "bogus"},
     bad_value("x-queue-type", "\"unsupported queue type 'bogus'\"")),
    # a master locator RabbitMQ 3.10 has no module for crashes its channel: 541, after
    # every other check
    ({"x-queue-master-locator": "bogus"}, ("connection", 541, "INTERNAL_ERROR")),
    ({"x-queue-master-locator": "balanced"}, ("connection", 541, "INTERNAL_ERROR")),
    ({"x-queue-master-locator": 1}, ("connection", 541, "INTERNAL_ERROR")),
    ({"x-queue-master-locator": "bogus", "x-max-age": "1D"}, other_type("x-max-age", "classic")),
    ({"x-queue-master-locator": "bogus", "x-queue-version": 3},
     bad_value("x-queue-version", "\"unsupported queue version '3'\"")),
])
def test_classic_declare_arguments_as_rabbitmq(url: str, args: dict, want: tuple) -> None:
    assert declare(url, args) == want


def test_classic_refuses_stream_argument_on_an_exclusive_queue(url: str) -> None:
    assert declare(url, {"x-max-age": "1D"}, durable=False, exclusive=True) == \
        other_type("x-max-age", "classic")


@pytest.mark.parametrize("flags,prop", [
    ({"exclusive": True}, "exclusive-owner"), ({"durable": False}, "non-durable"),
    ({"durable": False, "exclusive": True}, "exclusive-owner"),
    ({"exclusive": True, "auto_delete": True}, "auto-delete"),
    ({"auto_delete": True}, "auto-delete")])
def test_quorum_properties_as_rabbitmq(url: str, flags: dict, prop: str) -> None:
    assert declare(url, TYPES["quorum"], **flags) == (
        "channel", 406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue 'Q' in "
                        "vhost '/'")


def test_quorum_arguments_checked_before_properties(url: str) -> None:
    assert declare(url, {**TYPES["quorum"], "x-max-age": "1D"}, durable=False) == \
        other_type("x-max-age", "quorum")


def test_quorum_queue_is_never_server_named(url: str) -> None:
    assert declare(url, TYPES["quorum"], name="") == (
        "channel", 406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
                        "rabbit_quorum_queue")


@pytest.mark.parametrize("first,second,want", [
    # a classic queue compares its own arguments only
    ({}, {"x-max-age": "1D"}, None),
    ({}, {"x-quorum-initial-group-size": 3}, None),
    ({}, {"x-max-in-memory-length": 3}, None),
    ({}, {"x-queue-version": 2},
     ("x-queue-version", "received the value '2' of type 'signedint' but current is none")),
    ({}, {"x-queue-master-locator": "random"},
     ("x-queue-master-locator", "received the value 'random' of type 'longstr' but current "
                                "is none")),
    # a quorum queue its own
    (TYPES["quorum"], {"x-max-priority": 3}, None),
    (TYPES["quorum"], {"x-queue-mode": "lazy"}, None),
    (TYPES["quorum"], {"x-queue-version": 2}, None),
    (TYPES["quorum"], {"x-max-age": "1D"}, None),
    (TYPES["quorum"], {"x-quorum-initial-group-size": 3},
     ("x-quorum-initial-group-size", "received the value '3' of type 'signedint' but current "
                                     "is none")),
    (TYPES["quorum"], {"x-max-in-memory-length": 3},
     ("x-max-in-memory-length", "received the value '3' of type 'signedint' but current is "
                                "none")),
    (TYPES["quorum"], {"x-delivery-limit": 3},
     ("x-delivery-limit", "received the value '3' of type 'signedint' but current is none")),
])
def test_redeclare_compares_the_types_own_arguments(conn: pika.BlockingConnection, first: dict,
                                                    second: dict, want: tuple | None) -> None:
    q = f"t.ta.{uuid.uuid4().hex[:10]}"
    conn.channel().queue_declare(q, durable=True, arguments=first)
    ch = conn.channel()
    try:
        if want is None:
            ch.queue_declare(q, durable=True, arguments={**first, **second})
            return
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare(q, durable=True, arguments={**first, **second})
        assert (e.value.reply_code, e.value.reply_text) == (
            406, f"PRECONDITION_FAILED - inequivalent arg '{want[0]}' for queue '{q}' in "
                 f"vhost '/': {want[1]}")
    finally:
        conn.channel().queue_delete(q)


@pytest.mark.parametrize("qtype,args,want", [
    ("quorum", {"x-stream-offset": "first"}, other_type("x-stream-offset", "quorum")),
    ("quorum", {"x-cancel-on-ha-failover": True}, other_type("x-cancel-on-ha-failover", "quorum")),
    ("quorum", {"x-cancel-on-ha-failover": "a"}, other_type("x-cancel-on-ha-failover", "quorum")),
    ("quorum", {"x-priority": "a"}, bad_value("x-priority", '"expected integer, got longstr"')),
    ("quorum", {"x-priority": 1, "x-stream-offset": 5}, other_type("x-stream-offset", "quorum")),
    ("quorum", {"x-credit": {"credit": 5, "drain": False}}, None),
    ("classic", {"x-stream-offset": "first"}, other_type("x-stream-offset", "classic")),
    ("classic", {"x-priority": "a", "x-stream-offset": 1},
     bad_value("x-priority", '"expected integer, got longstr"')),
    ("classic", {"x-credit": {"credit": 5, "drain": False}}, None),
])
def test_consume_arguments_by_queue_type(conn: pika.BlockingConnection, qtype: str,
                                         args: dict, want: tuple | None) -> None:
    q = f"t.ta.{uuid.uuid4().hex[:10]}"
    conn.channel().queue_declare(q, durable=True, arguments=TYPES[qtype])
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    try:
        if want is None:
            ch.basic_consume(q, lambda *a: None, arguments=args)
            conn.process_data_events(0.2)
            ch.basic_qos(prefetch_count=5)  # a round trip: a late close arrives first
            assert ch.is_open
            return
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.basic_consume(q, lambda *a: None, arguments=args)
            conn.process_data_events(0.2)
            ch.basic_qos(prefetch_count=5)
        assert ("channel", e.value.reply_code,
                e.value.reply_text.replace(f"'{q}'", "'Q'")) == want
    finally:
        conn.channel().queue_delete(q)
