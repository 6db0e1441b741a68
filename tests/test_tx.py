"""Transactions (SPEC T1-T3), observed from a second channel.

Why: a transaction is all-or-nothing; a publish or ack that leaks out before commit,
or survives a rollback, breaks the only guarantee tx gives.
T4 (throughput cost) is measured by the benchmark suite, not here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pamqp import commands
from support.rawamqp import Message, RawConnection, safe_name

TX, OBS = 1, 2  # the transactional channel and an observer channel


@pytest.fixture
def qname(qname: str) -> str:
    return safe_name(qname)


@pytest.fixture
def raw(broker_url: str, qname: str) -> Iterator[RawConnection]:
    conn = RawConnection.open(broker_url)
    conn.open_channel(TX)
    conn.open_channel(OBS)
    conn.rpc(OBS, commands.Queue.Declare(queue=qname, auto_delete=False),
             commands.Queue.DeclareOk)
    yield conn
    if not conn.closed:
        try:
            conn.open_channel(9)
            conn.rpc(9, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)
        except Exception:  # noqa: BLE001 - cleanup only
            pass
    conn.abort()


def ready(conn: RawConnection, queue: str) -> int:
    """Ready (not unacked) messages in the queue, asked on the observer channel."""
    ok = conn.rpc(OBS, commands.Queue.Declare(queue=queue, passive=True),
                  commands.Queue.DeclareOk)
    return ok.message_count


def ready_eventually(conn: RawConnection, queue: str, want: int, timeout: float = 5.0) -> int:
    """Channels are independent: effects of one reach another's view shortly after."""
    deadline = time.monotonic() + timeout
    while True:
        n = ready(conn, queue)
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def tx_select(conn: RawConnection) -> None:
    conn.rpc(TX, commands.Tx.Select(), commands.Tx.SelectOk)


def commit(conn: RawConnection) -> None:
    conn.rpc(TX, commands.Tx.Commit(), commands.Tx.CommitOk, timeout=15)


def rollback(conn: RawConnection) -> None:
    conn.rpc(TX, commands.Tx.Rollback(), commands.Tx.RollbackOk)


def get(conn: RawConnection, channel: int, queue: str) -> Message:
    conn.send(channel, commands.Basic.Get(queue=queue, no_ack=False))
    return conn.expect(commands.Basic.GetOk, channel=channel)


def fill(conn: RawConnection, queue: str, n: int) -> None:
    for i in range(n):
        conn.publish(OBS, "", queue, str(i).encode())
    assert ready_eventually(conn, queue, n) == n


# ---- T1: publishes ----------------------------------------------------------------

def test_T1_publishes_invisible_until_commit(raw: RawConnection, qname: str) -> None:
    tx_select(raw)
    for i in range(3):
        raw.publish(TX, "", qname, str(i).encode())
    raw.rpc(TX, commands.Basic.Qos(0, 0), commands.Basic.QosOk)  # the publishes were read
    assert ready(raw, qname) == 0
    raw.send(OBS, commands.Basic.Get(queue=qname, no_ack=True))
    raw.expect(commands.Basic.GetEmpty, channel=OBS)
    commit(raw)
    assert ready(raw, qname) == 3
    bodies = []
    for _ in range(3):
        raw.send(OBS, commands.Basic.Get(queue=qname, no_ack=True))
        bodies.append(raw.expect(commands.Basic.GetOk, channel=OBS).body)
    assert bodies == [b"0", b"1", b"2"]


def test_T1_rollback_discards_publishes(raw: RawConnection, qname: str) -> None:
    tx_select(raw)
    raw.publish(TX, "", qname, b"no")
    rollback(raw)
    commit(raw)  # an empty commit after the rollback publishes nothing
    assert ready(raw, qname) == 0
    raw.publish(TX, "", qname, b"yes")
    commit(raw)
    raw.send(OBS, commands.Basic.Get(queue=qname, no_ack=True))
    assert raw.expect(commands.Basic.GetOk, channel=OBS).body == b"yes"
    raw.send(OBS, commands.Basic.Get(queue=qname, no_ack=True))
    raw.expect(commands.Basic.GetEmpty, channel=OBS)


def test_T1_channel_stays_transactional_after_commit(raw: RawConnection, qname: str) -> None:
    tx_select(raw)
    raw.publish(TX, "", qname, b"1")
    commit(raw)
    raw.publish(TX, "", qname, b"2")
    raw.rpc(TX, commands.Basic.Qos(0, 0), commands.Basic.QosOk)
    assert ready(raw, qname) == 1
    commit(raw)
    assert ready(raw, qname) == 2


