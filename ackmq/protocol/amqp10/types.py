"""The AMQP 1.0 type system (OASIS AMQP 1.0, part 1): every primitive encoding, described
types, lists, maps and arrays. Sans-IO: bytes in, Python values out, and back.

Encoding rules (part 1.6), as a table (code: type, width):

    0x40 null      0x41 true      0x42 false     0x56 boolean (1 byte)
    0x50 ubyte 1   0x60 ushort 2  0x70 uint 4    0x52 smalluint 1   0x43 uint0
    0x80 ulong 8   0x53 smallulong 1              0x44 ulong0
    0x51 byte 1    0x61 short 2   0x71 int 4     0x54 smallint 1
    0x81 long 8    0x55 smalllong 1
    0x72 float 4   0x82 double 8  0x74 decimal32 0x84 decimal64  0x94 decimal128
    0x73 char 4 (UTF-32)          0x83 timestamp 8 (ms since the epoch)   0x98 uuid 16
    0xa0 vbin8   0xb0 vbin32   0xa1 str8-utf8   0xb1 str32-utf8   0xa3 sym8   0xb3 sym32
    0x45 list0   0xc0 list8 (size, count)   0xd0 list32
    0xc1 map8    0xd1 map32 (count = 2 x pairs)
    0xe0 array8  0xf0 array32 (size, count, one element constructor, bare elements)
    0x00 described: a descriptor value, then the described value

Python values: None, bool, int (long), float (double), str (string), bytes (binary),
list, dict, uuid.UUID, and wrappers for the types Python has no own type for (Symbol,
UByte, UShort, UInt, ULong, Byte, Short, Int, Float, Char, Timestamp, Decimal32/64/128),
Array (element code + items) and Described (descriptor + value). Decoding returns the
wrappers, so what is decoded encodes back to the same types. The encoder writes the
smallest encoding of each value (proton reads them all; tests/test_amqp10_codec.py
checks both ways against proton). Anything malformed raises `DecodeError`
(amqp:decode-error).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

MAX_DEPTH = 64  # nesting of lists/maps/arrays/described values a decoder accepts


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP 1.0 encoding (amqp:decode-error)."""


class Symbol(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class Char(str):
    __slots__ = ()


class _Int(int):
    __slots__ = ()
    lo = hi = 0

    def __new__(cls, v: int = 0) -> Any:
        if not cls.lo <= int(v) <= cls.hi:
            raise ValueError(f"{cls.__name__} out of range: {v}")
        return int.__new__(cls, v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class UByte(_Int):
    __slots__ = ()
    lo, hi = 0, 0xFF


class UShort(_Int):
    __slots__ = ()
    lo, hi = 0, 0xFFFF


class UInt(_Int):
    __slots__ = ()
    lo, hi = 0, 0xFFFFFFFF


class ULong(_Int):
    __slots__ = ()
    lo, hi = 0, 0xFFFFFFFFFFFFFFFF


class Byte(_Int):
    __slots__ = ()
    lo, hi = -0x80, 0x7F


class Short(_Int):
    __slots__ = ()
    lo, hi = -0x8000, 0x7FFF


class Int(_Int):
    __slots__ = ()
    lo, hi = -0x80000000, 0x7FFFFFFF


class Timestamp(_Int):
    """Milliseconds since the Unix epoch."""
    __slots__ = ()
    lo, hi = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Float(float):
    __slots__ = ()


class _Decimal(bytes):
    """Kept as its raw IEEE 754 bytes (ackmq never computes with decimals)."""
    __slots__ = ()


class Decimal32(_Decimal):
    __slots__ = ()


class Decimal64(_Decimal):
    __slots__ = ()


class Decimal128(_Decimal):
    __slots__ = ()


class Described:
    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Any, value: Any) -> None:
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Described) and other.descriptor == self.descriptor
                and other.value == self.value)

    def __hash__(self) -> int:
        return hash(self.descriptor)

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


class Array:
    """An AMQP array: one element type (`code`, a constructor byte) for every item."""
    __slots__ = ("code", "items")

    def __init__(self, code: int, items: list[Any]) -> None:
        self.code = code
        self.items = items

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Array) and other.items == self.items

    def __repr__(self) -> str:
        return f"Array(0x{self.code:02x}, {self.items!r})"


# -- decoding --------------------------------------------------------------------------
_B = struct.Struct(">b")
_H = struct.Struct(">H")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")

