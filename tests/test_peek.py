"""V3 peek: `POST /api/queues/<vhost>/<name>/peek` looks at a queue's messages without
taking them — no redelivered flag, no reorder, no delivery count, no counter moves —
including the ones paged to the spill and the ones left in the store after a restart;
`state: unacked` shows what consumers hold; a stream is read by offset range; a user
needs read on the queue (as for a get); bad bodies are clear 400s.

The broker runs with `--queue-hot-messages 5`, so that most of each queue is spilled.
RabbitMQ 3.10 has no such route (its "Get messages" takes and requeues, marking the
messages redelivered): the comparison test shows what peek avoids there.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerProcess
from hypothesis import given, settings
from hypothesis import strategies as st
from support.mgmthelp import Target, q, rabbit_http
from support.pikahelp import uniq
from test_model_readylist import OWNER

from ackmq.broker.message import Message
from ackmq.broker.queue_type import QueueEntry
from ackmq.broker.readylist import ReadyList


# -- the model: ReadyList.browse -------------------------------------------------------
class MemSpill:
    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.next = 0

    def put(self, record: bytes) -> int:
        self.next += 1
        self.records[self.next] = record
        return self.next

    def get(self, loc: int) -> bytes:
        return self.records[loc]

    def get_many(self, locs: list[int]) -> list[bytes]:
        return [self.records[loc] for loc in locs]

    def release(self, loc: int) -> None:
        del self.records[loc]


def _entry(seq: int, priority: int = 0) -> QueueEntry:
    props = b"\x00\x00" if not priority else b"\x08\x00" + bytes([priority])
    return QueueEntry(Message("", "q", props, b"m%d" % seq), seq, OWNER)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "pop", "requeue"]), st.integers(0, 2)),
                max_size=60),
       st.integers(0, 3), st.integers(0, 70), st.integers(0, 70))
def test_V3_model_browse_is_the_delivery_order_and_changes_nothing(
        ops: list[tuple[str, int]], max_priority: int, offset: int, count: int) -> None:
    """Whatever mix of spill, requeue and priorities: browse(offset, count) is the slice
    of the order pops would give, and popping afterwards gives that same order."""
    spill = MemSpill()
    rl = ReadyList(max_priority, spill, owner=OWNER, hot_max=3)
    seq, taken = 0, []
    for op, prio in ops:
        if op == "add":
            seq += 1
            rl.append(_entry(seq, prio if max_priority else 0))
        elif op == "pop" and len(rl):
            taken.append(rl.pop())
        elif op == "requeue" and taken:
            rl.requeue(taken.pop(0))
    before = (len(rl), rl.bytes, dict(spill.records))
    seen = [e.seq for e in rl.browse(offset, count)]
    assert (len(rl), rl.bytes, dict(spill.records)) == before
    order = []
    while len(rl):
        order.append(rl.pop().seq)
    assert seen == order[offset:offset + count]


# -- over the wire -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("peek"), "--http-port", "0",
                      "--queue-hot-messages", "5")
    b.start()
    yield b
    b.stop()


def _http(b: BrokerProcess) -> Target:
    line = next(x for x in reversed(b.log) if "listening on" in x)
    return Target("ackmq", line.split(" and ")[-1].split(" ")[0], b.url)


def peek(t: Target, queue: str, body: Any = None, vhost: str = "/",
         auth: Any = "default") -> Any:
    return t.call("POST", f"/api/queues/{q(vhost)}/{q(queue)}/peek",
                  {} if body is None else body, auth=auth)


def _fill(ch: Any, queue: str, n: int, **kw: Any) -> None:
    ch.queue_declare(queue, durable=True, **kw)
    for i in range(n):
        ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(
            delivery_mode=2, message_id=f"id{i}", headers={"i": i}))


def _queue_counts(t: Target, queue: str) -> tuple[int, int]:
    r = t.call("GET", f"/api/queues/%2F/{q(queue)}?disable_stats=true")
    assert r.status == 200, r
    return r.body["messages_ready"], r.body["messages_unacknowledged"]


def _get_all(ch: Any, queue: str) -> list[tuple[bytes, bool]]:
    out = []
    while True:
        m, props, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append((body, m.redelivered))


def test_V3_peek_leaves_the_queue_exactly_as_it_was(broker: BrokerProcess) -> None:
    """40 messages (35 of them spilled), one taken and requeued (it goes back first,
    redelivered): two peeks agree, show the same order, flags and properties a get then
    sees, and no message got a redelivered flag or moved."""
    t, queue = _http(broker), uniq("peek.keep")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    _fill(ch, queue, 40)
    m, _p, body = ch.basic_get(queue)
    assert body == b"m0"
    ch.basic_nack(m.delivery_tag, requeue=True)
    assert _queue_counts(t, queue) == (40, 0)
    r = peek(t, queue, {"count": 100})
    assert r.status == 200, r
    again = peek(t, queue, {"count": 100})
    assert again.body == r.body
    assert [x["payload"] for x in r.body] == [f"m{i}" for i in range(40)]
    assert [x["redelivered"] for x in r.body] == [True] + [False] * 39
    first = r.body[1]
    assert first["properties"]["headers"] == {"i": 1}
    assert first["properties"]["message_id"] == "id1"
    assert first["properties"]["delivery_mode"] == 2
    assert first["exchange"] == "" and first["routing_key"] == queue
    assert first["payload_encoding"] == "string" and first["payload_bytes"] == 2
    assert [x["message_count"] for x in r.body] == list(range(39, -1, -1))
    assert _queue_counts(t, queue) == (40, 0)
    got = _get_all(ch, queue)
    assert got == [(f"m{i}".encode(), i == 0) for i in range(40)]
    conn.close()


def test_V3_peek_pages_with_offset_and_count(broker: BrokerProcess) -> None:
    t, queue = _http(broker), uniq("peek.pages")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    _fill(ch, queue, 23)
    pages = [peek(t, queue, {"offset": o, "count": 7}) for o in range(0, 29, 7)]
    assert [len(p.body) for p in pages] == [7, 7, 7, 2, 0]
    assert [x["payload"] for p in pages for x in p.body] == [f"m{i}" for i in range(23)]
    assert [x["payload"] for x in peek(t, queue).body] == [f"m{i}" for i in range(10)]
    b64 = peek(t, queue, {"offset": 3, "count": 1, "encoding": "base64", "truncate": 1})
    assert b64.body[0]["payload"] == "bQ==" and b64.body[0]["payload_encoding"] == "base64"
    assert _queue_counts(t, queue) == (23, 0)
    conn.close()


def test_V3_peek_unacked_shows_what_consumers_hold(broker: BrokerProcess) -> None:
    """state=unacked: the deliveries consumers hold, in queue order; they stay unacked
    and their ack still works."""
    t, queue = _http(broker), uniq("peek.unacked")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    _fill(ch, queue, 8)
    ch.basic_qos(prefetch_count=3)
    tags: list[int] = []
    ch.basic_consume(queue, lambda c, m, p, b: tags.append(m.delivery_tag))
    conn.process_data_events(time_limit=0.2)
    while len(tags) < 3:
        conn.process_data_events(time_limit=0.2)
    r = peek(t, queue, {"state": "unacked"})
    assert r.status == 200, r
    assert [x["payload"] for x in r.body] == ["m0", "m1", "m2"]
    assert all(not x["redelivered"] for x in r.body)
    assert [x["payload"] for x in peek(t, queue, {"state": "unacked", "offset": 1,
                                                  "count": 1}).body] == ["m1"]
    assert [x["payload"] for x in peek(t, queue, {"count": 2}).body] == ["m3", "m4"]
    assert _queue_counts(t, queue) == (5, 3)
    ch.basic_ack(tags[-1], multiple=True)
    while len(tags) < 6:
        conn.process_data_events(time_limit=0.2)
    assert [x["payload"] for x in peek(t, queue, {"state": "unacked"}).body] == \
        ["m3", "m4", "m5"]
    conn.close()


def test_V3_peek_after_restart_reads_stored_messages_and_keeps_counts(
        tmp_path: Path) -> None:
    """After a restart most of the queue is still in the store (read on demand): peek
    reads it without taking it; a message redelivered before the restart stays
    redelivered, the others do not become so."""
    b = BrokerProcess(tmp_path / "data", "--http-port", "0", "--queue-hot-messages", "5")
    b.start()
    try:
        queue = uniq("peek.restart")
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        _fill(ch, queue, 5000)
        conn.close()
        b.stop()
        b.start()
        t = _http(b)
        r = peek(t, queue, {"offset": 4990, "count": 20})
        assert [x["payload"] for x in r.body] == [f"m{i}" for i in range(4990, 5000)]
        assert not any(x["redelivered"] for x in r.body)
        assert peek(t, queue, {"offset": 4990, "count": 20}).body == r.body
        assert _queue_counts(t, queue) == (5000, 0)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        got = _get_all(conn.channel(), queue)
        assert got == [(f"m{i}".encode(), False) for i in range(5000)]
        conn.close()
    finally:
        b.stop()


def test_V3_peek_stream_by_offset_range(broker: BrokerProcess) -> None:
    """A stream: `offset` is the stream offset; each message carries x-stream-offset as
    a consumer sees it; nothing is consumed (a stream never is) and a later consumer
    from `first` sees them all."""
    t, queue = _http(broker), uniq("peek.stream")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(30):
        ch.basic_publish("", queue, f"s{i}".encode())
    r = peek(t, queue, {"offset": 10, "count": 5})
    assert r.status == 200, r
    assert [x["payload"] for x in r.body] == [f"s{i}" for i in range(10, 15)]
    assert [x["properties"]["headers"]["x-stream-offset"] for x in r.body] == \
        list(range(10, 15))
    assert [x["payload"] for x in peek(t, queue, {"offset": 28}).body] == ["s28", "s29"]
    assert peek(t, queue, {"offset": 30}).body == []
    conn.close()


def test_V3_peek_needs_read_permission_as_get(broker: BrokerProcess) -> None:
    """A user with write but no read on the queue is refused as /get refuses it; a
    queue that does not exist is /get's 404."""
    t, queue = _http(broker), uniq("peek.perm")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare(queue)
    conn.close()
    name, pw = t.name("u"), "pw"
    assert t.call("PUT", f"/api/users/{name}", {"password": pw, "tags": "management"}
                  ).status in (201, 204)
    t.cleanup.append(("user", name))
    assert t.call("PUT", f"/api/permissions/%2F/{name}",
                  {"configure": ".*", "write": ".*", "read": "^nothing$"}).status in (201, 204)
    try:
        got = t.call("POST", f"/api/queues/%2F/{q(queue)}/get",
                     {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"},
                     auth=(name, pw))
        r = peek(t, queue, auth=(name, pw))
        assert (r.status, r.body) == (got.status, got.body)
        assert r.status == 401
        missing = peek(t, "no-such-" + queue)
        assert missing.status == 404
        assert missing.body["reason"] == t.call(
            "POST", f"/api/queues/%2F/no-such-{q(queue)}/get",
            {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}).body["reason"]
    finally:
        t.forget()


BAD_BODIES: list[tuple[Any, str]] = [
    ({"offset": -1}, "offset must be a non-negative integer"),
    ({"offset": "3"}, "offset must be a non-negative integer"),
    ({"offset": 1.5}, "offset must be a non-negative integer"),
    ({"offset": True}, "offset must be a non-negative integer"),
    ({"offset": None}, "offset must be a non-negative integer"),
    ({"offset": 1 << 70}, "offset must be at most"),
    ({"count": -5}, "count must be a non-negative integer"),
    ({"count": "ten"}, "count must be a non-negative integer"),
    ({"count": [1]}, "count must be a non-negative integer"),
    ({"count": 1001}, "count must be at most 1000"),
    ({"state": "gone"}, "state must be one of ready, unacked"),
    ({"state": 1}, "state must be one of ready, unacked"),
    ({"encoding": "hex"}, "Unsupported encoding"),
    ({"truncate": -1}, "truncate must be a non-negative integer"),
    ([1, 2], "not_json"),
    ("peek", "not_json"),
]


@pytest.mark.parametrize("body,reason", BAD_BODIES)
def test_V3_peek_bad_body_is_a_clear_400(broker: BrokerProcess, body: Any,
                                         reason: str) -> None:
    t, queue = _http(broker), uniq("peek.bad")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare(queue)
    conn.close()
    r = peek(t, queue, body)
    assert r.status == 400, r
    assert r.body["error"] == "bad_request" and reason in r.body["reason"], r.body


def test_V3_peek_fuzzed_bodies_answer_200_or_400_and_the_broker_serves_on(
        broker: BrokerProcess) -> None:
    """Random JSON values in every field and random bytes as the body: each answer is
    200 or a 400 with a reason; no 500; the queue is unchanged; no traceback in the log."""
    t, queue = _http(broker), uniq("peek.fuzz")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    _fill(ch, queue, 12)
    rnd = random.Random(38)
    values: list[Any] = [-1, 0, 1, 7, 999, 1000, 1001, 2**63, -2**63, 1.0, "", "ready",
                         "unacked", "auto", "base64", None, True, False, [], {}, "\x00",
                         "é" * 300]
    for _ in range(300):
        if rnd.random() < 0.1:
            raw = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 40)))
            r = t.call("POST", f"/api/queues/%2F/{q(queue)}/peek", raw)
        else:
            body = {k: rnd.choice(values) for k in
                    rnd.sample(["offset", "count", "state", "encoding", "truncate", "x"],
                               rnd.randrange(0, 6))}
            r = t.call("POST", f"/api/queues/%2F/{q(queue)}/peek", json.dumps(body).encode())
        assert r.status in (200, 400), r
        if r.status == 400:
            assert r.body["reason"], r
    assert _queue_counts(t, queue) == (12, 0)
    assert [b for b, _r in _get_all(ch, queue)] == [f"m{i}".encode() for i in range(12)]
    conn.close()
    assert not any("Traceback" in line for line in broker.log)


