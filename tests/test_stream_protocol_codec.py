"""The stream protocol's sans-IO codec (protocol/stream) against the encodings rstream
(the client under test) produces and reads, and against hostile input (X1, X6)."""

from __future__ import annotations

import gzip
import os
import random
import struct

import pytest
from rstream import OffsetType, schema
from rstream.encoding import decode_frame, encode_frame, encode_publish

from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream import frames as F
from ackmq.protocol.stream.chunk import deliver, read_chunk
from ackmq.protocol.stream.messages import from_record, to_record


def _one(data: bytes) -> F.Command:
    (cmd,) = F.Decoder(0).feed(data)
    return cmd


def test_X1_codec_reads_rstreams_requests() -> None:
    c = _one(encode_frame(schema.DeclarePublisher(7, publisher_id=3, reference="ref",
                                                  stream="s")))
    assert (c.key, c.correlation_id, c.publisher_id, c.reference, c.stream) == \
        (K.DECLARE_PUBLISHER, 7, 3, "ref", "s")
    c = _one(encode_frame(schema.Subscribe(
        9, subscription_id=2, stream="s",
        offset_spec=schema.OffsetSpec.from_params(schema.OffsetType.OFFSET, 42), credit=10,
        properties=[schema.Property("name", "c1")])))
    assert (c.subscription_id, c.stream, c.offset, c.credit, c.properties) == \
        (2, "s", (K.OFFSET_OFFSET, 42), 10, {"name": "c1"})
    c = _one(encode_frame(schema.Subscribe(
        9, subscription_id=2, stream="s",
        offset_spec=schema.OffsetSpec.from_params(schema.OffsetType.FIRST, None), credit=1,
        properties=[])))
    assert c.offset == (K.OFFSET_FIRST, 0)
    c = _one(encode_frame(schema.Create(1, stream="s", arguments=[
        schema.Property("max-age", "1h")])))
    assert c.arguments == {"max-age": "1h"}
    c = _one(encode_frame(schema.Metadata(4, streams=["a", "b"])))
    assert c.streams == ["a", "b"]
    c = _one(encode_frame(schema.StoreOffset(reference="c", stream="s", offset=5)))
    assert (c.reference, c.stream, c.offset) == ("c", "s", 5)
    c = _one(encode_frame(schema.Tune(frame_max=1048576, heartbeat=60)))
    assert (c.frame_max, c.heartbeat) == (1048576, 60)
    c = _one(encode_frame(schema.CreateSuperStream(
        3, super_stream="ss", partitions=["ss-0", "ss-1"], binding_keys=["0", "1"],
        arguments=[])))
    assert (c.name, c.partitions, c.binding_keys) == ("ss", ["ss-0", "ss-1"], ["0", "1"])


def test_X1_codec_reads_rstreams_publish_and_sub_entry_batches() -> None:
    frame = encode_publish(schema.Publish(publisher_id=1, messages=[
        schema.Message(publishing_id=10, filter_value=None, data=b"a"),
        schema.Message(publishing_id=11, filter_value=None, data=b"bb")]))
    c = _one(frame)
    entries = [(pid, fv, kind, bytes(d)) for pid, fv, kind, d in F.read_publish(c.content, 1)]
    assert entries == [(10, None, 0, b"a"), (11, None, 0, b"bb")]
    # a sub-entry batch as rstream's producer sends it (send_sub_entry): gzip
    body = b"".join(struct.pack(">I", len(m)) + m for m in (b"x", b"yy", b"zzz"))
    data = gzip.compress(body)
    frame = encode_frame(schema.PublishSubBatching(
        publisher_id=1, number_of_root_messages=1, publishing_id=5,
        compress_type=0x80 | (K.COMPRESSION_GZIP << 4), subbatching_message_count=3,
        uncompressed_data_size=len(body), compressed_data_size=len(data), messages=data))
    c = _one(frame)
    ((pid, _fv, kind, d),) = list(F.read_publish(c.content, 1))
    assert pid == 5 and F.subentries(kind, d, 1 << 20) == [b"x", b"yy", b"zzz"]


