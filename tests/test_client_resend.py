"""Idempotent producers (issue 23): a producer whose connection is cut 50 times while
it publishes lands each message exactly once in a dedup queue (docs/dedup.md).

Cuts alternate between a TCP proxy that drops the link mid-stream (a reset; bytes in
flight either way are lost) and a broker-side close (`ackmq ctl delete_user` on the
admin socket: 320 CONNECTION_FORCED; the user is added back at once). The same run
against RabbitMQ 3.10 (no dedup plugin; proxy cuts only) shows the duplicates that
re-sending without broker-side dedup stores. The normal suite publishes 10,000 ids;
the slow run 100,000 (figures in docs/dedup.md).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.cutproxy import CutProxy
from support.pikahelp import uniq

from ackmq.client import connect
from ackmq.ctl.socket_client import request

CUTS = 50
BODY = 1000  # bytes: the sync client looks at its socket every 64 KiB of publishes


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    b.stop()


def _ctl(b: BrokerProcess, verb: str, *args: str) -> None:
    reply = request(b.data_dir / "ctl.sock", verb, list(args))
    assert reply.get("ok", True), reply


def _add_producer_user(b: BrokerProcess) -> None:
    _ctl(b, "add_user", "prod", "prod-pw")
    _ctl(b, "set_permissions", "prod", ".*", ".*", ".*")


def produce(url: str, queue: str, n: int, cut: Callable[[int], None],
            **options: object) -> dict[str, int]:
    """Publish bodies 0..n-1 with publish() (asynchronous confirms), cutting the
    connection CUTS times on the way (each cut lands while the last few hundred
    publishes and their confirms are in flight); then wait for every confirm."""
    every = max(1, n // (CUTS * 2))
    with connect(url, reconnect=True, reconnect_timeout=30, heartbeat=0, **options) as conn:
        p = conn.session().producer(queue)
        start = cut_gen = conn.generation
        cuts, next_at = 0, every
        for i in range(n):
            p.publish(str(i).encode().ljust(BODY))
            # the next cut once the last one was seen and healed (a reconnect)
            if i >= next_at and cuts < CUTS and (cuts == 0 or conn.generation >= cut_gen):
                cuts += 1
                cut_gen = conn.generation + 1
                next_at = i + every
                cut(cuts)
        p.wait_for_confirms(timeout=120)
        failed = p.take_failed()
        return {"cuts": cuts, "reconnects": conn.generation - start, "failed": len(failed)}


def _later(fn: Callable[[], None]) -> None:
    """Cut 0-3 ms from now, from another thread, while the publishes and confirms
    already written are in flight; back when the cut is done."""
    def run() -> None:
        time.sleep(random.uniform(0, 0.003))
        fn()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)


def stored_bodies(url: str, queue: str) -> Counter[int]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2000)
        total = ch.queue_declare(queue, passive=True).method.message_count
        got: Counter[int] = Counter()
        n = 0
        for m, _p, body in ch.consume(queue, auto_ack=True, inactivity_timeout=2):
            if m is None:
                break
            got[int(body)] += 1
            n += 1
            if n >= total:
                break
        ch.cancel()
        ch.queue_delete(queue)
        return got
    finally:
        conn.close()


def _ackmq_run(b: BrokerProcess, n: int) -> None:
    _add_producer_user(b)
    q = uniq("resend")
    direct = b.url
    conn = pika.BlockingConnection(pika.URLParameters(direct))
    conn.channel().queue_declare(q, durable=True, arguments={"x-message-deduplication": True})
    conn.close()
    proxy = CutProxy(("127.0.0.1", b.port))

    def broker_side() -> None:
        _ctl(b, "delete_user", "prod")  # the broker closes the connection: 320
        _add_producer_user(b)

    def cut(k: int) -> None:
        _later(proxy.cut if k % 2 else broker_side)

    try:
        stats = produce(f"amqp://prod:prod-pw@127.0.0.1:{proxy.port}/", q, n, cut)
    finally:
        proxy.close()
    got = stored_bodies(direct, q)
    print(f"ackmq, {stats['reconnects']} reconnects: {n} ids, "
          f"{sum(c - 1 for c in got.values())} duplicates")
    assert stats["failed"] == 0
    assert stats["cuts"] == CUTS and stats["reconnects"] >= CUTS, stats
    dups = {k: c for k, c in got.items() if c > 1}
    assert not dups, f"{len(dups)} ids stored twice or more: {sorted(dups)[:10]}"
    missing = set(range(n)) - set(got)
    assert not missing, f"{len(missing)} ids never stored: {sorted(missing)[:10]}"


def test_idempotent_producer_cut_50_times_lands_each_id_once(own_broker: BrokerProcess) -> None:
    _ackmq_run(own_broker, 10_000)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_idempotent_producer_cut_50_times_lands_100000_ids_once(
        own_broker: BrokerProcess) -> None:
    _ackmq_run(own_broker, 100_000)


@pytest.mark.rabbitmq
def test_rabbitmq_without_dedup_stores_the_resent_duplicates() -> None:
    """The comparison: the same producer (re-sending, ids in the header) through the same
    cutting proxy into RabbitMQ 3.10, which has no dedup plugin: every message arrives,
    some of them twice (those stored whose confirm the cut swallowed)."""
    reference = rabbitmq_url()  # or a skip saying why there is none
    params = pika.URLParameters(reference)
    q = uniq("dedup.resend")
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare(q, durable=True, arguments={"x-message-deduplication": True})
    conn.close()
    proxy = CutProxy((params.host, params.port))
    n = 10_000
    try:
        stats = produce(f"amqp://guest:guest@127.0.0.1:{proxy.port}/", q, n,
                        lambda k: _later(proxy.cut), idempotent=True)
    finally:
        proxy.close()
    got = stored_bodies(reference, q)
    assert stats["failed"] == 0 and set(got) == set(range(n))
    dups = sum(c - 1 for c in got.values())
    print(f"RabbitMQ 3.10, {stats['reconnects']} reconnects: {n} ids, {dups} duplicates")
    assert dups > 0


def test_idempotent_fast_path_encodes_as_the_general_encoder() -> None:
    """OutboundMessage.plain(dedup=True) (the hot path) equals build() with the header."""
    from ackmq.client.message import DEDUP_HEADER, OutboundMessage
    for persistent in (True, False):
        fast = OutboundMessage.plain(b"x", "", "q", True, "ID:a-1:2:3", persistent, True)
        slow = OutboundMessage.build(b"x", "", "q", True, "ID:a-1:2:3",
                                     headers={DEDUP_HEADER: "ID:a-1:2:3"},
                                     persistent=persistent)
        assert fast.raw_properties == slow.raw_properties
        assert fast.headers == {DEDUP_HEADER: "ID:a-1:2:3"}


def test_idempotent_asyncio_send_survives_cuts(own_broker: BrokerProcess) -> None:
    """The asyncio API: send() in flight when the link is cut waits through the
    reconnect and the re-send; each message lands once."""
    import asyncio

    from ackmq.client import connect_async

    q = uniq("resend.aio")
    conn = pika.BlockingConnection(pika.URLParameters(own_broker.url))
    conn.channel().queue_declare(q, durable=True, arguments={"x-message-deduplication": True})
    conn.close()
    proxy = CutProxy(("127.0.0.1", own_broker.port))
    n = 300

    async def run() -> int:
        async with await connect_async(f"amqp://guest:guest@127.0.0.1:{proxy.port}/",
                                       reconnect=True, heartbeat=0) as c:
            p = await (await c.session()).producer(q)
            start = c.generation
            for i in range(n):
                if i % 30 == 15:
                    asyncio.get_running_loop().call_later(0.0005, proxy.cut)
                await p.send(str(i).encode())
            return c.generation - start

    try:
        reconnects = asyncio.run(run())
    finally:
        proxy.close()
    got = stored_bodies(own_broker.url, q)
    assert reconnects >= 5
    assert got == Counter(range(n))


def test_idempotent_publishes_fail_when_the_reconnect_gives_up(own_broker: BrokerProcess) -> None:
    """Kept publishes never hang: when the reconnect fails for reconnect_timeout, the
    waiting call raises ConnectionLost and every unconfirmed publish is handed back."""
    from ackmq.client import ConnectionLost

    q = uniq("resend.giveup")
    with connect(own_broker.url, reconnect=True, reconnect_timeout=1.0, heartbeat=0) as conn:
        conn.declare_queue(q, arguments={"x-message-deduplication": True})
        p = conn.session().producer(q)
        futures = [p.publish(b"x" * 1000) for _ in range(2000)]
        own_broker.kill()
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost, match="reconnect failed"):
            p.wait_for_confirms(timeout=30)
        assert time.monotonic() - t0 < 10
        failed = p.take_failed()
        done = [f for f in futures if f.done()]
        assert len(done) == len(futures)  # every future settled, none pending
        assert len(failed) == sum(1 for f in futures if f.exception(0) is not None)
    own_broker.start()


def test_idempotent_producer_across_kill_9_lands_each_id_once(own_broker: BrokerProcess) -> None:
    """The broker itself dies (kill -9) three times while the producer publishes: after
    each restart the ids of what was stored come back from the log, so the re-sent
    publishes whose confirms died with the broker are dropped as duplicates."""
    q = uniq("resend.kill")
    conn = pika.BlockingConnection(pika.URLParameters(own_broker.url))
    conn.channel().queue_declare(q, durable=True, arguments={"x-message-deduplication": True})
    conn.close()
    n, kills = 6000, 3

    def restart() -> None:
        own_broker.kill()
        own_broker.start()

    with connect(own_broker.url, reconnect=True, reconnect_timeout=60, heartbeat=0) as c:
        p = c.session().producer(q)
        start = c.generation
        for i in range(n):
            p.publish(str(i).encode().ljust(BODY))
            if i % (n // (kills + 1)) == n // (kills + 1) - 1 and i < n - 1:
                restart()
        p.wait_for_confirms(timeout=60)
        assert not p.take_failed()
        assert c.generation - start == kills
    got = stored_bodies(own_broker.url, q)
    assert got == Counter(range(n))


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_idempotent_producer_cut_50_times_then_landed_each_id_once_in_the_table(
        own_broker: BrokerProcess, tmp_path: Path) -> None:
    """Issue 23's whole path: the producer cut 50 times lands each id once in the dedup
    queue, and `ackmq pipeline land` takes the queue into a table exactly once (S2)."""
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark==4.3.0')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")
    from ackmq.spark.lake import read_committed

    _add_producer_user(own_broker)
    q = uniq("resend.land")
    conn = pika.BlockingConnection(pika.URLParameters(own_broker.url))
    conn.channel().queue_declare(q, durable=True, arguments={"x-message-deduplication": True})
    conn.close()
    proxy = CutProxy(("127.0.0.1", own_broker.port))
    n = 20_000
    try:
        stats = produce(f"amqp://prod:prod-pw@127.0.0.1:{proxy.port}/", q, n,
                        lambda k: _later(proxy.cut))
    finally:
        proxy.close()
    assert stats["cuts"] == CUTS and stats["failed"] == 0
    lake = tmp_path / "lake"
    r = subprocess.run([sys.executable, "-m", "ackmq.spark", "pipeline", "land", "--url",
                        own_broker.url, "--queue", q, "--to", str(lake), "--checkpoint",
                        str(tmp_path / "chk"), "--available-now"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    table = read_committed(lake, ["body"])
    assert table is not None
    assert Counter(int(b) for b in table.column("body").to_pylist()) == Counter(range(n))
