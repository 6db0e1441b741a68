"""A vhost's firehose tracer (SPEC M9) and ackmq's lifecycle events (SPEC S10).

Off (the default) a vhost's `trace` is None and the hot paths pay one attribute check.
On (`ackmq ctl trace_on`, as `rabbitmqctl trace_on`), every publish through a channel
and every delivery (consume or get) is copied to the vhost's `amq.rabbitmq.trace`
(topic, internal) as RabbitMQ 3.10 copies them: `publish.<exchange>` and
`deliver.<queue>`, the body as it is, the facts in headers (protocol/amqp/firehose.py).
With `lifecycle` (`trace_on --lifecycle`) the same exchange also carries ackmq's own
events, headers only, no body: `route.<exchange>`, `confirm.<exchange>` (with the
commit's fsync time), `ack.<queue>`, `nack.<queue>`, `reject.<queue>`,
`deadletter.<queue>`, `expire.<queue>`, `drop.<queue>` (max-length, delivery limit);
every event, the publish and deliver copies included, then carries `x-ackmq-id` (one
per published message, kept by its dead-lettered copy) and `x-ackmq-time-us`, so
events join on it (`ackmq pipeline audit`: spark/audit.py).

Nothing about the trace exchange's own messages is traced (RabbitMQ skips them too), so
a consumer of the copies adds no copies. The state is not persistent (RabbitMQ's
neither): a restarted broker traces nothing until asked again.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ackmq.broker.message import Message
from ackmq.broker.queue_type import REQUEUE
from ackmq.protocol.amqp.firehose import copy_properties, event_properties
from ackmq.protocol.amqp.properties import FLAGS

if TYPE_CHECKING:
    from ackmq.broker.exchange import Exchange
    from ackmq.broker.host import QueueHost
    from ackmq.broker.queue_type import Queue, QueueEntry


class TracedChannel(Protocol):
    """What an event names of its channel (a `ChannelModel`, above the tracer)."""

    @property
    def owner(self) -> Any: ...
    @property
    def output(self) -> object: ...
    @property
    def user(self) -> str | None: ...


class Settled(Protocol):
    """A settled delivery (the channel's `Delivery`)."""

    @property
    def entry(self) -> QueueEntry: ...

TRACE_EXCHANGE = "amq.rabbitmq.trace"
ID_HEADER = "x-ackmq-id"
TIME_HEADER = "x-ackmq-time-us"
SEQ_HEADER = "seq"  # the message's seq in the queue (x-ackmq-seq is the reader's own)

MESSAGE_ID_FLAG = FLAGS["message_id"]  # in the low byte of the property flags
_BOOT = os.urandom(4).hex()  # ids stay unique across restarts without a store
_COUNTER = itertools.count(1)


def trace_id(msg: Message) -> str:
    """The message's broker identity for lifecycle events, given on first use."""
    tid = getattr(msg, "trace_id", None)
    if tid is None:
        tid = msg.trace_id = f"{_BOOT}-{next(_COUNTER)}"
    return tid


def _now_us() -> int:
    return time.time_ns() // 1000


class Tracer:
    """What `VHost.trace` holds while tracing is on: the hooks turn model events into
    messages on `amq.rabbitmq.trace`. `connection_name(owner)` names a channel's
    connection as the management API does ("peer -> local"), given by the server."""

    def __init__(self, vhost: QueueHost, node: str, connection_name: Callable[[Any], str],
                 lifecycle: bool = False) -> None:
        self.vhost = vhost
        self.node = node
        self.connection_name = connection_name
        self.lifecycle = lifecycle
        self._busy = False  # emitting: what the copies themselves cause is not traced
        # confirms owed after a commit: (id(channel), confirm seq) -> (exchange, msg, t0)
        self._owed: dict[tuple[int, int], tuple[str, Message, float]] = {}

    # -- emitting -----------------------------------------------------------------
    def _emit(self, key: str, properties: bytes, body: bytes = b"") -> None:
        x = self.vhost.exchanges.get(TRACE_EXCHANGE)
        if x is None or self._busy:
            return
        msg = Message(TRACE_EXCHANGE, key, properties, body, trusted=True)
        self._busy = True
        try:
            for q in self.vhost.route(x, msg):
                q.publish(msg)
        finally:
            self._busy = False

    def _ours(self, msg: Message | None) -> bool:
        return msg is None or msg.exchange == TRACE_EXCHANGE or self._busy

    def _event(self, kind: str, name: str, msg: Message,
               entries: list[tuple[str, Any]]) -> None:
        head: list[tuple[str, Any]] = [("event", kind), ("vhost", self.vhost.name),
                                       ("node", self.node), (ID_HEADER, trace_id(msg)),
                                       (TIME_HEADER, _now_us())]
        mid = self._message_id(msg)
        if mid is not None:
            head.append(("message_id", mid))
        self._emit(f"{kind}.{name}", event_properties(head + entries))

    def _channel_tail(self, ch: TracedChannel) -> list[tuple[str, Any]]:
        try:
            conn = self.connection_name(ch.owner) if ch.owner is not None else ""
        except Exception:  # an internal channel (management publish/get)
            conn = ""
        return [("vhost", self.vhost.name), ("connection", conn),
                ("channel", getattr(ch.output, "number", 0)), ("user", ch.user or "")]

    def _ids(self, msg: Message) -> list[tuple[str, Any]]:
        """What lifecycle tracing adds to a publish or deliver copy (after RabbitMQ's)."""
        if not self.lifecycle:
            return []
        out: list[tuple[str, Any]] = [(ID_HEADER, trace_id(msg)), (TIME_HEADER, _now_us())]
        mid = self._message_id(msg)
        if mid is not None:
            out.append(("message_id", mid))
        return out

    @staticmethod
    def _message_id(msg: Message) -> str | None:
        if not msg.properties[1] & MESSAGE_ID_FLAG:
            return None
        return msg.view.message_id

    # -- the firehose (M9) ------------------------------------------------------------
    def published(self, ch: TracedChannel, x: Exchange, msg: Message,
                  queues: list[Queue]) -> None:
        """A channel's publish, routed to `queues` (none: unroutable)."""
        if self._ours(msg):
            return
        keys = [msg.routing_key, *msg.cc]
        routed = [q.name for q in queues]
        tail = [("node", self.node), *self._channel_tail(ch), ("routed_queues", routed),
                *self._ids(msg)]
        self._emit("publish." + x.name, copy_properties(x.name, keys, msg.properties, tail),
                   msg.body)
        if self.lifecycle:
            self._event("route", x.name, msg, [("exchange_name", x.name),
                                               ("routing_keys", keys),
                                               ("routed_queues", routed)])

    def delivered(self, ch: TracedChannel, entry: QueueEntry) -> None:
        """A delivery to a consumer or a basic.get."""
        msg = entry.message
        if msg is None or self._ours(msg):
            return
        tail: list[tuple[str, Any]] = [("node", self.node),
                                       ("redelivered", int(entry.redelivered)),
                                       *self._channel_tail(ch)]
        if self.lifecycle:
            tail += [*self._ids(msg), ("queue", entry.queue.name), (SEQ_HEADER, entry.seq),
                     ("delivery_count", entry.delivery_count)]
        self._emit("deliver." + entry.queue.name,
                   copy_properties(msg.exchange, [msg.routing_key, *msg.cc],
                                   msg.properties, tail), msg.body)

    # -- lifecycle (S10) ------------------------------------------------------------
    def confirm_owed(self, ch: TracedChannel, seq: int, x: Exchange, msg: Message,
                     stored: bool, refused: bool) -> None:
        """A publish in confirm mode: confirmed now, or once the store's commit is synced."""
        if not self.lifecycle or self._ours(msg):
            return
        if stored and not refused:
            self._owed[(id(ch), seq)] = (x.name, msg, time.monotonic())
        else:
            self._confirm(x.name, msg, not refused, 0, 0)

    def committed(self, ch: TracedChannel, seq: int, commit_t0: float,
                  failed: bool) -> None:
        """The store's commit that started at `commit_t0` (monotonic; 0: unknown) is
        synced (or failed): the confirm owed for `seq` goes out."""
        owed = self._owed.pop((id(ch), seq), None)
        if owed is None:
            return
        xname, msg, t0 = owed
        now = time.monotonic()
        self._confirm(xname, msg, not failed, int((now - commit_t0) * 1e6) if commit_t0
                      else 0, int((now - t0) * 1e6))

    def _confirm(self, xname: str, msg: Message, ack: bool, fsync_us: int,
                 latency_us: int) -> None:
        self._event("confirm", xname, msg, [("exchange_name", xname), ("ack", ack),
                                            ("fsync_us", fsync_us),
                                            ("latency_us", latency_us)])

    def settled(self, verb: str, action: str, taken: Iterable[tuple[int, Settled]]) -> None:
        """ack / nack / reject of deliveries (`action`: the queue's ACK, REQUEUE, REJECT)."""
        if not self.lifecycle:
            return
        requeue = action == REQUEUE
        for _tag, d in taken:
            entry = d.entry
            msg = entry.message
            if msg is None or self._ours(msg):
                continue
            extra: list[tuple[str, Any]] = [("queue", entry.queue.name),
                                            (SEQ_HEADER, entry.seq),
                                            ("delivery_count", entry.delivery_count)]
            if verb != "ack":
                extra.append(("requeue", requeue))
            self._event(verb, entry.queue.name, msg, extra)

    def dead_lettered(self, queue: Queue, entry: QueueEntry, reason: str, x: Exchange,
                      copy: Message) -> None:
        """`entry` leaves `queue` for the dead-letter exchange `x` as `copy`, which keeps
        the original's identity (its later events join the original's)."""
        msg = entry.message
        if msg is None or self._ours(msg):
            return
        copy.trace_id = trace_id(msg)
        if not self.lifecycle:
            return
        routed = [q.name for q in self.vhost.route(x, copy)]
        self._event("deadletter", queue.name, msg, [
            ("queue", queue.name), (SEQ_HEADER, entry.seq), ("reason", reason),
            ("exchange_name", x.name), ("routing_keys", [copy.routing_key, *copy.cc]),
            ("routed_queues", routed)])

    def dropped(self, queue: Queue, entry: QueueEntry, reason: str) -> None:
        """A message leaves `queue` unconsumed: expired (TTL), or over max-length or the
        delivery limit (`drop`); a rejection is the nack/reject event's."""
        msg = entry.message
        if not self.lifecycle or msg is None or self._ours(msg) or reason == "rejected":
            return
        self._event("expire" if reason == "expired" else "drop", queue.name, msg, [
            ("queue", queue.name), (SEQ_HEADER, entry.seq), ("reason", reason),
            ("dead_lettered", queue.dlx is not None)])
