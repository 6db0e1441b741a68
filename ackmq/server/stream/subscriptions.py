"""Subscriptions (X1, X2, X5): Subscribe with an offset specification and credit, Credit,
Unsubscribe, and Deliver: each subscription reads its stream's log itself (no model
consumer, no per-message queue entry) and sends whole chunks, one credit each, at the
end of the loop turn (the connection's flush), as long as the socket takes them. A
stream deleted under its readers: MetadataUpdate STREAM_NOT_AVAILABLE, as RabbitMQ.

Single active consumer (`single-active-consumer=true` with a `name`): the subscriptions
of one name on one stream form a group (StreamQueue.groups), the first is active. The
active one is told by ConsumerUpdate(active) and starts from the offset its answer
names; the others get nothing until the active one goes (unsubscribe, connection
closed), when the next in line is told the same way. A group on a super stream's
partition (the `super-stream` property) is rebalanced as RabbitMQ 3.11+'s
(rabbit_stream_sac_coordinator): on every join and leave the active one is the member at
the partition's index modulo the group's size, so N consumers of N partitions get one
each; one that steps down is told ConsumerUpdate(inactive) and stops at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackmq.broker.stream import StreamQueue
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream import frames as F
from ackmq.protocol.stream.chunk import deliver_parts, size_prefix
from ackmq.protocol.stream.frames import Command
from ackmq.protocol.stream.messages import filter_value, record_parts
from ackmq.server.stream.chunks import deliver_from_spans
from ackmq.server.stream.common import access_code, stream_queue, super_stream_partitions

if TYPE_CHECKING:
    from ackmq.server.stream.connection import StreamConnection

CHUNK_RECORDS = 256  # records per Deliver at most (ackmq's log has no chunks of its own)
MAX_CREDIT = 0xFFFF
MAX_SKIPPED = 64  # filtered-out stretches one subscription reads per turn at most
_SPEC = {K.OFFSET_FIRST: "first", K.OFFSET_LAST: "last", K.OFFSET_NEXT: "next",
         K.OFFSET_OFFSET: "offset", K.OFFSET_TIMESTAMP: "timestamp"}


def offset_spec(q: StreamQueue, spec: tuple[int, int]) -> int:
    """Where (type, value) starts in `q` (a timestamp in ms, as Erlang's system time).
    `last` is the newest chunk: ackmq's chunks are its Delivers, at most CHUNK_RECORDS
    records, so at most that many before the end of the newest batch written together
    (a client's 5,000-message batch is not one chunk)."""
    kind, value = spec
    start = q.start_offset(_SPEC.get(kind, "next"), value)
    if kind == K.OFFSET_LAST and q.log is not None:
        start = max(start, q.log.next_offset - CHUNK_RECORDS)
    return start


def committed_chunk_id(q: StreamQueue) -> int:
    """The newest chunk's first offset, where `last` starts: StreamStats'
    `committed_chunk_id` and Deliver v2's (one node: what is written is committed, and
    readers read nothing else). A Deliver sends at least its own first offset."""
    return offset_spec(q, (K.OFFSET_LAST, 0))


@dataclass(slots=True, eq=False)
class Subscription:
    subscription_id: int
    queue: StreamQueue
    offset: int  # the next to send
    credit: int
    properties: dict[str, str | None]
    group: str | None = None  # X5: the single active consumer group's name
    ready: bool = True  # may deliver (a group's member: once active and answered)
    owner: Any = None  # the Subscriptions (connection) it belongs to
    filters: frozenset[str] = frozenset()  # X5: `filter.N` values (none: no filtering)
    match_unfiltered: bool = False  # `match-unfiltered`: records without a value too
    consumed: int = 0  # messages sent (the management API's)
    active: bool = False  # X5: the group's active member (told so)
    partition: int = -1  # X5: its stream's index in the `super-stream` (-1: none)


def _partition_index(conn: StreamConnection, super_stream: str | None, stream: str) -> int:
    """The stream's index among its super stream's partitions (-1: not one of them)."""
    if not super_stream:
        return -1
    names = list(dict.fromkeys(n for n, _k in super_stream_partitions(conn, super_stream)
                               or []))
    return names.index(stream) if stream in names else -1


def _rebalance(q: StreamQueue, group: str) -> None:
    """Who of a group is active: the one already active (the first to come), or on a
    super stream's partition the member at its index modulo the group's size; the one
    that steps down is told first."""
    members = q.groups.get(group) or []
    if not members:
        return
    current = next((m for m in members if m.active), None)
    index = members[0].partition
    want = members[index % len(members)] if index >= 0 else current or members[0]
    if want is current:
        return
    if current is not None:
        current.owner.tell(current, False)
    want.owner.tell(want, True)


class _Watch:
    """The connection's reader registration on one stream (StreamQueue.readers)."""

    def __init__(self, subs: Subscriptions, q: StreamQueue) -> None:
        self.subs = subs
        self.queue = q

    def appended(self) -> None:
        if self.subs.by_id:
            self.subs.conn.want_delivery()

    def stream_deleted(self) -> None:
        self.subs.stream_gone(self.queue)


class Subscriptions:
    def __init__(self, conn: StreamConnection) -> None:
        self.conn = conn
        self.by_id: dict[int, Subscription] = {}
        self.watches: dict[int, _Watch] = {}  # id(queue) ->
        # ConsumerUpdate correlation id -> (the subscription, told active or inactive)
        self.updates: dict[int, tuple[Subscription, bool]] = {}
        self._correlation = 0

    @property
    def waiting(self) -> bool:
        return any(s.credit > 0 and s.ready for s in self.by_id.values())

    def watch(self, q: StreamQueue) -> None:
        if id(q) not in self.watches:
            w = _Watch(self, q)
            self.watches[id(q)] = w
            q.readers[id(w)] = w

    def subscribe(self, c: Command) -> None:
        conn = self.conn
        sid = c.subscription_id
        q = stream_queue(conn, c.stream)
        code = K.OK
        if sid in self.by_id:
            code = K.SUBSCRIPTION_ID_ALREADY_EXISTS
        elif q is None:
            code = K.STREAM_DOES_NOT_EXIST
        else:
            code = access_code(conn, q, write=False)
        if code != K.OK:
            conn.write(F.response(K.SUBSCRIBE, c.correlation_id, code))
            return
        assert q is not None
        props = dict(c.properties)
        group = props.get("name") if props.get("single-active-consumer") == "true" else None
        if props.get("single-active-consumer") == "true" and not group:
            conn.write(F.response(K.SUBSCRIBE, c.correlation_id, K.PRECONDITION_FAILED))
            return
        start = offset_spec(q, c.offset)
        sub = Subscription(sid, q, start, min(c.credit, MAX_CREDIT), props, group,
                           group is None, self,
                           frozenset(v for k, v in props.items()
                                     if k.startswith("filter.") and v is not None),
                           props.get("match-unfiltered") == "true")
        self.by_id[sid] = sub
        self.watch(q)
        conn.write(F.response(K.SUBSCRIBE, c.correlation_id, K.OK))
        if group is not None:
            sub.partition = _partition_index(conn, props.get("super-stream"), q.name)
            q.groups.setdefault(group, []).append(sub)
            _rebalance(q, group)
            return
        conn.want_delivery()

    # -- single active consumer (X5) ---------------------------------------------------------
    def tell(self, sub: Subscription, active: bool) -> None:
        """Tell `sub` it is (no longer) the group's active one; active, it delivers once
        answered; inactive, it stopped already."""
        sub.active = active
        sub.ready = False
        self._correlation += 1
        self.updates[self._correlation] = (sub, active)
        self.conn.write(F.consumer_update(self._correlation, sub.subscription_id, active))
        self.conn.ctx.request_flush()

    def consumer_update_answer(self, c: Command) -> None:
        sub, active = self.updates.pop(c.correlation_id, (None, False))
        if sub is None or self.by_id.get(sub.subscription_id) is not sub \
                or not active or not sub.active:
            return
        kind, _value = c.offset
        if kind != K.OFFSET_NONE and sub.queue.log is not None:
            sub.offset = offset_spec(sub.queue, c.offset)
        sub.ready = True
        self.conn.want_delivery()

    def _leave(self, sub: Subscription) -> None:
        """`sub` ends: out of its group; the next in line becomes active."""
        if sub.group is None:
            return
        members = sub.queue.groups.get(sub.group, [])
        if sub in members:
            members.remove(sub)
        sub.active = False
        if not members:
            sub.queue.groups.pop(sub.group, None)
        elif not sub.queue.deleted:
            _rebalance(sub.queue, sub.group)

    def credit(self, c: Command) -> None:
        sub = self.by_id.get(c.subscription_id)
        if sub is None:  # answered only when something is wrong
            self.conn.write(F.credit_response(K.SUBSCRIPTION_ID_DOES_NOT_EXIST,
                                              c.subscription_id))
            return
        sub.credit = min(sub.credit + c.credit, MAX_CREDIT)
        self.conn.want_delivery()

    def unsubscribe(self, c: Command) -> None:
        sub = self.by_id.pop(c.subscription_id, None)
        if sub is not None:
            self._leave(sub)
        code = K.OK if sub is not None else K.SUBSCRIPTION_ID_DOES_NOT_EXIST
        self.conn.write(F.response(K.UNSUBSCRIBE, c.correlation_id, code))

    def deliver(self) -> None:
        """Chunks for every subscription with credit, while the socket takes them."""
        conn = self.conn
        budget = conn.frame_max - 64  # Deliver and chunk headers
        v2 = conn.deliver_version == 2
        for sub in list(self.by_id.values()):
            lg = sub.queue.log
            skipped = 0
            while sub.credit > 0 and sub.ready and conn.writable and lg is not None \
                    and sub.subscription_id in self.by_id:
                if not sub.filters:  # straight from the log's bytes (chunks.py)
                    spans = lg.read_spans(sub.offset, CHUNK_RECORDS)
                    if not spans:
                        break
                    (head, data), first_offset, count = deliver_from_spans(
                        sub.subscription_id, spans, budget,
                        committed_chunk_id(sub.queue) if v2 else None)
                    conn.write(head)
                    conn.write(data)
                    sub.offset = first_offset + count
                    sub.consumed += count
                    sub.credit -= 1
                    continue
                records = lg.read(sub.offset, CHUNK_RECORDS)
                if not records:
                    break
                records = self._filtered(sub, records)
                if not records:  # nothing of this stretch matches: skipped, no credit
                    skipped += 1
                    if skipped >= MAX_SKIPPED:  # the rest on a later turn
                        conn.ctx.loop.call_soon(conn.want_delivery)
                        break
                    continue
                parts: list[bytes] = []  # size, head, body per message: joined once
                size = count = 0
                for _off, _ts, exchange, routing_key, props, body in records:
                    head, tail = record_parts(props, body, exchange, routing_key)
                    n = len(head) + len(tail)
                    if count and size + 4 + n > budget:
                        break
                    parts += (size_prefix(n), head, tail)
                    size += 4 + n
                    count += 1
                first = records[0]
                committed = max(committed_chunk_id(sub.queue), first[0]) if v2 else None
                conn.write(deliver_parts(sub.subscription_id, first[0], first[1], parts,
                                         count, committed=committed))
                sub.offset = first[0] + count
                sub.consumed += count
                sub.credit -= 1
        # stopped by a full socket or turn: the transport's _wake comes back here

    @staticmethod
    def _filtered(sub: Subscription, records: list[Any]) -> list[Any]:
        """X5 (RabbitMQ 3.13+'s filtering): the stretch from the first record whose
        filter value the subscription asked for to the last (what lies between goes
        too, as a chunk whose bloom filter matches: the client filters further);
        `sub.offset` moves past what is skipped."""
        wanted, unfiltered = sub.filters, sub.match_unfiltered
        hits = [i for i, r in enumerate(records)
                if (fv := filter_value(r[4])) in wanted or (fv is None and unfiltered)]
        if not hits:
            sub.offset = records[-1][0] + 1
            return []
        return records[hits[0]:hits[-1] + 1]

    def stream_gone(self, q: StreamQueue) -> None:
        """The stream was deleted: its subscriptions and publishers end, the client hears."""
        self.watches.pop(id(q), None)
        for sid in [s.subscription_id for s in self.by_id.values() if s.queue is q]:
            self._leave(self.by_id.pop(sid))
        self.conn.publishers.stream_gone(q)
        self.conn.write(F.metadata_update(K.STREAM_NOT_AVAILABLE, q.name))
        self.conn.ctx.request_flush()

    def close(self) -> None:
        for sub in list(self.by_id.values()):
            self._leave(sub)
        for w in self.watches.values():
            w.queue.readers.pop(id(w), None)
        self.watches.clear()
        self.by_id.clear()
