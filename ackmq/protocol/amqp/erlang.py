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


class Atom(str):
    """An Erlang atom: printed bare (`value_negative`, `longstr`)."""

    __slots__ = ()


class Chars(str):
    """An Erlang string (a character list): printed quoted, as `erl_string`."""

    __slots__ = ()


def erl_term(v: object) -> str:
    """A value as Erlang's ~p prints it in RabbitMQ's texts, the one renderer for them:
    an `Atom` bare, a `Chars` as a quoted string, any other str as a binary (<<"a">>),
    bytes as `erlang_binary`, a tuple as {a,b}, a list as [a,b], a dict as a map
    (#{k => v}), None as `null` (what JSON's null decodes to), numbers as they are."""
    if isinstance(v, str):
        if isinstance(v, Atom):
            return str.__str__(v)
        if isinstance(v, Chars):
            return erl_string(v)
        return f"<<{erl_string(v)}>>"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return erlang_binary(v, limit=len(v))
    if isinstance(v, tuple):
        return "{" + ",".join(erl_term(x) for x in v) + "}"
    if isinstance(v, list):
        return "[" + ",".join(erl_term(x) for x in v) + "]"
    if isinstance(v, dict):
        return "#{" + ",".join(f"{erl_term(k)} => {erl_term(x)}" for k, x in v.items()) + "}"
    return str(v)


def reason(tag: str, *args: object) -> str:
    """RabbitMQ's `{tag,Arg,...}` error reason (the bare atom when there are no args)."""
    return erl_term((Atom(tag), *args)) if args else tag


def pretty_pair(column: int, first: str, second: str, width: int) -> str:
    """`{First,Second}` (both rendered already) as ~p lays it out when it starts at
    `column`: on the line when it ends within `width`, else Second on the next line,
    under First."""
    flat = "{" + first + "," + second + "}"
    if column + len(flat) <= width:
        return flat
    return "{" + first + ",\n" + " " * (column + 1) + second + "}"