def test_X1_codec_writes_what_rstream_reads() -> None:
    r = decode_frame(F.response(K.CREATE, 5, K.STREAM_ALREADY_EXISTS)[4:])
    assert isinstance(r, schema.CreateResponse) and r.response_code == K.STREAM_ALREADY_EXISTS
    r = decode_frame(F.metadata_response(
        6, [(0, "127.0.0.1", 5552)], [("s", K.OK, 0, []), ("x", 2, 0xFFFF, [])])[4:])
    assert isinstance(r, schema.MetadataResponse)
    assert [(b.host, b.port) for b in r.brokers] == [("127.0.0.1", 5552)]
    assert [(m.name, m.response_code, m.leader_ref) for m in r.metadata] == \
        [("s", 1, 0), ("x", 2, 0xFFFF)]
    r = decode_frame(F.publish_confirm(1, [3, 4])[4:])
    assert isinstance(r, schema.PublishConfirm) and r.publishing_ids == [3, 4]
    r = decode_frame(F.publish_error(1, [(3, K.PUBLISHER_DOES_NOT_EXIST)])[4:])
    assert r.errors[0].response_code == K.PUBLISHER_DOES_NOT_EXIST
    r = decode_frame(F.command_versions_response(2, [(1, 1, 1), (2, 1, 1)])[4:])
    assert r.command_versions[1].key_command == 2
    r = decode_frame(F.u64_response(K.QUERY_OFFSET, 3, K.OK, 77)[4:])
    assert isinstance(r, schema.QueryOffsetResponse) and r.offset == 77
    r = decode_frame(F.credit_response(K.SUBSCRIPTION_ID_DOES_NOT_EXIST, 9)[4:])
    assert isinstance(r, schema.CreditResponse) and r.subscription_id == 9
    r = decode_frame(F.tune(1048576, 60)[4:])
    assert isinstance(r, schema.Tune) and r.heartbeat == 60


def test_X1_deliver_chunk_is_what_rstream_parses() -> None:
    msgs = [b"one", b"", os.urandom(1000)]
    frame = deliver(4, 100, 1_700_000_000_000, msgs)
    r = decode_frame(frame[4:])
    assert isinstance(r, schema.Deliver)  # its __post_init__ checks length and crc
    assert (r.subscription_id, r.chunk_first_offset, r.num_entries, r.timestamp) == \
        (4, 100, 3, 1_700_000_000_000)
    assert r.get_messages() == msgs
    assert read_chunk(frame[9:]) == (100, 1_700_000_000_000, msgs)


def test_X1_deliver_v2_is_v1_with_the_committed_chunk_id() -> None:
    """Deliver v2 (RabbitMQ 3.13+'s PROTOCOL.adoc): key, version 2, subscription id, a
    u64 committed chunk id, then v1's chunk; the project's client side reads both."""
    msgs = [b"one", os.urandom(300)]
    v1 = deliver(4, 100, 7, msgs)
    v2 = deliver(4, 100, 7, msgs, committed=(1 << 40) + 3)
    assert v2[4:9] == b"\x00\x08\x00\x02\x04" and v1[4:9] == b"\x00\x08\x00\x01\x04"
    assert struct.unpack(">Q", v2[9:17])[0] == (1 << 40) + 3
    assert v2[17:] == v1[9:] and struct.unpack(">I", v2[:4])[0] == len(v2) - 4
    from ackmq.protocol.stream import peer as P

    f = P.read_frame(v2[4:])
    assert (f.key, f.version, f.subscription_id, read_chunk(f.chunk)) == \
        (K.DELIVER, 2, 4, (100, 7, msgs))


def test_X2_messages_round_trip_through_the_model_record() -> None:
    from rstream import AMQPMessage, amqp_decoder
    m = AMQPMessage(body=b"hello", application_properties={"k": "v"})
    props, body = to_record(bytes(m))
    assert body == b"hello"
    back = amqp_decoder(from_record(props, body, "", "s"))
    assert bytes(back.body) == b"hello"
    assert back.application_properties == {b"k": b"v"} or \
        back.application_properties == {"k": "v"}
    # any bytes that are not an AMQP 1.0 message come back as they were
    props, body = to_record(b"\x01raw")
    assert from_record(props, body, "", "s") == b"\x01raw"


