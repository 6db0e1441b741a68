"""Errors the model raises; the server turns them into channel.close / connection.close.

Reply codes are the AMQP ones (a STOMP front end maps them to ERROR frames). The class
and method ids of the offending method are filled in by the server, which knows them.
"""

from __future__ import annotations

NOT_FOUND = 404
ACCESS_REFUSED = 403
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

_NAMES = {
    403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED", 501: "FRAME_ERROR", 502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID", 504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR", 530: "NOT_ALLOWED", 540: "NOT_IMPLEMENTED", 541: "INTERNAL_ERROR",
    320: "CONNECTION_FORCED",
}


class AMQPError(Exception):
    """An error with an AMQP reply code; `text` is prefixed with the code's name as RabbitMQ does."""

    hard = False  # True: closes the whole connection

    def __init__(self, code: int, text: str) -> None:
        name = _NAMES.get(code, "")
        self.code = code
        self.text = f"{name} - {text}" if name else text
        super().__init__(self.text)


class ChannelError(AMQPError):
    """Soft error: only the channel is closed."""


class ConnectionError_(AMQPError):
    """Hard error: the connection is closed."""

    hard = True


def fit_shortstr(text: str) -> str:
    """Reply texts are shortstrs: cut to 255 bytes with "..." as RabbitMQ does."""
    data = text.encode("utf-8")
    if len(data) <= 255:
        return text
    return data[:252].decode("utf-8", "ignore") + "..."


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


def not_found(what: str, name: str, vhost: str) -> ChannelError:
    return ChannelError(NOT_FOUND, f"no {what} '{name}' in vhost '{vhost}'")
