"""A realistic aio-pika application against the broker (pytest-asyncio, auto mode).

Why: aio-pika/aiormq is the asyncio client people actually use; it drives confirms,
prefetch, manual acks and requeues in its own way (pipelined, callback-based), so it
catches protocol details that pika's blocking adapter hides.
"""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from aiormq.exceptions import ChannelNotFoundEntity, DeliveryError
from pamqp.commands import Basic

TIMEOUT = 20.0


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


async def test_confirmed_persistent_publish_then_consume_exactly_once(broker_url: str) -> None:
    """Publish with confirms, consume with manual ack and prefetch, requeue some once:
    every message is acked exactly once and requeued ones come back redelivered."""
    n = 200
    qname = unique("aio.app")
    async with asyncio.timeout(TIMEOUT):
        conn = await aio_pika.connect_robust(broker_url)
        try:
            pub = await conn.channel(publisher_confirms=True)
            await pub.declare_queue(qname, durable=True)
            confirms = await asyncio.gather(*[
                pub.default_exchange.publish(
                    aio_pika.Message(f"m{i}".encode(), message_id=str(i),
                                     delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                     headers={"i": i}),
                    routing_key=qname)
                for i in range(n)])
            assert all(isinstance(c, Basic.Ack) for c in confirms)

            sub = await conn.channel()
            await sub.set_qos(prefetch_count=10)
            squeue = await sub.get_queue(qname)
            acked: list[int] = []
            nacked: set[int] = set()
            redelivered_seen: set[int] = set()
            async with squeue.iterator() as it:
                async for msg in it:
                    i = int(msg.message_id)
                    assert msg.body == f"m{i}".encode() and msg.headers["i"] == i
                    assert msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
                    if msg.redelivered:
                        redelivered_seen.add(i)
                    if i % 17 == 0 and i not in nacked:
                        nacked.add(i)
                        assert not msg.redelivered
                        await msg.nack(requeue=True)
                        continue
                    await msg.ack()
                    acked.append(i)
                    if len(acked) == n:
                        break
            assert sorted(acked) == list(range(n))
            assert len(set(acked)) == n
            assert redelivered_seen == nacked
            # queue.declare() asks the broker again (channel.declare_queue may be cached)
            assert (await squeue.declare()).message_count == 0
        finally:
            cleanup = await conn.channel()
            await cleanup.queue_delete(qname)
            await conn.close()


async def test_callback_consumer_with_process_context(broker_url: str) -> None:
    """message.process() acks on success and rejects (requeue) on exception."""
    async with asyncio.timeout(TIMEOUT):
        conn = await aio_pika.connect_robust(broker_url)
        try:
            ch = await conn.channel(publisher_confirms=True)
            await ch.set_qos(prefetch_count=5)
            queue = await ch.declare_queue(exclusive=True)
            bodies = [f"b{i}".encode() for i in range(20)]
            for b in bodies:
                await ch.default_exchange.publish(aio_pika.Message(b), routing_key=queue.name)

            seen: list[tuple[bytes, bool]] = []
            done = asyncio.Event()
            failed_once: set[bytes] = set()

            async def on_message(msg: AbstractIncomingMessage) -> None:
                try:
                    async with msg.process(requeue=True):
                        seen.append((msg.body, msg.redelivered))
                        if msg.body in (b"b3", b"b11") and msg.body not in failed_once:
                            failed_once.add(msg.body)
                            raise RuntimeError("handler failure: requeue")
                finally:
                    ok = [b for b, _r in seen if b not in failed_once or _r]
                    if len(set(ok)) == len(bodies):
                        done.set()

            tag = await queue.consume(on_message)
            await done.wait()
            await queue.cancel(tag)
            firsts = [b for b, r in seen if not r]
            assert sorted(firsts) == sorted(bodies)
            assert sorted(b for b, r in seen if r) == [b"b11", b"b3"]
            assert (await queue.declare()).message_count == 0
        finally:
            await conn.close()


async def test_get_and_reject_and_channel_close_requeue(broker_url: str) -> None:
    """queue.get (basic.get), reject without requeue, and close with unacked (D8)."""
    async with asyncio.timeout(TIMEOUT):
        conn = await aio_pika.connect_robust(broker_url)
        try:
            ch = await conn.channel(publisher_confirms=True)
            qname = unique("aio.get")
            queue = await ch.declare_queue(qname, auto_delete=False)
            for i in range(3):
                await ch.default_exchange.publish(aio_pika.Message(str(i).encode()),
                                                  routing_key=qname)
            other = await conn.channel()
            oq = await other.get_queue(qname)
            m0 = await oq.get(no_ack=False, timeout=5)
            assert (m0.body, m0.redelivered) == (b"0", False)
            await m0.reject(requeue=False)  # dropped: no DLX
            m1 = await oq.get(no_ack=False, timeout=5)
            assert m1.body == b"1"
            await other.close()  # m1 unacked: requeued at its position
            got = []
            while (m := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
                got.append((m.body, m.redelivered))
            assert got == [(b"1", True), (b"2", False)]
            await queue.delete()
        finally:
            await conn.close()


async def test_unroutable_mandatory_publish_is_returned(broker_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        conn = await aio_pika.connect_robust(broker_url)
        try:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            with pytest.raises(DeliveryError):
                await ch.default_exchange.publish(aio_pika.Message(b"lost"),
                                                  routing_key=unique("no.such.queue"),
                                                  mandatory=True)
            # the channel is still usable afterwards
            q = await ch.declare_queue(exclusive=True)
            ack = await ch.default_exchange.publish(aio_pika.Message(b"ok"),
                                                    routing_key=q.name)
            assert isinstance(ack, Basic.Ack)
        finally:
            await conn.close()


async def test_topic_exchange_and_missing_queue(broker_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        conn = await aio_pika.connect_robust(broker_url)
        try:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.declare_exchange(unique("aio.topic"), aio_pika.ExchangeType.TOPIC,
                                           auto_delete=True)
            q = await ch.declare_queue(exclusive=True)
            await q.bind(ex, "orders.#")
            await ex.publish(aio_pika.Message(b"o1"), routing_key="orders.eu.new")
            await ex.publish(aio_pika.Message(b"p1"), routing_key="payments.eu")
            m = await q.get(no_ack=True, timeout=5)
            assert m.body == b"o1" and m.routing_key == "orders.eu.new"
            assert await q.get(no_ack=True, fail=False, timeout=5) is None
            with pytest.raises(ChannelNotFoundEntity):
                ch2 = await conn.channel()
                await ch2.declare_queue(unique("missing"), passive=True)
        finally:
            await conn.close()
