"""Task frameworks' delays against ackmq, as their users write them (issue 27, L1):
taskiq-aio-pika with `delayed_message_exchange_plugin=True` and FastStream's RabbitMQ
broker publishing to an `x-delayed-message` exchange with an `x-delay` header. Each test
fails if the delay is not honoured: the delayed task must not be seen before its delay,
the undelayed one sent after it must arrive first, the delayed one must arrive.
RabbitMQ 3.10 here has no plugin: both frameworks fail at startup there (checked live).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import rabbitmq_url
from support.pikahelp import uniq

import ackmq

taskiq_aio_pika = pytest.importorskip("taskiq_aio_pika")
faststream_rabbit = pytest.importorskip("faststream.rabbit")

EARLY = 0.002
LATE = 15.0
DELAY = 1.0


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ackmq.EmbeddedBroker(data_dir=tmp_path_factory.mktemp("frameworks")) as b:
        yield b.url


def _taskiq_broker(url: str, name: str) -> Any:
    from taskiq_aio_pika import AioPikaBroker, Exchange, Queue
    return AioPikaBroker(url, exchange=Exchange(name=name),
                         task_queues=[Queue(name=name)],
                         delayed_message_exchange_plugin=True)


async def _taskiq_run(url: str) -> dict[int, float]:
    broker = _taskiq_broker(url, uniq("taskiq"))

    @broker.task
    async def job(n: int) -> int:
        return n

    broker.is_worker_process = True  # as `taskiq worker` runs it: it also consumes
    await broker.startup()
    try:
        t0 = time.time()
        await job.kicker().with_labels(delay=DELAY).kiq(1)
        await job.kiq(0)
        seen: dict[int, float] = {}

        async def worker() -> None:
            async for msg in broker.listen():  # what `taskiq worker` reads
                task = broker.formatter.loads(msg.data)
                seen[task.args[0]] = time.time() - t0
                await msg.ack()
                if len(seen) == 2:
                    return

        await asyncio.wait_for(worker(), LATE)
        return seen
    finally:
        await broker.shutdown()


def test_L1_taskiq_aio_pika_delayed_exchange_mode(url: str) -> None:
    seen = asyncio.run(_taskiq_run(url))
    assert seen[0] < seen[1]
    assert seen[1] >= DELAY - EARLY


def test_L1_taskiq_aio_pika_plugin_mode_fails_on_rabbitmq_without_the_plugin() -> None:
    async def start() -> None:
        broker = _taskiq_broker(rabbitmq_url(), uniq("taskiq"))
        try:
            await broker.startup()
        finally:
            await broker.shutdown()

    with pytest.raises(Exception, match="unknown exchange type|COMMAND_INVALID"):
        asyncio.run(start())


async def _faststream_run(url: str) -> dict[str, float]:
    from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue
    broker = RabbitBroker(url, logger=None)
    exch = RabbitExchange(uniq("fs"), type=ExchangeType.X_DELAYED_MESSAGE, durable=True,
                          arguments={"x-delayed-type": "direct"})
    queue = RabbitQueue(uniq("fsq"), durable=True, routing_key="jobs")
    seen: dict[str, float] = {}
    done = asyncio.Event()
    t0 = 0.0

    @broker.subscriber(queue, exch)
    async def handle(body: str) -> None:
        seen[body] = time.time() - t0
        if len(seen) == 2:
            done.set()

    async with broker:
        await broker.start()
        t0 = time.time()
        await broker.publish("later", routing_key="jobs", exchange=exch,
                             headers={"x-delay": int(DELAY * 1000)}, persist=True)
        await broker.publish("now", routing_key="jobs", exchange=exch, persist=True)
        await asyncio.wait_for(done.wait(), LATE)
    return seen


def test_L1_faststream_rabbit_publish_with_x_delay(url: str) -> None:
    seen = asyncio.run(_faststream_run(url))
    assert seen["now"] < seen["later"]
    assert seen["later"] >= DELAY - EARLY


def test_L1_faststream_delayed_exchange_fails_on_rabbitmq_without_the_plugin() -> None:
    with pytest.raises(Exception, match="unknown exchange type|COMMAND_INVALID"):
        asyncio.run(_faststream_run(rabbitmq_url()))
