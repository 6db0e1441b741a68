"""The AMQP 1.0 codec against python-qpid-proton as the oracle: what proton encodes,
ackmq decodes to the same values; what ackmq encodes, proton decodes to the same values
(SPEC A9 rests on it: a frame ackmq cannot read is a decode error, never a guess)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ackmq.protocol.amqp10 import Composite, Decoder, FramingError, decode, encode
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10 import types as T
from ackmq.protocol.amqp10.composite import INDEX, KINDS, TABLE, from_described
from ackmq.protocol.amqp10.message import (
    AMQP_SEQUENCE,
    AMQP_VALUE,
    DATA,
    Message10,
    decode_message,
)
from ackmq.protocol.amqp10.transfer import delivery_frames, settled_disposition
from ackmq.protocol.amqp10.types import DecodeError

proton = pytest.importorskip("proton")


def _proton_value(raw: bytes):
    d = proton.Data()
    d.decode(raw)
    d.rewind()
    d.next()
    return _plain(d.get_object())


def _plain(v):
    """proton hands binaries out as views into its buffer: copy them."""
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    return v


VALUES = [
    None, True, False, 0, 1, -1, 127, -128, 300, -(2 ** 63), 2 ** 63 - 1, 1.5, "", "héllo",
    "x" * 300, b"", b"\x00\xff", b"y" * 70000, T.Symbol("sym"), T.UInt(0), T.UInt(7),
    T.UInt(2 ** 32 - 1), T.ULong(0), T.ULong(255), T.ULong(2 ** 64 - 1), T.UByte(200),
    T.UShort(65535), T.Byte(-5), T.Short(-300), T.Int(-70000), T.Int(5), T.Float(0.5),
    T.Char("€"), T.Timestamp(1700000000123), uuid.UUID(int=12345),
    [], [1, "a", [None]], {"k": 1, T.Symbol("s"): [1, 2]}, {"big": "v" * 300},
    T.symbol_array(["a", "bb"]), T.Array(0x71, [T.Int(1), T.Int(-1)]),
    T.Described(T.ULong(0x77), "value"), T.Described(T.Symbol("x:y"), [1]),
]

_PROTON_TYPES = {
    T.Symbol: "symbol", T.UInt: "uint", T.ULong: "ulong", T.UByte: "ubyte",
    T.UShort: "ushort", T.Byte: "byte", T.Short: "short", T.Int: "int32", T.Float: "float32",
    T.Char: "char", T.Timestamp: "timestamp",
}


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:30])
def test_A9_types_round_trip_through_proton(value):
    raw = encode(value)
    back, end = decode(raw)
    assert end == len(raw) and back == value and type(back) is type(value) or \
        isinstance(value, (list, dict)) and back == value
    # proton reads what ackmq wrote
    seen = _proton_value(raw)
    if isinstance(value, T.Described):
        assert seen.descriptor == value.descriptor and seen.value == value.value
    elif isinstance(value, T.Array):
        assert list(seen) == value.items
    else:
        assert seen == value
        name = _PROTON_TYPES.get(type(value))
        if name is not None:
            assert type(seen).__name__ == name
    # ackmq reads what proton writes for the same value
    d = proton.Data()
    d.put_object(seen)
    if not isinstance(value, (T.Described, T.Array)):
        assert decode(d.encode())[0] == value


def test_A9_proton_messages_decode():
    m = proton.Message(body=b"hi", durable=True, priority=7, ttl=2.5, id="abc",
                       correlation_id=uuid.UUID(int=1), subject="subj", reply_to="/queue/r",
                       content_type="text/plain", properties={"a": 1, "b": "x"},
                       annotations={"x-opt-a": "b"}, user_id=b"guest", creation_time=12.0)
    m.inferred = True  # bytes as a data section (else proton sends an amqp-value binary)
    got = decode_message(m.encode())
    assert got.header.durable is True and got.header.priority == 7 and got.header.ttl == 2500
    p = got.properties
    assert (p.message_id, p.correlation_id, p.subject, p.reply_to, p.content_type, p.user_id,
            p.creation_time) == ("abc", uuid.UUID(int=1), "subj", "/queue/r", "text/plain",
                                 b"guest", 12000)
    assert got.application_properties == {"a": 1, "b": "x"}
    assert got.message_annotations == {"x-opt-a": "b"}
    assert got.body == [(DATA, b"hi")] and got.data == b"hi"
    assert decode_message(proton.Message(body="text").encode()).body == [(AMQP_VALUE, "text")]
    seq = proton.Message()
    seq.inferred, seq.body = True, [b"a", b"b"]
    assert decode_message(seq.encode()).body == [(AMQP_SEQUENCE, [b"a", b"b"])]


def test_A9_proton_reads_ackmq_messages():
    m = Message10(
        header=Composite("header", durable=True, priority=3),
        message_annotations={T.Symbol("x-opt-k"): "v"},
        properties=Composite("properties", message_id="id-1", subject="s",
                             content_type=T.Symbol("application/json"), group_sequence=4),
        application_properties={"n": 5, "s": "t"},
        body=[(DATA, b"payload")])
    got = proton.Message()
    got.decode(m.encode())
    assert (got.durable, got.priority, got.id, got.subject, got.content_type, got.group_sequence,
            got.properties, got.annotations, got.body) == (
        True, 3, "id-1", "s", "application/json", 4, {"n": 5, "s": "t"}, {"x-opt-k": "v"},
        b"payload")
    assert decode_message(m.encode()) == m


def _proton_client_bytes(action) -> bytes:
    """What a proton client engine writes (SASL ANONYMOUS, open, begin, ...)."""
    c = proton.Connection()
    c.container = "cid"
    c.hostname = "vhost:/"
    t = proton.Transport()
    t.sasl().allowed_mechs("ANONYMOUS")
    t.bind(c)
    action(c)
    out = _drain(t)
    # the server's side, as ackmq writes it: proton answers only after the mechanisms
    t.push(F.SASL_HEADER + F.encode_frame(0, Composite(
        "sasl_mechanisms", sasl_server_mechanisms=["PLAIN", "ANONYMOUS"]), b"", F.SASL_FRAME))
    out += _drain(t)
    t.push(F.encode_frame(0, Composite("sasl_outcome", code=0), b"", F.SASL_FRAME)
           + F.AMQP_HEADER)
    return out + _drain(t)


def _drain(t) -> bytes:
    out = b""
    while True:
        n = t.pending()
        if n <= 0:
            return out
        out += t.peek(n)
        t.pop(n)


def test_A9_decoder_reads_proton_frames():
    def act(c):
        c.open()
        s = c.session()
        s.open()
        snd = s.sender("l1")
        snd.target.address = "/queues/q"
        snd.open()
    raw = _proton_client_bytes(act)
    dec = Decoder(max_frame_size=1 << 20)
    events = []
    for i in range(0, len(raw), 3):  # any split of the stream reads the same
        events += dec.feed(raw[i:i + 3])
    kinds = [getattr(e, "performative", e).__class__.__name__ if not isinstance(e, F.Frame)
             else e.performative.kind for e in events]
    assert kinds[0] == "ProtocolHeader" and events[0].protocol_id == 3
    assert "sasl_init" in kinds
    frames = [e for e in events if isinstance(e, F.Frame)]
    init = frames[0].performative
    assert init.kind == "sasl_init" and init.mechanism == "ANONYMOUS"
    assert kinds[-4:] == ["ProtocolHeader", "open", "begin", "attach"]
    op, begin, attach = (f.performative for f in frames[-3:])
    assert (op.container_id, op.hostname) == ("cid", "vhost:/")
    assert begin.remote_channel is None and begin.next_outgoing_id == 0
    assert (attach.name, attach.handle, attach.role) == ("l1", 0, False)
    target = attach.target
    assert isinstance(target, T.Described)


def test_A9_our_frames_read_by_proton():
    """proton's engine, as a client, accepts ackmq's server frames (open, begin)."""
    c = proton.Connection()
    c.container = "cid"
    t = proton.Transport()
    t.bind(c)
    c.open()
    server = (F.AMQP_HEADER
              + F.encode_frame(0, Composite("open", container_id="ackmq", max_frame_size=65536,
                                            channel_max=255, idle_time_out=30000,
                                            offered_capabilities=["ANONYMOUS-RELAY"])))
    t.push(server)
    assert c.remote_container == "ackmq"
    assert t.remote_max_frame_size == 65536
    assert list(c.remote_offered_capabilities) == ["ANONYMOUS-RELAY"]


def test_A9_frame_errors():
    with pytest.raises(F.BadHeader):
        Decoder().feed(b"HTTP/1.1")
    d = Decoder(max_frame_size=512)
    d.feed(F.AMQP_HEADER)
    with pytest.raises(FramingError) as e:
        d.feed(b"\x00\x00\x10\x00\x02\x00\x00\x00")
    assert e.value.condition == F.FRAME_SIZE_TOO_SMALL
    d = Decoder(max_frame_size=512)
    d.feed(F.AMQP_HEADER)
    with pytest.raises(FramingError) as e:  # an unknown descriptor
        d.feed(b"\x00\x00\x00\x0d\x02\x00\x00\x00\x00\x53\x99\x45\x40")
    assert e.value.condition == F.DECODE_ERROR
    for bad in (b"\xc0\x05\x09\x40", b"\xa1\x05ab", b"\xc1\x03\x01\x40\x40", b"\x56\x02",
                b"\xff"):
        with pytest.raises(T.DecodeError):
            decode(bad)


def test_A9_split_transfer_reassembles():
    tr = Composite("transfer", handle=0, delivery_id=0, delivery_tag=b"t", message_format=0)
    frames = F.encode_frames(0, tr, b"z" * 2000, 512)
    assert len(frames) > 3 and all(len(f) <= 512 for f in frames)
    d = Decoder(max_frame_size=512)
    d.feed(F.AMQP_HEADER)
    got = d.feed(b"".join(frames))
    assert b"".join(f.payload for f in got) == b"z" * 2000
    assert [f.performative.more for f in got] == [True] * (len(got) - 1) + [False]


def test_A9_numeric_fields_out_of_their_type_range_are_decode_errors():
    """Found by the listener fuzzer: an open whose channel-max is a long -1 (not a
    ushort) must be a decode error, not a value the server later fails to encode."""
    from ackmq.protocol.amqp10.composite import from_fields
    with pytest.raises(T.DecodeError):
        from_fields("open", ["c", None, None, -1])
    with pytest.raises(T.DecodeError):
        from_fields("begin", [None, 0, 2 ** 32, 0])
    assert from_fields("open", ["c", None, T.UInt(512), T.UShort(7)]).channel_max == 7


@pytest.mark.parametrize("settled", [False, True])
def test_amqp10_delivery_frames_are_encode_frames(settled: bool) -> None:
    """The delivery path's transfer, written without a performative (issue 39), is
    byte for byte the performative's encoding, split alike when the payload needs
    more than one frame."""
    for handle, did, size, frame_max in ((0, 0, 0, 512), (1, 255, 100, 512),
                                          (300, 70000, 1000, 512), (7, 2**32 - 1, 300, 65536),
                                          (2, 256, 5000, 4096)):
        tag = (did * 3).to_bytes(8, "big")
        payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
        want = F.encode_frames(5, Composite("transfer", handle=T.UInt(handle),
                                            delivery_id=T.UInt(did), delivery_tag=tag,
                                            message_format=T.UInt(0), settled=settled or None),
                               payload, frame_max)
        assert delivery_frames(5, handle, did, tag, settled, payload, frame_max) == want


def test_amqp10_settled_disposition_is_encode_frame() -> None:
    """A publisher's outcomes, written without a performative (issue 39), are byte for
    byte the performative's encoding."""
    for state in (Composite("accepted"), Composite("released"), Composite("rejected"),
                  Composite("rejected", error=Composite("error", condition=T.Symbol("c"),
                                                        description="d" * 300))):
        for role, first, last in ((True, 0, None), (True, 5, 7), (False, 300, 2**32 - 1)):
            want = F.encode_frame(3, Composite(
                "disposition", role=role, first=T.UInt(first),
                last=T.UInt(last) if last is not None else None, settled=True, state=state))
            assert settled_disposition(3, role, first, last, state.encode_amqp()) == want