# fixed-width codes: width, reader (of `width` bytes at pos)
_FIXED: dict[int, tuple[int, Any]] = {
    0x40: (0, lambda b, p: None),
    0x41: (0, lambda b, p: True),
    0x42: (0, lambda b, p: False),
    0x43: (0, lambda b, p: UInt(0)),
    0x44: (0, lambda b, p: ULong(0)),
    0x45: (0, lambda b, p: []),
    0x50: (1, lambda b, p: UByte(b[p])),
    0x51: (1, lambda b, p: Byte(_B.unpack_from(b, p)[0])),
    0x52: (1, lambda b, p: UInt(b[p])),
    0x53: (1, lambda b, p: ULong(b[p])),
    0x54: (1, lambda b, p: Int(_B.unpack_from(b, p)[0])),
    0x55: (1, lambda b, p: _B.unpack_from(b, p)[0]),
    0x56: (1, lambda b, p: _bool(b[p])),
    0x60: (2, lambda b, p: UShort(_H.unpack_from(b, p)[0])),
    0x61: (2, lambda b, p: Short(_h.unpack_from(b, p)[0])),
    0x70: (4, lambda b, p: UInt(_I.unpack_from(b, p)[0])),
    0x71: (4, lambda b, p: Int(_i.unpack_from(b, p)[0])),
    0x72: (4, lambda b, p: Float(_f.unpack_from(b, p)[0])),
    0x73: (4, lambda b, p: _char(bytes(b[p:p + 4]))),
    0x74: (4, lambda b, p: Decimal32(b[p:p + 4])),
    0x80: (8, lambda b, p: ULong(_Q.unpack_from(b, p)[0])),
    0x81: (8, lambda b, p: _q.unpack_from(b, p)[0]),
    0x82: (8, lambda b, p: _d.unpack_from(b, p)[0]),
    0x83: (8, lambda b, p: Timestamp(_q.unpack_from(b, p)[0])),
    0x84: (8, lambda b, p: Decimal64(b[p:p + 8])),
    0x94: (16, lambda b, p: Decimal128(b[p:p + 16])),
    0x98: (16, lambda b, p: uuid.UUID(bytes=bytes(b[p:p + 16]))),
}
_VARIABLE = {0xa0: 1, 0xa1: 1, 0xa3: 1, 0xb0: 4, 0xb1: 4, 0xb3: 4}
_COMPOUND = {0xc0: 1, 0xc1: 1, 0xd0: 4, 0xd1: 4, 0xe0: 1, 0xf0: 4}


def _bool(v: int) -> bool:
    if v > 1:
        raise DecodeError(f"boolean byte {v}")
    return v == 1


def _char(raw: bytes) -> Char:
    try:
        return Char(raw.decode("utf-32-be"))
    except UnicodeDecodeError:
        raise DecodeError("invalid char") from None


def _need(buf: Any, pos: int, n: int) -> None:
    if pos + n > len(buf):
        raise DecodeError("truncated value")


def decode(buf: Any, pos: int = 0, depth: int = 0) -> tuple[Any, int]:
    """One value from `buf` (bytes or memoryview) at `pos` -> (value, next pos)."""
    if pos >= len(buf):  # _need, inlined: once per value decoded
        raise DecodeError("truncated value")
    code = buf[pos]
    pos += 1
    if code == 0x00:
        if depth >= MAX_DEPTH:
            raise DecodeError("nested too deep")
        descriptor, pos = decode(buf, pos, depth + 1)
        if isinstance(descriptor, Described):
            raise DecodeError("described descriptor")
        value, pos = decode(buf, pos, depth + 1)
        return Described(descriptor, value), pos
    return _decode_body(buf, code, pos, depth)


