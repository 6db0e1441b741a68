"""A consumer: a queue's subscription on a channel, with its own prefetch (Q3 global=false)."""

from __future__ import annotations

from typing import Any

from ackmq.broker.arguments import DELIVERY_COUNT_ARG, SEQ_ARG, opt_in
from ackmq.broker.retry import backoff_of


class Consumer:
    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "limit", "unacked",
                 "active", "parked", "arguments", "seq_header", "count_header", "priority",
                 "backoff", "timeout_ms", "credit")

    def __init__(self, tag: str, channel: Any, queue: Any, no_ack: bool, exclusive: bool,
                 limit: int, arguments: dict[str, Any] | None = None) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.limit = 0 if no_ack else limit  # Q5: no-ack consumers ignore prefetch
        self.unacked = 0
        self.active = False  # in the queue's round-robin deque
        self.parked = False  # waiting in its channel's deque for channel-wide room
        self.arguments = arguments or {}
        # the headers ackmq adds only when asked: by the queue or by this consume's arguments
        self.seq_header = queue.seq_header or opt_in(self.arguments, SEQ_ARG)
        self.count_header = queue.count_header or opt_in(self.arguments, DELIVERY_COUNT_ARG)
        p = self.arguments.get("x-priority", 0)  # checked at consume: an integer
        self.priority = p if type(p) is int else 0  # RabbitMQ's consumer priorities
        # L6: this consumer's back-off for what it requeues (None: the queue's)
        self.backoff = backoff_of(self.arguments) if self.arguments else None
        t = self.arguments.get("x-consumer-timeout")  # L7: checked at consume
        self.timeout_ms: int | None = t if type(t) is int and t >= 0 else None
        # AMQP 1.0 link credit (A5): when set, at most this many more deliveries, acked or
        # not; the front end counts it down as it delivers and up on the client's flow
        self.credit: int | None = None

    def own_room(self) -> bool:
        """Below its own prefetch (Q3 global=false); the channel may still be full."""
        if self.credit is not None and self.credit <= 0:
            return False
        return self.no_ack or self.limit == 0 or self.unacked < self.limit

    def has_room(self) -> bool:
        if self.credit is not None and self.credit <= 0:
            return False
        if self.no_ack:
            return self.channel.can_send()
        return (self.limit == 0 or self.unacked < self.limit) and self.channel.has_room()
