"""Values rendered the way RabbitMQ's error texts render them (Erlang's ~p): reply texts
are compared with RabbitMQ's to the byte, so both the codec and the model use these."""

from __future__ import annotations


def erlang_binary(data: bytes | bytearray | memoryview, limit: int = 48) -> str:
    """Render bytes the way RabbitMQ's error texts do (<<"abc">> or <<0,20>>), capped."""
    data = bytes(data)
    more = len(data) > limit
    data = data[:limit]
    if data and all(32 <= b < 127 for b in data):
        inner = '"' + data.decode("ascii").replace("\\", "\\\\").replace('"', '\\"') + '"'
    else:
        inner = ",".join(str(b) for b in data)
    return f"<<{inner}{',...' if more else ''}>>"


_ERL_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t",
                0x0B: b"\\v", 0x08: b"\\b", 0x0C: b"\\f", 0x1B: b"\\e"}


def erl_bytes(data: bytes) -> bytes:
    """A byte list as Erlang's ~p writes it in RabbitMQ's texts: a quoted string when every
    byte is printable latin-1, else [N,...]."""
    if all(32 <= c <= 126 or 160 <= c or c in _ERL_ESCAPES for c in data):
        return b'"' + b"".join(_ERL_ESCAPES.get(c) or bytes((c,)) for c in data) + b'"'
    return b"[" + b",".join(str(c).encode() for c in data) + b"]"


def erl_string(text: str) -> str:
    return erl_bytes(text.encode("utf-8")).decode("utf-8", "replace")
