"""The MQTT 3.1 / 3.1.1 / 5.0 wire format, sans-IO: `Decoder.feed(bytes) -> packets` and
`encode(packet, level) -> bytes`.

Every way bytes can be wrong is an `MQTTError` carrying the 5.0 reason code the
specification names for it (0x81 malformed, 0x82 protocol error, 0x95 packet too large,
0x84 unsupported protocol version) and the packets decoded before it; the decoder raises
nothing else, whatever it is fed. The protocol level is read from CONNECT (the decoder of
a server) or set by the caller (`level`, a client's decoder after its CONNECT)."""

from __future__ import annotations

from typing import Any

from ackmq.protocol.wire import U16 as _U16
from ackmq.protocol.wire import U32 as _U32

from .constants import (
    AUTH,
    BINARY,
    BYTE,
    CONNACK,
    CONNECT,
    DISCONNECT,
    FIXED_FLAGS,
    FOUR,
    MALFORMED_PACKET,
    MAX_VARINT,
    MQTT5,
    MQTT31,
    MQTT311,
    PACKET_NAMES,
    PACKET_TOO_LARGE,
    PINGREQ,
    PINGRESP,
    PROPERTIES,
    PROPERTY_IDS,
    PROTOCOL_ERROR,
    PROTOCOL_NAMES,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    REPEATABLE,
    SUBACK,
    SUBSCRIBE,
    TWO,
    UNSUBACK,
    UNSUBSCRIBE,
    UNSUPPORTED_PROTOCOL_VERSION,
    UTF8,
    VARINT,
    WILL,
)
from .packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PublishResponse,
    PubRec,
    PubRel,
    SubAck,
    SubOptions,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
)


class MQTTError(Exception):
    """Bytes that are not MQTT: `reason_code` (5.0's), a text, and the packets decoded
    before the bad one (`packets`), which the caller still handles."""

    def __init__(self, reason_code: int, text: str) -> None:
        super().__init__(text)
        self.reason_code = reason_code
        self.text = text
        self.packets: list[Packet] = []


def _malformed(text: str) -> MQTTError:
    return MQTTError(MALFORMED_PACKET, text)


