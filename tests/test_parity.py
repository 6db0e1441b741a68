"""What clients see, compared with RabbitMQ 3.10: every test here runs against ackmq and
against RabbitMQ (`ACKMQ_RABBITMQ_URL`, default amqp://guest:guest@127.0.0.1:5672/; CI
starts Debian's) and asserts the same answer on both, so each assertion is RabbitMQ's
observed behaviour, not our reading of it.

Why: the test suites of pika, aio-pika, aiormq, py-amqp and kombu failed on ackmq where
it added headers nobody published, refused an unbind RabbitMQ accepts, left
connection.update-secret unanswered and refused high channel numbers.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
import time
import uuid
from collections.abc import Iterator

import aio_pika
import pika
import pytest
from conftest import rabbitmq_url
from pamqp import commands as C
from support.rawamqp import Message, RawConnection


@pytest.fixture(params=["ackmq", "rabbitmq"])
def url(request: pytest.FixtureRequest, broker_url: str) -> str:
    """The broker under test: ackmq, then the reference RabbitMQ."""
    if request.param == "ackmq":
        return broker_url
    return rabbitmq_url()


@pytest.fixture
def raw(url: str) -> Iterator[RawConnection]:
    conn = RawConnection.open(url)
    conn.open_channel(1)
    yield conn
    conn.abort()


def uniq(prefix: str = "p") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------- field tables by hand

def short(s: bytes) -> bytes:
    return bytes([len(s)]) + s


def long_(s: bytes) -> bytes:
    return struct.pack(">I", len(s)) + s


def table(*entries: tuple[bytes, bytes]) -> bytes:
    return long_(b"".join(short(k) + v for k, v in entries))


def S(s: str) -> bytes:
    return b"S" + long_(s.encode())


def array(*values: bytes) -> bytes:
    return b"A" + long_(b"".join(values))


# every field type of AMQP 0-9-1 as RabbitMQ reads it, each with its own tag
EVERY_TYPE = (
    (b"bool", b"t\x01"), (b"int8", b"b\xfb"), (b"uint8", b"B\xfe"),
    (b"int16", b"s\xff\x9c"), (b"uint16", b"u\xff\xf0"), (b"int32", b"I\xff\xff\xff\x85"),
    (b"uint32", b"i\xff\xff\xff\xf0"), (b"int64", b"l" + struct.pack(">q", -(2**40))),
    (b"float", b"f" + struct.pack(">f", 1.5)), (b"double", b"d" + struct.pack(">d", -2.25)),
    (b"decimal", b"D\x02" + struct.pack(">i", 31415)), (b"longstr", S("h\u00e9llo")),
    (b"bytes", b"x" + long_(b"\x00\xff\x01")), (b"void", b"V"),
    (b"timestamp", b"T" + struct.pack(">Q", 1_700_000_000)),
    (b"array", array(b"b\x01", S("two"), b"V")),
    (b"table", b"F" + table((b"k", S("v")), (b"n", b"I\x00\x00\x00\x07"))),
)


def properties(headers: bytes | None, expiration: bytes | None = None) -> bytes:
    """Every basic property set (headers optional), in wire order."""
    flags = 0
    out = b""
    fields = [
        (0x8000, short(b"application/json")), (0x4000, short(b"gzip")),
        (0x2000, headers), (0x1000, b"\x02"), (0x0800, b"\x05"),
        (0x0400, short(b"corr-1")), (0x0200, short(b"reply.q")),
        (0x0100, None if expiration is None else short(expiration)),
        (0x0080, short(b"msg-1")), (0x0040, struct.pack(">Q", 1_700_000_123)),
        (0x0020, short(b"order.created")), (0x0010, short(b"guest")),
        (0x0008, short(b"app-1")),
    ]
    for flag, value in fields:
        if value is not None:
            flags |= flag
            out += value
    return struct.pack(">H", flags) + out


WITH_HEADERS = properties(table(*EVERY_TYPE))
NO_HEADERS = properties(None)
EMPTY_HEADERS = properties(table())
MINIMAL = b"\x00\x00"
CASES = {"every-type": WITH_HEADERS, "no-headers": NO_HEADERS,
         "empty-headers": EMPTY_HEADERS, "no-properties": MINIMAL}


def get(conn: RawConnection, queue: str, no_ack: bool = False) -> Message:
    """basic.get that waits for a message (dead-lettering and requeue are asynchronous)."""
    deadline = time.monotonic() + 5
    while True:
        conn.send(1, C.Basic.Get(queue=queue, no_ack=no_ack))
        _ch, reply = conn.recv()
        if isinstance(reply, Message):
            return reply
        assert isinstance(reply, C.Basic.GetEmpty), reply
        assert time.monotonic() < deadline, f"nothing on {queue}"
        time.sleep(0.02)


def declare(conn: RawConnection, queue: str, **arguments: object) -> None:
    conn.rpc(1, C.Queue.Declare(queue=queue, exclusive=True, arguments=arguments or None),
             C.Queue.DeclareOk)


# ------------------------------------------------- properties come out as they went in


@pytest.mark.parametrize("case", CASES)
def test_properties_byte_exact_through_get_deliver_return_and_requeue(
        raw: RawConnection, case: str) -> None:
    props = CASES[case]
    q = uniq()
    declare(raw, q)
    raw.publish(1, "", q, b"body", raw_properties=props)
    got = get(raw, q)                                  # basic.get-ok
    assert (got.raw_properties, got.body) == (props, b"body")
    raw.send(1, C.Basic.Nack(delivery_tag=got.delivery_tag, requeue=True))
    again = get(raw, q)                                # requeued, redelivered
    assert again.redelivered and again.raw_properties == props
    raw.send(1, C.Basic.Ack(delivery_tag=again.delivery_tag))

    raw.publish(1, "", q, b"pushed", raw_properties=props)
    raw.rpc(1, C.Basic.Consume(queue=q, consumer_tag="c1"), C.Basic.ConsumeOk)
    pushed = raw.expect(C.Basic.Deliver)               # basic.deliver
    assert (pushed.raw_properties, pushed.body) == (props, b"pushed")
    raw.rpc(1, C.Basic.Cancel(consumer_tag="c1"), C.Basic.CancelOk)
    raw.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))  # D8: requeued
    raw.expect(C.Channel.CloseOk, skip_others=True)
    raw.open_channel(1)
    back = get(raw, q, no_ack=True)
    assert back.redelivered and back.raw_properties == props

    raw.publish(1, "", uniq("nowhere"), b"ret", raw_properties=props, mandatory=True)
    ret = raw.expect(C.Basic.Return)                   # basic.return
    assert (ret.reply_code, ret.raw_properties, ret.body) == (312, props, b"ret")


def test_properties_byte_exact_through_pika_and_aio_pika(url: str) -> None:
    """What the client libraries decode: no header table appears on a message published
    without one, and a headers dict comes back equal (kombu and aio-pika compare them)."""
    q = uniq()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, exclusive=True)
        ch.basic_publish("", q, b"a", pika.BasicProperties(content_type="text/plain"))
        ch.basic_publish("", q, b"b", pika.BasicProperties(headers={"k1": "v1", "n": 1}))
        got = []
        for _ in range(2):
            deadline = time.monotonic() + 5
            while (m := ch.basic_get(q, auto_ack=True))[0] is None:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            got.append(m[1].headers)
        assert got == [None, {"k1": "v1", "n": 1}]
    finally:
        conn.close()

    async def aio() -> dict:
        c = await aio_pika.connect(url)
        async with c:
            ch = await c.channel()
            queue = await ch.declare_queue(q, exclusive=True)
            await ch.default_exchange.publish(
                aio_pika.Message(b"x", headers={"a": "b"}, message_id="m1"), routing_key=q)
            msg = await queue.get(timeout=5, fail=True)
            await msg.ack()
            return msg.info()
    info = asyncio.run(aio())
    assert info["headers"] == {"a": "b"} and info["message_id"] == "m1"


def test_bcc_removed_other_headers_keep_order_and_types(raw: RawConnection) -> None:
    q = uniq()
    other = uniq()
    declare(raw, q)
    declare(raw, other)
    headers = table(EVERY_TYPE[4], (b"CC", array(S(other))), EVERY_TYPE[1],
                    (b"BCC", array(S(other))), EVERY_TYPE[6])
    raw.publish(1, "", q, b"b", raw_properties=properties(headers))
    got = get(raw, q, no_ack=True)
    assert got.raw_properties == properties(table(EVERY_TYPE[4], (b"CC", array(S(other))),
                                                  EVERY_TYPE[1], EVERY_TYPE[6]))
    cc = get(raw, other, no_ack=True)
    assert cc.raw_properties == got.raw_properties


# ------------------------------------------------------------------ dead-lettering


def death(count: int, reason: str, queue: str, exchange: str, keys: list[str],
          expiration: str | None = None, sort: bool = False) -> bytes:
    """One x-death table as RabbitMQ writes it: the first death in event order, one
    written by a later death sorted by key (rabbit_misc:sort_field_table). Times are
    zeroed by `_zero_times` before comparing."""
    entries = [(b"count", b"l" + struct.pack(">q", count)), (b"reason", S(reason)),
               (b"queue", S(queue)), (b"time", b"T" + bytes(8)),
               (b"exchange", S(exchange)),
               (b"routing-keys", array(*(S(k) for k in keys)))]
    if expiration is not None:
        entries.append((b"original-expiration", S(expiration)))
    if sort:
        entries.sort()
    return b"F" + table(*entries)


def _zero_times(raw: bytes) -> bytes:
    """x-death `time` values are the broker's clock: zero them (each is b"\\x04timeT" +
    8 bytes) after checking they are recent."""
    out = bytearray(raw)
    marker = b"\x04timeT"
    pos = out.find(marker)
    while pos >= 0:
        at = pos + len(marker)
        (secs,) = struct.unpack_from(">Q", out, at)
        assert abs(secs - time.time()) < 600, secs
        out[at:at + 8] = bytes(8)
        pos = out.find(marker, at)
    return bytes(out)


def test_D6_dead_letter_properties_as_rabbitmq(raw: RawConnection) -> None:
    """The first death: expiration moved into x-death, x-first-death-*, the whole headers
    table sorted by key with every publisher entry's encoding kept; CC dropped because
    the queue names its own dead-letter routing key."""
    q, dead = uniq("q"), uniq("dead")
    declare(raw, dead)
    declare(raw, q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    headers = table(*EVERY_TYPE[::-1], (b"CC", array(S("cc-key"))))
    raw.publish(1, "", q, b"dies", raw_properties=properties(headers, expiration=b"60000"))
    got = get(raw, q)
    raw.send(1, C.Basic.Reject(delivery_tag=got.delivery_tag, requeue=False))
    dl = get(raw, dead, no_ack=True)
    expect = properties(table(*sorted([
        *EVERY_TYPE,
        (b"x-death", array(death(1, "rejected", q, "", [q, "cc-key"], "60000"))),
        (b"x-first-death-exchange", S("")), (b"x-first-death-queue", S(q)),
        (b"x-first-death-reason", S("rejected"))])))
    assert _zero_times(dl.raw_properties) == expect
    assert dl.body == b"dies" and dl.routing_key == dead


def test_D6_dead_letter_cycle_bumps_matching_death_sorted(raw: RawConnection) -> None:
    """Rejected from a to b, from b back to a, from a again: a new entry is prepended for
    b, then a's entry is bumped to count 2 and moved first; later entries sorted."""
    a, b = uniq("a"), uniq("b")
    declare(raw, a, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
    declare(raw, b, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a})
    raw.publish(1, "", a, b"loop", raw_properties=properties(table(EVERY_TYPE[2])))
    for queue in (a, b, a):
        got = get(raw, queue)
        raw.send(1, C.Basic.Reject(delivery_tag=got.delivery_tag, requeue=False))
    last = get(raw, b, no_ack=True)
    first_a = death(1, "rejected", a, "", [a])
    expect = properties(table(*sorted([
        EVERY_TYPE[2],
        (b"x-death", array(
            b"F" + table(*sorted([(b"count", b"l" + struct.pack(">q", 2)),
                                  *_entries(first_a)[1:]])),
            death(1, "rejected", b, "", [b], sort=True))),
        (b"x-first-death-exchange", S("")), (b"x-first-death-queue", S(a)),
        (b"x-first-death-reason", S("rejected"))])))
    assert _zero_times(last.raw_properties) == expect


