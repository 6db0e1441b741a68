"""The asyncio API of ackmq.client: the same behaviour as the sync one (it shares the
session layer), awaited."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from conftest import BrokerProcess

from ackmq.client import (
    AckMode,
    ConnectionLost,
    IllegalStateError,
    Message,
    NackError,
    RedeliveryPolicy,
    connect_async,
)

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]


@pytest.fixture
def own_broker(tmp_path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    yield broker
    if broker.proc and broker.proc.poll() is None:
        os.kill(broker.proc.pid, signal.SIGCONT)
    broker.stop()


async def wait_ready(witness: Witness, queue: str, n: int) -> None:
    deadline = time.monotonic() + 5
    while witness.ready(queue) != n:
        assert time.monotonic() < deadline, f"{queue}: {witness.ready(queue)} != {n}"
        await asyncio.sleep(0.02)


async def test_J1_async_send_receive_and_auto_ack(url: str, q: str, witness: Witness) -> None:
    async with await connect_async(url) as conn:
        s = await conn.session(AckMode.AUTO)
        p = await s.producer(q)
        await p.send(b"one", headers={"k": "v"}, content_type="text/plain")
        await p.send(b"two")
        c = await s.consumer(q)
        m = await c.receive(timeout=2)
        assert (m.body, m.headers, m.properties["content_type"]) == \
            (b"one", {"k": "v"}, "text/plain")
        assert m.delivery_count == 1 and m.message_id.startswith("ID:")
        conn.abort()  # "one" was acked before receive() returned
    await wait_ready(witness, q, 1)


async def test_J1_async_client_mode_acknowledge(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"1", b"2", b"3")
    conn = await connect_async(url)
    c = await (await conn.session(AckMode.CLIENT)).consumer(q)
    got = [await c.receive(timeout=2) for _ in range(2)]
    got[0].acknowledge()  # both delivered ones
    conn.abort()
    await wait_ready(witness, q, 1)


async def test_J1_async_transacted_commit_and_rollback(url: str, q: str,
                                                      witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"in")
    async with await connect_async(url, redelivery_policy=RedeliveryPolicy(
            initial_redelivery_delay=0)) as conn:
        t = await conn.session(transacted=True)
        c = await t.consumer(q)
        p = await t.producer(q + ".out")
        m = await c.receive(timeout=2)
        await p.send(b"discarded")
        await t.rollback()
        again = await c.receive(timeout=2)
        assert (again.body, again.redelivered, again.delivery_count) == (b"in", True, 2)
        await p.send(b"kept")
        await t.commit()
        assert m.body == b"in"
    await wait_ready(witness, q + ".out", 1)
    await wait_ready(witness, q, 0)


async def test_J6_async_listener_coroutine_that_raises_is_redelivered_then_poisoned(
        url: str, q: str, witness: Witness) -> None:
    dlq = q + ".dlq"
    witness.declare(dlq)
    witness.declare(q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    calls: list[int] = []

    async def listener(m: Message) -> None:
        await asyncio.sleep(0)
        calls.append(m.delivery_count)
        raise ValueError("always")

    policy = RedeliveryPolicy(maximum_redeliveries=1, initial_redelivery_delay=0)
    async with await connect_async(url, redelivery_policy=policy) as conn:
        await conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                               "x-dead-letter-routing-key": dlq})
        s = await conn.session()
        c = await s.consumer(q, listener=listener)
        with pytest.raises(IllegalStateError):
            await c.receive(timeout=0.1)
        witness.publish(q, b"bad")
        await wait_ready(witness, dlq, 1)
    assert calls == [1, 2]
    [(_, props, _)] = witness.drain(dlq)
    assert props.headers["x-ackmq-dlq-cause"] == "ValueError('always')"


async def test_J10_async_publish_futures_and_nacks(url: str, q: str, witness: Witness) -> None:
    witness.declare(q, **{"x-max-length": 2, "x-overflow": "reject-publish"})
    async with await connect_async(url) as conn:
        p = await (await conn.session()).producer(q)
        futures = [p.publish(f"m{i}".encode()) for i in range(5)]
        await p.wait_for_confirms(timeout=5)
        assert [f.exception() is None for f in futures] == [True, True, False, False, False]
        assert isinstance(futures[2].exception(), NackError)
        assert [m.body for m in p.take_failed()] == [b"m2", b"m3", b"m4"]
        with pytest.raises(NackError):
            await p.send_batch([b"x", b"y"])


async def test_J4_async_pull_with_prefetch_0(url: str, q: str, witness: Witness) -> None:
    witness.declare(q)
    witness.publish(q, b"a", b"b")
    async with await connect_async(url) as conn:
        c = await (await conn.session()).consumer(q + "?consumer.prefetchSize=0")
        assert (await c.receive(timeout=2)).body == b"a"
        await wait_ready(witness, q, 1)
        assert (await c.receive(timeout=2)).body == b"b"
        started = time.monotonic()
        assert await c.receive(timeout=0.2) is None
        assert time.monotonic() - started >= 0.18


async def test_async_connection_lost_on_the_next_call(own_broker: BrokerProcess,
                                                      q: str) -> None:
    conn = await connect_async(own_broker.url)
    s = await conn.session()
    p = await s.producer(q)
    await p.send(b"x")
    own_broker.kill()
    with pytest.raises(ConnectionLost):
        await p.send(b"y", timeout=5)
    with pytest.raises(ConnectionLost):
        await conn.session()
    await conn.close()


async def test_async_reconnect_restores_consumers(own_broker: BrokerProcess, q: str) -> None:
    got: list[bytes] = []
    conn = await connect_async(own_broker.url, reconnect=True)
    try:
        s = await conn.session()
        p = await s.producer(q)
        await s.consumer(q, listener=lambda m: got.append(m.body))
        await p.send(b"before")
        own_broker.kill()
        again = BrokerProcess(own_broker.data_dir, port=own_broker.port)
        again.start()
        own_broker.proc = again.proc
        for _ in range(3):
            try:
                await p.send(b"after")
                break
            except ConnectionLost:
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + 5
        while b"after" not in got:
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.02)
        assert got[0] == b"before"
    finally:
        await conn.close()