def test_T1_uncommitted_publishes_lost_on_close(raw: RawConnection, qname: str) -> None:
    tx_select(raw)
    raw.publish(TX, "", qname, b"never")
    raw.rpc(TX, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    assert ready(raw, qname) == 0


def test_T1_tx_select_twice_ok(raw: RawConnection) -> None:
    tx_select(raw)
    tx_select(raw)


# ---- T1: acks -----------------------------------------------------------------------

def test_T1_acks_take_effect_on_commit(raw: RawConnection, qname: str) -> None:
    fill(raw, qname, 3)
    tx_select(raw)
    tags = [get(raw, TX, qname).delivery_tag for _ in range(3)]
    assert tags == [1, 2, 3]
    raw.send(TX, commands.Basic.Ack(delivery_tag=3, multiple=True))
    commit(raw)
    raw.rpc(TX, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    time.sleep(0.2)
    assert ready(raw, qname) == 0  # acked for good: nothing came back


def test_T1_uncommitted_acks_requeued_on_close(raw: RawConnection, qname: str) -> None:
    fill(raw, qname, 3)
    tx_select(raw)
    for _ in range(3):
        get(raw, TX, qname)
    raw.send(TX, commands.Basic.Ack(delivery_tag=3, multiple=True))
    raw.rpc(TX, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    assert ready_eventually(raw, qname, 3) == 3
    msg = get(raw, OBS, qname)
    assert msg.redelivered is True
    assert msg.body == b"0"


def test_T1_rolled_back_acks_leave_deliveries_unacked(raw: RawConnection, qname: str) -> None:
    """After rollback the deliveries are neither acked nor requeued: still unacked,
    ackable again, and requeued (redelivered) only when the channel closes."""
    fill(raw, qname, 3)
    tx_select(raw)
    for _ in range(3):
        get(raw, TX, qname)
    raw.send(TX, commands.Basic.Ack(delivery_tag=3, multiple=True))
    rollback(raw)
    time.sleep(0.2)
    assert ready(raw, qname) == 0  # not requeued by the rollback
    # still unacked on the channel: acking tag 1 again is valid (no 406)
    raw.send(TX, commands.Basic.Ack(delivery_tag=1))
    commit(raw)
    raw.rpc(TX, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    assert ready_eventually(raw, qname, 2) == 2  # 2 and 3 were never acked
    bodies = set()
    for _ in range(2):
        msg = get(raw, OBS, qname)
        assert msg.redelivered is True
        bodies.add(msg.body)
    assert bodies == {b"1", b"2"}


def test_T1_reject_requeue_in_tx_waits_for_commit(raw: RawConnection, qname: str) -> None:
    fill(raw, qname, 1)
    tx_select(raw)
    tag = get(raw, TX, qname).delivery_tag
    raw.send(TX, commands.Basic.Reject(delivery_tag=tag, requeue=True))
    raw.rpc(TX, commands.Basic.Qos(0, 0), commands.Basic.QosOk)
    assert ready(raw, qname) == 0
    commit(raw)
    assert ready_eventually(raw, qname, 1) == 1


def test_T1_nack_without_requeue_in_tx_drops_on_commit(raw: RawConnection, qname: str) -> None:
    fill(raw, qname, 2)
    tx_select(raw)
    get(raw, TX, qname)
    get(raw, TX, qname)
    raw.send(TX, commands.Basic.Nack(delivery_tag=2, multiple=True, requeue=False))
    commit(raw)
    raw.rpc(TX, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    time.sleep(0.2)
    assert ready(raw, qname) == 0


def test_T1_ack_of_unknown_tag_in_tx_is_406(raw: RawConnection) -> None:
    tx_select(raw)
    raw.send(TX, commands.Basic.Ack(delivery_tag=7))
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406


def test_T1_publish_and_ack_commit_together(raw: RawConnection, qname: str) -> None:
    """Consume-transform-produce: the ack of the input and the output publish land
    in the same commit."""
    out = qname + ".out"
    raw.rpc(OBS, commands.Queue.Declare(queue=out, auto_delete=True), commands.Queue.DeclareOk)
    fill(raw, qname, 1)
    tx_select(raw)
    msg = get(raw, TX, qname)
    raw.publish(TX, "", out, msg.body + b"!")
    raw.send(TX, commands.Basic.Ack(delivery_tag=msg.delivery_tag))
    raw.rpc(TX, commands.Basic.Qos(0, 0), commands.Basic.QosOk)
    assert ready(raw, out) == 0
    commit(raw)
    assert ready(raw, out) == 1
    raw.rpc(TX, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    time.sleep(0.2)
    assert ready(raw, qname) == 0


# ---- T2 --------------------------------------------------------------------------------

@pytest.mark.parametrize("method,mid", [(commands.Tx.Commit, 20), (commands.Tx.Rollback, 30)],
                         ids=["commit", "rollback"])
def test_T2_commit_or_rollback_on_non_tx_channel_is_406(raw: RawConnection, method,
                                                        mid: int) -> None:
    raw.send(TX, method())
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close) and raw.close_channel == TX
    assert close.reply_code == 406
    assert close.reply_text.startswith("PRECONDITION_FAILED")
    assert (close.class_id, close.method_id) == (90, mid)
    raw.rpc(OBS, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # others unaffected


# ---- T3 --------------------------------------------------------------------------------

def test_T3_commit_persistent_to_durable_queue(raw: RawConnection, qname: str) -> None:
    durable = qname + ".durable"
    raw.rpc(OBS, commands.Queue.Declare(queue=durable, durable=True), commands.Queue.DeclareOk)
    try:
        tx_select(raw)
        for i in range(20):
            raw.publish(TX, "", durable, str(i).encode(),
                        properties=commands.Basic.Properties(delivery_mode=2))
        commit(raw)
        assert ready(raw, durable) == 20
        raw.send(OBS, commands.Basic.Get(queue=durable, no_ack=True))
        msg = raw.expect(commands.Basic.GetOk, channel=OBS)
        assert msg.properties.delivery_mode == 2 and msg.body == b"0"
    finally:
        raw.rpc(OBS, commands.Queue.Delete(queue=durable), commands.Queue.DeleteOk)


def test_T1_pika_tx(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True)
    channel.tx_select()
    channel.basic_publish("", qname, b"a")
    assert channel.queue_declare(qname, passive=True).method.message_count == 0
    channel.tx_commit()
    assert channel.queue_declare(qname, passive=True).method.message_count == 1