def _entries(encoded_table: bytes) -> list[tuple[bytes, bytes]]:
    """Split b"F" + table into (key, encoded value) pairs (values here are fixed-size or
    length-prefixed kinds only)."""
    body = encoded_table[5:]
    out, pos = [], 0
    while pos < len(body):
        key = body[pos + 1:pos + 1 + body[pos]]
        pos += 1 + body[pos]
        tag = body[pos:pos + 1]
        size = {b"l": 8, b"T": 8}.get(tag)
        if size is None:
            size = 4 + struct.unpack_from(">I", body, pos + 1)[0]
        out.append((key, body[pos:pos + 1 + size]))
        pos += 1 + size
    return out


# ------------------------------------------------------------- unbind and delete


UNBIND_CASES = {
    # name: (method factory given (queue, exchange, missing), expected reply or (code, text))
    "queue.unbind, queue gone": (
        lambda q, x, n: C.Queue.Unbind(queue=n, exchange=x, routing_key="k"), C.Queue.UnbindOk),
    "queue.unbind, exchange gone": (
        lambda q, x, n: C.Queue.Unbind(queue=q, exchange=n, routing_key="k"), C.Queue.UnbindOk),
    "queue.unbind, both gone": (
        lambda q, x, n: C.Queue.Unbind(queue=n, exchange=n + "x", routing_key="k"),
        C.Queue.UnbindOk),
    "queue.unbind, no such binding": (
        lambda q, x, n: C.Queue.Unbind(queue=q, exchange=x, routing_key="other"),
        C.Queue.UnbindOk),
    "queue.unbind, default exchange": (
        lambda q, x, n: C.Queue.Unbind(queue=q, exchange="", routing_key=q),
        (403, "ACCESS_REFUSED - operation not permitted on the default exchange")),
    "exchange.unbind, source gone": (
        lambda q, x, n: C.Exchange.Unbind(destination=x, source=n, routing_key="k"),
        C.Exchange.UnbindOk),
    "exchange.unbind, destination gone": (
        lambda q, x, n: C.Exchange.Unbind(destination=n, source=x, routing_key="k"),
        C.Exchange.UnbindOk),
    "exchange.unbind, no such binding": (
        lambda q, x, n: C.Exchange.Unbind(destination="amq.fanout", source=x, routing_key="k"),
        C.Exchange.UnbindOk),
    "exchange.unbind, destination default": (
        lambda q, x, n: C.Exchange.Unbind(destination="", source=x, routing_key="k"),
        (403, "ACCESS_REFUSED - operation not permitted on the default exchange")),
    "exchange.delete, gone": (lambda q, x, n: C.Exchange.Delete(exchange=n),
                              C.Exchange.DeleteOk),
    "exchange.delete if-unused, gone": (
        lambda q, x, n: C.Exchange.Delete(exchange=n, if_unused=True), C.Exchange.DeleteOk),
    "queue.delete if-empty if-unused, gone": (
        lambda q, x, n: C.Queue.Delete(queue=n, if_empty=True, if_unused=True),
        C.Queue.DeleteOk),
    "queue.bind, queue gone": (
        lambda q, x, n: C.Queue.Bind(queue=n, exchange=x, routing_key="k"),
        (404, "NOT_FOUND - no queue '{n}' in vhost '/'")),
    "exchange.bind, source gone": (
        lambda q, x, n: C.Exchange.Bind(destination=x, source=n, routing_key="k"),
        (404, "NOT_FOUND - no exchange '{n}' in vhost '/'")),
}


