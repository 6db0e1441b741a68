"""Publishers (X1-X3): declare/delete, Publish (simple entries and sub-entry batches) onto
the stream queue through the model channel in confirm mode, a frame's records in one
call (`publish_stream`: one permission check, one append, one confirm number for the
frame), PublishConfirm once the model confirms (after fsync: P5c), PublishError with the protocol's codes, and
deduplication by named publisher: a publishing id at or below the publisher's last one
is dropped and confirmed; the last id is kept with the frame's records (in the trailer of
the first, written and synced with them: store/streamlog.py) and in the stream's tracking
file (store/streamtrack.py), so it holds across a kill -9 and a power cut."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ackmq.broker.confirms import take_confirmed
from ackmq.broker.errors import ReplyError
from ackmq.broker.stream import TRACK_PUBLISHER, StreamQueue
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream import frames as F
from ackmq.protocol.stream.frames import Command
from ackmq.protocol.stream.messages import to_record, with_filter_value
from ackmq.server.stream.common import access_code, code_of, stream_queue

if TYPE_CHECKING:
    from ackmq.server.stream.connection import StreamConnection


@dataclass(slots=True, eq=False)
class Publisher:
    publisher_id: int
    reference: str  # "" : not named, no deduplication
    queue: StreamQueue
    last: int  # the last publishing id taken (named publishers), -1 before any
    published: int = 0  # entries received, confirmed, refused (the management API's)
    confirmed: int = 0
    errored: int = 0


class Publishers:
    def __init__(self, conn: StreamConnection) -> None:
        self.conn = conn
        self.by_id: dict[int, Publisher] = {}
        # the model's confirm seq of a Publish frame's records (ChannelModel.
        # publish_stream) -> (publisher id, publishing id) of the entries it took
        # confirm number -> (publisher id, the publishing ids of its frame)
        self.pending: OrderedDict[int, tuple[int, list[int]]] = OrderedDict()

    def declare(self, c: Command) -> None:
        conn = self.conn
        pid, ref = c.publisher_id, c.reference or ""
        q = stream_queue(conn, c.stream)
        code = K.OK
        if q is None:
            code = K.STREAM_DOES_NOT_EXIST
        elif pid in self.by_id or (ref and any(
                p.reference == ref and p.queue is q for p in self.by_id.values())):
            code = K.PRECONDITION_FAILED
        else:
            code = access_code(conn, q, write=True)
        if code == K.OK:
            assert q is not None
            last = q.tracked(TRACK_PUBLISHER, ref) if ref else None
            self.by_id[pid] = Publisher(pid, ref, q, -1 if last is None else last)
            conn.subscriptions.watch(q)
        conn.write(F.response(K.DECLARE_PUBLISHER, c.correlation_id, code))

    def delete(self, c: Command) -> None:
        code = K.OK if self.by_id.pop(c.publisher_id, None) is not None \
            else K.PUBLISHER_DOES_NOT_EXIST
        self.conn.write(F.response(K.DELETE_PUBLISHER, c.correlation_id, code))

    def query_sequence(self, c: Command) -> None:
        q = stream_queue(self.conn, c.stream)
        if q is None:
            self.conn.write(F.u64_response(K.QUERY_PUBLISHER_SEQUENCE, c.correlation_id,
                                           K.STREAM_DOES_NOT_EXIST, 0))
            return
        v = q.tracked(TRACK_PUBLISHER, c.reference or "") if c.reference else None
        self.conn.write(F.u64_response(K.QUERY_PUBLISHER_SEQUENCE, c.correlation_id, K.OK,
                                       v or 0))

    def publish(self, c: Command) -> None:
        conn = self.conn
        pid = c.publisher_id
        pub = self.by_id.get(pid)
        entries = list(F.read_publish(c.content, c.version))
        if pub is None or pub.queue.deleted:
            code = K.PUBLISHER_DOES_NOT_EXIST if pub is None else K.STREAM_NOT_AVAILABLE
            conn.write(F.publish_error(pid, [(e[0], code) for e in entries]))
            conn.count_error(code)  # once per frame, as RabbitMQ
            return
        ch = conn.channel
        assert ch is not None
        named = bool(pub.reference)
        top = pub.last
        dups: list[int] = []
        errors: list[tuple[int, int]] = []
        taken: list[int] = []  # the publishing ids of the frame's records
        take = taken.append
        records: list[tuple[bytes, bytes]] = []
        add = records.append
        max_size = conn.ctx.config.max_message_size
        for pubid, fv, kind, data in entries:
            if named and pubid <= top:
                dups.append(pubid)  # X3: already taken: dropped, confirmed
                continue
            if pubid > top:
                top = pubid
            if kind == 0 and fv is None:  # the usual entry: one message
                if len(data) > max_size:
                    errors.append((pubid, K.PRECONDITION_FAILED))
                    continue
                add(to_record(data))
                take(pubid)
                continue
            messages: Sequence[bytes | memoryview]
            if kind == 0:
                messages = (data,)
                too_large = len(data) > max_size
            else:
                messages = F.subentries(kind, data, max_size)
                too_large = any(len(m) > max_size for m in messages)
            if not messages:
                dups.append(pubid)
                continue
            if too_large:
                errors.append((pubid, K.PRECONDITION_FAILED))
                continue
            for m in messages:
                props, body = to_record(m)
                if fv is not None:
                    props = with_filter_value(props, fv)
                add((props, body))
            take(pubid)
        kept = False  # the sequence went with the records
        if records:
            try:  # the frame's records together, one confirm for them (X3)
                seq = ch.publish_stream(pub.queue, records,
                                        (pub.reference, top) if named else None)
                self.pending[seq] = (pid, taken)
                kept = named
            except ReplyError as e:
                code = code_of(e)
                errors += [(pubid, code) for pubid in taken]
        pub.published += len(entries)
        pub.confirmed += len(dups)
        pub.errored += len(errors)
        if named and top > pub.last:
            pub.last = top
            if not kept:  # no record written: the tracking file alone
                pub.queue.track(TRACK_PUBLISHER, pub.reference, top)
        if dups:
            conn.write(F.publish_confirm(pid, dups))
        if errors:
            conn.write(F.publish_error(pid, errors))
            conn.count_error(errors[0][1])

    def confirmed(self, ack: bool, tag: int, multiple: bool) -> None:
        """The model confirmed (or nacked: a failed write) publishes up to `tag`."""
        done = take_confirmed(self.pending, tag, multiple)
        oks: dict[int, list[int]] = {}
        errs: dict[int, list[tuple[int, int]]] = {}
        for pid, taken in done:
            if ack:
                oks.setdefault(pid, []).extend(taken)
                continue
            errs.setdefault(pid, []).extend((pubid, K.INTERNAL_ERROR) for pubid in taken)
            for pubid in taken:
                self._not_taken(pid, pubid)
        by_id = self.by_id
        for pid, ids in oks.items():
            if (pub := by_id.get(pid)) is not None:
                pub.confirmed += len(ids)
            self.conn.write(F.publish_confirm(pid, ids))
        for pid, errors in errs.items():
            if (pub := by_id.get(pid)) is not None:
                pub.errored += len(errors)
            self.conn.write(F.publish_error(pid, errors))
            self.conn.count_error(K.INTERNAL_ERROR)

    def _not_taken(self, pid: int, pubid: int) -> None:
        """A publish failed (a failed write): its id must be taken again when resent,
        not dropped as a duplicate, so the publisher's sequence goes back below it."""
        pub = self.by_id.get(pid)
        if pub is not None and pub.reference and pub.last >= pubid:
            pub.last = pubid - 1
            pub.queue.track(TRACK_PUBLISHER, pub.reference, pub.last)

    def stream_gone(self, q: StreamQueue) -> None:
        """The stream was deleted: its publishers go. The connection is then told by a
        MetadataUpdate 0x06 (Subscriptions.stream_gone, the one caller), counted here as
        RabbitMQ counts it: once per connection."""
        self.conn.count_error(K.STREAM_NOT_AVAILABLE)
        for pid in [p.publisher_id for p in self.by_id.values() if p.queue is q]:
            del self.by_id[pid]

    def close(self) -> None:
        self.by_id.clear()
        self.pending.clear()
