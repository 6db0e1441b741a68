"""AMQP 1.0 composite types: described lists whose fields have names, types and defaults
(part 1.4: performatives, SASL frames, delivery states, source/target, error, and the
message's header and properties sections). One table, `TABLE`, states them all, as the
specification writes them; `Composite` encodes and decodes any of them.

    name            code  fields (name, type, default; "!": mandatory; "*": multiple)

Encoding drops trailing fields that are null (part 1.4: "trailing nulls may be
omitted"); a field's type picks its encoding (a `uint` is written as a uint, whatever
Python int holds it); a multiple field of one value is written as that value, of several
as an array (part 1.4). Decoding takes any encoding a peer may write: a list0, list8 or
list32, fewer fields than the table has (the rest are defaults), a single value for a
multiple field. A mandatory field left null, or a field of the wrong type, is a
DecodeError (amqp:decode-error), as is a descriptor no table names (the caller decides:
an unknown performative is amqp:not-implemented... see frames.py).
"""

from __future__ import annotations

from typing import Any

from ackmq.protocol.amqp10.types import (
    Array,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    encode,
    encode_list,
    symbol_array,
)

# type name -> wrapper that gives a Python value its AMQP type on encoding
_WRAP: dict[str, Any] = {
    "uint": UInt, "ushort": UShort, "ulong": ULong, "ubyte": UByte, "symbol": Symbol,
    "timestamp": Timestamp,
}
# type name -> Python types a decoded value may have (None: any)
_ACCEPT: dict[str, tuple[type, ...] | None] = {
    "uint": (int,), "ushort": (int,), "ulong": (int,), "ubyte": (int,), "boolean": (bool,),
    "string": (str,), "symbol": (str,), "binary": (bytes,), "map": (dict,),
    "timestamp": (int,), "any": None, "error": (Described,), "list": (list,),
}

_F = tuple[str, str, Any]  # field: name, type ("!" mandatory, "*" multiple), default

TABLE: dict[str, tuple[int, tuple[_F, ...]]] = {
    # transport performatives (part 2.7)
    "open": (0x10, (
        ("container_id", "string!", None), ("hostname", "string", None),
        ("max_frame_size", "uint", 4294967295), ("channel_max", "ushort", 65535),
        ("idle_time_out", "uint", None), ("outgoing_locales", "symbol*", None),
        ("incoming_locales", "symbol*", None), ("offered_capabilities", "symbol*", None),
        ("desired_capabilities", "symbol*", None), ("properties", "map", None))),
    "begin": (0x11, (
        ("remote_channel", "ushort", None), ("next_outgoing_id", "uint!", None),
        ("incoming_window", "uint!", None), ("outgoing_window", "uint!", None),
        ("handle_max", "uint", 4294967295), ("offered_capabilities", "symbol*", None),
        ("desired_capabilities", "symbol*", None), ("properties", "map", None))),
    "attach": (0x12, (
        ("name", "string!", None), ("handle", "uint!", None), ("role", "boolean!", None),
        ("snd_settle_mode", "ubyte", 2), ("rcv_settle_mode", "ubyte", 0),
        ("source", "any", None), ("target", "any", None), ("unsettled", "map", None),
        ("incomplete_unsettled", "boolean", False), ("initial_delivery_count", "uint", None),
        ("max_message_size", "ulong", None), ("offered_capabilities", "symbol*", None),
        ("desired_capabilities", "symbol*", None), ("properties", "map", None))),
    "flow": (0x13, (
        ("next_incoming_id", "uint", None), ("incoming_window", "uint!", None),
        ("next_outgoing_id", "uint!", None), ("outgoing_window", "uint!", None),
        ("handle", "uint", None), ("delivery_count", "uint", None),
        ("link_credit", "uint", None), ("available", "uint", None),
        ("drain", "boolean", False), ("echo", "boolean", False), ("properties", "map", None))),
    "transfer": (0x14, (
        ("handle", "uint!", None), ("delivery_id", "uint", None),
        ("delivery_tag", "binary", None), ("message_format", "uint", None),
        ("settled", "boolean", None), ("more", "boolean", False),
        ("rcv_settle_mode", "ubyte", None), ("state", "any", None),
        ("resume", "boolean", False), ("aborted", "boolean", False),
        ("batchable", "boolean", False))),
    "disposition": (0x15, (
        ("role", "boolean!", None), ("first", "uint!", None), ("last", "uint", None),
        ("settled", "boolean", False), ("state", "any", None), ("batchable", "boolean", False))),
    "detach": (0x16, (("handle", "uint!", None), ("closed", "boolean", False),
                      ("error", "error", None))),
    "end": (0x17, (("error", "error", None),)),
    "close": (0x18, (("error", "error", None),)),
    "error": (0x1d, (("condition", "symbol!", None), ("description", "string", None),
                     ("info", "map", None))),
    # delivery states and outcomes (part 3.4)
    "received": (0x23, (("section_number", "uint!", None), ("section_offset", "ulong!", None))),
    "accepted": (0x24, ()),
    "rejected": (0x25, (("error", "error", None),)),
    "released": (0x26, ()),
    "modified": (0x27, (("delivery_failed", "boolean", None),
                        ("undeliverable_here", "boolean", None),
                        ("message_annotations", "map", None))),
    # source and target (part 3.5)
    "source": (0x28, (
        ("address", "any", None), ("durable", "uint", 0), ("expiry_policy", "symbol", None),
        ("timeout", "uint", 0), ("dynamic", "boolean", False),
        ("dynamic_node_properties", "map", None), ("distribution_mode", "symbol", None),
        ("filter", "map", None), ("default_outcome", "any", None), ("outcomes", "symbol*", None),
        ("capabilities", "symbol*", None))),
    "target": (0x29, (
        ("address", "any", None), ("durable", "uint", 0), ("expiry_policy", "symbol", None),
        ("timeout", "uint", 0), ("dynamic", "boolean", False),
        ("dynamic_node_properties", "map", None), ("capabilities", "symbol*", None))),
    # message sections that are lists (part 3.2)
    "header": (0x70, (
        ("durable", "boolean", None), ("priority", "ubyte", None), ("ttl", "uint", None),
        ("first_acquirer", "boolean", None), ("delivery_count", "uint", None))),
    "properties": (0x73, (
        ("message_id", "any", None), ("user_id", "binary", None), ("to", "any", None),
        ("subject", "string", None), ("reply_to", "any", None), ("correlation_id", "any", None),
        ("content_type", "symbol", None), ("content_encoding", "symbol", None),
        ("absolute_expiry_time", "timestamp", None), ("creation_time", "timestamp", None),
        ("group_id", "string", None), ("group_sequence", "uint", None),
        ("reply_to_group_id", "string", None))),
    # SASL (part 5.3)
    "sasl_mechanisms": (0x40, (("sasl_server_mechanisms", "symbol*!", None),)),
    "sasl_init": (0x41, (("mechanism", "symbol!", None), ("initial_response", "binary", None),
                         ("hostname", "string", None))),
    "sasl_challenge": (0x42, (("challenge", "binary!", None),)),
    "sasl_response": (0x43, (("response", "binary!", None),)),
    "sasl_outcome": (0x44, (("code", "ubyte!", None), ("additional_data", "binary", None))),
}

