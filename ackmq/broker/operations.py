"""The operation layer (SPEC C1): the topology verbs every front end calls — declare,
bind, unbind, purge, delete a queue or an exchange — each checking what RabbitMQ's
`rabbit_channel` checks before it acts: the user's permissions (U3, topic permissions
included), another connection's exclusive queue (405), the reserved names, limits (U6);
equivalence and arguments are the vhost's own checks at the point it makes the change.
`VHost` does the mechanics only and checks no permission.

A mixin of `ChannelModel` (broker/channel.py), whose publish, get, consume, cancel, ack,
nack, reject and recover are the message verbs; AMQP 0-9-1, AMQP 1.0 (links and
`/management`), STOMP, the HTTP API, the UI and ctl translate their grammar to these
calls and re-check nothing. The stream protocol's Publish is one verb here too
(`publish_stream`: a frame's records, checked once and appended together). `access`
None means no permission checks (the broker's own uses); `superuser` (the admin
socket, as rabbitmqctl) skips exclusivity too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import READ, WRITE
from ackmq.broker.arguments import as_text
from ackmq.broker.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    HardError,
    SoftError,
    not_found,
)
from ackmq.broker.exchange import EXCHANGE_CLASSES
from ackmq.broker.vhost import DEFAULT_EXCHANGE_REFUSED

if TYPE_CHECKING:
    from ackmq.broker.confirms import ConfirmTracker
    from ackmq.broker.exchange import Exchange
    from ackmq.broker.queue_type import Queue
    from ackmq.broker.stream import StreamQueue
    from ackmq.broker.vhost import VHost


class Operations:
    """The verbs; `ChannelModel` supplies the state below."""

    vhost: VHost
    owner: Any  # the connection: exclusive queues belong to it
    access: Any  # ackmq.broker.access.ChannelAccess, or None: no permission checks
    superuser: bool
    last_queue: str
    open: bool
    broker: Any  # ackmq.broker.broker.Broker
    confirms: ConfirmTracker | None
    stats: Any  # ackmq.broker.stats.MessageStats

    def queue_name(self, name: str) -> str:
        """Expand RabbitMQ's shortcut: "" is the channel's last declared queue (AMQP
        0-9-1's front end expands it; the verbs take names as they are)."""
        if name:
            return name
        if not self.last_queue:
            raise SoftError(NOT_FOUND, "no previously declared queue")
        return self.last_queue

    # -- lookups --------------------------------------------------------------------
    def _queue(self, name: str) -> Queue:
        """The queue `name`: 404 if missing, 405 if another connection's exclusive one."""
        vh = self.vhost
        q = vh.queues.get(name)
        if q is None:
            raise not_found("queue", name, vh.name)
        if not self.superuser:
            vh.check_exclusive(q, self.owner)
        return q

    # -- exchanges --------------------------------------------------------------------
    def declare_exchange(self, name: str, type_: str, passive: bool = False,
                         durable: bool = False, auto_delete: bool = False,
                         internal: bool = False, arguments: dict[str, Any] | None = None
                         ) -> Exchange:
        """exchange.declare: configure on the exchange; a new one with an
        alternate-exchange also needs read on itself and write on the AE
        (rabbit_channel's order: after the name checks, before the reserved prefix)."""
        args = arguments or {}
        access = self.access

        def permit(existing: Exchange | None) -> None:
            if type_ not in EXCHANGE_CLASSES:
                raise HardError(COMMAND_INVALID, f"unknown exchange type '{type_}'")
            access.configure("exchange", name)
            if existing is None and not name.startswith("amq."):
                ae = as_text(args.get("alternate-exchange"))
                if ae is not None:
                    access.read("exchange", name)
                    access.write("exchange", ae)

        return self.vhost.declare_exchange(name, type_, passive, durable, auto_delete,
                                           internal, args,
                                           permit=None if access is None else permit)

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        """exchange.delete: the default and `amq.*` exchanges are refused first, then
        configure on the exchange; deleting what is not there succeeds (RabbitMQ 3)."""
        self.vhost.check_exchange_deletable(name)
        if self.access is not None:
            self.access.configure("exchange", name)
        self.vhost.delete_exchange(name, if_unused)

    # -- queues -----------------------------------------------------------------------
    def declare_queue(self, name: str, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict[str, Any] | None = None) -> Queue:
        """queue.declare: passive is a lookup (404, 405); otherwise configure on the
        queue (a server-named one too), and for a new queue the vhost's max-queues
        limit (U6) and, with x-dead-letter-exchange, read on itself and write on the
        DLX. The queue becomes the channel's last declared one."""
        args = arguments or {}
        if passive:
            if name == "":
                raise not_found("queue", name, self.vhost.name)
            q = self._queue(name)
        else:
            access = self.access
            vh = self.vhost

            def permit(resolved: str, existing: Queue | None) -> None:
                access.configure("queue", resolved)
                if existing is not None:
                    return
                limit = access.model.vhost_limit(vh.name, "max-queues")
                if limit is not None and len(vh.queues) >= limit:
                    raise SoftError(PRECONDITION_FAILED, f"cannot declare queue '{resolved}': "
                                    f"queue limit in vhost '{vh.name}' ({limit}) is reached")
                dlx = as_text(args.get("x-dead-letter-exchange"))
                if dlx is not None:
                    access.read("queue", resolved)
                    access.write("exchange", dlx)

            q = vh.declare_queue(name, False, durable, exclusive, auto_delete, args,
                                 self.owner, permit=None if access is None else permit)
        self.last_queue = q.name
        return q

    def ensure_queue(self, name: str, durable: bool = True) -> Queue:
        """A destination naming a queue to use (AMQP 1.0's `/queue/` address): declared
        if missing, used as it is if not (no equivalence), configure either way, as
        RabbitMQ 4's address v1."""
        if name in self.vhost.queues:
            if self.access is not None:
                self.access.configure("queue", name)
            return self._queue(name)
        return self.declare_queue(name, durable=durable)

    def purge(self, name: str) -> int:
        """queue.purge: read on the queue, then 404 / 405; the ready messages removed."""
        if self.access is not None:
            self.access.read("queue", name)
        return int(self._queue(name).purge())

    def delete_queue(self, name: str, if_unused: bool = False, if_empty: bool = False,
                     notify: bool = True) -> int:
        """queue.delete: configure on the queue, then 405 for another connection's
        exclusive queue; a missing queue is deleted already (0, as RabbitMQ 3). The
        messages it held."""
        if self.access is not None:
            self.access.configure("queue", name)
        vh = self.vhost
        if name not in vh.queues:
            return 0
        q = self._queue(name)
        return int(vh.delete_queue(q, notify=notify, if_unused=if_unused, if_empty=if_empty))

    # -- bindings ---------------------------------------------------------------------
    def check_bind(self, kind: str, destination: str, source: str, key: str) -> None:
        """U3 for (un)bind, in rabbit_channel's order: write on the destination, the
        default exchange refused as either end, read on the source, then (the source
        an existing topic exchange) the user's topic permission on the binding key."""
        access = self.access
        if access is not None:
            access.write(kind, destination)
        if source == "" or (kind == "exchange" and destination == ""):
            raise SoftError(ACCESS_REFUSED, DEFAULT_EXCHANGE_REFUSED)
        if access is not None:
            access.read("exchange", source)
            if access.topics:
                x = self.vhost.exchanges.get(source)
                if x is not None:
                    access.check_topic(READ, x, key)

    def bind(self, kind: str, destination: str, source: str, key: str,
             arguments: dict[str, Any] | None = None) -> None:
        """queue.bind (`kind` "queue") or exchange.bind ("exchange"): `check_bind`, then
        the destination (404, 405) and the source (404)."""
        self.check_bind(kind, destination, source, key)
        vh = self.vhost
        dest: Any = self._queue(destination) if kind == "queue" else vh.exchange(destination)
        vh.exchange(source)
        vh.bind(source, dest, key, arguments or {})

    def unbind(self, kind: str, destination: str, source: str, key: str,
               arguments: dict[str, Any] | None = None) -> None:
        """queue.unbind / exchange.unbind: `check_bind`; unbinding what is not bound
        succeeds (the vhost refuses another connection's exclusive queue, 405)."""
        self.check_bind(kind, destination, source, key)
        self.vhost.unbind(source, kind, destination, key, arguments or {}, self.owner)

    # -- publishers -------------------------------------------------------------------
    def check_publisher(self, exchange: str) -> None:
        """A publisher that names its exchange up front (an AMQP 1.0 target at attach,
        as RabbitMQ 4): write on it. A topic permission depends on each message's
        routing key; the publish checks it."""
        if self.access is not None:
            self.access.check(WRITE, "exchange", exchange)

    def check_stream_writer(self, queue: str) -> None:
        """A stream-protocol publisher (declare publisher) or an offset it stores: write
        on the stream itself, as RabbitMQ's stream plugin checks the stream resource."""
        if self.access is not None:
            self.access.write("queue", queue)

    def check_stream_reader(self, queue: str) -> None:
        """A stream-protocol subscription, which reads the log without a model consumer:
        read on the stream, as basic.consume."""
        if self.access is not None:
            self.access.read("queue", queue)

    def publish_stream(self, queue: StreamQueue, records: Sequence[tuple[bytes, bytes]],
                       publisher: tuple[str, int] | None = None) -> int:
        """A stream-protocol Publish frame's (properties, body) records, appended to the
        stream together (SPEC X1-X3) on a channel in confirm mode. Checked once for the
        frame: write on the default exchange (the publish's way in, cached per channel
        as `basic_publish` caches it) and the stream still there (404). Written as
        RabbitMQ's stream plugin writes to its log: not routed, properties not read (no
        CC routing, user-id or expiration check: the plugin makes none). One confirm
        sequence number covers the records: confirmed (or nacked) once the turn's
        commit has fdatasynced them (P5c); returned (0: no records). `publisher`: a
        named publisher's (reference, last publishing id), kept with the records (X3).
        With the firehose on (S10) each record goes through `basic_publish`, which
        traces it."""
        if not records:
            return 0
        access = self.access
        if access is not None and "" not in access.write_exchanges:
            access.check_publish("")
        vh = self.vhost
        if queue.deleted or vh.queues.get(queue.name) is not queue:
            raise not_found("queue", queue.name, vh.name)
        confirms = self.confirms
        assert confirms is not None, "a stream publisher's channel confirms"
        if vh.trace is not None:
            model: Any = self
            seq = 0
            first = 0 if queue.log is None else queue.log.next_offset
            for properties, body in records:
                seq = model.basic_publish("", queue.name, False, False, properties, body)[0]
            if publisher is not None:
                queue.track_publish(first, *publisher)
            return seq
        n = len(records)
        stats = self.stats
        stats.received += n
        stats.received_confirm += n
        stats.routed += n
        x = vh.exchange("")
        x.stat_in += n
        x.stat_out += n
        queue.stat_published += n
        seq = confirms.publish()
        if not queue.publish_records("", queue.name, records, publisher):
            confirms.nack(seq)
            self.broker.mark_dirty(self)
            return seq
        confirms.wait(seq)
        self.broker.await_commit_callback(
            lambda exc: self._stream_committed(seq, n, exc))
        return seq

    def _stream_committed(self, seq: int, n: int, exc: BaseException | None) -> None:
        """`publish_stream`'s records are fdatasynced (or failed): its confirm (nack)."""
        confirms = self.confirms
        if not self.open or confirms is None:
            return
        if exc is None:
            confirms.ack(seq)
            self.stats.confirmed += n
        else:
            confirms.nack(seq)
        self.broker.mark_dirty(self)

    def topic_refusal(self, exchange: str, key: str) -> str | None:
        """RabbitMQ's text if the user's topic permission forbids reading `key` from
        `exchange` (a STOMP /topic/ subscription checks it before anything else)."""
        access = self.access
        if access is None or not access.topics:
            return None
        text: str | None = access.topic_refusal(READ, exchange, key)
        return text
