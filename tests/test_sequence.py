"""The `x-ackmq-seq` header (ackmq only; RabbitMQ has nothing like it), which a queue
(argument `x-ackmq-seq: true`, as here) or a consumer (the same basic.consume argument)
asks for: unasked, deliveries carry only what was published (tests/test_parity.py).

Why: the Spark reader (S2) deduplicates by (queue, seq) across crashes, so the seq must be
a per-queue unsigned 64-bit number, strictly increasing in publish order, fixed for a
message's life in the queue (redeliveries included) and still increasing after restarts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess
from pika.adapters.blocking_connection import BlockingChannel
from support.pikahelp import WAIT, take, wait_ready

SEQ = "x-ackmq-seq"
SEQ_ARGS = {SEQ: True}  # the queue argument that turns the header on
U64 = 2**64


@pytest.fixture(autouse=True)
def _ackmq_only(is_rabbitmq: bool) -> None:
    if is_rabbitmq:
        pytest.skip("x-ackmq-seq is an ackmq extension; RabbitMQ does not add it")


def seq_of(props: pika.BasicProperties) -> int:
    headers = props.headers or {}
    assert SEQ in headers, f"no {SEQ} header in {headers}"
    seq = headers[SEQ]
    assert isinstance(seq, int) and not isinstance(seq, bool)
    assert 0 <= seq < U64
    return seq


def get_all_seqs(ch: BlockingChannel, queue: str, n: int) -> list[tuple[bytes, int]]:
    out = []
    for _ in range(n):
        _m, p, b = take(ch, queue)
        out.append((b, seq_of(p)))
    return out


def test_seq_on_every_delivery_strictly_increasing(connection, channel: BlockingChannel,
                                                   qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments=SEQ_ARGS)
    for i in range(20):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 20)
    pulled = get_all_seqs(channel, qname, 10)  # pull
    pushed: list[tuple[bytes, int]] = []       # push
    channel.basic_consume(qname, lambda c, m, p, b: pushed.append((b, seq_of(p))),
                          auto_ack=True)
    deadline = time.monotonic() + WAIT
    while len(pushed) < 10 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    got = pulled + pushed
    assert [b for b, _s in got] == [str(i).encode() for i in range(20)]
    seqs = [s for _b, s in got]
    assert all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), seqs


def test_seq_unchanged_on_requeue_and_redelivery(connection, channel: BlockingChannel,
                                                 qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments=SEQ_ARGS)
    for i in range(3):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 3)
    first = {}
    for _ in range(3):
        m, p, b = take(channel, qname, auto_ack=False)
        first[b] = seq_of(p)
    channel.basic_nack(2, requeue=True)  # body "1"
    m, p, b = take(channel, qname, auto_ack=False)
    assert (b, m.redelivered, seq_of(p)) == (b"1", True, first[b"1"])
    channel.close()  # D8: everything unacked comes back
    ch2 = connection.channel()
    wait_ready(ch2, qname, 3)
    again = {b: s for b, s in get_all_seqs(ch2, qname, 3)}
    assert again == first


def test_seq_unchanged_by_recover(connection, channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments=SEQ_ARGS)
    channel.basic_publish("", qname, b"r")
    wait_ready(channel, qname, 1)
    _m, p, _b = take(channel, qname, auto_ack=False)
    before = seq_of(p)
    channel.basic_recover(requeue=True)
    wait_ready(channel, qname, 1)
    m, p, _b = take(channel, qname)
    assert m.redelivered and seq_of(p) == before


def test_seq_is_per_queue_for_fanout(channel: BlockingChannel, qname: str) -> None:
    q1, q2 = qname + ".1", qname + ".2"
    ex = qname + ".fan"
    channel.exchange_declare(ex, "fanout", auto_delete=True)
    for q in (q1, q2):
        channel.queue_declare(q, exclusive=True, arguments=SEQ_ARGS)
        channel.queue_bind(q, ex)
    for i in range(3):  # q1 gets a head start
        channel.basic_publish("", q1, f"own{i}".encode())
    for i in range(3):
        channel.basic_publish(ex, "", f"fan{i}".encode())
    wait_ready(channel, q1, 6)
    wait_ready(channel, q2, 3)
    s1 = get_all_seqs(channel, q1, 6)
    s2 = get_all_seqs(channel, q2, 3)
    fan1 = [s for b, s in s1 if b.startswith(b"fan")]
    fan2 = [s for _b, s in s2]
    assert fan1 == sorted(fan1) and fan2 == sorted(fan2)
    assert all(a < b for a, b in zip(fan2, fan2[1:], strict=False))
    # each queue numbers its own entries: the same message has different seqs
    assert fan1 != fan2
    assert max(s for b, s in s1 if b.startswith(b"own")) < min(fan1)


def test_client_cannot_forge_seq(channel: BlockingChannel, qname: str) -> None:
    channel.queue_declare(qname, exclusive=True, arguments=SEQ_ARGS)
    channel.basic_publish("", qname, b"a")
    channel.basic_publish("", qname, b"b", pika.BasicProperties(headers={SEQ: 1, "k": "v"}))
    channel.basic_publish("", qname, b"c", pika.BasicProperties(headers={SEQ: "junk"}))
    wait_ready(channel, qname, 3)
    msgs = []
    for _ in range(3):
        _m, p, b = take(channel, qname)
        msgs.append((b, seq_of(p), p.headers))
    seqs = [s for _b, s, _h in msgs]
    assert seqs[0] < seqs[1] < seqs[2]
    assert msgs[1][2]["k"] == "v"  # other headers untouched


def test_dead_lettered_message_gets_target_queue_seq(channel: BlockingChannel,
                                                     qname: str) -> None:
    dead = qname + ".dead"
    channel.queue_declare(dead, exclusive=True, arguments=SEQ_ARGS)
    channel.queue_declare(qname, exclusive=True, arguments={
        **SEQ_ARGS, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", dead, b"already-there")
    channel.basic_publish("", qname, b"dies")
    wait_ready(channel, qname, 1)
    m, p, _b = take(channel, qname, auto_ack=False)
    channel.basic_reject(m.delivery_tag, requeue=False)
    wait_ready(channel, dead, 2)
    (_b0, s0), (b1, s1) = get_all_seqs(channel, dead, 2)
    assert b1 == b"dies" and s0 < s1


# ------------------------------------------------------------------ restarts


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A private ackmq we may stop, kill and restart on the same data dir."""
    broker = BrokerProcess(tmp_path / "data")
    (tmp_path / "data").mkdir()
    broker.start()
    yield broker
    broker.stop()


