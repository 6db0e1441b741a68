"""Queues: declare/delete/purge rules, exclusivity, arguments (TTL, expiry, length, priority),
consumers (exclusive, cancel, cancel notification, recover).

Every test passes against RabbitMQ 3.10 (ACKMQ_TEST_URL=amqp://...:5672/); reply codes and
texts are RabbitMQ's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError
from support.pikahelp import WAIT, closed_with, ready_count, uniq, wait_ready
from support.rawamqp import RawConnection


def bodies(ch: BlockingChannel, queue: str) -> list[bytes]:
    out: list[bytes] = []
    while True:
        m, _p, b = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append(b)


def queue_exists(params: pika.URLParameters, name: str) -> bool:
    """Passive declare on a throw-away connection (a 404 would close our channel)."""
    conn = pika.BlockingConnection(params)
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False
    finally:
        if conn.is_open:
            conn.close()


def wait_gone(params: pika.URLParameters, name: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while queue_exists(params, name):
        assert time.monotonic() < deadline, f"queue {name} still exists"
        time.sleep(0.05)



def locked_text(q: str) -> str:
    """RabbitMQ's text, cut to 252 bytes + "..." (a reply-text is a 255-byte shortstr)."""
    text = (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in "
            "vhost '/'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.")
    return text if len(text) <= 255 else text[:252] + "..."


# ------------------------------------------------------------------ declare


def test_server_named_queue(channel: BlockingChannel) -> None:
    ok = channel.queue_declare("", exclusive=True).method
    assert ok.queue.startswith("amq.gen-") and len(ok.queue) > len("amq.gen-")
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    ok2 = channel.queue_declare("", exclusive=True).method
    assert ok2.queue != ok.queue
    channel.basic_publish("", ok.queue, b"x")
    assert bodies(channel, ok.queue) == [b"x"]