@pytest.mark.parametrize("case", UNBIND_CASES)
def test_unbind_and_delete_of_what_is_gone(raw: RawConnection, case: str) -> None:
    make, expected = UNBIND_CASES[case]
    q, x, missing = uniq("q"), uniq("x"), uniq("gone")
    declare(raw, q)
    raw.rpc(1, C.Exchange.Declare(exchange=x, exchange_type="direct", auto_delete=True),
            C.Exchange.DeclareOk)
    raw.rpc(1, C.Queue.Bind(queue=q, exchange=x, routing_key="k"), C.Queue.BindOk)
    raw.send(1, make(q, x, missing))
    _ch, reply = raw.recv()
    if isinstance(expected, tuple):
        code, text = expected
        assert isinstance(reply, C.Channel.Close), reply
        assert (reply.reply_code, reply.reply_text) == (code, text.format(n=missing))
    else:
        assert isinstance(reply, expected), reply
        raw.rpc(1, C.Queue.Declare(queue=q, passive=True), C.Queue.DeclareOk)  # still open


def test_unbind_another_connections_exclusive_queue(url: str, raw: RawConnection) -> None:
    """405 only when the binding exists; an unbind that would remove nothing is ok."""
    q = uniq("excl")
    declare(raw, q)
    raw.rpc(1, C.Queue.Bind(queue=q, exchange="amq.direct", routing_key="k"), C.Queue.BindOk)
    with RawConnection.open(url) as other:
        other.open_channel(1)
        other.rpc(1, C.Queue.Unbind(queue=q, exchange="amq.direct", routing_key="nope"),
                  C.Queue.UnbindOk)
        other.send(1, C.Queue.Unbind(queue=q, exchange="amq.direct", routing_key="k"))
        close = other.expect(C.Channel.Close)
        assert close.reply_code == 405 and close.reply_text.startswith(
            f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}'")