def _general(body: bytes) -> Any:
    """The general decoder's reading of a performative: (Composite, end) or the error."""
    try:
        v, end = decode(body, 0)
        return from_described(v), end
    except DecodeError as e:
        return type(e)


def test_amqp10_transfer_fast_read_is_the_general_one() -> None:
    """Transfers read without the general decoder (issue 39) give the Composite it
    gives; anything else (other encodings, truncated, mutated bytes) is left to it."""
    import random
    rnd = random.Random(39)
    cases = []
    for fields in (dict(handle=T.UInt(0)),
                   dict(handle=T.UInt(1), delivery_id=T.UInt(300), delivery_tag=b"t" * 8,
                        message_format=T.UInt(0), settled=False, more=False),
                   dict(handle=T.UInt(255), delivery_id=T.UInt(2**32 - 1), delivery_tag=b"",
                        settled=True, more=True, rcv_settle_mode=T.UByte(1), resume=True,
                        aborted=True, batchable=True),
                   dict(handle=T.UInt(7), state=Composite("accepted")),
                   dict(handle=T.UInt(7), delivery_tag=b"z" * 40)):
        cases.append(Composite("transfer", **fields).encode_amqp())
    cases.append(b"\x00\x53\x14\xc0\x04\x02\x43\x56\x01")  # not a transfer's field types
    cases.append(b"\x00\x53\x14\xc0\x07\x05\x43\x43\x40\x43\x56\x01")  # settled as 56 01
    cases.append(b"\x00\x53\x14\xc0\x02\x01\x40")  # a null handle
    assert _fast_reads_agree(cases, F._transfer, rnd) > 100


