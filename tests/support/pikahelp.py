"""Small waits and checks the pika-based conformance tests share."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

WAIT = 5.0  # upper bound for anything that should happen "soon"


def uniq(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def ready_count(ch: BlockingChannel, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_ready(ch: BlockingChannel, queue: str, n: int, timeout: float = WAIT) -> None:
    """Poll until the queue holds exactly n ready messages (requeues are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        got = ready_count(ch, queue)
        if got == n:
            return
        assert time.monotonic() < deadline, f"{queue}: {got} ready, expected {n}"
        time.sleep(0.02)


def take(ch: BlockingChannel, queue: str, auto_ack: bool = True):  # type: ignore[no-untyped-def]
    """basic.get that must find a message (polling briefly for asynchronous arrivals)."""
    deadline = time.monotonic() + WAIT
    while True:
        m, p, b = ch.basic_get(queue, auto_ack=auto_ack)
        if m is not None:
            return m, p, b
        assert time.monotonic() < deadline, f"nothing on {queue}"
        time.sleep(0.02)


def drain_ints(ch: BlockingChannel, queue: str) -> list[int]:
    """basic.get (auto-ack) until `queue` is empty: the bodies, as ints, in order."""
    out = []
    while True:
        m, _p, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append(int(body))


def closed_with(fn: Callable[[], object], code: int, text: str | None = None) -> str:
    """Run fn; the broker must close the channel with `code` (and exactly `text`)."""
    with pytest.raises(ChannelClosedByBroker) as ei:
        fn()
    assert ei.value.reply_code == code, ei.value
    if text is not None:
        assert ei.value.reply_text == text
    return ei.value.reply_text


def confirmed_publisher(url: str, queue: str, name: str, confirmed: list[str],
                        stop: threading.Event) -> None:
    """Publish persistent messages to `queue` one by one in confirm mode, recording each
    confirmed body, until `stop` or the broker dies (the kill tests' load: a message
    whose confirm the kill took is unconfirmed, so it is not recorded)."""
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        n = 0
        while not stop.is_set():
            body = f"{name}-{n}"
            n += 1
            ch.basic_publish("", queue, body.encode(),
                             pika.BasicProperties(delivery_mode=2))  # raises on nack
            confirmed.append(body)
    except Exception:  # the kill: connection lost mid-publish
        return