def _restart(broker: BrokerProcess, how: str) -> None:
    if how == "kill":
        broker.kill()
    else:
        broker.stop()
    broker.start()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_seq_survives_restart_and_keeps_increasing(own_broker: BrokerProcess,
                                                   qname: str, how: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(own_broker.url))
    ch = conn.channel()
    ch.queue_declare(qname, durable=True, arguments=SEQ_ARGS)
    ch.confirm_delivery()  # acked persistent messages must survive even kill -9 (P9)
    for i in range(5):
        ch.basic_publish("", qname, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    wait_ready(ch, qname, 5)
    before = {}
    for _ in range(5):
        _m, p, b = take(ch, qname, auto_ack=False)
        before[b] = seq_of(p)
    ch.basic_ack(1)  # body "0" is gone for good; the rest stay unacked at the restart
    if how == "stop":
        conn.close()  # polite: the unacked ones are requeued before the shutdown
    _restart(own_broker, how)  # on kill the connection just dies with the broker

    conn = pika.BlockingConnection(pika.URLParameters(own_broker.url))
    try:
        ch = conn.channel()
        # an ack is not a durability promise: after kill -9 the acked "0" may come back
        # (at-least-once), but with its old seq; after a clean stop it must be gone
        expected = [b"1", b"2", b"3", b"4"]
        if how == "kill":
            time.sleep(0.2)
            n = ch.queue_declare(qname, passive=True).method.message_count
            if n == 5:
                expected.insert(0, b"0")
        wait_ready(ch, qname, len(expected))
        after = get_all_seqs(ch, qname, len(expected))
        assert [b for b, _s in after] == expected
        assert {b: s for b, s in after} == {b: before[b] for b in expected}
        ch.confirm_delivery()
        for i in range(5, 8):
            ch.basic_publish("", qname, str(i).encode(),
                             pika.BasicProperties(delivery_mode=2))
        wait_ready(ch, qname, 3)
        new = [s for _b, s in get_all_seqs(ch, qname, 3)]
        assert all(a < b for a, b in zip(new, new[1:], strict=False))
        assert min(new) > max(before.values())
    finally:
        conn.close()


@pytest.mark.slow
def test_seq_keeps_increasing_across_two_restarts_when_queue_was_empty(
        own_broker: BrokerProcess, qname: str) -> None:
    """Even with nothing stored, a restarted queue never hands out an old seq again."""
    seen: list[int] = []
    for _round in range(3):
        conn = pika.BlockingConnection(pika.URLParameters(own_broker.url))
        try:
            ch = conn.channel()
            ch.queue_declare(qname, durable=True, arguments=SEQ_ARGS)
            ch.confirm_delivery()
            ch.basic_publish("", qname, b"x", pika.BasicProperties(delivery_mode=2))
            _m, p, _b = take(ch, qname)
            seen.append(seq_of(p))
        finally:
            conn.close()
        _restart(own_broker, "stop")
    assert seen[0] < seen[1] < seen[2], seen


# ------------------------------------------------------------------ opt-in


def test_seq_only_when_asked(connection, channel: BlockingChannel, qname: str) -> None:
    """A queue without the argument adds nothing; a consumer asking with the basic.consume
    argument gets the header on its deliveries, another consumer of the queue does not."""
    channel.queue_declare(qname, exclusive=True)
    for i in range(4):
        channel.basic_publish("", qname, str(i).encode())
    wait_ready(channel, qname, 4)
    _m, p, _b = take(channel, qname)
    assert p.headers is None  # basic.get on a queue that did not ask
    asked: list[int] = []
    plain: list[object] = []
    ch2 = connection.channel()
    ch2.basic_qos(prefetch_count=1)
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(qname, lambda c, m, p, b: (asked.append(seq_of(p)),
                                                     c.basic_ack(m.delivery_tag)),
                          arguments={SEQ: True})
    ch2.basic_consume(qname, lambda c, m, p, b: (plain.append(p.headers),
                                                 c.basic_ack(m.delivery_tag)))
    deadline = time.monotonic() + WAIT
    while len(asked) + len(plain) < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert asked and plain and all(h is None for h in plain)
    assert asked == sorted(asked)


def test_delivery_count_only_when_asked(channel: BlockingChannel, qname: str) -> None:
    """x-delivery-count on redeliveries: not on a plain queue, yes on one with a delivery
    limit (as RabbitMQ's quorum queues) or the x-ackmq-delivery-count argument."""
    for args, want in (({}, None), ({"x-delivery-limit": 5}, 1),
                       ({"x-ackmq-delivery-count": True}, 1)):
        q = f"{qname}.{len(args)}{want}.{'-'.join(args)}"
        channel.queue_declare(q, exclusive=True, arguments=args)
        channel.basic_publish("", q, b"x")
        m, p, _b = take(channel, q, auto_ack=False)
        assert p.headers is None
        channel.basic_nack(m.delivery_tag, requeue=True)
        m, p, _b = take(channel, q)
        assert m.redelivered and (p.headers or {}).get("x-delivery-count") == want, args


def test_seq_argument_checked_at_declare(channel: BlockingChannel, qname: str) -> None:
    from support.pikahelp import closed_with
    closed_with(lambda: channel.queue_declare(qname, arguments={SEQ: "yes"}), 406,
                f"PRECONDITION_FAILED - invalid arg '{SEQ}' for queue '{qname}' in vhost '/': "
                "{unacceptable_type,longstr}")