def test_rpc_pattern_unbind_after_auto_delete_queue_went(url: str) -> None:
    """aio-pika's RPC.close(): server-named exclusive auto-delete queue, bound, consumed,
    consumer cancelled (the queue goes), then unbind: unbind-ok, channel still usable."""
    async def run() -> None:
        conn = await aio_pika.connect(url)
        async with conn:
            ch = await conn.channel()
            x = await ch.declare_exchange(uniq("rpc"), auto_delete=True)
            q = await ch.declare_queue(exclusive=True, auto_delete=True)
            await q.bind(x, routing_key="reply")
            async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await message.ack()

            tag = await q.consume(ignore)
            await q.cancel(tag)
            await q.unbind(x, routing_key="reply")
            await ch.declare_queue(uniq("after"), exclusive=True)  # the channel lives
    asyncio.run(run())


# ------------------------------------------------------- connection.update-secret


def test_update_secret_answered(raw: RawConnection) -> None:
    raw.send(0, C.Connection.UpdateSecret(new_secret="guest", reason="token refresh"))
    raw.expect(C.Connection.UpdateSecretOk)
    raw.rpc(1, C.Queue.Declare(queue=uniq(), exclusive=True), C.Queue.DeclareOk)


def test_update_secret_pika(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.update_secret("guest", "token refresh")  # timed out on ackmq before
        conn.channel().queue_declare(uniq(), exclusive=True)
    finally:
        conn.close()


# ---------------------------------------------------------------- channel numbers


def test_channel_numbers_above_channel_max_open(url: str) -> None:
    """channel-max limits how many channels are open at once, not their numbers."""
    with RawConnection.open(url) as conn:
        assert conn.channel_max == 2047
        for number in (65535, 2048, 40000):
            conn.open_channel(number)
        conn.rpc(65535, C.Queue.Declare(queue=uniq(), exclusive=True), C.Queue.DeclareOk)


def test_channel_max_counts_open_channels(url: str) -> None:
    with RawConnection.open(url, channel_max=3) as conn:
        for number in (10, 11, 12):
            conn.open_channel(number)
        conn.send(13, C.Channel.Open())
        close = conn.wait_close()
        assert isinstance(close, C.Connection.Close)
        assert (close.reply_code, close.reply_text) == (
            530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated "
                 "channel_max (3)")


def test_channel_max_frees_a_slot_on_close(url: str) -> None:
    with RawConnection.open(url, channel_max=2) as conn:
        conn.open_channel(1)
        conn.open_channel(2)
        conn.rpc(2, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), C.Channel.CloseOk)
        conn.open_channel(300)
        conn.rpc(300, C.Queue.Declare(queue=uniq(), exclusive=True), C.Queue.DeclareOk)