# descriptor code -> name, and the symbolic descriptors ("amqp:open:list", ...)
BY_CODE: dict[int, str] = {code: name for name, (code, _) in TABLE.items()}
BY_SYMBOL: dict[str, str] = {
    f"amqp:{name.replace('_', '-')}:list": name for name in TABLE}


# read from TABLE once, for the decoder's hot path (a transfer and its sections per
# message): per kind, a field name's index, and each field as
# (name, base type, multiple, default); the mandatory fields' indexes
INDEX: dict[str, dict[str, int]] = {
    kind: {n: i for i, (n, _, _) in enumerate(spec)} for kind, (_, spec) in TABLE.items()}
FIELDS: dict[str, tuple[tuple[str, str, bool, Any], ...]] = {
    kind: tuple((n, t.rstrip("!").rstrip("*"), t.rstrip("!").endswith("*"), d)
                for n, t, d in spec) for kind, (_, spec) in TABLE.items()}
MANDATORY: dict[str, tuple[int, ...]] = {
    kind: tuple(i for i, (_, t, _) in enumerate(spec) if t.endswith("!"))
    for kind, (_, spec) in TABLE.items()}


class Composite:
    """One composite value: `kind` (a TABLE name) and its fields as attributes.

    An instance is of its kind's subclass (`KINDS`), whose fields are properties over
    `values`: a field read is one property call, where a miss of the normal lookup,
    its AttributeError and `__getattr__` cost ~10 times as much (a transfer's fields
    are read per message)."""

    __slots__ = ("kind", "values")

    def __new__(cls, kind: str, **fields: Any) -> Composite:
        return object.__new__(KINDS[kind])

    def __init__(self, kind: str, **fields: Any) -> None:
        names = INDEX[kind]
        values = [d for _, _, _, d in FIELDS[kind]]
        for k, v in fields.items():
            values[names[k]] = v
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "values", values)

    def __getattr__(self, name: str) -> Any:
        try:
            i = INDEX[object.__getattribute__(self, "kind")].get(name)
        except AttributeError:
            raise AttributeError(name) from None
        if i is None:
            raise AttributeError(name)
        return self.values[i]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("kind", "values"):
            object.__setattr__(self, name, value)
            return
        i = INDEX[self.kind].get(name)
        if i is None:
            raise AttributeError(name)
        self.values[i] = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Composite) and (other.kind, other.values) == (
            self.kind, self.values)

    def __repr__(self) -> str:
        spec = TABLE[self.kind][1]
        shown = ", ".join(f"{n}={v!r}" for (n, _, d), v in zip(spec, self.values, strict=True)
                          if v != d)
        return f"{self.kind}({shown})"

    def encode_amqp(self) -> bytes:
        code, spec = TABLE[self.kind]
        fields: list[Any] = []
        for (_, typ, default), v in zip(spec, self.values, strict=True):
            fields.append(None if v is None else _typed(typ.rstrip("!"), v))
            del default
        while fields and fields[-1] is None:
            fields.pop()
        return b"\x00\x53" + bytes((code,)) + encode_list(fields)


