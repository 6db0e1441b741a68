"""In process: a stream-protocol Publish frame's records through the model in one verb
(`publish_stream`, broker/operations.py) and a Deliver built from the log's bytes
(server/stream/chunks.py) equal, byte for byte, to the one built record by record
(X1-X3)."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from rstream import AMQPMessage, schema
from rstream._pyamqp.message import Properties
from rstream.encoding import decode_frame, encode_frame

from ackmq.broker import BrokerModel, NullScheduler
from ackmq.broker.access import AccessModel, ChannelAccess
from ackmq.broker.errors import SoftError
from ackmq.broker.trace import Tracer
from ackmq.protocol.amqp.properties import encode_fields
from ackmq.protocol.amqp10.message import AMQP_VALUE, Message10
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream import frames as F
from ackmq.protocol.stream.chunk import deliver_parts, read_chunk, size_prefix
from ackmq.protocol.stream.messages import record_parts, to_record, with_filter_value
from ackmq.server.stream.chunks import deliver_from_spans
from ackmq.store.streamlog import BODY, PROPERTIES, TIMESTAMP, StreamLog, StreamStore


class _Output:
    def __init__(self) -> None:
        self.confirms: list[tuple[bool, int, bool]] = []

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        self.confirms.append((ack, delivery_tag, multiple))

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def _world(tmp_path: Path, perms: tuple[str, str, str] | None = None
           ) -> tuple[BrokerModel, Any, _Output]:
    streams = StreamStore(tmp_path / "streams")  # no loop: synced inline by the commit
    broker = BrokerModel(NullScheduler(), streams=streams)
    broker.start()
    vh = broker.vhost("/")
    vh.declare_queue("s", False, True, False, False, {"x-queue-type": "stream"}, None)
    out = _Output()
    ch = broker.open_channel(vh, "conn", out, "u")
    if perms is not None:
        access = AccessModel()
        access.add_vhost("/")
        access.add_user("u", "pw")
        access.set_permissions("u", "/", *perms)
        ch.access = ChannelAccess(access, "u", "/")
    ch.confirm_select()
    return broker, ch, out


def test_X3_publish_stream_appends_a_frame_and_confirms_it_once_synced(
        tmp_path: Path) -> None:
    broker, ch, out = _world(tmp_path, (".*", ".*", ".*"))
    q = broker.vhost("/").queues["s"]
    records = [(b"\x10\x00\x02", b"a"), (b"\x10\x00\x02", b"bb"), (b"\x00\x00", b"")]
    seq = ch.publish_stream(q, records)
    assert seq == 1 and q.message_count == 3
    assert out.confirms == []  # not before the commit has fdatasynced them (P5c)
    assert q.log._dirty is False and q.log.pending  # buffered, not written yet
    broker.end_of_turn()
    assert out.confirms == [(True, 1, False)]
    assert ch.stats.received == ch.stats.confirmed == ch.stats.routed == 3
    assert q.stat_published == 3
    assert [(r[PROPERTIES], r[BODY]) for r in q.log.read(0, 10)] == records
    # the next frame: the next sequence number, appended after the first
    assert ch.publish_stream(q, [(b"\x00\x00", b"c")]) == 2
    broker.end_of_turn()
    assert out.confirms[-1] == (True, 2, False) and q.message_count == 4
    assert ch.publish_stream(q, []) == 0  # nothing to publish: no number


@pytest.mark.parametrize("traced", [False, True])
def test_X3_publish_stream_keeps_the_publishers_sequence_with_its_records(
        tmp_path: Path, traced: bool) -> None:
    """A named publisher's frame: its (reference, last publishing id) goes into the
    trailer of the frame's first record (store/streamlog.py), so the log alone gives
    the sequence back, the tracking file gone; the firehose's record-by-record way
    (S10) too. Readers see the records as they were published."""
    broker, ch, out = _world(tmp_path, (".*", ".*", ".*"))
    vh = broker.vhost("/")
    if traced:
        vh.trace = Tracer(vh, "node", lambda owner: "conn")
        out.number = 1  # type: ignore[attr-defined]  # (the channel number a copy names)
    q = vh.queues["s"]
    records = [(b"\x00\x00", b"a"), (b"\x00\x00", b"bb")]
    ch.publish_stream(q, [(b"\x00\x00", b"u")])  # an unnamed publisher's: no trailer
    ch.publish_stream(q, records, ("app", 7))
    ch.publish_stream(q, records, ("other", 3))
    broker.end_of_turn()
    assert out.confirms[-1][0] is True
    assert [r[BODY] for r in q.log.read(0, 10)] == [b"u", b"a", b"bb", b"a", b"bb"]
    d = q.log.dir
    q.log.close()
    (d / "tracking").unlink()
    lg = StreamLog(d)
    assert (lg.tracked(0, "app"), lg.tracked(0, "other")) == (7, 3)
    assert [r[BODY] for r in lg.read(0, 10)] == [b"u", b"a", b"bb", b"a", b"bb"]
    lg.close()


def test_X3_publish_stream_nacked_when_its_write_fails(tmp_path: Path) -> None:
    """P6: a frame whose records cannot be written is nacked, not confirmed."""
    broker, ch, out = _world(tmp_path)
    q = broker.vhost("/").queues["s"]
    ch.publish_stream(q, [(b"\x00\x00", b"a")])
    broker.end_of_turn()
    assert out.confirms == [(True, 1, False)]
    lg = q.log
    os.close(lg._wfd)  # the segment open for reading only: the next write fails (EBADF)
    lg._wfd = os.open(lg.segments[-1].path, os.O_RDONLY)
    assert ch.publish_stream(q, [(b"\x00\x00", b"b"), (b"\x00\x00", b"c")]) == 2
    broker.end_of_turn()
    assert out.confirms[-1] == (False, 2, False) and ch.stats.confirmed == 1


def test_X6_publish_stream_checked_once_for_the_frame(tmp_path: Path) -> None:
    broker, ch, out = _world(tmp_path, (".*", "^s$", ".*"))  # no write on amq.default
    q = broker.vhost("/").queues["s"]
    with pytest.raises(SoftError) as e:
        ch.publish_stream(q, [(b"\x00\x00", b"a")] * 5)
    assert e.value.code == 403 and "amq.default" in e.value.text
    assert q.message_count == 0 and ch.confirms.next_seq == 1
    broker, ch, out = _world(tmp_path / "2", (".*", ".*", ".*"))
    q = broker.vhost("/").queues["s"]
    calls: list[str] = []

    class Counted(ChannelAccess):
        __slots__ = ()

        def check_publish(self, exchange: str) -> bool:  # not remembered: each counted
            calls.append(exchange)
            super().check_publish(exchange)
            self.write_exchanges.clear()
            return False

    ch.access = Counted(ch.access.model, "u", "/")
    ch.publish_stream(q, [(b"\x00\x00", b"a")] * 5)
    ch.publish_stream(q, [(b"\x00\x00", b"b")] * 3)
    assert calls == ["", ""] and q.message_count == 8  # one check per frame
    broker.vhost("/").delete_queue(q)
    with pytest.raises(SoftError) as e:
        ch.publish_stream(q, [(b"\x00\x00", b"a")])
    assert e.value.code == 404


def test_X1_append_many_writes_the_records_append_writes(tmp_path: Path) -> None:
    one, many = StreamLog(tmp_path / "one"), StreamLog(tmp_path / "many")
    records = [(b"\x10\x00\x02", b"x" * n) for n in (0, 1, 255, 256, 70_000)]
    for p, b in records:
        one.append("amq.direct", "rk", p, b)
    assert many.append_many("amq.direct", "rk", records) == 0
    for lg in (one, many):
        lg.flush()
        lg.sync()
    a, b = one.read(0, 10), many.read(0, 10)
    assert [r[:TIMESTAMP] + r[TIMESTAMP + 1:] for r in a] == \
        [r[:TIMESTAMP] + r[TIMESTAMP + 1:] for r in b]
    assert len({r[TIMESTAMP] for r in b}) == 1  # one frame: one timestamp
    reopened = StreamLog(tmp_path / "many")  # checksums and offsets hold on a rescan
    assert reopened.next_offset == 5 and reopened.read(0, 10) == b


def _messages() -> list[tuple[str, str, bytes, bytes]]:
    """(exchange, routing key, properties, body) of records of every kind a stream
    holds: simple 1.0 messages (repeating and changing properties, bodies of every data
    section size), a sub-entry batch's messages, filter values, raw payloads, a 1.0
    body kept encoded, and AMQP 0-9-1 publishes through an exchange."""
    out: list[tuple[str, str, bytes, bytes]] = []

    def stream(data: bytes, fv: str | None = None) -> None:
        p, b = to_record(data)
        out.append(("", "s", with_filter_value(p, fv), b))

    for i in range(40):
        stream(bytes(AMQPMessage(body=b"m%d" % i, application_properties={"k": "v"})))
    for n in (0, 255, 256, 5000):
        stream(bytes(AMQPMessage(body=b"z" * n)))
    for i in range(3):
        stream(bytes(AMQPMessage(body=b"p", properties=Properties(
            message_id=f"id-{i}", content_type="text/plain", subject="s"),
            application_properties={"n": i})))
    batch = b"".join(struct.pack(">I", len(m)) + m for m in
                     (bytes(AMQPMessage(body=b"sub%d" % i)) for i in range(5)))
    data = gzip.compress(batch)
    (c,) = F.Decoder(0).feed(encode_frame(schema.PublishSubBatching(  # as rstream sends it
        publisher_id=1, number_of_root_messages=1, publishing_id=5,
        compress_type=0x80 | (K.COMPRESSION_GZIP << 4), subbatching_message_count=5,
        uncompressed_data_size=len(batch), compressed_data_size=len(data), messages=data)))
    ((_pid, _fv, kind, d),) = list(F.read_publish(c.content, 1))
    subs = F.subentries(kind, d, 1 << 20)
    assert len(subs) == 5
    for m in subs:
        stream(m)
    for i in range(10):
        stream(bytes(AMQPMessage(body=b"f%d" % i)), ("red", "blue", None)[i % 3])
    for i in range(6):
        stream(b"\x01raw %d" % i)
    stream(Message10(body=[(AMQP_VALUE, "a value")]).encode())
    stream(Message10(body=[(AMQP_VALUE, ["a", 1])]).encode())
    for i in range(8):
        out.append(("amq.direct", f"rk{i // 3}", encode_fields(
            {"delivery_mode": 2, "headers": {"h": i // 4}}), b"amqp %d" % i))
    for i in range(30):
        stream(bytes(AMQPMessage(body=b"tail%d" % i)))
    return out


def _old_chunk(lg: StreamLog, offset: int, budget: int) -> tuple[bytes, int]:
    """The Deliver the record-by-record path built (subscriptions.py before chunks.py)."""
    records = lg.read(offset, 256)
    parts: list[bytes] = []
    size = count = 0
    for _off, _ts, exchange, routing_key, props, body in records:
        head, tail = record_parts(props, body, exchange, routing_key)
        n = len(head) + len(tail)
        if count and size + 4 + n > budget:
            break
        parts += (size_prefix(n), head, tail)
        size += 4 + n
        count += 1
    return deliver_parts(7, records[0][0], records[0][1], parts, count), count


@pytest.mark.parametrize("budget", [1 << 20, 2000, 1])
def test_X1_chunk_from_the_logs_bytes_equals_the_record_by_record_one(
        tmp_path: Path, budget: int) -> None:
    msgs = _messages()
    lg = StreamLog(tmp_path / "s", segment_bytes=8 << 10)  # several segments
    for i, (x, k, p, b) in enumerate(msgs):
        lg.append(x, k, p, b)
        if i == len(msgs) - 20:
            lg.flush()  # the newest records from the write buffer, the rest from files
    frames = 0
    offset = 0
    while offset < lg.next_offset:
        old, n_old = _old_chunk(lg, offset, budget)
        pieces, first, n_new = deliver_from_spans(7, lg.read_spans(offset, 256), budget)
        new = b"".join(pieces)
        assert (first, n_new) == (offset, n_old)
        assert new == old
        # Deliver v2: the committed chunk id (at least the chunk's own) before the same chunk
        v2 = b"".join(deliver_from_spans(7, lg.read_spans(offset, 256), budget, 3)[0])
        assert v2[6:8] == b"\x00\x02" and v2[17:] == old[9:]
        assert int.from_bytes(v2[9:17], "big") == max(3, offset)
        d = decode_frame(new[4:])  # rstream checks the chunk's length and crc
        assert isinstance(d, schema.Deliver) and d.chunk_first_offset == offset
        assert read_chunk(new[9:])[2] == [
            record_parts(p, b, x, k)[0] + record_parts(p, b, x, k)[1]
            for x, k, p, b in msgs[offset:offset + n_new]]
        offset += n_new
        frames += 1
    assert offset == len(msgs)
    if budget == 1:
        assert frames == len(msgs)  # one record per chunk when none fits with another


@pytest.mark.parametrize("budget", [1 << 20, 30_000, 1100, 1])
def test_X1_chunk_of_equal_records_across_reads_and_budgets(tmp_path: Path,
                                                            budget: int) -> None:
    """Runs of equal records (one publisher's messages of one size, as `pre.join` sends
    them) split by reads (segments of 64 KiB, the write buffer), by a body of another
    size, by another head and by the budget: the same Deliver as record by record."""
    lg = StreamLog(tmp_path / "s", segment_bytes=64 << 10)
    props, body = to_record(bytes(AMQPMessage(body=b"x" * 1000)))
    other, _b = to_record(bytes(AMQPMessage(body=b"y", application_properties={"a": 1})))
    msgs: list[tuple[bytes, bytes]] = []
    for i in range(700):
        b = b"%04d" % i + body[4:]
        if i % 97 == 0:
            b = b[:300]  # another size
        msgs.append((other if i % 131 == 0 else props, b))
    for i, (p, b) in enumerate(msgs):
        lg.append("", "s", p, b)
        if i == 600:
            lg.flush()
    offset = 0
    while offset < lg.next_offset:
        old, n_old = _old_chunk(lg, offset, budget)
        pieces, first, n_new = deliver_from_spans(7, lg.read_spans(offset, 256), budget)
        assert (first, n_new, b"".join(pieces)) == (offset, n_old, old)
        offset += n_new
    assert offset == 700