def test_frames_pipelined_after_the_clients_channel_close_are_dropped(raw: RawConnection
                                                                       ) -> None:
    """A client that sends more on a channel right behind its own channel.close (an ack or
    a publish racing the close, in the same write) loses those frames, not the
    connection: RabbitMQ drops them. ackmq closed the whole connection with 504 before.
    (RabbitMQ answers 504 to frames that arrive after its channel process has ended, a
    few ms later; ackmq keeps dropping them until the number is opened again.)"""
    q = uniq()
    raw.open_channel(2)
    raw.rpc(2, C.Queue.Declare(queue=q, exclusive=True), C.Queue.DeclareOk)
    sock, sent = raw.sock, []
    raw.sock = type("Collect", (), {"sendall": lambda self, b: sent.append(b)})()
    try:
        raw.send(1, C.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                    method_id=0))
        raw.send(1, C.Queue.Declare(queue=uniq(), exclusive=True))
        raw.publish(1, "", q, b"after close")
        raw.send(1, C.Basic.Ack(delivery_tag=1))
    finally:
        raw.sock = sock
    sock.sendall(b"".join(sent))  # one write: pipelined behind the close
    raw.expect(C.Channel.CloseOk, channel=1)
    ok = raw.rpc(2, C.Queue.Declare(queue=q, passive=True), C.Queue.DeclareOk)
    assert ok.message_count == 0
    assert raw.drain(0.3) == []


