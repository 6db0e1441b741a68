"""What a client needs beyond the shared codec: basic properties built from Python
values without pamqp's per-call validation (every publish pays for this), and a copy
of raw properties with a different headers table (dead-lettering from the client)."""

from __future__ import annotations

import datetime
import struct
from typing import TYPE_CHECKING, Any

from .properties import FIELDS, OCTET, SHORTSTR, TABLE, TIMESTAMP, PropertiesView, generate
from .table import encode_table

_U16 = struct.Struct(">H").pack
_U64 = struct.Struct(">Q").pack


def _short(value: Any, name: str) -> bytes:
    """A shortstr from str, bytes, or anything else as its str() (an int expiration)."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, bytes | bytearray):
        data = bytes(value)
    else:
        data = str(value).encode()
    if len(data) > 255:
        raise ValueError(f"property {name} longer than 255 bytes")
    return bytes((len(data),)) + data


# how the encoder takes each kind of property (`{n}`: its name, `{f}`: its flag)
_PUT = {
    SHORTSTR: "    if {n} is not None:\n        flags |= {f}\n"
              "        parts.append(_short({n}, '{n}'))\n",
    TABLE: "    if {n}:\n        flags |= {f}\n        parts.append(encode_table({n}))\n",
    OCTET: "    if {n} is not None:\n        flags |= {f}\n        parts.append(bytes(({n},)))\n",
    TIMESTAMP: "    if {n} is not None:\n        flags |= {f}\n"
               "        if isinstance({n}, datetime.datetime):\n"
               "            {n} = int({n}.timestamp())\n        parts.append(_U64({n}))\n",
}
_CLIENT_FIELDS = [(flag, name, kind) for flag, name, kind in FIELDS if name != "cluster_id"]

if TYPE_CHECKING:
    def encode_basic_properties(
        *,
        content_type: str | None = None,
        content_encoding: str | None = None,
        headers: dict[str, Any] | None = None,
        delivery_mode: int | None = None,
        priority: int | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expiration: str | int | None = None,
        message_id: str | None = None,
        timestamp: datetime.datetime | int | None = None,
        message_type: str | None = None,
        user_id: str | None = None,
        app_id: str | None = None,
    ) -> bytes:
        """Raw content-header properties (flags + property list), as the broker keeps
        them; generated from properties.FIELDS (every publish pays for this)."""
else:
    encode_basic_properties = generate("encode_basic_properties", "".join((
        "def encode_basic_properties(*, ",
        ", ".join(f"{name}=None" for _flag, name, _kind in _CLIENT_FIELDS),
        "):\n    flags = 0\n    parts = []\n",
        *(_PUT[kind].format(n=name, f=f"0x{flag:04x}") for flag, name, kind in _CLIENT_FIELDS),
        "    return _U16(flags) + b''.join(parts)\n")),
        {"_short": _short, "encode_table": encode_table, "_U16": _U16, "_U64": _U64,
         "datetime": datetime})
    encode_basic_properties.__doc__ = """Raw content-header properties (flags + property
list), as the broker keeps them, from keyword arguments by pamqp name; generated from
properties.FIELDS as straight-line code (every publish pays for this)."""


PROPERTY_NAMES = tuple(name for _flag, name, _kind in _CLIENT_FIELDS if name != "headers")


def properties_dict(raw: bytes) -> dict[str, Any]:
    """The present basic properties of raw property bytes, headers left out."""
    view = PropertiesView(raw)
    return {name: getattr(view, name) for name in PROPERTY_NAMES if name in view}


def with_headers(raw: bytes, headers: dict[str, Any]) -> bytes:
    """Raw properties with the headers table replaced by `headers` (other fields as
    they were). The slow path: re-encodes the property list."""
    values = properties_dict(raw)
    return encode_basic_properties(headers=headers, **values)