def _decode_body(buf: Any, code: int, pos: int, depth: int) -> tuple[Any, int]:
    fixed = _FIXED.get(code)
    if fixed is not None:
        width, read = fixed
        if pos + width > len(buf):  # _need, inlined
            raise DecodeError("truncated value")
        return read(buf, pos), pos + width
    w = _VARIABLE.get(code)
    if w is not None:
        _need(buf, pos, w)
        n = buf[pos] if w == 1 else _I.unpack_from(buf, pos)[0]
        pos += w
        _need(buf, pos, n)
        raw = bytes(buf[pos:pos + n])
        pos += n
        if code & 0x0F == 0:
            return raw, pos
        try:
            text = raw.decode("utf-8") if code & 0x0F == 1 else raw.decode("ascii")
        except UnicodeDecodeError:
            raise DecodeError("invalid string or symbol") from None
        return (text if code & 0x0F == 1 else Symbol(text)), pos
    w = _COMPOUND.get(code)
    if w is None:
        raise DecodeError(f"unknown type code 0x{code:02x}")
    if depth >= MAX_DEPTH:
        raise DecodeError("nested too deep")
    _need(buf, pos, 2 * w)
    if w == 1:
        size, count = buf[pos], buf[pos + 1]
    else:
        size, count = _I.unpack_from(buf, pos)[0], _I.unpack_from(buf, pos + 4)[0]
    if size < w:
        raise DecodeError("compound size below its count")
    start = pos + 2 * w
    end = pos + w + size  # size counts the count field and the items
    if end > len(buf):
        raise DecodeError("truncated compound")
    if count > size:  # every item takes at least one byte
        raise DecodeError("compound count past its size")
    p = start
    if code in (0xe0, 0xf0):
        items, p = _decode_array(buf, p, count, depth + 1, end)
        value: Any = items
    elif code in (0xc1, 0xd1):
        if count % 2:
            raise DecodeError("map with an odd count")
        m: dict[Any, Any] = {}
        for _ in range(count // 2):
            k, p = decode(buf, p, depth + 1)
            v, p = decode(buf, p, depth + 1)
            try:
                m[k] = v
            except TypeError:
                raise DecodeError("unhashable map key") from None
        value = m
    else:
        lst = []
        for _ in range(count):
            v, p = decode(buf, p, depth + 1)
            lst.append(v)
        value = lst
    if p != end:
        raise DecodeError("compound size does not match its items")
    return value, end


def _decode_array(buf: Any, p: int, count: int, depth: int, end: int) -> tuple[Array, int]:
    _need(buf, p, 1)
    code = buf[p]
    p += 1
    descriptor = None
    if code == 0x00:
        descriptor, p = decode(buf, p, depth + 1)
        _need(buf, p, 1)
        code = buf[p]
        p += 1
    items = []
    for _ in range(count):
        if p > end:
            raise DecodeError("array past its size")
        v, p = _decode_body(buf, code, p, depth)
        items.append(v if descriptor is None else Described(descriptor, v))
    arr = Array(code, items)
    return arr, p


# -- encoding --------------------------------------------------------------------------
def _enc_int(v: int) -> bytes:  # plain Python int: long
    if -128 <= v <= 127:
        return b"\x55" + _B.pack(v)
    return b"\x81" + _q.pack(v)


def _enc_uint(v: int) -> bytes:
    if v == 0:
        return b"\x43"
    if v < 256:
        return b"\x52" + bytes((v,))
    return b"\x70" + _I.pack(v)


def _enc_ulong(v: int) -> bytes:
    if v == 0:
        return b"\x44"
    if v < 256:
        return b"\x53" + bytes((v,))
    return b"\x80" + _Q.pack(v)


def _enc_int32(v: int) -> bytes:
    if -128 <= v <= 127:
        return b"\x54" + _B.pack(v)
    return b"\x71" + _i.pack(v)


def _vbin(small: int, big: int, raw: bytes) -> bytes:
    n = len(raw)
    if n < 256:
        return bytes((small, n)) + raw
    return bytes((big,)) + _I.pack(n) + raw


def _compound(small: int, big: int, count: int, body: bytes) -> bytes:
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((big,)) + _I.pack(len(body) + 4) + _I.pack(count) + body


def encode_list(items: list[Any]) -> bytes:
    if not items:
        return b"\x45"
    return _compound(0xc0, 0xd0, len(items), b"".join(encode(v) for v in items))


def encode_map(m: dict[Any, Any]) -> bytes:
    body = b"".join(encode(k) + encode(v) for k, v in m.items())
    return _compound(0xc1, 0xd1, 2 * len(m), body)


# element encodings of an array: one constructor for all, so the widest form
_ARRAY_ELEMENT: dict[int, Any] = {
    0x40: lambda v: b"", 0x56: lambda v: b"\x01" if v else b"\x00",
    0x50: lambda v: bytes((v,)), 0x51: _B.pack, 0x60: _H.pack, 0x61: _h.pack,
    0x70: _I.pack, 0x71: _i.pack, 0x80: _Q.pack, 0x81: _q.pack, 0x72: _f.pack,
    0x82: _d.pack, 0x83: _q.pack, 0x73: lambda v: v.encode("utf-32-be"),
    0x98: lambda v: v.bytes, 0x74: bytes, 0x84: bytes, 0x94: bytes,
    0xb0: lambda v: _I.pack(len(v)) + v,
    0xb1: lambda v: _I.pack(len(v.encode())) + v.encode(),
    0xb3: lambda v: _I.pack(len(v)) + v.encode("ascii"),
    0xd0: lambda v: _wide_list(v),
    0xd1: lambda v: _wide_map(v),
}


def _wide_list(items: list[Any]) -> bytes:
    body = b"".join(encode(v) for v in items)
    return _I.pack(len(body) + 4) + _I.pack(len(items)) + body


def _wide_map(m: dict[Any, Any]) -> bytes:
    body = b"".join(encode(k) + encode(v) for k, v in m.items())
    return _I.pack(len(body) + 4) + _I.pack(2 * len(m)) + body


_WIDE = {0x41: 0x56, 0x42: 0x56, 0x43: 0x70, 0x52: 0x70, 0x44: 0x80, 0x53: 0x80,
         0x54: 0x71, 0x55: 0x81, 0xa0: 0xb0, 0xa1: 0xb1, 0xa3: 0xb3, 0x45: 0xd0,
         0xc0: 0xd0, 0xc1: 0xd1, 0xe0: 0xf0}


def encode_array(arr: Array) -> bytes:
    code = _WIDE.get(arr.code, arr.code)
    element = _ARRAY_ELEMENT.get(code)
    if element is None:
        raise ValueError(f"cannot encode an array of 0x{code:02x}")
    body = bytes((code,)) + b"".join(element(v) for v in arr.items)
    n = len(arr.items)
    if len(body) + 1 < 256 and n < 256:
        return bytes((0xe0, len(body) + 1, n)) + body
    return b"\xf0" + _I.pack(len(body) + 4) + _I.pack(n) + body


def symbol_array(items: list[str]) -> Array:
    return Array(0xb3, [Symbol(s) for s in items])


def encode(v: Any) -> bytes:
    """One value in its smallest encoding (see the module's table)."""
    t = type(v)
    enc = _ENCODERS.get(t)
    if enc is not None:
        return enc(v)
    for base, enc in _ENCODERS.items():  # subclasses (IntEnum, str subclasses...)
        if isinstance(v, base) and base not in (bool, int, str, float, bytes):
            return enc(v)
    if isinstance(v, bool):
        return b"\x41" if v else b"\x42"
    if isinstance(v, int):
        return _enc_int(v)
    if isinstance(v, str):
        return _vbin(0xa1, 0xb1, v.encode("utf-8"))
    if isinstance(v, float):
        return b"\x82" + _d.pack(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _vbin(0xa0, 0xb0, bytes(v))
    if isinstance(v, (list, tuple)):
        return encode_list(list(v))
    if isinstance(v, dict):
        return encode_map(v)
    if hasattr(v, "encode_amqp"):  # performatives, sections: described lists
        return v.encode_amqp()
    raise TypeError(f"no AMQP 1.0 encoding for {t.__name__}")


_ENCODERS: dict[type, Any] = {
    type(None): lambda v: b"\x40",
    bool: lambda v: b"\x41" if v else b"\x42",
    int: _enc_int,
    float: lambda v: b"\x82" + _d.pack(v),
    str: lambda v: _vbin(0xa1, 0xb1, v.encode("utf-8")),
    bytes: lambda v: _vbin(0xa0, 0xb0, v),
    Symbol: lambda v: _vbin(0xa3, 0xb3, v.encode("ascii")),
    Char: lambda v: b"\x73" + v.encode("utf-32-be"),
    UByte: lambda v: b"\x50" + bytes((v,)),
    UShort: lambda v: b"\x60" + _H.pack(v),
    UInt: _enc_uint,
    ULong: _enc_ulong,
    Byte: lambda v: b"\x51" + _B.pack(v),
    Short: lambda v: b"\x61" + _h.pack(v),
    Int: _enc_int32,
    Timestamp: lambda v: b"\x83" + _q.pack(v),
    Float: lambda v: b"\x72" + _f.pack(v),
    Decimal32: lambda v: b"\x74" + bytes(v),
    Decimal64: lambda v: b"\x84" + bytes(v),
    Decimal128: lambda v: b"\x94" + bytes(v),
    uuid.UUID: lambda v: b"\x98" + v.bytes,
    list: encode_list,
    tuple: lambda v: encode_list(list(v)),
    dict: encode_map,
    Array: encode_array,
    Described: lambda v: b"\x00" + encode(v.descriptor) + encode(v.value),
}