@pytest.mark.parametrize("data, error", [
    (struct.pack(">I", 2) + b"\x00\x01", F.BadFrame),  # below the smallest frame
    (struct.pack(">IHH", 4 + 4, K.OPEN, 1) + b"\x00\x00\x00\x01", F.BadFrame),  # no vhost
    (struct.pack(">IHH", 4 + 6, K.OPEN, 1) + b"\x00\x00\x00\x01\x00\x09", F.BadFrame),
    (struct.pack(">IHH", 4 + 4, 0x7F00, 1) + b"\x00\x00\x00\x01", F.UnknownFrame),
    (struct.pack(">IHH", 4 + 4, K.OPEN, 9) + b"\x00\x00\x00\x01", F.UnknownFrame),
    (struct.pack(">I", 1 << 30), F.FrameTooLarge),
    (struct.pack(">IHH", 4 + 4 + 4, K.METADATA, 1) + b"\x00\x00\x00\x01\x7f\xff\xff\xff",
     F.BadFrame),  # an array of 2^31 strings in 4 bytes
    (struct.pack(">IHH", 4 + 9, K.PEER_PROPERTIES, 1) + b"\x00\x00\x00\x01\x00\x00\x00\x01"
     b"\x00", F.BadFrame),
    (struct.pack(">IHH", 4 + 9, K.OPEN, 1) + b"\x00\x00\x00\x01\x00\x03\xff\xfe\xfd",
     F.BadFrame),  # not UTF-8
])
def test_X6_hostile_frames_are_refused_cleanly(data: bytes, error: type) -> None:
    with pytest.raises(error):
        F.Decoder(1 << 20).feed(data)


def test_X6_hostile_publish_and_sub_entries() -> None:
    content = b"\x01" + struct.pack(">i", 2) + struct.pack(">Q", 1) + struct.pack(">I", 99)
    with pytest.raises(F.BadFrame):
        list(F.read_publish(content, 1))
    bomb = gzip.compress(b"\x00" * (4 << 20))
    with pytest.raises(F.BadFrame):
        F.subentries((0x80 | K.COMPRESSION_GZIP << 4) << 16 | 1, bomb, 1 << 20)
    with pytest.raises(F.BadFrame):
        F.subentries((0x80 | 3 << 4) << 16 | 1, b"xx", 1 << 20)  # lz4: not supported


def test_X6_random_bytes_never_raise_anything_else() -> None:
    rnd = random.Random(37)
    for _ in range(20000):
        n = rnd.randrange(0, 64)
        data = bytes(rnd.randrange(256) for _ in range(n))
        if rnd.random() < 0.7 and n >= 8:  # a plausible header before the noise
            data = struct.pack(">IHH", n - 4, rnd.randrange(0, 0x20), 1) + data[8:]
        try:
            for c in F.Decoder(1 << 16).feed(data):
                if c.key == K.PUBLISH:
                    list(F.read_publish(c.content, c.version))
        except F.StreamFrameError:
            pass


def test_X2_conversions_by_the_last_prefix_keep_each_message_whole() -> None:
    """The publish side compares a message with the last prefix it decoded (no search),
    the delivery side repeats the last record's prefix: neither may mix one message's
    body or sections up with another's."""
    from rstream import AMQPMessage, amqp_decoder

    from ackmq.protocol.stream.messages import record_parts
    a = bytes(AMQPMessage(body=b"first", application_properties={"k": "v"}))
    props, body = to_record(a)
    assert body == b"first"
    big = os.urandom(300)  # a 32-bit data section after the same prefix
    b = bytes(AMQPMessage(body=big, application_properties={"k": "v"}))
    assert to_record(b) == (props, big)
    # the same prefix followed by more than one data section is not split by it
    tail = b"\x00\x53\x75\xa0\x01z"
    props2, body2 = to_record(a + tail)
    assert (props2, body2) != (props, b"first" + tail)
    # delivery: the same properties, another exchange, then the first again
    heads = []
    for x, data in (("", b"one"), ("ex", b"two"), ("", big)):
        head, rest = record_parts(props, data, x, "s")
        assert bytes(amqp_decoder(head + rest).body) == data
        assert from_record(props, data, x, "s") == head + rest
        heads.append(head[:-5] if len(data) < 256 else head[:-8])
    assert heads[0] == heads[2] != heads[1]  # the exchange is in the annotations


