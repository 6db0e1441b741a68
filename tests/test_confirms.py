"""Publisher confirms (SPEC P1-P7, P10), checked on the wire.

Why: a publisher's only proof that the broker took responsibility is the exact
basic.ack/basic.nack frame for its sequence number; off-by-one numbering, a missing
or doubled confirm, or a return after its ack silently breaks every client.
P8/P9 (fsync, crash survival) live in the durability tests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from pamqp import commands
from support.rawamqp import Message, RawConnection, ack_frame, nack_frame, safe_name

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


class Confirms:
    """Expands ack/nack frames (with `multiple`) into per-sequence outcomes.

    Every seq must be settled exactly once: settling one twice, or a frame that
    settles nothing new, fails the test.
    """

    def __init__(self) -> None:
        self.outcome: dict[int, str] = {}
        self.frames: list[commands.Basic.Ack | commands.Basic.Nack] = []
        self.published = 0

    def feed(self, frame: commands.Basic.Ack | commands.Basic.Nack) -> None:
        kind = "ack" if isinstance(frame, commands.Basic.Ack) else "nack"
        tag = frame.delivery_tag
        assert 1 <= tag <= self.published, f"{kind} for seq {tag}, only {self.published} sent"
        self.frames.append(frame)
        if frame.multiple:
            seqs = [s for s in range(1, tag + 1) if s not in self.outcome]
        else:
            assert tag not in self.outcome, f"seq {tag} settled twice ({self.outcome[tag]}, {kind})"
            seqs = [tag]
        assert seqs or frame.multiple, f"{kind} {tag} settles nothing new"
        for s in seqs:
            self.outcome[s] = kind

    @property
    def done(self) -> bool:
        return len(self.outcome) == self.published

    def assert_complete(self) -> None:
        assert sorted(self.outcome) == list(range(1, self.published + 1))


def collect(conn: RawConnection, confirms: Confirms, channel: int = 1,
            timeout: float = 20.0, others: list | None = None) -> None:
    """Read until every publish is settled; other frames go to `others` (or fail)."""
    deadline = time.monotonic() + timeout
    while not confirms.done:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"unconfirmed: {set(range(1, confirms.published + 1)) - set(confirms.outcome)}"
        ch, frame = conn.recv(remaining)
        if isinstance(frame, commands.Basic.Ack | commands.Basic.Nack) and ch == channel:
            confirms.feed(frame)
        elif others is not None:
            others.append((ch, frame))
        else:
            raise AssertionError(f"unexpected frame on channel {ch}: {frame!r}")


@pytest.fixture
def qname(qname: str) -> str:
    return safe_name(qname)


@pytest.fixture
def raw(broker_url: str) -> Iterator[RawConnection]:
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    yield conn
    conn.abort()


@pytest.fixture
def confirm_raw(raw: RawConnection) -> RawConnection:
    raw.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    return raw


def declare(conn: RawConnection, name: str, channel: int = 1, **kw) -> None:
    kw.setdefault("auto_delete", True)
    conn.rpc(channel, commands.Queue.Declare(queue=name, **kw), commands.Queue.DeclareOk)


def message_count(conn: RawConnection, name: str, channel: int = 1) -> int:
    ok = conn.rpc(channel, commands.Queue.Declare(queue=name, passive=True),
                  commands.Queue.DeclareOk)
    return ok.message_count


# ---- P1 -------------------------------------------------------------------------------

def test_P1_confirm_select_ok(raw: RawConnection) -> None:
    raw.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # channel still fine


def test_P1_confirm_select_nowait_has_no_reply(raw: RawConnection, qname: str) -> None:
    """nowait: no select-ok; the next thing we hear is the qos-ok we ask for after it."""
    raw.send(1, commands.Confirm.Select(nowait=True))
    raw.rpc(1, commands.Basic.Qos(0, 5), commands.Basic.QosOk)
    declare(raw, qname)
    raw.publish(1, "", qname, b"m")
    ack = raw.expect(commands.Basic.Ack, channel=1)
    assert ack.delivery_tag == 1  # and the channel really is in confirm mode


def test_P1_select_twice_is_harmless(confirm_raw: RawConnection, qname: str) -> None:
    """A second select neither fails nor restarts the numbering."""
    raw = confirm_raw
    declare(raw, qname)
    confirms = Confirms()
    for _ in range(2):
        raw.publish(1, "", qname, b"m")
        confirms.published += 1
    collect(raw, confirms)
    raw.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    raw.publish(1, "", qname, b"m")
    confirms.published += 1
    collect(raw, confirms)
    confirms.assert_complete()
    assert confirms.frames[-1].delivery_tag == 3


def test_P1_pika_confirm_delivery(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True)
    channel.confirm_delivery()
    for i in range(10):
        channel.basic_publish("", qname, str(i).encode())  # raises on nack
    assert channel.queue_declare(qname, passive=True).method.message_count == 10


def test_P1_no_confirms_without_select(raw: RawConnection, qname: str) -> None:
    declare(raw, qname)
    raw.publish(1, "", qname, b"m")
    raw.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # nothing before it
    assert raw.drain(0.3) == []


# ---- P2 -------------------------------------------------------------------------------

def test_P2_tx_then_confirm_is_406(raw: RawConnection) -> None:
    raw.rpc(1, commands.Tx.Select(), commands.Tx.SelectOk)
    raw.send(1, commands.Confirm.Select())
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close) and raw.close_channel == 1
    assert close.reply_code == 406
    assert close.reply_text.startswith("PRECONDITION_FAILED")
    assert (close.class_id, close.method_id) == (85, 10)


def test_P2_confirm_then_tx_is_406(confirm_raw: RawConnection) -> None:
    raw = confirm_raw
    raw.send(1, commands.Tx.Select())
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close) and raw.close_channel == 1
    assert close.reply_code == 406
    assert close.reply_text.startswith("PRECONDITION_FAILED")
    assert (close.class_id, close.method_id) == (90, 10)


def test_P2_other_channels_unaffected(confirm_raw: RawConnection, qname: str) -> None:
    raw = confirm_raw
    raw.open_channel(2)
    raw.send(1, commands.Tx.Select())
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close) and close.reply_code == 406
    declare(raw, qname, channel=2)
    assert message_count(raw, qname, channel=2) == 0


# ---- P3 / P4 --------------------------------------------------------------------------

def test_P3_sequence_numbers_start_at_one(confirm_raw: RawConnection, qname: str) -> None:
    raw = confirm_raw
    declare(raw, qname)
    raw.publish(1, "", qname, b"first")
    ack = raw.expect(commands.Basic.Ack, channel=1)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_P3_unroutable_publishes_are_counted(confirm_raw: RawConnection, qname: str) -> None:
    """Routable and unroutable publishes share one numbering: 1..N, all acked."""
    raw = confirm_raw
    declare(raw, qname)
    confirms = Confirms()
    routable = set()
    for i in range(1, 61):
        if i % 3 == 0:
            raw.publish(1, "", f"nowhere.{uuid.uuid4().hex}", b"lost")
        else:
            raw.publish(1, "", qname, b"kept")
            routable.add(i)
        confirms.published += 1
    collect(raw, confirms)
    confirms.assert_complete()
    assert set(confirms.outcome.values()) == {"ack"}
    assert message_count(raw, qname) == len(routable)


def test_P3_unroutable_to_named_exchange_counted(confirm_raw: RawConnection) -> None:
    raw = confirm_raw
    confirms = Confirms()
    for _ in range(5):
        raw.publish(1, "amq.direct", f"nobody.{uuid.uuid4().hex}", b"x")
        confirms.published += 1
    collect(raw, confirms)
    confirms.assert_complete()
    assert set(confirms.outcome.values()) == {"ack"}


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_P4_every_publish_settled_exactly_once(confirm_raw: RawConnection, qname: str,
                                               persistent: bool) -> None:
    raw = confirm_raw
    declare(raw, qname, durable=persistent, auto_delete=not persistent)
    confirms = Confirms()
    props = PERSISTENT if persistent else None
    n = 1000
    for i in range(n):
        raw.publish(1, "", qname, str(i).encode(), properties=props)
        confirms.published += 1
    collect(raw, confirms, timeout=60)
    confirms.assert_complete()
    assert set(confirms.outcome.values()) == {"ack"}
    assert message_count(raw, qname) == n
    raw.rpc(1, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)


def test_P3_numbering_restarts_on_a_new_channel(confirm_raw: RawConnection,
                                                qname: str) -> None:
    raw = confirm_raw
    declare(raw, qname)
    for _ in range(3):
        raw.publish(1, "", qname, b"m")
    confirms = Confirms()
    confirms.published = 3
    collect(raw, confirms)
    raw.rpc(1, commands.Channel.Close(200, "", 0, 0), commands.Channel.CloseOk)
    raw.open_channel(1)
    raw.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    raw.publish(1, "", qname, b"m")
    ack = raw.expect(commands.Basic.Ack, channel=1)
    assert ack.delivery_tag == 1


def test_P4_acks_coalesced_under_load(confirm_raw: RawConnection, qname: str) -> None:
    """SHOULD: a burst of persistent publishes is confirmed with fewer frames."""
    raw = confirm_raw
    declare(raw, qname, durable=True, auto_delete=False)
    confirms = Confirms()
    n = 2000
    for _ in range(n):
        raw.publish(1, "", qname, b"x" * 100, properties=PERSISTENT)
        confirms.published += 1
    collect(raw, confirms, timeout=60)
    confirms.assert_complete()
    assert any(f.multiple for f in confirms.frames)
    assert len(confirms.frames) < n
    raw.rpc(1, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)


def test_P4_multiple_ack_covers_only_outstanding(confirm_raw: RawConnection,
                                                 qname: str) -> None:
    """Interleaved waits: a multiple ack never reaches past what was published."""
    raw = confirm_raw
    declare(raw, qname)
    confirms = Confirms()
    for round_ in range(20):
        for _ in range(round_ % 5 + 1):
            raw.publish(1, "", qname, b"m")
            confirms.published += 1
        collect(raw, confirms)  # feed() rejects tags above `published`
    confirms.assert_complete()


def test_P4_confirm_channels_are_numbered_independently(raw: RawConnection,
                                                        qname: str) -> None:
    declare(raw, qname)
    raw.open_channel(2)
    for ch in (1, 2):
        raw.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
    c1, c2 = Confirms(), Confirms()
    for i in range(30):
        raw.publish(1, "", qname, b"a")
        c1.published += 1
        if i % 2:
            raw.publish(2, "", qname, b"b")
            c2.published += 1
    deadline = time.monotonic() + 20
    while not (c1.done and c2.done):
        ch, frame = raw.recv(max(0.01, deadline - time.monotonic()))
        assert isinstance(frame, commands.Basic.Ack)
        (c1 if ch == 1 else c2).feed(frame)
    c1.assert_complete()
    c2.assert_complete()


# ---- P5 -------------------------------------------------------------------------------

def test_P5_mandatory_unroutable_return_before_ack(confirm_raw: RawConnection) -> None:
    raw = confirm_raw
    rk = f"nowhere.{uuid.uuid4().hex}"
    raw.publish(1, "", rk, b"bounce", mandatory=True,
                properties=commands.Basic.Properties(message_id="m-1"))
    ch, first = raw.recv(5)
    assert isinstance(first, Message) and isinstance(first.method, commands.Basic.Return), first
    assert ch == 1
    assert first.reply_code == 312
    assert first.reply_text == "NO_ROUTE"
    assert (first.exchange, first.routing_key) == ("", rk)
    assert first.body == b"bounce"
    assert first.properties.message_id == "m-1"
    ack = raw.expect(commands.Basic.Ack, channel=1)
    assert ack.delivery_tag == 1


def test_P5_each_return_precedes_its_ack(confirm_raw: RawConnection, qname: str) -> None:
    """Mixed mandatory publishes: when an ack covers seq s and s was returned, the
    return was on the wire first."""
    raw = confirm_raw
    declare(raw, qname)
    confirms = Confirms()
    unroutable: set[int] = set()
    for i in range(1, 41):
        if i % 4 == 1:
            raw.publish(1, "", f"nowhere.{i}.{uuid.uuid4().hex}", str(i).encode(),
                        mandatory=True)
            unroutable.add(i)
        else:
            raw.publish(1, "", qname, str(i).encode(), mandatory=True)
        confirms.published += 1
    returned: set[int] = set()
    deadline = time.monotonic() + 20
    while not confirms.done:
        ch, frame = raw.recv(max(0.01, deadline - time.monotonic()))
        if isinstance(frame, Message):
            assert frame.method.reply_code == 312
            seq = int(frame.body)
            assert seq not in confirms.outcome, f"return for {seq} after its ack"
            returned.add(seq)
            continue
        before = set(confirms.outcome)
        confirms.feed(frame)
        for seq in set(confirms.outcome) - before:
            if seq in unroutable:
                assert seq in returned, f"ack for {seq} before its basic.return"
    assert returned == unroutable
    assert set(confirms.outcome.values()) == {"ack"}


def test_P5_non_mandatory_unroutable_is_acked_silently(confirm_raw: RawConnection) -> None:
    raw = confirm_raw
    raw.publish(1, "", f"nowhere.{uuid.uuid4().hex}", b"gone")
    ack = raw.expect(commands.Basic.Ack, channel=1)
    assert ack.delivery_tag == 1
    assert raw.drain(0.3) == []


def test_P5_mandatory_routable_has_no_return(confirm_raw: RawConnection, qname: str) -> None:
    raw = confirm_raw
    declare(raw, qname)
    raw.publish(1, "", qname, b"here", mandatory=True)
    ack = raw.expect(commands.Basic.Ack, channel=1)
    assert ack.delivery_tag == 1
    assert raw.drain(0.3) == []


def test_P5_pika_unroutable_raises(channel) -> None:
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", f"nowhere.{uuid.uuid4().hex}", b"x", mandatory=True)
    assert channel.is_open


def test_P5_confirm_after_delivery_and_ack(confirm_raw: RawConnection, qname: str) -> None:
    """(d) a persistent message consumed and acked at once is still confirmed, once."""
    raw = confirm_raw
    declare(raw, qname, durable=True, auto_delete=False)
    raw.open_channel(2)
    raw.rpc(2, commands.Basic.Consume(queue=qname, consumer_tag="c"),
            commands.Basic.ConsumeOk)
    confirms = Confirms()
    for i in range(50):
        raw.publish(1, "", qname, str(i).encode(), properties=PERSISTENT)
        confirms.published += 1
    got = 0
    deadline = time.monotonic() + 20
    while not confirms.done or got < 50:
        ch, frame = raw.recv(max(0.01, deadline - time.monotonic()))
        if isinstance(frame, Message):
            got += 1
            raw.send(2, commands.Basic.Ack(frame.delivery_tag))
        else:
            confirms.feed(frame)
    confirms.assert_complete()
    assert set(confirms.outcome.values()) == {"ack"}
    raw.rpc(2, commands.Basic.Cancel(consumer_tag="c"), commands.Basic.CancelOk)
    assert message_count(raw, qname) == 0
    raw.rpc(1, commands.Queue.Delete(queue=qname), commands.Queue.DeleteOk)


# ---- P6 -------------------------------------------------------------------------------

def test_P6_reject_publish_overflow_nacks(confirm_raw: RawConnection, qname: str) -> None:
    raw = confirm_raw
    declare(raw, qname, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    confirms = Confirms()
    for i in range(5):
        raw.publish(1, "", qname, str(i).encode())
        confirms.published += 1
    collect(raw, confirms)
    confirms.assert_complete()
    assert confirms.outcome == {1: "ack", 2: "ack", 3: "nack", 4: "nack", 5: "nack"}
    assert message_count(raw, qname) == 2


def test_P6_room_again_after_consuming(confirm_raw: RawConnection, qname: str) -> None:
    raw = confirm_raw
    declare(raw, qname, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    confirms = Confirms()
    for _ in range(2):
        raw.publish(1, "", qname, b"m")
        confirms.published += 1
    collect(raw, confirms)
    raw.send(1, commands.Basic.Get(queue=qname, no_ack=True))
    raw.expect(commands.Basic.GetOk, channel=1)
    raw.publish(1, "", qname, b"m")
    confirms.published += 1
    collect(raw, confirms)
    assert confirms.outcome == {1: "ack", 2: "nack", 3: "ack"}


def test_P6_one_full_queue_of_two_nacks(confirm_raw: RawConnection, qname: str) -> None:
    """Fanout to a full reject-publish queue and a free one: the publish is nacked
    (the free queue still gets its copy, as RabbitMQ does)."""
    raw = confirm_raw
    full, free = qname + ".full", qname + ".free"
    declare(raw, full, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    declare(raw, free)
    ex = qname + ".fan"
    raw.rpc(1, commands.Exchange.Declare(exchange=ex, exchange_type="fanout", auto_delete=True),
            commands.Exchange.DeclareOk)
    for q in (full, free):
        raw.rpc(1, commands.Queue.Bind(queue=q, exchange=ex), commands.Queue.BindOk)
    confirms = Confirms()
    for _ in range(3):
        raw.publish(1, ex, "", b"m")
        confirms.published += 1
    collect(raw, confirms)
    assert confirms.outcome == {1: "ack", 2: "nack", 3: "nack"}
    assert message_count(raw, full) == 1
    assert message_count(raw, free) == 3


def test_P6_mandatory_rejected_publish_is_nacked_not_returned(confirm_raw: RawConnection,
                                                            qname: str) -> None:
    """Routed but refused by a full queue: a nack, no basic.return (it was routable)."""
    raw = confirm_raw
    declare(raw, qname, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    confirms = Confirms()
    for _ in range(2):
        raw.publish(1, "", qname, b"m", mandatory=True)
        confirms.published += 1
    others: list = []
    collect(raw, confirms, others=others)
    assert confirms.outcome == {1: "ack", 2: "nack"}
    assert others == [] and raw.drain(0.3) == []


def test_P6_pika_nack_raises(channel, qname: str) -> None:
    channel.queue_declare(qname, auto_delete=True,
                          arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", qname, b"1")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", qname, b"2")


# ---- P7 -------------------------------------------------------------------------------

def test_P7_tracking_by_set_across_queues(confirm_raw: RawConnection, qname: str) -> None:
    """Publishes spread over durable/transient queues and unroutable keys: the client
    tracks outstanding seqs as a set; whatever the order, each is settled once."""
    raw = confirm_raw
    queues = [qname + f".{i}" for i in range(4)]
    for i, q in enumerate(queues):
        declare(raw, q, durable=i % 2 == 0, auto_delete=i % 2 == 1)
    confirms = Confirms()
    outstanding = set()
    for i in range(400):
        target = queues[i % 4] if i % 7 else f"nowhere.{i}"
        props = PERSISTENT if i % 2 == 0 else None
        raw.publish(1, "", target, str(i).encode(), properties=props)
        confirms.published += 1
        outstanding.add(confirms.published)
    deadline = time.monotonic() + 60
    while outstanding:
        _, frame = raw.recv(max(0.01, deadline - time.monotonic()))
        before = set(confirms.outcome)
        confirms.feed(frame)
        newly = set(confirms.outcome) - before
        assert newly <= outstanding
        outstanding -= newly
    confirms.assert_complete()
    for q in queues:
        raw.rpc(1, commands.Queue.Delete(queue=q), commands.Queue.DeleteOk)


# ---- P10 ------------------------------------------------------------------------------

@pytest.mark.parametrize("tag", [2**32 + 5, 2**63 + 7, 2**64 - 1])
def test_P10_delivery_tags_are_64_bit(raw: RawConnection, tag: int) -> None:
    """An ack for a tag beyond 32 bits is parsed whole: the error names all 64 bits."""
    raw.open_channel(2)
    raw.send_raw(ack_frame(1, tag))
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close) and raw.close_channel == 1
    assert close.reply_code == 406
    assert close.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {tag}"
    raw.rpc(2, commands.Basic.Qos(0, 1), commands.Basic.QosOk)


def test_P10_nack_tag_is_64_bit(raw: RawConnection) -> None:
    tag = 2**63 + 1
    raw.send_raw(nack_frame(1, tag, requeue=False))
    close = raw.wait_close()
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406
    assert close.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {tag}"
