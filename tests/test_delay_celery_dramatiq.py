"""Celery and dramatiq delays against ackmq, as their users run them (issue 27): a worker
in this process, tasks sent with Celery's `countdown` / `retry(countdown=)` and with
dramatiq's `send_with_options(delay=)`. Neither framework uses `x-delay`: Celery holds
ETA tasks unacked in the worker (or, with quorum queues, builds its 28-level TTL+DLX
ladder: "native delayed delivery"), dramatiq parks them in its `.DQ` delay queue and
the worker holds them until due. Each test fails if the task runs before its delay or
never runs; they prove these stacks run unchanged on ackmq (the broker's own timer
store is proven by test_delayed*.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.pikahelp import uniq

import ackmq

celery = pytest.importorskip("celery")
dramatiq = pytest.importorskip("dramatiq")

pytestmark = pytest.mark.slow
EARLY = 0.005
LATE = 30.0


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ackmq.EmbeddedBroker(data_dir=tmp_path_factory.mktemp("celery")) as b:
        yield b.url


def _wait(cond: Any, timeout: float = LATE) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the task never ran"
        time.sleep(0.02)


@pytest.mark.parametrize("quorum", [False, True], ids=["eta-in-worker", "native-ladder"])
def test_L1_celery_countdown_and_retry_countdown(url: str, quorum: bool) -> None:
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    app = Celery(uniq("app"), broker=url)
    queue = uniq("celery")
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)
    if quorum:  # Celery 5.5+: quorum queues turn on its TTL+DLX delay ladder
        app.conf.update(task_default_queue_type="quorum", task_acks_late=True,
                        worker_detect_quorum_queues=True)
    ran: dict[str, float] = {}
    tries: list[float] = []

    @app.task(name=uniq("job"))
    def job(tag: str) -> None:
        ran[tag] = time.time()

    @app.task(name=uniq("flaky"), bind=True, max_retries=1)
    def flaky(self: Any) -> None:
        tries.append(time.time())
        if len(tries) == 1:
            raise self.retry(countdown=1)

    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        t0 = time.time()
        job.apply_async(("later",), countdown=1.5)
        job.apply_async(("now",))
        flaky.delay()
        _wait(lambda: "later" in ran and len(tries) == 2)
    assert ran["now"] < ran["later"]
    assert ran["later"] >= t0 + 1.5 - EARLY
    assert tries[1] - tries[0] >= 1.0 - EARLY
    if quorum:  # the ladder Celery built on ackmq (kombu's native_delayed_delivery)
        import pika
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().exchange_declare("celery_delayed_27", passive=True)
        conn.close()


def test_L1_dramatiq_send_with_options_delay(url: str) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=url)
    queue = uniq("dramatiq")
    ran: dict[str, float] = {}
    lock = threading.Lock()

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=uniq("job"))
    def job(tag: str) -> None:
        with lock:
            ran[tag] = time.time()

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        t0 = time.time()
        job.send_with_options(args=("later",), delay=1500)
        job.send("now")
        _wait(lambda: "later" in ran)
    finally:
        worker.stop()
        broker.close()
    assert ran["now"] < ran["later"]
    assert ran["later"] >= t0 + 1.5 - EARLY
