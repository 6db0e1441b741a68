"""A published message (its place in a queue, `QueueEntry`, is the queue type's:
broker/queue_type.py).

Properties stay in their AMQP 0-9-1 encoding (as RabbitMQ keeps `properties_bin`): the
broker forwards them untouched and only peeks at delivery-mode, priority, expiration and
headers. A message routed to several queues is one `Message` and several `QueueEntry`s.
"""

from __future__ import annotations

import re

from ackmq.broker.arguments import MAX_EXPIRY_MS, type_name
from ackmq.broker.errors import PRECONDITION_FAILED, SoftError, erl_bytes
from ackmq.protocol.amqp.erlang import pretty_pair
from ackmq.protocol.amqp.properties import (
    PropertiesView,
    has_headers,
    header_entries,
    peek_routing_fields,
    properties_edit,
)

_LEADING_INT = re.compile(rb"[+-]?[0-9]+")


def _expiration_error(raw: bytes, reason: bytes, value: bytes | None) -> SoftError:
    """RabbitMQ's text: "invalid expiration '~s': ~p", the reason laid out as io_lib_pretty
    does (a tuple that does not fit in the line puts its second element on the next one)."""
    head = b"invalid expiration '" + raw + b"': "
    if value is None:
        text = head + reason
    else:  # latin-1: one character per byte, as ~p counts the columns
        text = head + pretty_pair(len(head), reason.decode("latin-1"), value.decode("latin-1"),
                                  78).encode("latin-1")
    return SoftError(PRECONDITION_FAILED, text.decode("utf-8", "replace"))


def parse_expiration(exp: str) -> int:
    """The per-message `expiration` property in ms, checked as RabbitMQ does (an integer
    string in 0 .. ten years); anything else is a 406 channel error."""
    if exp.isascii() and exp.isdigit():
        n = int(exp)
        if n <= MAX_EXPIRY_MS:
            return n
    raw = exp.encode("utf-8")
    m = _LEADING_INT.match(raw)
    if m is None:
        raise _expiration_error(raw, b"no_integer", None)
    if m.end() < len(raw):
        raise _expiration_error(raw, b"leftover_string", erl_bytes(raw[m.end():]))
    n = int(m.group())
    if n < 0:
        raise _expiration_error(raw, b"value_negative", str(n).encode())
    if n > MAX_EXPIRY_MS:
        raise _expiration_error(raw, b"value_too_large", str(n).encode())
    return n


class Message:
    __slots__ = ("exchange", "routing_key", "properties", "body", "persistent", "priority",
                 "expiration_ms", "_view", "cc", "cc_visible", "delivery_mode",
                 "trace_id")
    trace_id: str  # set only while tracing (broker/trace.py), unset otherwise

    def __init__(self, exchange: str, routing_key: str, properties: bytes, body: bytes,
                 trusted: bool = False) -> None:
        """Raises SoftError (406) for an invalid `expiration`, unless `trusted` (a message
        read back from the store: it was accepted once, so a bad value means no expiry)."""
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self._view: PropertiesView | None = None
        mode, prio, exp = peek_routing_fields(properties)
        self.delivery_mode = mode
        self.persistent = mode == 2
        self.priority = prio or 0
        self.cc_visible: tuple[str, ...] = ()
        self.cc: tuple[str, ...] = ()  # sender-selected distribution: CC and BCC routing keys
        self.expiration_ms: int | None = None
        if exp is not None:
            try:
                self.expiration_ms = parse_expiration(exp)
            except SoftError:
                if not trusted:
                    raise
        # (`in` alone first tries b"CC" as an int: an exception raised and cleared)
        if has_headers(properties) and b"CC" in properties:
            self._sender_selected(trusted)

    def _sender_selected(self, trusted: bool) -> None:
        """RabbitMQ's CC/BCC headers: extra routing keys; BCC is removed before delivery
        (the other entries keep their order and encoding, as RabbitMQ's keydelete)."""
        headers = self.view.headers or {}

        def keys(name: str) -> list[str]:
            v = headers.get(name)
            if v is None:
                return []
            if not isinstance(v, list):  # RabbitMQ's rabbit_basic:header_routes
                if trusted:
                    return []
                raise SoftError(PRECONDITION_FAILED, "invalid message: {unacceptable_type_in"
                                f'_header,"{name}",{type_name(v)}}}')
            # as RabbitMQ: routes are the longstr elements; others are ignored
            return [k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k
                    for k in v if isinstance(k, (str, bytes))]

        cc, bcc = keys("CC"), keys("BCC")
        self.cc = tuple(cc + bcc)
        if "BCC" in headers:
            self.properties = properties_edit(
                self.properties,
                [e for k, e in header_entries(self.properties) if k != b"BCC"])
            self._view = None
        self.cc_visible = tuple(cc)

    @property
    def routing_keys(self) -> list[str]:
        """Routing keys as recorded in x-death: the key plus CC (never BCC)."""
        if not self.cc:
            return [self.routing_key]
        return [self.routing_key, *self.cc_visible]

    @property
    def view(self) -> PropertiesView:
        """All properties, parsed on first use (headers exchange, dead-lettering)."""
        v = self._view
        if v is None:
            v = self._view = PropertiesView(self.properties)
        return v

    @property
    def headers(self) -> dict:
        return self.view.headers

    @property
    def size(self) -> int:
        return len(self.body)