def test_declare_ok_counts(connection, channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    for _ in range(3):
        channel.basic_publish("", qname, b"x")
    channel.basic_consume(qname, lambda *a: None, arguments=None)  # takes them all
    channel.basic_qos(prefetch_count=0)
    ch2 = connection.channel()
    deadline = time.monotonic() + WAIT
    while True:
        ok = ch2.queue_declare(qname, exclusive=True).method  # redeclare: same owner
        if ok.message_count == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert (ok.queue, ok.message_count, ok.consumer_count) == (qname, 0, 1)


def test_declare_passive_missing_404(channel: BlockingChannel) -> None:
    name = uniq("missing.q")
    closed_with(lambda: channel.queue_declare(name, passive=True), 404,
                f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_declare_amq_prefix_refused_403(channel: BlockingChannel) -> None:
    closed_with(lambda: channel.queue_declare("amq.foo"), 403,
                "ACCESS_REFUSED - queue name 'amq.foo' contains reserved prefix 'amq.*'")


@pytest.mark.parametrize("first,second,text", [
    ({"x-message-ttl": 1000}, {"x-message-ttl": 2000},
     "inequivalent arg 'x-message-ttl' for queue '{q}' in vhost '/': "
     "received '2000' but current is '1000'"),
    ({"x-dead-letter-exchange": "a"}, {"x-dead-letter-exchange": "b"},
     "inequivalent arg 'x-dead-letter-exchange' for queue '{q}' in vhost '/': "
     "received 'b' but current is 'a'"),
    (None, {"x-max-length": 5},
     "inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': "
     "received the value '5' of type 'signedint' but current is none"),
    ({"x-max-length": 5}, None,
     "inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': "
     "received none but current is the value '5' of type 'signedint'"),
], ids=["ttl", "dlx", "added", "omitted"])
def test_redeclare_inequivalent_arguments_406(channel: BlockingChannel, qname: str,
                                              first: dict | None, second: dict | None,
                                              text: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments=first)
    closed_with(lambda: channel.queue_declare(qname, exclusive=True, arguments=second), 406,
                "PRECONDITION_FAILED - " + text.format(q=qname))


def test_redeclare_inequivalent_durable_406(params, channel: BlockingChannel,
                                            qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True)
    try:
        closed_with(lambda: channel.queue_declare(qname, durable=True, auto_delete=True),
                    406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
                         f"'{qname}' in vhost '/': received 'true' but current is 'false'")
    finally:
        conn = pika.BlockingConnection(params)
        conn.channel().queue_delete(qname)
        conn.close()


def test_redeclare_equivalent_ok(channel: BlockingChannel, qname: str) -> None:
    args = {"x-message-ttl": 60000, "x-max-length": 10}
    channel.queue_declare(qname, exclusive=True, arguments=args)
    channel.queue_declare(qname, exclusive=True, arguments=dict(args))
    channel.queue_declare(qname, passive=True)


def test_invalid_argument_406(channel: BlockingChannel, qname: str) -> None:
    text = closed_with(lambda: channel.queue_declare(qname, exclusive=True,
                                                     arguments={"x-message-ttl": -1}), 406)
    assert text.startswith(
        f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{qname}' in vhost '/'")


def test_invalid_overflow_406(channel: BlockingChannel, qname: str) -> None:
    closed_with(lambda: channel.queue_declare(qname, exclusive=True,
                                              arguments={"x-overflow": "nope"}), 406,
                f"PRECONDITION_FAILED - invalid arg 'x-overflow' for queue '{qname}' in "
                "vhost '/': invalid_overflow")


# ------------------------------------------------------------------ exclusive


@pytest.mark.parametrize("op", [
    lambda ch, q: ch.queue_declare(q, exclusive=True),
    lambda ch, q: ch.queue_declare(q),
    lambda ch, q: ch.queue_declare(q, passive=True),
    lambda ch, q: ch.basic_consume(q, lambda *a: None),
    lambda ch, q: ch.basic_get(q),
    lambda ch, q: ch.queue_delete(q),
    lambda ch, q: ch.queue_purge(q),
    lambda ch, q: ch.queue_bind(q, "amq.fanout"),
], ids=["declare-exclusive", "declare", "passive", "consume", "get", "delete", "purge",
        "bind"])
def test_exclusive_queue_locked_for_other_connections_405(
        channel: BlockingChannel, other: pika.BlockingConnection, qname: str,
        op: Callable[[BlockingChannel, str], object]) -> None:
    channel.queue_declare(qname, exclusive=True)
    och = other.channel()
    closed_with(lambda: op(och, qname), 405, locked_text(qname))
    channel.queue_declare(qname, passive=True)  # the owner is unaffected


def test_exclusive_queue_accepts_publishes_from_others(
        channel: BlockingChannel, other: pika.BlockingConnection, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    och = other.channel()
    och.basic_publish("", qname, b"from-other")
    och.basic_qos(prefetch_count=0)
    wait_ready(channel, qname, 1)
    assert bodies(channel, qname) == [b"from-other"]


def test_exclusive_queue_deleted_when_connection_closes(params, qname: str) -> None:
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare(qname, exclusive=True, durable=False)
    conn.close()
    wait_gone(params, qname)
    # the name is free again for anybody
    conn2 = pika.BlockingConnection(params)
    try:
        conn2.channel().queue_declare(qname, exclusive=True)
    finally:
        conn2.close()


def test_exclusive_queue_survives_channel_close(connection, qname: str) -> None:
    ch = connection.channel()
    ch.queue_declare(qname, exclusive=True)
    ch.close()
    connection.channel().queue_declare(qname, passive=True)


# ------------------------------------------------------------------ auto-delete


def test_auto_delete_queue_deleted_when_last_consumer_cancels(
        params, connection, channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True)
    time.sleep(0.1)
    assert queue_exists(params, qname)  # never consumed: it stays
    t1 = channel.basic_consume(qname, lambda *a: None)
    ch2 = connection.channel()
    t2 = ch2.basic_consume(qname, lambda *a: None)
    channel.basic_cancel(t1)
    assert queue_exists(params, qname)  # one consumer left
    ch2.basic_cancel(t2)
    wait_gone(params, qname)


def test_auto_delete_queue_deleted_when_consumer_channel_closes(
        params, connection, qname: str) -> None:
    ch = connection.channel()
    ch.queue_declare(qname, auto_delete=True)
    ch.basic_consume(qname, lambda *a: None)
    ch.close()
    wait_gone(params, qname)


# ------------------------------------------------------------------ purge / delete


def test_purge_returns_ready_count_and_keeps_unacked(channel: BlockingChannel,
                                                     qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    for i in range(4):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 4)
    m, _p, _b = channel.basic_get(qname)  # one unacked: not purged
    assert channel.queue_purge(qname).method.message_count == 3
    assert ready_count(channel, qname) == 0
    channel.basic_nack(m.delivery_tag, requeue=True)
    wait_ready(channel, qname, 1)
    assert channel.queue_purge(qname).method.message_count == 1
    assert channel.queue_purge(qname).method.message_count == 0


def test_purge_missing_queue_404(channel: BlockingChannel) -> None:
    name = uniq("missing.q")
    closed_with(lambda: channel.queue_purge(name), 404,
                f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_delete_returns_message_count(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    for _ in range(3):
        channel.basic_publish("", qname, b"x")
    wait_ready(channel, qname, 3)
    assert channel.queue_delete(qname).method.message_count == 3
    closed_with(lambda: channel.queue_declare(qname, passive=True), 404)


def test_delete_missing_queue_is_ok(channel: BlockingChannel) -> None:
    assert channel.queue_delete(uniq("missing.q")).method.message_count == 0


def test_delete_if_unused_with_consumer_406(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    channel.basic_consume(qname, lambda *a: None)
    closed_with(lambda: channel.queue_delete(qname, if_unused=True), 406,
                f"PRECONDITION_FAILED - queue '{qname}' in vhost '/' in use")


def test_delete_if_empty_with_messages_406(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    channel.basic_publish("", qname, b"x")
    wait_ready(channel, qname, 1)
    closed_with(lambda: channel.queue_delete(qname, if_empty=True), 406,
                f"PRECONDITION_FAILED - queue '{qname}' in vhost '/' not empty")


def test_delete_if_empty_counts_only_ready_messages(channel: BlockingChannel,
                                                    qname: str) -> None:
    """RabbitMQ: unacked deliveries do not make a queue non-empty for if-empty."""
    channel.queue_declare(qname, exclusive=True)
    channel.basic_publish("", qname, b"x")
    wait_ready(channel, qname, 1)
    channel.basic_get(qname)
    assert channel.queue_delete(qname, if_empty=True, if_unused=True).method.message_count == 0


def test_delete_queue_removes_bindings(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True)
    channel.queue_bind(qname, "amq.direct", qname)
    channel.queue_delete(qname)
    channel.queue_declare(qname, exclusive=True)
    channel.basic_publish("amq.direct", qname, b"x")
    time.sleep(0.1)
    assert bodies(channel, qname) == []


def test_bind_to_missing_exchange_404(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    ex = uniq("missing.ex")
    closed_with(lambda: channel.queue_bind(qname, ex), 404,
                f"NOT_FOUND - no exchange '{ex}' in vhost '/'")


# ------------------------------------------------------------------ TTL and expiry


def _dead_queue(ch: BlockingChannel, qname: str) -> str:
    dead = qname + ".dead"
    ch.queue_declare(dead, exclusive=True)
    return dead


def test_message_ttl_expires(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True, arguments={"x-message-ttl": 150})
    channel.basic_publish("", qname, b"short-lived")
    wait_ready(channel, qname, 0, timeout=WAIT)
    assert bodies(channel, qname) == []


def test_message_ttl_zero_expires_unless_consumer_waiting(connection,
                                                           channel: BlockingChannel,
                                                           qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True, arguments={"x-message-ttl": 0})
    channel.basic_publish("", qname, b"nobody-waits")
    channel.basic_qos(prefetch_count=0)
    time.sleep(0.1)
    assert ready_count(channel, qname) == 0
    got: list[bytes] = []
    channel.basic_consume(qname, lambda c, m, p, b: got.append(b), auto_ack=True)
    channel.basic_publish("", qname, b"consumer-waits")
    deadline = time.monotonic() + WAIT
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [b"consumer-waits"]


def test_message_ttl_dead_letters_expired(channel: BlockingChannel, qname: str) -> None:
    dead = _dead_queue(channel, qname)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-message-ttl": 100, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead})
    channel.basic_publish("", qname, b"e", pika.BasicProperties(headers={"h": "v"}))
    wait_ready(channel, dead, 1)
    m, p, b = channel.basic_get(dead, auto_ack=True)
    assert (b, m.routing_key) == (b"e", dead)
    assert p.headers["h"] == "v"
    (death,) = p.headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("expired", qname, 1)
    assert death["exchange"] == "" and death["routing-keys"] == [qname]
    assert "original-expiration" not in death  # the TTL came from the queue
    assert p.headers["x-first-death-reason"] == "expired"


def test_per_message_expiration(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True)
    channel.basic_publish("", qname, b"short", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", qname, b"long", pika.BasicProperties(expiration="60000"))
    channel.basic_publish("", qname, b"forever")
    wait_ready(channel, qname, 2)
    m, p, b = channel.basic_get(qname, auto_ack=True)
    assert b == b"long" and p.expiration == "60000"  # kept while it lives
    assert bodies(channel, qname) == [b"forever"]


@pytest.mark.parametrize("expiration, reason", [
    ("-1", "{value_negative,-1}"),
    ("abc", "no_integer"),
    ("1.5", '{leftover_string,".5"}'),
    ("", "no_integer"),
    (" 5", "no_integer"),
    ("5 ", '{leftover_string," "}'),
    ("1e3", '{leftover_string,"e3"}'),
    ("315360000001", "{value_too_large,315360000001}"),  # over ten years
    # RabbitMQ's ~p layout: a reason that does not fit in the line wraps
    ("0" * 30 + "315360000001",
     "{value_too_large,\n" + " " * 66 + "315360000001}"),
])
def test_P4_invalid_expiration_closes_channel_406_never_confirmed(
        params, connection, qname: str, expiration: str, reason: str) -> None:
    """A bad per-message `expiration` is refused before the publish is numbered: the
    channel closes with 406, no confirm is sent, and the message is in no queue."""
    setup = connection.channel()
    setup.queue_declare(qname, auto_delete=True)
    ch = connection.channel()
    ch.confirm_delivery()
    closed_with(lambda: ch.basic_publish("", qname, b"x",
                                         pika.BasicProperties(expiration=expiration)),
                406, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}")
    assert ready_count(setup, qname) == 0
    assert connection.is_open  # a channel error only


@pytest.mark.parametrize("expiration", ["0", "-0", "+5000", "00042", "315360000000"])
def test_valid_expiration_forms_accepted(channel: BlockingChannel, qname: str,
                                         expiration: str) -> None:
    """What RabbitMQ's string:to_integer accepts (sign, leading zeros, up to ten years)."""
    channel.confirm_delivery()
    channel.queue_declare(qname, exclusive=True)
    channel.basic_publish("", qname, b"x", pika.BasicProperties(expiration=expiration))
    assert channel.is_open


def test_per_message_expiration_dead_lettered(channel: BlockingChannel, qname: str) -> None:
    dead = _dead_queue(channel, qname)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", qname, b"e", pika.BasicProperties(expiration="100"))
    wait_ready(channel, dead, 1)
    _m, p, b = channel.basic_get(dead, auto_ack=True)
    assert b == b"e"
    assert p.expiration is None  # RabbitMQ strips it so the dead letter does not expire
    (death,) = p.headers["x-death"]
    assert (death["reason"], death["queue"], death["original-expiration"]) == (
        "expired", qname, "100")


def test_shorter_of_queue_and_message_ttl_wins(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True, arguments={"x-message-ttl": 60000})
    channel.basic_publish("", qname, b"short", pika.BasicProperties(expiration="100"))
    wait_ready(channel, qname, 0)


def wait_unroutable(ch: BlockingChannel, queue: str, timeout: float = WAIT) -> None:
    """Wait for `queue` to disappear without touching it: a declare (even passive) or a
    basic.get would renew its x-expires lease, a mandatory publish does not."""
    ch.confirm_delivery()
    deadline = time.monotonic() + timeout
    while True:
        try:
            ch.basic_publish("", queue, b"probe", mandatory=True)
        except UnroutableError:
            return
        assert time.monotonic() < deadline, f"queue {queue} still exists"
        time.sleep(0.05)


def test_queue_expires_when_unused(params, channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, arguments={"x-expires": 300})
    assert queue_exists(params, qname)
    wait_unroutable(channel, qname)
    assert not queue_exists(params, qname)


def test_queue_expires_not_while_consumed(params, connection, channel: BlockingChannel,
                                          qname: str) -> None:
    channel.queue_declare(qname, arguments={"x-expires": 200})
    tag = channel.basic_consume(qname, lambda *a: None, auto_ack=True)
    time.sleep(0.6)
    connection.process_data_events(time_limit=0)
    channel.basic_cancel(tag)
    ch2 = connection.channel()
    ch2.confirm_delivery()
    ch2.basic_publish("", qname, b"still-there", mandatory=True)  # routable: not expired
    wait_unroutable(ch2, qname)


# ------------------------------------------------------------------ length limits


def test_max_length_drop_head(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True, arguments={"x-max-length": 2})
    for i in range(5):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 2)
    assert bodies(channel, qname) == [b"3", b"4"]


def test_max_length_counts_only_ready(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments={"x-max-length": 1})
    channel.basic_publish("", qname, b"a")
    wait_ready(channel, qname, 1)
    channel.basic_get(qname)  # unacked: no longer counts against the limit
    channel.basic_publish("", qname, b"b")
    wait_ready(channel, qname, 1)
    assert bodies(channel, qname) == [b"b"]


def test_max_length_drop_head_dead_letters_maxlen(channel: BlockingChannel,
                                                  qname: str) -> None:
    dead = _dead_queue(channel, qname)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-max-length": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    for i in range(4):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, dead, 2)
    assert bodies(channel, qname) == [b"2", b"3"]
    for expect in (b"0", b"1"):
        _m, p, b = channel.basic_get(dead, auto_ack=True)
        assert b == expect
        (death,) = p.headers["x-death"]
        assert (death["reason"], death["queue"], death["count"]) == ("maxlen", qname, 1)


def test_max_length_bytes_drop_head(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        channel.basic_publish("", qname, body)
    wait_ready(channel, qname, 2)
    assert bodies(channel, qname) == [b"bbbb", b"cccc"]


def test_overflow_reject_publish_nacks_publisher(channel: BlockingChannel,
                                                 qname: str) -> None:
    """P6: a full queue with x-overflow=reject-publish nacks the publish; nothing dropped."""
    dead = _dead_queue(channel, qname)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-max-length": 2, "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.confirm_delivery()
    channel.basic_publish("", qname, b"1")
    channel.basic_publish("", qname, b"2")
    with pytest.raises(NackError):
        channel.basic_publish("", qname, b"3")
    assert ready_count(channel, qname) == 2
    assert bodies(channel, qname) == [b"1", b"2"]
    assert ready_count(channel, dead) == 0  # reject-publish does not dead-letter
    channel.basic_publish("", qname, b"4")  # room again: acked
    assert bodies(channel, qname) == [b"4"]


def test_overflow_reject_publish_dlx_dead_letters(channel: BlockingChannel,
                                                  qname: str) -> None:
    dead = _dead_queue(channel, qname)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-max-length": 1, "x-overflow": "reject-publish-dlx",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.confirm_delivery()
    channel.basic_publish("", qname, b"1")
    with pytest.raises(NackError):
        channel.basic_publish("", qname, b"2")
    wait_ready(channel, dead, 1)
    _m, p, b = channel.basic_get(dead, auto_ack=True)
    assert b == b"2"
    assert p.headers["x-death"][0]["reason"] == "maxlen"
    assert bodies(channel, qname) == [b"1"]


# ------------------------------------------------------------------ priority


def test_max_priority_higher_first(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True, arguments={"x-max-priority": 10})
    for body, prio in [(b"p1", 1), (b"p5a", 5), (b"none", None), (b"p9", 9), (b"p5b", 5),
                       (b"p0", 0), (b"p200", 200)]:
        channel.basic_publish("", qname, body, pika.BasicProperties(priority=prio))
    wait_ready(channel, qname, 7)
    # above the max counts as the max (10); equal priorities stay FIFO; none = 0
    assert bodies(channel, qname) == [b"p200", b"p9", b"p5a", b"p5b", b"p1", b"none", b"p0"]


def test_priority_ignored_without_max_priority(channel: BlockingChannel, qname: str) -> None:
    channel.confirm_delivery()  # each publish is in its queue once it returns
    channel.queue_declare(qname, exclusive=True)
    for body, prio in [(b"a", 1), (b"b", 9), (b"c", 5)]:
        channel.basic_publish("", qname, body, pika.BasicProperties(priority=prio))
    wait_ready(channel, qname, 3)
    assert bodies(channel, qname) == [b"a", b"b", b"c"]


def test_priority_requeue_keeps_priority_order(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments={"x-max-priority": 5})
    for body, prio in [(b"hi", 5), (b"lo", 1)]:
        channel.basic_publish("", qname, body, pika.BasicProperties(priority=prio))
    wait_ready(channel, qname, 2)
    m, _p, b = channel.basic_get(qname)
    assert b == b"hi"
    channel.basic_nack(m.delivery_tag, requeue=True)
    wait_ready(channel, qname, 2)
    assert bodies(channel, qname) == [b"hi", b"lo"]


# ------------------------------------------------------------------ consumers


def test_exclusive_consumer_blocks_others_403(connection, channel: BlockingChannel,
                                              qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    channel.basic_consume(qname, lambda *a: None, exclusive=True)
    ch2 = connection.channel()
    closed_with(lambda: ch2.basic_consume(qname, lambda *a: None), 403,
                f"ACCESS_REFUSED - queue '{qname}' in vhost '/' in exclusive use")


def test_exclusive_consume_refused_when_consumers_exist_403(
        connection, channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    channel.basic_consume(qname, lambda *a: None)
    ch2 = connection.channel()
    closed_with(lambda: ch2.basic_consume(qname, lambda *a: None, exclusive=True), 403,
                f"ACCESS_REFUSED - queue '{qname}' in vhost '/' in exclusive use")


def test_exclusive_consumer_released_by_cancel(connection, channel: BlockingChannel,
                                               qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    tag = channel.basic_consume(qname, lambda *a: None, exclusive=True)
    channel.basic_cancel(tag)
    connection.channel().basic_consume(qname, lambda *a: None)


def test_message_ttl_applies_to_requeued_message(channel: BlockingChannel,
                                                 qname: str) -> None:
    """A message whose TTL ran out while it was unacked expires when it is requeued."""
    dead = _dead_queue(channel, qname)
    channel.queue_declare(qname, exclusive=True, arguments={
        "x-message-ttl": 200, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.confirm_delivery()
    channel.basic_publish("", qname, b"late")
    m, _p, _b = channel.basic_get(qname)
    assert m is not None
    time.sleep(0.4)
    channel.basic_nack(m.delivery_tag, requeue=True)
    wait_ready(channel, dead, 1)
    assert ready_count(channel, qname) == 0
    _m, p, b = channel.basic_get(dead, auto_ack=True)
    assert b == b"late" and p.headers["x-death"][0]["reason"] == "expired"


def test_consume_missing_queue_404(channel: BlockingChannel) -> None:
    name = uniq("missing.q")
    closed_with(lambda: channel.basic_consume(name, lambda *a: None), 404,
                f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_get_missing_queue_404(channel: BlockingChannel) -> None:
    name = uniq("missing.q")
    closed_with(lambda: channel.basic_get(name), 404,
                f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_consumer_cancel_notification_on_queue_delete(connection, channel: BlockingChannel,
                                                      qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    cancelled: list[str] = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = channel.basic_consume(qname, lambda *a: None)
    connection.channel().queue_delete(qname)
    deadline = time.monotonic() + WAIT
    while not cancelled and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert cancelled == [tag]
    assert channel.is_open
    channel.basic_qos(prefetch_count=0)


def test_basic_cancel_stops_deliveries(connection, channel: BlockingChannel,
                                       qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    got: list[bytes] = []
    tag = channel.basic_consume(qname, lambda c, m, p, b: got.append(b), auto_ack=True)
    channel.basic_publish("", qname, b"1")
    deadline = time.monotonic() + WAIT
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [b"1"]
    channel.basic_cancel(tag)
    channel.basic_publish("", qname, b"2")
    wait_ready(channel, qname, 1)
    connection.process_data_events(time_limit=0.1)
    assert got == [b"1"]
    assert channel.queue_declare(qname, passive=True).method.consumer_count == 0


def test_duplicate_consumer_tag_530_not_allowed(broker_url: str, qname: str) -> None:
    """Reusing a live consumer tag on a channel is a connection error (pika refuses it
    client-side, so this speaks raw frames)."""
    conn = RawConnection.open(broker_url)
    try:
        conn.open_channel(1)
        conn.rpc(1, commands.Queue.Declare(queue=qname, exclusive=True),
                 commands.Queue.DeclareOk)
        conn.rpc(1, commands.Basic.Consume(queue=qname, consumer_tag="ct"),
                 commands.Basic.ConsumeOk)
        conn.send(1, commands.Basic.Consume(queue=qname, consumer_tag="ct"))
        close = conn.wait_close()
        assert isinstance(close, commands.Connection.Close)
        assert close.reply_code == 530
        assert close.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'ct'"
    finally:
        conn.abort()


def test_recover_requeue_redelivers(connection, channel: BlockingChannel,
                                    qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    for i in range(3):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 3)
    m1, _p, _b = channel.basic_get(qname)
    m2, _p, _b = channel.basic_get(qname)
    channel.basic_ack(m1.delivery_tag)
    channel.basic_recover(requeue=True)
    wait_ready(channel, qname, 2)
    m, _p, b = channel.basic_get(qname, auto_ack=True)
    assert (b, m.redelivered) == (b"1", True)
    m, _p, b = channel.basic_get(qname, auto_ack=True)
    assert (b, m.redelivered) == (b"2", False)
    # the recovered delivery's old tag is settled: acking it is an unknown tag
    channel.basic_ack(m2.delivery_tag)
    closed_with(lambda: channel.basic_qos(prefetch_count=0), 406,
                f"PRECONDITION_FAILED - unknown delivery tag {m2.delivery_tag}")


def test_get_message_count(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True)
    for i in range(4):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 4)
    counts = []
    for _ in range(4):
        m, _p, _b = channel.basic_get(qname)
        counts.append(m.message_count)
    assert counts == [3, 2, 1, 0]
    assert channel.basic_get(qname)[0] is None
    channel.basic_nack(0, multiple=True, requeue=True)
    wait_ready(channel, qname, 4)
    m, _p, _b = channel.basic_get(qname, auto_ack=True)
    assert m.message_count == 3


# ------------------------------------------------------------------ "" = last declared queue

_EMPTY_NAME_OPS: dict[str, Callable[[BlockingChannel], object]] = {
    "queue.bind": lambda ch: ch.queue_bind("", "amq.direct", routing_key="k"),
    "queue.unbind": lambda ch: ch.queue_unbind("", "amq.direct", routing_key="k"),
    "basic.consume": lambda ch: ch.basic_consume("", lambda *a: None),
    "basic.get": lambda ch: ch.basic_get(""),
    "queue.purge": lambda ch: ch.queue_purge(""),
    "queue.delete": lambda ch: ch.queue_delete(""),
}


@pytest.mark.parametrize("op", list(_EMPTY_NAME_OPS))
def test_empty_queue_name_without_declared_queue_404(channel: BlockingChannel, op: str) -> None:
    """RabbitMQ: an empty queue name means the channel's last declared queue; none yet: 404."""
    closed_with(lambda: _EMPTY_NAME_OPS[op](channel), 404,
                "NOT_FOUND - no previously declared queue")


def test_empty_queue_name_is_last_declared_queue(params, connection, qname: str) -> None:
    ch = connection.channel()
    ch.confirm_delivery()
    ch.queue_declare(qname)
    ch.queue_bind("", "amq.direct", routing_key="k")
    ch.basic_publish("amq.direct", "k", b"1", mandatory=True)
    m, _p, b = ch.basic_get("", auto_ack=True)
    assert b == b"1" and m.message_count == 0
    ch.basic_publish("amq.direct", "k", b"2", mandatory=True)
    assert ch.queue_purge("").method.message_count == 1
    ch.queue_unbind("", "amq.direct", routing_key="k")
    with pytest.raises(UnroutableError):
        ch.basic_publish("amq.direct", "k", b"3", mandatory=True)
    got: list[bytes] = []
    ch.basic_consume("", lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", qname, b"4")
    deadline = time.monotonic() + WAIT
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [b"4"]
    ch.queue_delete("")
    assert not queue_exists(params, qname)


def test_empty_queue_name_and_routing_key_binds_queue_name(channel: BlockingChannel,
                                                           qname: str) -> None:
    """With the queue field empty, an empty routing key is the queue's name; with a named
    queue, an empty routing key stays empty."""
    channel.confirm_delivery()
    channel.queue_declare(qname, exclusive=True)
    channel.queue_bind("", "amq.direct", routing_key="")
    channel.basic_publish("amq.direct", qname, b"by-name", mandatory=True)
    with pytest.raises(UnroutableError):
        channel.basic_publish("amq.direct", "", b"by-empty-key", mandatory=True)
    assert bodies(channel, qname) == [b"by-name"]
    channel.queue_unbind("", "amq.direct", routing_key="")
    with pytest.raises(UnroutableError):
        channel.basic_publish("amq.direct", qname, b"unbound", mandatory=True)
    channel.queue_bind(qname, "amq.direct", routing_key="")
    channel.basic_publish("amq.direct", "", b"empty-key", mandatory=True)
    assert bodies(channel, qname) == [b"empty-key"]
    channel.queue_unbind(qname, "amq.direct", routing_key="")


def test_empty_queue_name_follows_passive_declare_and_outlives_delete(
        params, connection, qname: str) -> None:
    connection.channel().queue_declare(qname)
    ch = connection.channel()
    ch.queue_declare(qname, passive=True)  # a passive declare counts too
    ch.queue_delete("")
    assert not queue_exists(params, qname)
    # the name is remembered after the queue is gone
    closed_with(lambda: ch.basic_get(""), 404, f"NOT_FOUND - no queue '{qname}' in vhost '/'")


def test_empty_queue_name_is_per_channel(connection, qname: str) -> None:
    connection.channel().queue_declare(qname, exclusive=True)
    other_channel = connection.channel()
    closed_with(lambda: other_channel.basic_get(""), 404,
                "NOT_FOUND - no previously declared queue")
