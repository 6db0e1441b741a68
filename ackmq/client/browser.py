"""JMS's QueueBrowser over AMQP 0-9-1 (SPEC V3): `session.browser(queue, selector=None)`
iterates a **stream** queue's messages from its first offset to its end as browsing
starts, nothing consumed (a stream keeps its records; the browser's consumer only
reads them, on a session of its own, acking each to keep its credit). The same on ackmq
and RabbitMQ.

AMQP 0-9-1 has no way to look at a classic or quorum queue without taking the messages
(RabbitMQ's UI "gets and requeues", marking them redelivered), and the client speaks
AMQP only: browsing such a queue raises `NotBrowsable` before anything is delivered
(both brokers refuse a stream offset on it with 406); on ackmq, its management API's
`POST /api/queues/<vhost>/<name>/peek` browses any queue (docs/management.md).

`selector`: a predicate on the Message (JMS's SQL-92 selectors are not parsed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .errors import ChannelClosed, ClientError
from .options import AckMode

if TYPE_CHECKING:
    from .message import Message
    from .sync import Connection

OFFSET_HEADER = "x-stream-offset"
PRECONDITION_FAILED = 406


class NotBrowsable(ClientError):
    """The queue is not a stream: AMQP 0-9-1 cannot browse it (see the module doc)."""


class QueueBrowser:
    """Iterate it (each iteration browses again from the first offset)."""

    def __init__(self, conn: Connection, queue: str,
                 selector: Callable[[Message], bool] | None = None,
                 idle: float = 1.0) -> None:
        self.conn, self.queue, self.selector, self.idle = conn, queue, selector, idle

    def __iter__(self) -> Iterator[Message]:
        s = self.conn.session(AckMode.INDIVIDUAL)
        try:
            end = s.queue_info(self.queue).message_count
            try:
                c = s.consumer(f"{self.queue}?consumer.streamOffset=first"
                               "&consumer.prefetchSize=100")
            except ChannelClosed as e:
                if e.code != PRECONDITION_FAILED:
                    raise
                raise NotBrowsable(
                    f"queue '{self.queue}' is not a stream: AMQP 0-9-1 cannot browse it "
                    "without taking its messages (ackmq's management API can: POST "
                    f"/api/queues/<vhost>/{self.queue}/peek)") from None
            seen = 0
            while end <= 0 or seen < end:
                m = c.receive(timeout=self.idle)
                if m is None:
                    break  # the end (or a stale count: RabbitMQ refreshes it lazily)
                seen += 1
                m.acknowledge()  # a stream's ack only gives the consumer's credit back
                if self.selector is None or self.selector(m):
                    yield m
        finally:
            try:
                s.close()
            except ClientError:
                pass  # the channel was closed by the broker already