# -- variable byte integers ---------------------------------------------------------------
def encode_varint(n: int) -> bytes:
    if not 0 <= n <= MAX_VARINT:
        raise ValueError(f"{n} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int, end: int = -1
                  ) -> tuple[int, int] | None:
    """(value, next position), or None when the buffer (up to `end`) ends inside it."""
    if end < 0:
        end = len(buf)
    value = shift = 0
    for i in range(4):
        if pos + i >= end:
            return None
        b = buf[pos + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if i and b == 0:  # a longer encoding than needed ([MQTT-1.5.5-1])
                raise _malformed("variable byte integer not in its shortest form")
            return value, pos + i + 1
        shift += 7
    raise _malformed("variable byte integer longer than 4 bytes")


# -- a packet body reader -----------------------------------------------------------------
class _Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> bytes:
        p = self.pos
        if p + n > self.end:
            raise _malformed("packet shorter than its fields")
        self.pos = p + n
        return self.buf[p:p + n]

    def byte(self) -> int:
        if self.pos >= self.end:
            raise _malformed("packet shorter than its fields")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def u16(self) -> int:
        return int(_U16.unpack(self.take(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def varint(self) -> int:
        got = decode_varint(self.buf, self.pos, self.end)
        if got is None:
            raise _malformed("packet shorter than its fields")
        value, self.pos = got
        return value

    def binary(self) -> bytes:
        return self.take(self.u16())

    def utf8(self) -> str:
        raw = self.take(self.u16())
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("a string is not well-formed UTF-8") from None
        if "\x00" in text:  # [MQTT-1.5.4-2]
            raise _malformed("a string contains U+0000")
        return text

    def properties(self, ptype: int) -> Properties:
        length = self.varint()
        if length > self.left():
            raise _malformed("properties longer than the packet")
        end = self.pos + length
        props: Properties = {}
        while self.pos < end:
            ident = self.varint()
            spec = PROPERTIES.get(ident)
            if spec is None or ptype not in spec[2]:
                where = "the will" if ptype == WILL else PACKET_NAMES[ptype]
                raise _malformed(f"property 0x{ident:02x} is not valid in {where}")
            name, kind = spec[0], spec[1]
            saved_end, self.end = self.end, end  # a value may not run past the properties
            try:
                value = self._value(kind)
            finally:
                self.end = saved_end
            if name in REPEATABLE:
                props.setdefault(name, []).append(value)
            elif name in props:
                raise MQTTError(PROTOCOL_ERROR, f"property {name} given twice")
            else:
                props[name] = value
        return props

    def _value(self, kind: int) -> Any:
        if kind == BYTE:
            return self.byte()
        if kind == TWO:
            return self.u16()
        if kind == FOUR:
            return self.u32()
        if kind == VARINT:
            return self.varint()
        if kind == UTF8:
            return self.utf8()
        if kind == BINARY:
            return self.binary()
        return (self.utf8(), self.utf8())  # PAIR


_ACKS: dict[int, type[PubAck | PubRec | PubRel | PubComp]] = {
    PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}
_ACK_TYPES: dict[type[PublishResponse], int] = {cls: t for t, cls in _ACKS.items()}


# -- the decoder ----------------------------------------------------------------------------
class Decoder:
    """Bytes in, packets out. `max_packet_size`: a larger packet (whole, fixed header
    included) is refused with 0x95 as soon as its length is read, before its body
    arrives. `level`: the protocol level, set from CONNECT when `server` is true."""

    def __init__(self, max_packet_size: int = MAX_VARINT + 5, level: int = MQTT311,
                 server: bool = True) -> None:
        self.max_packet_size = max_packet_size
        self.level = level
        self.server = server
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        buf = self.buf
        buf += data
        out: list[Packet] = []
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 2:
                got = decode_varint(buf, pos + 1)
                if got is None:
                    break
                length, body = got
                if body - pos + length > self.max_packet_size:
                    raise MQTTError(PACKET_TOO_LARGE, f"a packet of {body - pos + length} "
                                    f"bytes is above the maximum packet size "
                                    f"{self.max_packet_size}")
                if body + length > n:
                    break
                first = buf[pos]
                out.append(self._packet(first >> 4, first & 0x0F, bytes(buf[body:body + length])))
                pos = body + length
        except MQTTError as e:
            e.packets = out
            self.buf = bytearray()
            raise
        del buf[:pos]
        return out

    def _packet(self, ptype: int, flags: int, body: bytes) -> Packet:
        if ptype == PUBLISH:
            return self._publish(flags, body)
        if ptype == 0:
            raise _malformed("packet type 0 is reserved")
        if flags != FIXED_FLAGS[ptype]:
            raise _malformed(f"{PACKET_NAMES[ptype]} with reserved flags {flags:#x}")
        r = _Reader(body)
        v5 = self.level == MQTT5
        p: Packet
        if ptype == CONNECT:
            p = self._connect(r)
        elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            pid = r.u16()
            code = 0
            props: Properties = {}
            if v5 and r.left():
                code = r.byte()
                if r.left():
                    props = r.properties(ptype)
            cls = _ACKS[ptype]
            p = cls(pid, code, props)
        elif ptype == SUBSCRIBE:
            p = self._subscribe(r)
        elif ptype == UNSUBSCRIBE:
            pid = self._packet_id(r)
            props = r.properties(ptype) if v5 else {}
            topics = []
            while r.left():
                topics.append(r.utf8())
            if not topics:
                raise MQTTError(PROTOCOL_ERROR, "UNSUBSCRIBE with no topic filter")
            p = Unsubscribe(pid, topics, props)
        elif ptype in (PINGREQ, PINGRESP):
            p = PingReq() if ptype == PINGREQ else PingResp()
        elif ptype == DISCONNECT:
            code = r.byte() if v5 and r.left() else 0
            props = r.properties(ptype) if v5 and r.left() else {}
            p = Disconnect(code, props)
        elif ptype == AUTH:
            if not v5:
                raise _malformed("AUTH is an MQTT 5 packet")
            code = r.byte() if r.left() else 0
            props = r.properties(ptype) if r.left() else {}
            p = Auth(code, props)
        elif ptype == CONNACK:
            flags_byte = r.byte()
            if flags_byte & 0xFE:
                raise _malformed("CONNACK with reserved acknowledge flags")
            code = r.byte()
            props = r.properties(ptype) if v5 else {}
            p = ConnAck(code, bool(flags_byte & 1), props)
        elif ptype == SUBACK:
            pid = r.u16()
            props = r.properties(ptype) if v5 else {}
            p = SubAck(pid, list(r.take(r.left())), props)
        else:  # UNSUBACK
            pid = r.u16()
            props = r.properties(ptype) if v5 else {}
            p = UnsubAck(pid, list(r.take(r.left())) if v5 else [], props)
        if r.left() and ptype not in (SUBACK, UNSUBACK):
            raise _malformed(f"{PACKET_NAMES[ptype]} longer than its fields")
        return p

    @staticmethod
    def _packet_id(r: _Reader) -> int:
        pid = r.u16()
        if pid == 0:
            raise _malformed("packet identifier 0")
        return pid

    def _publish(self, flags: int, body: bytes) -> Publish:
        qos = (flags >> 1) & 3
        if qos == 3:
            raise _malformed("PUBLISH with QoS 3")
        dup = bool(flags & 8)
        if dup and qos == 0:
            raise _malformed("PUBLISH with DUP set at QoS 0")
        r = _Reader(body)
        topic = r.utf8()
        pid = self._packet_id(r) if qos else 0
        props = r.properties(PUBLISH) if self.level == MQTT5 else {}
        return Publish(topic, body[r.pos:], qos, bool(flags & 1), dup, pid, props)

    def _connect(self, r: _Reader) -> Connect:
        name = r.utf8()
        level = r.byte()
        if (name, level) not in (("MQIsdp", MQTT31), ("MQTT", MQTT311), ("MQTT", MQTT5)):
            if name not in ("MQTT", "MQIsdp"):
                raise MQTTError(PROTOCOL_ERROR, f"protocol name {name[:20]!r} is not MQTT")
            err = MQTTError(UNSUPPORTED_PROTOCOL_VERSION,
                            f"protocol level {level} is not supported (3, 4 and 5 are)")
            raise err
        self.level = level
        cflags = r.byte()
        if cflags & 1:
            raise _malformed("CONNECT with the reserved flag set")
        keep_alive = r.u16()
        props = r.properties(CONNECT) if level == MQTT5 else {}
        client_id = r.utf8()
        will = None
        will_qos = (cflags >> 3) & 3
        if cflags & 4:
            if will_qos == 3:
                raise _malformed("CONNECT with will QoS 3")
            wprops = r.properties(WILL) if level == MQTT5 else {}
            will = Will(r.utf8(), r.binary(), will_qos, bool(cflags & 0x20), wprops)
        elif will_qos or cflags & 0x20:
            raise _malformed("CONNECT with will QoS or retain but no will flag")
        username = r.utf8() if cflags & 0x80 else None
        if cflags & 0x40 and username is None and level != MQTT5:
            raise _malformed("CONNECT with a password but no user name")
        password = r.binary() if cflags & 0x40 else None
        return Connect(client_id, level, bool(cflags & 2), keep_alive, will, username,
                       password, props)

    def _subscribe(self, r: _Reader) -> Subscribe:
        pid = self._packet_id(r)
        v5 = self.level == MQTT5
        props = r.properties(SUBSCRIBE) if v5 else {}
        topics: list[tuple[str, SubOptions]] = []
        while r.left():
            topic = r.utf8()
            o = r.byte()
            if (o & 0xC0 if v5 else o & 0xFC) or (o & 3) == 3 or (o >> 4) & 3 == 3:
                raise _malformed("SUBSCRIBE with reserved subscription options")
            topics.append((topic, SubOptions(o & 3, bool(o & 4), bool(o & 8), (o >> 4) & 3)))
        if not topics:
            raise MQTTError(PROTOCOL_ERROR, "SUBSCRIBE with no topic filter")
        return Subscribe(pid, topics, props)


# -- encoding -------------------------------------------------------------------------------
def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U16.pack(len(b)) + b


def _bin(b: bytes) -> bytes:
    return _U16.pack(len(b)) + b


def encode_properties(props: Properties) -> bytes:
    """The property length and properties, in the order given (paho's order is the
    caller's); repeatables once per value."""
    out = bytearray()
    for name, value in props.items():
        ident, kind = PROPERTY_IDS[name]
        values = value if name in REPEATABLE else [value]
        for v in values:
            out += encode_varint(ident)
            if kind == BYTE:
                out.append(v)
            elif kind == TWO:
                out += _U16.pack(v)
            elif kind == FOUR:
                out += _U32.pack(v)
            elif kind == VARINT:
                out += encode_varint(v)
            elif kind == UTF8:
                out += _str(v)
            elif kind == BINARY:
                out += _bin(v)
            else:
                out += _str(v[0]) + _str(v[1])
    return encode_varint(len(out)) + bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def encode_publish(topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                   packet_id: int, level: int, props: bytes = b"") -> bytes:
    """PUBLISH from its fields; `props` the encoded properties (5.0; b"": none): the
    delivery path calls this per message."""
    t = topic.encode("utf-8")
    head = _U16.pack(len(t)) + t
    if qos:
        head += _U16.pack(packet_id)
    if level == MQTT5:
        head += props or b"\x00"
    flags = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    return _packet(flags, head + payload)


def encode(p: Packet, level: int = MQTT311) -> bytes:
    """Any packet as bytes for a peer speaking `level`."""
    v5 = level == MQTT5
    props = (lambda: encode_properties(p.properties)) if v5 else (lambda: b"")  # type: ignore[union-attr]
    if isinstance(p, Publish):
        return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, level,
                              props())
    if isinstance(p, PublishResponse):
        ptype = _ACK_TYPES[type(p)]
        body = _U16.pack(p.packet_id)
        if v5 and (p.reason_code or p.properties):
            body += bytes((p.reason_code,))
            if p.properties:
                body += props()
        return _packet(ptype << 4 | FIXED_FLAGS[ptype], body)
    if isinstance(p, ConnAck):
        return _packet(CONNACK << 4, bytes((int(p.session_present), p.reason_code)) + props())
    if isinstance(p, SubAck):
        return _packet(SUBACK << 4, _U16.pack(p.packet_id) + props() + bytes(p.reason_codes))
    if isinstance(p, UnsubAck):
        codes = bytes(p.reason_codes) if v5 else b""
        return _packet(UNSUBACK << 4, _U16.pack(p.packet_id) + props() + codes)
    if isinstance(p, PingReq):
        return b"\xc0\x00"
    if isinstance(p, PingResp):
        return b"\xd0\x00"
    if isinstance(p, Disconnect | Auth):
        ptype = DISCONNECT if isinstance(p, Disconnect) else AUTH
        body = b""
        if v5 and (p.reason_code or p.properties):
            body = bytes((p.reason_code,)) + (props() if p.properties else b"")
        return _packet(ptype << 4, body)
    if isinstance(p, Subscribe):
        body = _U16.pack(p.packet_id) + props()
        for topic, o in p.topics:
            opts = o.qos
            if v5:
                opts |= (4 if o.no_local else 0) | (8 if o.retain_as_published else 0) \
                    | o.retain_handling << 4
            body += _str(topic) + bytes((opts,))
        return _packet(SUBSCRIBE << 4 | 2, body)
    if isinstance(p, Unsubscribe):
        return _packet(UNSUBSCRIBE << 4 | 2, _U16.pack(p.packet_id) + props()
                       + b"".join(_str(t) for t in p.topics))
    return _encode_connect(p, level)


def _encode_connect(p: Connect, level: int) -> bytes:
    flags = 2 if p.clean_start else 0
    w = p.will
    if w is not None:
        flags |= 4 | w.qos << 3 | (0x20 if w.retain else 0)
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    body = _str(PROTOCOL_NAMES[level]) + bytes((level, flags)) + _U16.pack(p.keep_alive)
    if level == MQTT5:
        body += encode_properties(p.properties)
    body += _str(p.client_id)
    if w is not None:
        if level == MQTT5:
            body += encode_properties(w.properties)
        body += _str(w.topic) + _bin(w.payload)
    if p.username is not None:
        body += _str(p.username)
    if p.password is not None:
        body += _bin(p.password)
    return _packet(CONNECT << 4, body)


LEVELS = (MQTT31, MQTT311, MQTT5)
