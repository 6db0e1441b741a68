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
    """With quorum queues and a topic exchange (what Celery's docs require for "native
    delayed delivery": with a direct exchange Celery skips the ladder and holds the
    task in the worker) countdown tasks and retries go through the `celery_delayed_*`
    TTL+DLX ladder: they come back from `celery_delayed_delivery` with the ladder's
    binary routing key, on time, and a plain task sent after them does not wait."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    app = Celery(uniq("app"), broker=url)
    queue = uniq("celery")
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)
    if quorum:  # Celery 5.5+: quorum queues and a topic exchange turn on its ladder
        app.conf.update(task_default_queue_type="quorum", task_default_exchange_type="topic",
                        task_acks_late=True, worker_detect_quorum_queues=True)
    ran: dict[str, float] = {}
    came: dict[str, dict[str, Any]] = {}
    tries: list[float] = []

    @app.task(name=uniq("job"), bind=True)
    def job(self: Any, tag: str) -> None:
        ran[tag] = time.time()
        came[tag] = dict(self.request.delivery_info or {})

    @app.task(name=uniq("flaky"), bind=True, max_retries=1)
    def flaky(self: Any) -> None:
        tries.append(time.time())
        came[f"try{len(tries)}"] = dict(self.request.delivery_info or {})
        if len(tries) == 1:
            raise self.retry(countdown=2)

    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=30):
        t0 = time.time()
        job.apply_async(("later",), countdown=3)  # the ladder counts whole seconds
        job.apply_async(("now",))
        flaky.delay()
        _wait(lambda: "later" in ran and len(tries) == 2)
    assert ran["now"] < ran["later"]
    assert t0 + 3 - EARLY <= ran["later"] <= t0 + 3 + LATE / 2
    assert 2 - EARLY <= tries[1] - tries[0] <= 2 + LATE / 2
    if quorum:  # through the ladder Celery built on ackmq (kombu's native_delayed_delivery)
        assert ran["now"] < t0 + 3, "a plain task waited behind a countdown task"
        # a delivery names the exchange the message was last dead-lettered to: 3 s
        # (…11) leaves level 0's queue for celery_delayed_delivery; 2 s (…10) leaves
        # level 1's queue for the celery_delayed_0 exchange, which passes it on
        for tag, bits, last in (("later", "0" * 26 + "11", "celery_delayed_delivery"),
                                ("try2", "0" * 26 + "10", "celery_delayed_0")):
            info = came[tag]
            assert info.get("exchange") == last, (tag, info)
            assert info.get("routing_key") == ".".join(bits) + f".{queue}", (tag, info)
        assert came["now"].get("exchange") == queue and came["try1"].get("exchange") == queue


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