def test_time_fields_are_utc_seconds(raw: RawConnection) -> None:
    """The x-death time a client decodes is the broker's UTC clock in whole seconds."""
    q, dead = uniq("q"), uniq("dead")
    declare(raw, dead)
    declare(raw, q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    raw.publish(1, "", q, b"t")
    got = get(raw, q)
    raw.send(1, C.Basic.Reject(delivery_tag=got.delivery_tag, requeue=False))
    when = get(raw, dead, no_ack=True).properties.headers["x-death"][0]["time"]
    now = datetime.datetime.now(tz=datetime.UTC)
    assert abs((now - when.replace(tzinfo=datetime.UTC)).total_seconds()) < 60


# ------------------------------------------- found by running client suites (audit)


def test_queue_delete_ok_before_the_cancel_of_own_consumer(raw: RawConnection) -> None:
    """kombu/Celery (py-amqp) wait for delete-ok and fail on a basic.cancel before it."""
    q = uniq("del")
    raw.rpc(1, C.Queue.Declare(queue=q), C.Queue.DeclareOk)
    raw.rpc(1, C.Basic.Consume(queue=q, consumer_tag="own"), C.Basic.ConsumeOk)
    raw.send(1, C.Queue.Delete(queue=q))
    first = raw.recv()[1]
    second = raw.recv()[1]
    assert isinstance(first, C.Queue.DeleteOk), first
    assert isinstance(second, C.Basic.Cancel) and second.consumer_tag == "own", second


def test_start_offers_amqplain_then_plain(url: str) -> None:
    """RabbitMQ 3.10 lists its auth_mechanism registry (an ETS table) in an order that
    changes from one start to the next: "AMQPLAIN PLAIN" and "PLAIN AMQPLAIN" were both
    seen on restarts of the same node (and a CI run failed on it). ackmq offers one
    order always, the one this audit first saw."""
    with RawConnection.connect(url) as conn:
        start = conn.start()
        if url == rabbitmq_url():
            assert sorted(start.mechanisms.split()) == ["AMQPLAIN", "PLAIN"]
        else:
            assert start.mechanisms == "AMQPLAIN PLAIN"


def test_user_id_must_be_the_logged_in_user(raw: RawConnection) -> None:
    q = uniq("uid")
    declare(raw, q)
    raw.publish(1, "", q, b"ok", C.Basic.Properties(user_id="guest"))
    assert get(raw, q, no_ack=True).body == b"ok"
    raw.publish(1, "", q, b"forged", C.Basic.Properties(user_id="bob"))
    close = raw.expect(C.Channel.Close)
    assert (close.reply_code, close.reply_text) == (
        406, "PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user "
             "was 'guest'")


@pytest.mark.parametrize("header", ["CC", "BCC"])
def test_cc_bcc_must_be_arrays(raw: RawConnection, header: str) -> None:
    q, other = uniq("cc"), uniq("cc2")
    declare(raw, q)
    declare(raw, other)
    # elements that are not strings are ignored, the strings route
    raw.publish(1, "", q, b"a", C.Basic.Properties(headers={header: [other, 7]}))
    assert get(raw, other, no_ack=True).body == b"a"
    raw.publish(1, "", q, b"b", C.Basic.Properties(headers={header: other}))
    close = raw.expect(C.Channel.Close, skip_others=True)
    assert (close.reply_code, close.reply_text) == (
        406, f'PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,"{header}",'
             'longstr}')


@pytest.mark.parametrize("args,text", [
    ({"x-priority": "abc"}, "invalid arg 'x-priority' for queue '{q}' in vhost '/': "
                            '"expected integer, got longstr"'),
    ({"x-cancel-on-ha-failover": "yes"}, "invalid arg 'x-cancel-on-ha-failover' for queue "
                                         "'{q}' in vhost '/': {{unacceptable_type,longstr}}"),
])
def test_consume_arguments_checked(raw: RawConnection, args: dict, text: str) -> None:
    q = uniq("cargs")
    declare(raw, q)
    raw.send(1, C.Basic.Consume(queue=q, arguments=args))
    close = raw.expect(C.Channel.Close)
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - "
                                                    + text.format(q=q))


