"""The stream queue type (R1-R3), after RabbitMQ 3.10's `rabbit_stream_queue` over AMQP
0-9-1: messages are appended to a log (a StreamLog of the broker's StreamStorage) and
never removed by consumption; each consumer reads from its own offset, with its own
prefetch as credit, and an ack only gives that credit back. Every delivery carries
`x-stream-offset` (a signed long), spliced into the properties when the record is read.

The queue holds no message: a consumer is an offset and its credit; a delivery reads
its records from the log in batches (a seek by the log's sparse index, then one pread
for many records), so a stream's length costs no broker memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ackmq.broker import stream_args
from ackmq.broker.arguments import as_text
from ackmq.broker.consumer import Consumer
from ackmq.broker.errors import NOT_IMPLEMENTED, HardError
from ackmq.broker.message import Message
from ackmq.broker.queue_type import ACK, QUEUE_TYPES, RECOVER, Queue, QueueEntry
from ackmq.protocol.amqp.properties import properties_with_header

if TYPE_CHECKING:
    from ackmq.broker.host import QueueHost
    from ackmq.broker.storage import QueuedMessages, StreamLogLike

OFFSET_HEADER = "x-stream-offset"

READ_BATCH = 256  # records read from the log at once for one consumer
TRACK_PUBLISHER, TRACK_OFFSET = 0, 1  # the log's tracking kinds (X3, X4)


class StreamReader(Protocol):
    """A reader of the log outside the model's consumers (a stream-protocol subscription,
    which reads whole chunks straight from the log): told when records were appended
    and when the stream is gone."""

    def appended(self) -> None: ...
    def stream_deleted(self) -> None: ...


def _int(args: dict[str, Any], key: str) -> int | None:
    v = args.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class StreamQueue(Queue):
    kind = "stream"
    vhost: QueueHost
    equivalence_keys = stream_args.EQUIVALENCE_KEYS
    server_named = False

    def __init__(self, vhost: QueueHost, name: str, durable: bool = True, exclusive_owner: Any = None,
                 auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                 epoch: int = 0) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments, epoch)
        self.deleted = False
        self.consumers: dict[int, Consumer] = {}
        self.consumer_timeout = _int(self.arguments, "x-consumer-timeout")
        self.seq_header = False
        self.count_header = False
        self.persistent_store = vhost.store if durable else None
        self.log: StreamLogLike | None = None
        self._offsets: dict[int, int] = {}   # consumer id -> next offset to deliver
        self._waiting: dict[int, Consumer] = {}  # consumers with credit, caught up or not
        self.readers: dict[int, StreamReader] = {}  # by id(): told of appends and deletion
        # X5: single active consumer groups of the stream protocol's subscriptions, by
        # consumer name, in subscription order: the first is the active one
        self.groups: dict[str, list[Any]] = {}

    def __repr__(self) -> str:
        return f"<StreamQueue {self.name!r}>"

    # -- declare ------------------------------------------------------------------------
    @classmethod
    def check_declare(cls, arguments: dict[str, Any], name: str, vhost: str, durable: bool,
                      exclusive: bool, auto_delete: bool) -> None:
        stream_args.check_declare(arguments, name, vhost, durable, exclusive, auto_delete)

    def declared(self, new: bool) -> None:
        streams = self.vhost.broker.streams
        if streams is None:
            raise HardError(NOT_IMPLEMENTED, "stream queues need the broker's stream storage")
        self.log = streams.open(self.vhost.name, self.name, new, *self._retention())

    def _retention(self) -> tuple[int, int | None, int | None]:
        """(segment size, max bytes, max age in ms) from the effective arguments
        (declared ⊕ policy ⊕ operator policy, broker/policy.py)."""
        a = self.vhost.broker.policies.queue_arguments(self)
        age = as_text(a.get("x-max-age"))
        age_ms = None
        if age is not None:
            try:
                age_ms = stream_args.max_age_ms(age)
            except HardError:
                age_ms = None
        return (_int(a, "x-stream-max-segment-size-bytes") or 0,  # 0: the default
                _int(a, "x-max-length-bytes"), age_ms)

    def apply_policy(self) -> None:
        """A policy changed (M7): the new retention, applied as segments roll."""
        if self.log is not None:
            self.log.retain(*self._retention())

    def recover(self, messages: QueuedMessages, hot: int | None) -> int:
        return 0  # a stream's records are in its own log, not the main store

    # -- counters -----------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Records in the stream (RabbitMQ: committed offset + 1 - first offset, which it
        refreshes every few seconds; ackmq's is current)."""
        lg = self.log
        return 0 if lg is None else lg.next_offset - lg.first_offset

    @property
    def consumer_count(self) -> int:
        """What declare-ok reports: 0, as RabbitMQ 3.10's stat for a stream, whatever
        reads it (`consumers` has them)."""
        return 0

    @property
    def unacked_count(self) -> int:
        return sum(c.unacked for c in self.consumers.values())

    # -- publish ------------------------------------------------------------------------
    def publish(self, message: Message) -> bool:
        lg = self.log
        if lg is None or self.deleted:
            return False
        lg.append(message.exchange, message.routing_key, message.properties, message.body)
        self._appended(lg)
        return True

    def publish_records(self, exchange: str, routing_key: str,
                        records: Sequence[tuple[bytes, bytes]],
                        publisher: tuple[str, int] | None = None) -> bool:
        """Several (properties, body) records published together (a stream-protocol
        Publish frame, broker/operations.py's `publish_stream`): appended in one go,
        consumers and readers told once. `publisher`: a named publisher's (reference,
        last publishing id), kept with the records (X3)."""
        lg = self.log
        if lg is None or self.deleted:
            return False
        first = lg.append_many(exchange, routing_key, records)
        if publisher is not None:
            lg.track_publish(first, *publisher)
        self._appended(lg)
        return True

    def _appended(self, lg: StreamLogLike) -> None:
        """What follows an append: the store told, waiting consumers and readers woken."""
        self.vhost.broker.streams.appended(self.vhost.name, self.name, lg)  # type: ignore[union-attr]
        if self._waiting:
            self.dispatch()
        if self.readers:
            for r in self.readers.values():
                r.appended()

    # -- the stream protocol: offsets, tracking, readers outside the model ---------------
    def start_offset(self, how: str, value: Any = None) -> int:
        """Where a reader starts, by `stream_args.start_spec`'s (how, value): first, last
        (the newest chunk), next, timestamp (ms) or an offset (the first retained one if
        below it)."""
        lg = self.log
        assert lg is not None
        if how == "first":
            return lg.first_offset
        if how == "last":  # the newest chunk: what was written together last
            return lg.last_chunk
        if how == "next":
            return lg.next_offset
        if how == "timestamp":
            return lg.offset_for_timestamp(value)
        return max(int(value), lg.first_offset)

    def tracked(self, kind: int, ref: str) -> int | None:
        return None if self.log is None else self.log.tracked(kind, ref)

    def tracked_all(self) -> list[tuple[int, str, int]]:
        return [] if self.log is None else self.log.tracked_all()

    def track_publish(self, first: int, ref: str, value: int) -> None:
        """A named publisher's sequence `value` kept with its records from offset `first`
        on, appended this turn one by one (the firehose's way, `publish_stream`)."""
        lg = self.log
        if lg is not None and not self.deleted:
            lg.track_publish(first, ref, value)

    def track(self, kind: int, ref: str, value: int) -> None:
        """A publisher's sequence or a consumer's offset, durable with this turn's commit."""
        lg = self.log
        if lg is None or self.deleted:
            return
        lg.track(kind, ref, value)
        self.vhost.broker.streams.appended(self.vhost.name, self.name, lg)  # type: ignore[union-attr]

    # -- consumers ------------------------------------------------------------------------
    def check_consume(self, arguments: dict[str, Any], no_ack: bool, exclusive: bool,
                      prefetch: int) -> None:
        stream_args.check_consume(arguments, self.name, self.vhost.name, no_ack, prefetch)

    def add_consumer(self, c: Consumer) -> None:
        how, value = stream_args.start_spec(c.arguments)
        start = self.start_offset(how, value)
        self.consumers[id(c)] = c
        self._offsets[id(c)] = start
        self.activate(c)

    def remove_consumer(self, c: Consumer) -> None:
        if self.consumers.pop(id(c), None) is None:
            return
        self._offsets.pop(id(c), None)
        self._waiting.pop(id(c), None)
        c.active = False

    def activate(self, c: Consumer) -> None:
        if id(c) not in self.consumers or self.deleted:
            return
        if not c.has_room():
            c.active = False
            self._waiting.pop(id(c), None)
            c.channel.park(c)
            return
        c.active = True
        self._waiting[id(c)] = c
        self._serve(c)

    def dispatch(self) -> None:
        for c in list(self._waiting.values()):
            self._serve(c)

    def _serve(self, c: Consumer) -> None:
        """Deliver to `c` from its offset while it has credit and the log has records."""
        lg = self.log
        key = id(c)
        if lg is None:
            return
        deliver, consumers, offsets = c.channel.deliver, self.consumers, self._offsets
        while True:
            offset = offsets[key]
            if offset >= lg.next_offset:
                return  # caught up: stays waiting for the next publish
            room = c.limit - c.unacked
            if room <= 0 or not c.has_room():
                c.active = False
                self._waiting.pop(key, None)
                c.channel.park(c)
                return
            records = lg.read(offset, min(room, READ_BATCH))
            if not records:
                return
            for off, _ts, exchange, routing_key, props, body in records:
                offsets[key] = off + 1
                props = properties_with_header(props, OFFSET_HEADER, off)
                deliver(c, QueueEntry(Message(exchange, routing_key, props, body, trusted=True),
                                      off, self))
                if key not in consumers or not c.has_room():
                    break

    def browse(self, offset: int, count: int) -> list[QueueEntry]:
        """A stream by offset range: the records from stream offset `offset` (the first
        one kept if older), each with its `x-stream-offset` as a consumer sees it."""
        lg = self.log
        out: list[QueueEntry] = []
        if lg is None:
            return []
        offset = max(offset, lg.first_offset)
        while len(out) < count and offset < lg.next_offset:
            records = lg.read(offset, min(count - len(out), READ_BATCH))
            if not records:
                break
            for off, _ts, exchange, routing_key, props, body in records:
                props = properties_with_header(props, OFFSET_HEADER, off)
                out.append(QueueEntry(Message(exchange, routing_key, props, body, trusted=True),
                                      off, self))
            offset = records[-1][0] + 1
        return out[:count]

    # -- pull and settle ------------------------------------------------------------------
    def get(self) -> QueueEntry | None:
        raise HardError(NOT_IMPLEMENTED, "basic.get not supported by stream queues "
                                         f"{stream_args.rs(self.name, self.vhost.name)}")

    def delivered(self, entry: QueueEntry, ack_required: bool) -> None:
        pass  # nothing leaves a stream

    def check_settle(self, action: str) -> None:
        """basic.nack / basic.reject / basic.recover on a stream's delivery: refused."""
        if action == RECOVER:
            raise stream_args.internal_error()  # RabbitMQ 3.10's channel crashes (541)
        if action != ACK:
            raise HardError(NOT_IMPLEMENTED, "basic.nack and basic.reject not supported by "
                                             f"stream queues {stream_args.rs(self.name, self.vhost.name)}")

    def settle(self, entry: QueueEntry, action: str, backoff: Any = None) -> bool:
        return False  # an ack, or a requeue on close: only the consumer's credit comes back

    # -- admin ----------------------------------------------------------------------------
    def purge(self) -> int:
        raise HardError(NOT_IMPLEMENTED, "queue.purge not supported by stream queues "
                                         f"{stream_args.rs(self.name, self.vhost.name)}")

    def deletion(self, if_unused: bool, if_empty: bool) -> int:
        return 0  # RabbitMQ 3.10 deletes a stream whatever if-unused / if-empty say

    def touch(self) -> None:
        pass

    def destroy(self) -> None:
        self.deleted = True
        self._waiting.clear()
        self._offsets.clear()
        readers, self.readers = self.readers, {}
        for r in readers.values():
            r.stream_deleted()
        streams = self.vhost.broker.streams
        if streams is not None and self.log is not None:
            streams.remove(self.vhost.name, self.name)
        self.log = None


QUEUE_TYPES["stream"] = StreamQueue