def test_X1_client_side_codec_against_rstreams() -> None:
    """protocol/stream/peer.py (the Spark reader's client side): its requests are what
    rstream encodes and the server's table decodes; server frames (from the server's
    encoder, which rstream reads) are read back; a chunk's gzip sub-entry batch is read
    record by record."""
    from ackmq.protocol.stream import peer as P

    sub = P.request(K.SUBSCRIBE, correlation_id=5, subscription_id=1, stream="s",
                    offset=(K.OFFSET_OFFSET, 1234), credit=8, properties={"a": "b"})
    assert sub == encode_frame(schema.Subscribe(
        5, subscription_id=1, stream="s", offset_spec=schema.OffsetSpec.from_params(
            OffsetType.OFFSET, 1234), credit=8, properties=[schema.Property("a", "b")]))
    assert _one(sub).fields["offset"] == (K.OFFSET_OFFSET, 1234)
    auth = P.request(K.SASL_AUTHENTICATE, correlation_id=2, mechanism="PLAIN",
                     data=b"\0guest\0guest")
    assert decode_frame(auth[4:]).data == b"\0guest\0guest"
    # server frames as the server's encoder writes them (which rstream reads: above)
    f = P.read_frame(F.peer_properties_response(3, {"product": "RabbitMQ"})[4:])
    assert (f.correlation_id, f.code, P.read_properties(f.rest)) == \
        (3, K.OK, {"product": "RabbitMQ"})
    f = P.read_frame(F.close_request(9, 1, "bye")[4:])
    assert (f.key, f.correlation_id, f.code, f.reason) == (K.CLOSE, 9, 1, "bye")
    f = P.read_frame(deliver(4, 100, 0, [b"m0", b"m1"])[4:])
    assert (f.key, f.subscription_id, read_chunk(f.chunk)[::2]) == \
        (K.DELIVER, 4, (100, [b"m0", b"m1"]))
    # a chunk holding a gzip sub-entry batch of three records, then a simple entry
    records = [b"r0", b"r11", b"r222"]
    raw = b"".join(struct.pack(">I", len(r)) + r for r in records)
    packed = gzip.compress(raw)
    data = bytes((0x80 | (K.COMPRESSION_GZIP << 4),)) + struct.pack(
        ">HII", 3, len(raw), len(packed)) + packed + struct.pack(">I", 2) + b"s4"
    import zlib

    from ackmq.protocol.stream.chunk import HEADER
    chunk = HEADER.pack(K.CHUNK_MAGIC_VERSION, 0, 2, 4, 0, 1, 40, zlib.crc32(data),
                        len(data), 0, 0) + data
    assert read_chunk(chunk) == (40, 0, [*records, b"s4"])
    with pytest.raises(F.BadFrame):
        read_chunk(chunk[:-1] + b"x")  # the crc


def test_X1_decoder_reads_frames_cut_anywhere_by_the_socket() -> None:
    """The same commands whatever the reads cut (each frame parsed from the read or
    completed in the buffer and handed over: copied at most once), a Publish's
    messages unchanged after later reads; a too-large frame refused at its size, before
    its bytes arrive."""
    frames = [encode_publish(schema.Publish(publisher_id=1, messages=[
        schema.Message(publishing_id=i * 10 + j, filter_value=None, data=b"m%d" % j * 300)
        for j in range(5)])) for i in range(4)]
    frames.insert(2, encode_frame(schema.StoreOffset(reference="c", stream="s", offset=5)))
    frames.append(encode_frame(schema.Metadata(4, streams=["a", "b"])))
    stream = b"".join(frames)

    def entries(cmds: list[F.Command]) -> list[object]:
        return [list(F.read_publish(c.content, c.version)) if c.key == K.PUBLISH
                else (c.key, c.offset if c.key == K.STORE_OFFSET else c.streams)
                for c in cmds]

    cmds = F.Decoder(1 << 20).feed(stream)
    whole = entries(cmds)
    assert len(whole) == 6
    # a Publish within one read is a view of the read, not a copy
    assert isinstance(cmds[0].content, memoryview) and cmds[0].content.obj is stream
    rng = random.Random(5)
    cuts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(1, len(stream), 777)),
            [len(frames[0]) - 1, len(frames[0]), len(frames[0]) + 3]]
    cuts += [sorted(rng.sample(range(1, len(stream)), 12)) for _ in range(30)]
    for points in cuts:
        d = F.Decoder(1 << 20)
        got: list[F.Command] = []
        for a, b in zip([0, *points], [*points, len(stream)], strict=True):
            got += d.feed(stream[a:b])
        assert entries(got) == whole
    d = F.Decoder(100)
    assert d.feed(frames[0][:3]) == []
    with pytest.raises(F.FrameTooLarge):
        d.feed(frames[0][3:5])