@pytest.mark.rabbitmq
def test_V3_rabbitmq_get_marks_redelivered_where_peek_does_not() -> None:
    """RabbitMQ 3.10: no /peek route (404); its management get with ack_requeue_true takes
    the messages and puts them back marked redelivered — what peek exists to avoid."""
    t = Target("rabbitmq", rabbit_http(), "amqp://guest:guest@127.0.0.1:5672/")
    queue = uniq("ackmq-peek")
    conn = pika.BlockingConnection(pika.URLParameters(t.amqp_url))
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        _fill(ch, queue, 3)
        assert peek(t, queue).status in (404, 405)
        r = t.call("POST", f"/api/queues/%2F/{q(queue)}/get",
                   {"count": 3, "ackmode": "ack_requeue_true", "encoding": "auto"})
        assert [x["redelivered"] for x in r.body] == [False] * 3
        assert [redelivered for _b, redelivered in _get_all(ch, queue)] == [True] * 3
    finally:
        ch.queue_delete(queue)
        conn.close()


def test_V3_peek_after_restart_keeps_delivery_counts(tmp_path: Path) -> None:
    """5,000 messages all delivered once and returned, then a restart: the tail is read
    from the store on demand with its delivery count. Peeking it must not use the count
    up: a get afterwards still sees every message redelivered."""
    b = BrokerProcess(tmp_path / "data", "--http-port", "0")
    b.start()
    try:
        queue = uniq("peek.counts")
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        _fill(ch, queue, 5000)
        ch.basic_qos(prefetch_count=5000)
        seen: list[int] = []
        ch.basic_consume(queue, lambda c, m, p, body: seen.append(m.delivery_tag))
        while len(seen) < 5000:
            conn.process_data_events(time_limit=0.5)
        conn.close()  # all 5,000 back to the queue, delivered once
        b.stop()
        b.start()
        t = _http(b)
        r = peek(t, queue, {"offset": 4900, "count": 100})
        assert [x["payload"] for x in r.body] == [f"m{i}" for i in range(4900, 5000)]
        assert all(x["redelivered"] for x in r.body)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        got = _get_all(conn.channel(), queue)
        assert len(got) == 5000 and all(redelivered for _b, redelivered in got)
        conn.close()
    finally:
        b.stop()