def _field(i: int) -> property:
    return property(lambda self: self.values[i])


# kind -> its subclass of Composite, each field a property reading `values`
KINDS: dict[str, type[Composite]] = {
    kind: type(f"Composite_{kind}", (Composite,),
               {"__slots__": (), **{n: _field(i) for n, i in INDEX[kind].items()}})
    for kind in TABLE}


def composite_of(kind: str, values: list[Any]) -> Composite:
    """A Composite of `kind` over `values` (the decoders' way: no keyword matching)."""
    c = object.__new__(KINDS[kind])
    object.__setattr__(c, "kind", kind)
    object.__setattr__(c, "values", values)
    return c


def _typed(typ: str, v: Any) -> Any:
    if typ.endswith("*"):
        base = typ[:-1]
        if isinstance(v, (list, tuple)):
            if base == "symbol":
                return v[0] if len(v) == 1 else symbol_array(list(v))
            return Array(0xa1, list(v))
        v = v if not isinstance(v, Array) else v
        typ = base
    wrap = _WRAP.get(typ)
    if wrap is not None and not isinstance(v, (wrap, Array)):
        return wrap(v)
    return v


def from_described(d: Described) -> Composite:
    """A decoded described list as its Composite (DecodeError: unknown or malformed)."""
    name = descriptor_name(d.descriptor)
    if name is None:
        raise DecodeError(f"unknown descriptor {d.descriptor!r}")
    return from_fields(name, d.value)


def descriptor_name(descriptor: Any) -> str | None:
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        if descriptor >> 32 != 0:  # the domain: 0 is AMQP's own
            return None
        return BY_CODE.get(descriptor & 0xFFFFFFFF)
    if isinstance(descriptor, str):
        return BY_SYMBOL.get(descriptor)
    return None


def from_fields(name: str, fields: Any) -> Composite:
    if not isinstance(fields, list):
        raise DecodeError(f"{name} is not a list")
    spec = FIELDS[name]
    if len(fields) > len(spec):
        # part 1.4: a receiver ignores fields it does not know only in later versions;
        # RabbitMQ and proton refuse them as a decode error
        raise DecodeError(f"{name} has {len(fields)} fields, at most {len(spec)}")
    values = [d for _, _, _, d in spec]
    for i, v in enumerate(fields):
        if v is None:
            continue
        fname, base, multiple, _ = spec[i]
        if multiple:
            items = v.items if isinstance(v, Array) else [v]
            _check(name, fname, base, items)
            values[i] = list(items)
        else:
            _check(name, fname, base, [v])
            values[i] = from_described(v) if base == "error" else v
    for i in MANDATORY[name]:
        if values[i] is None:
            raise DecodeError(f"{name}: mandatory field {spec[i][0]} is null")
    return composite_of(name, values)


_RANGE = {"ubyte": 0xFF, "ushort": 0xFFFF, "uint": 0xFFFFFFFF, "ulong": 0xFFFFFFFFFFFFFFFF}


def _check(name: str, fname: str, typ: str, items: list[Any]) -> None:
    accept = _ACCEPT.get(typ)
    if accept is None:
        return
    top = _RANGE.get(typ)
    for v in items:
        if not isinstance(v, accept) or (typ != "boolean" and isinstance(v, bool)):
            raise DecodeError(f"{name}: field {fname} is not a {typ}")
        if top is not None and isinstance(v, int) and not 0 <= v <= top:  # a long -1
            raise DecodeError(f"{name}: field {fname} is out of a {typ}'s range")


def error(condition: str, description: str | None = None,
          info: dict[Any, Any] | None = None) -> Composite:
    return Composite("error", condition=Symbol(condition), description=description, info=info)


def encode_value(v: Any) -> bytes:
    return encode(v)
