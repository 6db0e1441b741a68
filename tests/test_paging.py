"""Deep queues keep a hot head in memory and the rest in spill files (bounded memory).

The broker runs with `--queue-hot-messages 5` so that every path below crosses the
boundary between in-memory entries and spilled ones many times.
"""

from __future__ import annotations

import os
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess
from support.pikahelp import drain_ints

from ackmq.store.spill import Spill


def test_spill_put_get_release_deletes_empty_segments(tmp_path: Path) -> None:
    sp = Spill(tmp_path / "spill", segment_bytes=64)
    locs = [sp.put(bytes([i]) * 40) for i in range(6)]
    assert sp.get(locs[0]) == b"\x00" * 40   # still in the write buffer
    sp.flush()
    assert [sp.get(loc) for loc in locs] == [bytes([i]) * 40 for i in range(6)]
    first = sorted(os.listdir(tmp_path / "spill"))[0]
    for loc in locs[:2]:
        sp.release(loc)
    assert first not in os.listdir(tmp_path / "spill")  # its records are all released
    sp.close()
    assert not (tmp_path / "spill").exists()


def test_spill_get_many_across_segments_buffer_and_large_records(tmp_path: Path) -> None:
    sp = Spill(tmp_path / "spill", segment_bytes=1000)
    records = [bytes([i % 251]) * (10 + 37 * i) for i in range(40)]
    records[7] = b"L" * 300_000  # larger than one read chunk
    locs = [sp.put(r) for r in records]
    sp.flush()
    locs.append(sp.put(b"unflushed"))
    records.append(b"unflushed")
    assert sp.get_many(locs) == records
    assert sp.get_many(locs[5:9] + locs[20:22]) == records[5:9] + records[20:22]
    sp.close()


def test_spill_get_many_interleaved_queues_one_read_per_window(tmp_path: Path,
                                                               monkeypatch) -> None:
    """A fanout spills ten queues at once: each queue's records are every tenth one in
    the file. Reading one queue back must return exactly its records, in order, and
    share reads among them (not one large read per record)."""
    import random

    import ackmq.store.spill as spill_mod

    rnd = random.Random(7)
    sp = Spill(tmp_path / "spill", segment_bytes=1 << 20)
    per_queue: list[list[tuple[int, bytes]]] = [[] for _ in range(10)]
    for i in range(3000):
        q = i % 10
        size = 9000 if rnd.random() < 0.01 else rnd.randrange(0, 400)  # some > slack
        rec = rnd.randbytes(size)
        per_queue[q].append((sp.put(rec), rec))
    sp.flush()
    tail = sp.put(b"still buffered")
    reads = 0
    real_pread = os.pread

    def counting_pread(fd: int, n: int, off: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_pread(fd, n, off)

    monkeypatch.setattr(spill_mod.os, "pread", counting_pread)
    for q in range(10):
        locs = [loc for loc, _ in per_queue[q]]
        got = sp.get_many(locs + ([tail] if q == 0 else []))
        assert got == [rec for _, rec in per_queue[q]] + ([b"still buffered"] if q == 0 else [])
    assert reads < 3000 // 4, f"{reads} preads for 3000 interleaved records"
    sp.close()


@pytest.fixture
def deep_broker(tmp_path: Path):
    b = BrokerProcess(tmp_path / "data", "--queue-hot-messages", "5")
    b.start()
    yield b
    b.stop()


def _publish(ch, q: str, n: int, persistent: bool = True) -> None:
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", q, str(i).encode(),
                         pika.BasicProperties(delivery_mode=2 if persistent else 1,
                                              priority=i % 3))