def _consume_all(conn: pika.BlockingConnection, got: list, seconds: float = 0.7) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def test_consumer_priorities(url: str) -> None:
    """The higher x-priority consumer takes messages while it has room; the lower one
    gets them only then."""
    q = uniq("prio")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        low, high = conn.channel(), conn.channel()
        low.queue_declare(q, exclusive=True)
        got: list[tuple[str, bytes]] = []
        low.basic_qos(prefetch_count=1)
        high.basic_qos(prefetch_count=2)
        low.basic_consume(q, lambda c, m, p, b: got.append(("low", b)),
                          arguments={"x-priority": 1})
        high.basic_consume(q, lambda c, m, p, b: got.append(("high", b)),
                           arguments={"x-priority": 10})
        conn.process_data_events(time_limit=0.1)
        for i in range(4):
            low.basic_publish("", q, str(i).encode())
        _consume_all(conn, got)
        assert sorted(got) == [("high", b"0"), ("high", b"1"), ("low", b"2")]
    finally:
        conn.close()


def test_single_active_consumer(url: str) -> None:
    """x-single-active-consumer: one consumer gets everything; the next takes over when
    it goes."""
    q = uniq("sac")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(q, exclusive=True, arguments={"x-single-active-consumer": True})
        got: list[tuple[str, bytes]] = []
        ch.basic_consume(q, lambda c, m, p, b: got.append(("first", b)), auto_ack=True,
                         consumer_tag="first")
        ch.basic_consume(q, lambda c, m, p, b: got.append(("second", b)), auto_ack=True,
                         consumer_tag="second")
        for i in range(3):
            ch.basic_publish("", q, str(i).encode())
        _consume_all(conn, got)
        assert got == [("first", b"0"), ("first", b"1"), ("first", b"2")]
        ch.basic_cancel("first")
        ch.basic_publish("", q, b"3")
        _consume_all(conn, got)
        assert got[3:] == [("second", b"3")]
    finally:
        conn.close()


