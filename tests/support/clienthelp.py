"""Fixtures and checks shared by the ackmq.client tests (tests/test_client_*.py).

`url` runs a test against the ackmq broker under test (`broker_url`) and against the
reference RabbitMQ on 127.0.0.1:5672 (skipped, saying so, when it is not reachable).
Checks go through pika, a second client, so the broker — not our client — is the witness.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator

import pika
import pytest

RABBITMQ_URL = os.environ.get("ACKMQ_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
WAIT = 5.0
_rabbit: list[str | None] = []


def rabbitmq_problem() -> str | None:
    """None when the reference RabbitMQ answers, else why not (checked once)."""
    if not _rabbit:
        params = pika.URLParameters(RABBITMQ_URL)
        try:
            with socket.create_connection((params.host, params.port), timeout=2):
                pass
            conn = pika.BlockingConnection(params)
            product = conn._impl.server_properties.get("product", b"")
            conn.close()
            product = product.decode() if isinstance(product, bytes) else str(product)
            _rabbit.append(None if "RabbitMQ" in product else f"{RABBITMQ_URL} is {product}")
        except Exception as err:  # noqa: BLE001 - any failure means "not available"
            _rabbit.append(f"RabbitMQ not reachable at {RABBITMQ_URL}: {err!r}")
    return _rabbit[0]


@pytest.fixture(params=["ackmq", "rabbitmq"])
def url(request: pytest.FixtureRequest) -> str:
    """The broker under test: ackmq, then the reference RabbitMQ."""
    if request.param == "ackmq":
        return request.getfixturevalue("broker_url")
    problem = rabbitmq_problem()
    if problem:
        pytest.skip(problem)
    return RABBITMQ_URL


@pytest.fixture
def ackmq_url(broker_url: str) -> str:
    """For rules that need an ackmq extension (broker-kept x-delivery-count, ...)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker_url))
    product = conn._impl.server_properties.get("product", b"")
    conn.close()
    if b"ackmq" not in (product if isinstance(product, bytes) else str(product).encode()):
        pytest.skip("needs an ackmq broker (ACKMQ_TEST_URL points elsewhere)")
    return broker_url


SUFFIXES = ("", ".a", ".b", ".dlq", ".out", ".pull", ".full", ".mine")


@pytest.fixture
def q(request: pytest.FixtureRequest) -> Iterator[str]:
    """A queue name unique to the test; the queues made from it are deleted afterwards
    (the reference RabbitMQ is shared)."""
    name = f"c.{request.node.name[:50]}.{uuid.uuid4().hex[:8]}"
    yield name
    for fixture in ("url", "ackmq_url"):
        if fixture in request.fixturenames:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(
                    request.getfixturevalue(fixture)))
            except Exception:  # noqa: BLE001 - the broker may be gone; nothing to clean
                continue
            try:
                for suffix in SUFFIXES:
                    ch = conn.channel()
                    ch.queue_delete(name + suffix)
                    ch.close()
            except Exception:  # noqa: BLE001
                pass
            finally:
                if conn.is_open:
                    conn.close()


class Witness:
    """A pika connection that looks at queues from the outside."""

    def __init__(self, url: str) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.ch = self.conn.channel()

    def declare(self, queue: str, **arguments: object) -> None:
        self.ch.queue_declare(queue, durable=True, arguments=arguments or None)

    def ready(self, queue: str) -> int:
        return self.ch.queue_declare(queue, passive=True).method.message_count

    def wait_ready(self, queue: str, n: int, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        got = -1
        while time.monotonic() < deadline:
            got = self.ready(queue)
            if got == n:
                return
            time.sleep(0.02)
        raise AssertionError(f"{queue}: {got} ready, wanted {n}")

    def stays(self, queue: str, n: int, duration: float = 0.3) -> None:
        """The ready count is n now and still n after `duration`."""
        self.wait_ready(queue, n)
        time.sleep(duration)
        assert self.ready(queue) == n

    def publish(self, queue: str, *bodies: bytes, **props: object) -> None:
        for body in bodies:
            self.ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2,
                                                                        **props))

    def drain(self, queue: str, timeout: float = 1.0) -> list[tuple[object, object, bytes]]:
        """Every message now in `queue` (acked)."""
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, props, body = self.ch.basic_get(queue, auto_ack=True)
            if method is None:
                if out:
                    break
                time.sleep(0.02)
                continue
            out.append((method, props, body))
        return out

    def delete(self, queue: str) -> None:
        self.ch.queue_delete(queue)

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


@pytest.fixture
def witness(url: str) -> Iterator[Witness]:
    w = Witness(url)
    yield w
    w.close()


def wait_for(pred: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
