"""STOMP subscriptions (W3-W6): SUBSCRIBE and UNSUBSCRIBE as consumers on the
connection's one model channel, the queues behind /queue/, /topic/, /exchange/ and
/temp-queue/ destinations (declared as RabbitMQ's plugin declares them), and ACK/NACK of
one subscription's deliveries. NACK's redelivery limit and dead-letter target are the
model's (`ChannelModel.nack_with_limit`); this part only says which fallback applies."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ackmq.broker import stream_args
from ackmq.broker.arguments import DELIVERY_COUNT_ARG, SEQ_ARG
from ackmq.broker.errors import ReplyError
from ackmq.broker.queue_type import RETURN
from ackmq.broker.retry import RETRY_ARGS
from ackmq.protocol.stomp import Destination, Frame
from ackmq.protocol.stomp.destinations import (
    AMQQUEUE,
    EXCHANGE,
    QUEUE,
    REPLY_QUEUE,
    TEMP_QUEUE,
    TOPIC,
)
from ackmq.server.stomp.refusal import Refused, boolean_header, quoted

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.queue_type import Queue

ACK_MODES = ("auto", "client", "client-individual")
ACTIVEMQ_DLQ = "ActiveMQ.DLQ"
STOMP_DELIVERY_LIMIT = 6  # W6: ActiveMQ's maximumRedeliveries, for STOMP subscriptions
# SUBSCRIBE headers that become queue arguments, as RabbitMQ's plugin takes them
QUEUE_ARGUMENTS = {"x-dead-letter-exchange": str, "x-dead-letter-routing-key": str,
                   "x-expires": int, "x-max-length": int, "x-max-length-bytes": int,
                   "x-max-priority": int, "x-message-ttl": int, "x-queue-type": str,
                   "x-delivery-limit": int}
# SUBSCRIBE headers passed on as consume arguments: ackmq's opt-in delivery headers
CONSUMER_ARGUMENTS = (SEQ_ARG, DELIVERY_COUNT_ARG)
# ... and the subscription's own timeout and back-off (L6, L7): numbers, in header text
TIMING_ARGUMENTS = ("x-consumer-timeout", *RETRY_ARGS)


class Subscription:
    """One subscription: its consumer tag on the channel and what its frames need."""

    __slots__ = ("id", "tag", "dest_text", "dest", "ack", "queue", "head", "durable")

    def __init__(self, sub_id: str | None, tag: str, dest_text: str, dest: Destination | None,
                 ack: str, queue: str, durable: bool) -> None:
        self.id = sub_id
        self.tag = tag
        self.dest_text = dest_text
        self.dest = dest
        self.ack = ack
        self.queue = queue
        self.durable = durable
        # the MESSAGE headers before destination: RabbitMQ names the subscription only
        # when it has an id
        self.head = [("subscription", sub_id)] if sub_id is not None else []


class Subscriptions:
    """The subscription frames of `StompConnection` (a part of it, kept apart)."""

    channel: ChannelModel | None
    subs: dict[str, Subscription]  # by consumer tag
    timed_out: set[str]  # L7: subscriptions a consumer timeout ended
    reply_queues: dict[str, str]  # temp-queue id -> queue name
    version: str | None
    session: str
    _destination: Callable[[str, Frame], tuple[str, Destination]]
    _tx: Callable[[str], list[tuple[Any, ...]]]

    def _reply_queue(self, reply_to: str) -> str:
        """RabbitMQ's temp-queue: a server-named exclusive queue per /temp-queue/ id,
        consumed by this connection (subscription `/temp-queue/ID`); the message's
        reply-to becomes the queue's name, so AMQP repliers can use it as it is."""
        ch = self.channel
        assert ch is not None
        name = self.reply_queues.get(reply_to)
        if name is not None and name in ch.vhost.queues:
            return name
        q = ch.declare_queue("", False, False, True, True)
        tag = "T_" + reply_to
        ch.basic_consume(q.name, tag, True, False, {})
        self.subs[tag] = Subscription(reply_to, tag, reply_to, None, "auto", q.name, False)
        self.reply_queues[reply_to] = q.name
        ch.start_consumer(tag)
        return q.name

    # -- SUBSCRIBE / UNSUBSCRIBE (W3, W4, W5) --------------------------------------------
    def _on_subscribe(self, f: Frame) -> Callable[[], None]:
        h = f.headers
        sub_id = h.get("id")
        durable = h.get("durable") == "true" or h.get("persistent") == "true"
        if durable and sub_id is None:
            raise Refused("Missing Header", "Header 'id' is required for durable subscriptions")
        text, dest = self._destination("SUBSCRIBE", f)
        if dest.kind == TOPIC:
            self._check_topic_subscription(dest)
        if dest.kind == TEMP_QUEUE:
            raise Refused("Invalid destination",
                           f"'{text}' is not a valid destination for 'SUBSCRIBE'\n")
        if sub_id is not None and sub_id.startswith("/temp-queue/"):
            raise Refused("Invalid id", "SUBSCRIBE 'id' may not start with /temp-queue/\n")
        ack = h.get("ack", "auto")
        if ack not in ACK_MODES:
            raise Refused("Invalid header", f"'ack' must be auto, client or "
                                             f"client-individual, not {ack[:40]!r}\n")
        prefetch = self._prefetch(h)
        tag = "T_" + sub_id if sub_id is not None else "Q_" + text
        if tag in self.subs:
            raise Refused("Duplicated subscription identifier",
                           f"A subscription identified by '{tag}' already exists.")
        ch = self.channel
        assert ch is not None
        queue = self._source_queue(dest, h, sub_id, durable)
        args: dict[str, Any] = {k: h[k] for k in CONSUMER_ARGUMENTS if k in h}
        args.update((k, _number(h[k])) for k in TIMING_ARGUMENTS if k in h)
        try:  # R2 over STOMP, as RabbitMQ's plugin
            offset = stream_args.from_stomp(h.get("x-stream-offset"))
        except ValueError:
            raise Refused("Invalid header", "'x-stream-offset' must be first, last, next, "
                                            "offset=<n> or timestamp=<seconds>\n") from None
        if offset is not None:
            args["x-stream-offset"] = offset
        try:
            ch.basic_consume(queue.name, tag, ack == "auto", False, args, prefetch=prefetch)
        except ReplyError:
            self._drop_unused(queue, dest)
            raise
        self.subs[tag] = Subscription(sub_id, tag, text, dest, ack, queue.name, durable)
        return lambda: ch.start_consumer(tag)  # deliveries after the RECEIPT

    def _check_topic_subscription(self, dest: Destination) -> None:
        """U3: RabbitMQ's plugin checks a /topic/ subscription against the user's topic
        permission (read on amq.topic) before anything else, with its own text (no
        ACCESS_REFUSED prefix); /exchange/ subscriptions meet it at their queue.bind."""
        ch = self.channel
        assert ch is not None
        refusal = ch.topic_refusal("amq.topic", dest.name)
        if refusal is not None:
            raise Refused("access_refused", refusal)

    @staticmethod
    def _prefetch(h: dict[str, str]) -> int | None:
        for name in ("prefetch-count", "activemq.prefetchSize"):
            v = h.get(name)
            if v is not None:
                v = v.strip()
                if not (v.isascii() and v.isdigit()):
                    raise Refused("Invalid header", f"'{name}' must be a whole number, "
                                                     f"not {v[:40]!r}\n")
                return int(v)
        return None  # the channel's (unlimited), as RabbitMQ

    def _source_queue(self, dest: Destination, h: dict[str, str], sub_id: str | None,
                      durable: bool) -> Queue:
        ch = self.channel
        assert ch is not None
        vh = ch.vhost
        if dest.kind == QUEUE:
            return self._declare_queue(dest.name, h, durable=True)
        if dest.kind in (AMQQUEUE, REPLY_QUEUE):
            return ch.declare_queue(dest.name, passive=True)
        # /topic/ and /exchange/: a queue per subscription, bound to the exchange
        exchange, key = ("amq.topic", dest.name) if dest.kind == TOPIC \
            else (dest.name, dest.key or "")
        vh.exchange(exchange)  # 404 before anything is declared
        name = h.get("x-queue-name")
        if name is None:
            seed = sub_id if durable and sub_id is not None else os.urandom(16).hex()
            digest = hashlib.md5(f"{dest.name}\x00{seed}".encode()).digest()
            name = "stomp-subscription-" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
        fresh = name not in vh.queues
        q = self._declare_queue(name, h, durable=durable, auto_delete=True)
        try:
            ch.bind("queue", q.name, exchange, key)
        except ReplyError:
            if fresh:
                self._drop_unused(q, dest)
            raise
        return q

    def _declare_queue(self, name: str, h: dict[str, str], durable: bool,
                       auto_delete: bool = False) -> Queue:
        """Declare as RabbitMQ's plugin does: the durable / persistent, auto-delete and
        exclusive headers override the destination's defaults; x-* headers are
        queue arguments."""
        ch = self.channel
        assert ch is not None
        for header in ("durable", "persistent"):
            b = boolean_header(h.get(header))
            if b is not None:
                durable = b
        b = boolean_header(h.get("auto-delete"))
        if b is not None:
            auto_delete = b
        exclusive = boolean_header(h.get("exclusive")) or False
        args: dict[str, Any] = {}
        for k, kind in QUEUE_ARGUMENTS.items():
            v = h.get(k)
            if v is None:
                continue
            if kind is int:
                try:
                    args[k] = int(v.strip())
                except ValueError:
                    raise Refused("Invalid header",
                                   f"'{k}' must be an integer, not {v[:40]!r}\n") from None
            else:
                args[k] = v.strip()
        return ch.declare_queue(name, False, durable, exclusive, auto_delete, args)

    def _drop_unused(self, q: Queue, dest: Destination) -> None:
        """A subscription queue we declared and could not use goes again."""
        if dest.kind in (TOPIC, EXCHANGE) and q.auto_delete and not q.consumers \
                and not q.deleted:
            ch = self.channel
            assert ch is not None
            ch.vhost.delete_queue(q, notify=False)

    def _on_unsubscribe(self, f: Frame) -> None:
        h = f.headers
        sub_id = h.get("id")
        if sub_id is not None:
            if sub_id.startswith("/temp-queue/"):
                raise Refused("Invalid id", "UNSUBSCRIBE 'id' may not start with "
                                             "/temp-queue/\n")
            tag, desc = "T_" + sub_id, f"id='{sub_id}'"
        elif "destination" in h:
            tag, desc = "Q_" + h["destination"], f"destination='{h['destination']}'"
        else:
            raise Refused("Missing destination or id",
                           "UNSUBSCRIBE must include a 'destination' or 'id' header")
        sub = self.subs.pop(tag, None)
        if sub is None:
            raise Refused("No subscription found",
                           f"UNSUBSCRIBE must refer to an existing subscription.\n"
                           f"Subscription to {desc} not found.\n")
        ch = self.channel
        assert ch is not None
        consumer = ch.consumers.get(tag)
        ch.basic_cancel(tag)
        if consumer is not None:  # its unacked deliveries go back now, not at disconnect
            mine = ch.unacked_of(tag)
            if mine:
                ch.settle(RETURN, ch.take_for_consumer(tag, mine[-1], True))
        if sub.dest is not None and sub.dest.kind == TOPIC and \
                (h.get("durable") == "true" or h.get("persistent") == "true"):
            # ends a durable subscription: a queue.delete, as RabbitMQ's plugin
            ch.delete_queue(sub.queue, notify=False)

    # -- ACK / NACK (W4, W6) ----------------------------------------------------------
    def _on_ack(self, f: Frame) -> None:
        self._ack(f, nack=False)

    def _on_nack(self, f: Frame) -> None:
        self._ack(f, nack=True)

    def _ack(self, f: Frame, nack: bool) -> None:
        cmd = f.command
        header = "id" if self.version == "1.2" else "message-id"
        ack_id = f.headers.get(header)
        if ack_id is None:
            raise Refused("Missing header", f"{quoted(cmd)} must include the {quoted(header)} header\n")
        parts = ack_id.rsplit("@@", 2)
        if len(parts) != 3 or not (parts[2].isascii() and parts[2].isdigit()):
            raise Refused("Invalid header",
                           f"{quoted(cmd)} must include a valid {quoted(header)} header\n")
        ctag, session, tag = parts[0], parts[1], int(parts[2])
        sub = self.subs.get(ctag)
        if sub is None and ctag in self.timed_out and session == self.session:
            return  # L7: its messages went back to the queue when it timed out
        if sub is None or session != self.session:
            raise Refused("Subscription not found",
                           f"Message with id {quoted(ack_id)} has no subscription\n")
        requeue = boolean_header(f.headers.get("requeue"))
        action = ("nack" if nack else "ack", sub, tag, requeue is not False)
        tx = f.headers.get("transaction")
        if tx is not None:
            actions = self._tx(tx)
            ch = self.channel
            assert ch is not None
            ch.check_unacked(ctag, tag)  # refused now as take_for_consumer would
            actions.append(action)
            return
        self._settle(*action)

    def _settle(self, kind: str, sub: Subscription, tag: int, requeue: bool) -> None:
        ch = self.channel
        assert ch is not None
        taken = ch.take_for_consumer(sub.tag, tag, sub.ack == "client")
        if kind == "ack":
            ch.settle("ack", taken)
            return
        # W6: a destination in ActiveMQ's form dead-letters to ActiveMQ.DLQ when its queue
        # has no dead-letter exchange of its own
        fallback = ACTIVEMQ_DLQ if sub.dest is not None and sub.dest.activemq else None
        ch.nack_with_limit(taken, requeue, fallback, STOMP_DELIVERY_LIMIT)


def _number(text: str) -> int | float | str:
    """A header's number as the consume argument it stands for; anything else stays
    text, for the argument's check to refuse (406 -> ERROR)."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text