# ------------------------------------------------------------------ direct reply-to

REPLY_TO = "amq.rabbitmq.reply-to"


def test_direct_reply_to_round_trip(url: str) -> None:
    """The RPC pattern of RabbitMQ's docs: consume amq.rabbitmq.reply-to (no-ack), send the
    request with that reply_to; the server answers to the name it received."""
    q = uniq("rpc")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        client, server = conn.channel(), conn.channel()
        server.queue_declare(q, exclusive=True)
        replies: list[tuple[bytes, str, str]] = []
        client.basic_consume(REPLY_TO, lambda c, m, p, b: replies.append(
            (b, p.correlation_id, m.routing_key)), auto_ack=True)
        client.basic_publish("", q, b"2+2", pika.BasicProperties(reply_to=REPLY_TO,
                                                                 correlation_id="c1"))
        deadline = time.monotonic() + 5
        while (req := server.basic_get(q, auto_ack=True))[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        reply_to = req[1].reply_to
        assert reply_to.startswith(REPLY_TO + ".") and len(reply_to) > len(REPLY_TO) + 8
        assert server.queue_declare(reply_to, passive=True).method.consumer_count == 1
        server.basic_publish("", reply_to, b"4", pika.BasicProperties(correlation_id="c1"))
        while not replies and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert replies == [(b"4", "c1", reply_to)]
    finally:
        conn.close()


def test_direct_reply_to_refusals(raw: RawConnection) -> None:
    raw.send(1, C.Queue.Declare(queue=REPLY_TO, passive=True))
    ok = raw.expect(C.Queue.DeclareOk)
    assert (ok.queue, ok.message_count, ok.consumer_count) == (REPLY_TO, 0, 1)
    # a publish asking for replies without a reply consumer on its channel
    raw.publish(1, "", uniq("x"), b"q", C.Basic.Properties(reply_to=REPLY_TO))
    close = raw.expect(C.Channel.Close)
    assert (close.reply_code, close.reply_text) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    raw.send(1, C.Channel.CloseOk())
    raw.open_channel(1)
    raw.send(1, C.Basic.Consume(queue=REPLY_TO, no_ack=False))
    close = raw.expect(C.Channel.Close)
    assert close.reply_text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"
    raw.send(1, C.Channel.CloseOk())
    raw.open_channel(1)
    raw.rpc(1, C.Basic.Consume(queue=REPLY_TO, no_ack=True), C.Basic.ConsumeOk)
    raw.send(1, C.Basic.Consume(queue=REPLY_TO, no_ack=True))
    close = raw.expect(C.Channel.Close)
    assert close.reply_text == "PRECONDITION_FAILED - reply consumer already set"