def test_D6_requeue_keeps_order_across_spilled_tail(deep_broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    ch.queue_declare("deep", durable=True)
    _publish(ch, "deep", 60)
    tags = [ch.basic_get("deep")[0].delivery_tag for _ in range(8)]
    for t in reversed(tags[2:6]):          # requeue 2..5 while 8..59 sit in the spill
        ch.basic_nack(t, requeue=True)
    ch.basic_ack(tags[0])
    ch.basic_ack(tags[1])
    ch.basic_ack(tags[6])
    ch.basic_ack(tags[7])
    assert drain_ints(ch, "deep") == [2, 3, 4, 5, *range(8, 60)]
    conn.close()


def test_P9_spilled_persistent_messages_survive_restart_in_order(deep_broker: BrokerProcess
                                                                 ) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    ch.queue_declare("deep2", durable=True)
    _publish(ch, "deep2", 40)
    ch.queue_declare("transient-deep")
    _publish(ch, "transient-deep", 40, persistent=False)
    assert ch.queue_declare("transient-deep", passive=True).method.message_count == 40
    assert drain_ints(ch, "transient-deep") == list(range(40))
    conn.close()
    deep_broker.kill()
    deep_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    assert drain_ints(ch, "deep2") == list(range(40))
    conn.close()


def test_purge_of_spilled_persistent_messages_is_durable(deep_broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    ch.queue_declare("deep3", durable=True)
    _publish(ch, "deep3", 30)
    assert ch.queue_purge("deep3").method.message_count == 30
    _publish(ch, "deep3", 3)               # a confirm after the purge: purge is on disk too
    conn.close()
    deep_broker.kill()
    deep_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    assert drain_ints(ch, "deep3") == [0, 1, 2]
    conn.close()


def test_max_length_and_priority_with_spilled_tail(deep_broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    ch.queue_declare("deep4", arguments={"x-max-length": 20})
    _publish(ch, "deep4", 50, persistent=False)
    assert drain_ints(ch, "deep4") == list(range(30, 50))   # drop-head reaches into the spill
    ch.queue_declare("deep5", arguments={"x-max-priority": 2})
    _publish(ch, "deep5", 30, persistent=False)
    got = drain_ints(ch, "deep5")
    assert got == [i for p in (2, 1, 0) for i in range(30) if i % 3 == p]
    conn.close()


def test_D8_restart_with_deep_queue_marks_delivered_ones_and_purge_stays_durable(
        deep_broker: BrokerProcess) -> None:
    """After a restart only the head is read back; the tail stays in the store. Messages
    delivered before the crash come back redelivered (with x-delivery-count), wherever
    they sit, and a purge of the never-read tail is durable."""
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    ch.queue_declare("deep6", durable=True, arguments={"x-ackmq-delivery-count": True})
    _publish(ch, "deep6", 30)
    ch.basic_qos(prefetch_count=12)
    seen = 0
    for _m, _p, _b in ch.consume("deep6", inactivity_timeout=2):
        seen += 1
        if seen == 12:
            break
    conn.process_data_events(time_limit=0.5)   # let the delivery records reach the disk
    ch2 = conn.channel()
    ch2.confirm_delivery()
    ch2.queue_declare("sync", durable=True)
    ch2.basic_publish("", "sync", b"s", pika.BasicProperties(delivery_mode=2))
    deep_broker.kill()
    deep_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    ch = conn.channel()
    flags = []
    for i in range(15):
        m, p, body = ch.basic_get("deep6", auto_ack=True)
        assert int(body) == i
        flags.append((m.redelivered, (p.headers or {}).get("x-delivery-count")))
    assert flags == [(True, 1)] * 12 + [(False, None)] * 3
    assert ch.queue_purge("deep6").method.message_count == 15
    ch.confirm_delivery()
    ch.basic_publish("", "deep6", b"99", pika.BasicProperties(delivery_mode=2))
    conn.close()
    deep_broker.kill()
    deep_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(deep_broker.url))
    assert drain_ints(conn.channel(), "deep6") == [99]
    conn.close()


def _budget_run(n_queues: int, per_queue: int, body: int, **options) -> tuple[list, int, int]:
    """Publish `per_queue` messages of `body` bytes to each of `n_queues` queues of an
    embedded broker; returns (per-queue (in memory, spilled) after the burst, the
    budget's `used` then, and `used` once every queue is drained, requeued, purged or
    deleted)."""
    import ackmq

    with ackmq.EmbeddedBroker(persistent=False, **options) as b:
        model = b.server.broker
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        names = [f"budget.{i}" for i in range(n_queues)]
        for name in names:
            ch.queue_declare(name)
        for i in range(per_queue):
            for name in names:
                ch.basic_publish("", name, b"%08d" % i + b"x" * (body - 8))
        ch.queue_declare(names[-1], passive=True)  # a channel's frames are handled in order
        queues = [model.vhost("/").queues[name] for name in names]
        shape = [(len(q.ready) - q.ready.spilled, q.ready.spilled) for q in queues]
        used = model.hot_budget.used
        # every way out of a ready list: get + ack, nack-requeue, purge, delete, consume
        for _ in range(3):  # the head is taken and requeued (D6) three times
            m, _p, _b = ch.basic_get(names[0])
            ch.basic_nack(m.delivery_tag, requeue=True)
        got = []
        while (m := ch.basic_get(names[0]))[0] is not None:
            got.append(int(m[2][:8]))
            ch.basic_ack(m[0].delivery_tag)
        assert got == list(range(per_queue)), "order lost across the spill"
        ch.queue_purge(names[1])
        ch.queue_delete(names[2])
        for name in names[3:]:  # pushed to a no-ack consumer
            n = 0
            for m, _p, _b in ch.consume(name, auto_ack=True, inactivity_timeout=10):
                assert m is not None, f"{name}: only {n} of {per_queue} delivered"
                n += 1
                if n == per_queue:
                    break
            ch.cancel()
        left = model.hot_budget.used
        conn.close()
    return shape, used, left


def test_queue_memory_budget_spills_every_queue_past_its_floor_and_accounts_to_zero() -> None:
    from ackmq.broker.readylist import ENTRY_COST, HOT_FLOOR

    shape, used, left = _budget_run(6, 1500, 1024, queue_memory_mb=1)
    for in_memory, spilled in shape:  # the budget, not the 65536 cap, made them spill
        assert in_memory >= HOT_FLOOR and spilled > 0, shape
    assert used < 6 * (HOT_FLOOR + 100) * (1024 + ENTRY_COST)  # bounded by the floors
    assert left == 0, f"{left} bytes still counted after every queue was emptied"


def test_queue_memory_budget_keeps_a_burst_into_many_queues_in_memory() -> None:
    """4 queues x 4,500 (past the old fixed 4,096 per queue): well inside the default
    256 MiB, nothing spills (a fanout's queues used to page out and back)."""
    shape, used, left = _budget_run(4, 4500, 100)
    assert all(spilled == 0 for _, spilled in shape), shape
    assert used > 0 and left == 0