def _fast_reads_agree(cases: list[bytes], fast: Any, rnd: Any) -> int:
    """Each case, its truncations and 200 mutations, with and without a data section
    after it, read by `_performative` as the general decoder reads it (refused alike;
    the same Composite of the same AMQP types: a uint re-encodes as a uint); how many
    the fast reader `fast` took."""
    for base in list(cases):
        cases.extend(base[:k] for k in range(len(base)))
        for _ in range(200):
            b = bytearray(base)
            b[rnd.randrange(4, len(b))] = rnd.randrange(256)
            cases.append(bytes(b))
    taken = 0
    for body in cases:
        for tail in (b"", b"\x00\x53\x75\xa0\x01x"):
            want = _general(body + tail)
            if not isinstance(want, tuple):  # refused: the frame reader says so
                with pytest.raises(F.FramingError):
                    F._performative(body + tail)
                continue
            taken += fast(body + tail) is not None
            got = F._performative(body + tail)
            assert got == want
            assert [type(v) for v in got[0].values] == [type(v) for v in want[0].values]
            state = getattr(want[0], "state", None) if want[0].kind == "disposition" else None
            if isinstance(state, T.Described):
                assert type(got[0].state.descriptor) is type(state.descriptor)
    return taken


def test_amqp10_disposition_fast_read_is_the_general_one() -> None:
    """Dispositions read without the general decoder (issue 39) give the Composite it
    gives, the state a Described outcome of the same types; anything else (an outcome
    with fields, other encodings, truncated or mutated bytes) is left to it."""
    import random
    rnd = random.Random(1539)
    cases = []
    for fields in (dict(role=True, first=T.UInt(0)),
                   dict(role=True, first=T.UInt(5), last=T.UInt(300), settled=True,
                        state=Composite("accepted")),
                   dict(role=False, first=T.UInt(2**32 - 1), settled=False,
                        state=Composite("released"), batchable=True),
                   dict(role=True, first=T.UInt(1), state=Composite("rejected")),
                   dict(role=True, first=T.UInt(1), state=Composite("modified")),
                   dict(role=True, first=T.UInt(1), state=Composite(
                       "modified", delivery_failed=True)),
                   dict(role=True, first=T.UInt(1), state=Composite(
                       "rejected", error=Composite("error", condition=T.Symbol("c"))))):
        cases.append(Composite("disposition", **fields).encode_amqp())
    cases.append(b"\x00\x53\x15\xc0\x07\x05\x41\x43\x40\x41\x00\x53\x24\xc0\x01\x00")
    cases.append(b"\x00\x53\x15\xc0\x03\x02\x40\x43")  # a null role
    cases.append(b"\x00\x53\x15\xc0\x03\x02\x41\x40")  # a null first
    assert _fast_reads_agree(cases, F._disposition, rnd) > 100


def test_amqp10_composite_fields_are_properties_of_their_kind() -> None:
    """Every composite is of its kind's class, each field a property over `values`
    (a field read per message must not go through a failed lookup and __getattr__);
    built, decoded or read by the transfer fast path alike."""
    for kind in TABLE:
        cls = KINDS[kind]
        assert issubclass(cls, Composite) and not hasattr(cls(kind), "__dict__")
        for name, i in INDEX[kind].items():
            assert isinstance(cls.__dict__.get(name), property), (kind, name)
            c = Composite(kind)
            setattr(c, name, f"v{i}")
            assert getattr(c, name) == f"v{i}" == c.values[i]
        with pytest.raises(AttributeError):
            Composite(kind).no_such_field  # noqa: B018
    transfer = Composite("transfer", handle=T.UInt(1), delivery_id=T.UInt(7),
                         delivery_tag=b"t", settled=True)
    dec = Decoder()
    dec.want_header = False  # past the protocol header: frames only
    (frame,) = dec.feed(F.encode_frame(0, transfer))
    assert type(frame.performative) is KINDS["transfer"]
    assert frame.performative.delivery_id == 7 and frame.performative.settled is True
    assert type(from_described(decode(transfer.encode_amqp())[0])) is KINDS["transfer"]
