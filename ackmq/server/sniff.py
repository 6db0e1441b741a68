"""One port, two protocols (SPEC A1): the protocol header a client sends first picks the
connection class, as RabbitMQ 4 serves AMQP 0-9-1 and 1.0 on 5672. `AMQP 0 0 9 1` (and
anything that is not an AMQP 1.0 header) goes to the 0-9-1 connection, which answers a
bad header as it always did; `AMQP 3 1 0 0` (SASL) or `AMQP 0 1 0 0` to the 1.0 one. The
sniffer holds the socket only until it has read enough bytes to tell (at most eight),
then hands the transport and those bytes to the chosen connection; it never reads past
them. Without 1.0 enabled the listener builds 0-9-1 connections directly, unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ackmq.broker.timers import Deadline
from ackmq.protocol.amqp10 import AMQP_HEADER, SASL_HEADER

#: what a client of AMQP 1.0 sends first: SASL, or AMQP without SASL
AMQP10_HEADERS = (SASL_HEADER, AMQP_HEADER)

if TYPE_CHECKING:
    from ackmq.server.context import FrontEnd
    from ackmq.server.transport import ClientConnection

Factory = Callable[["FrontEnd"], "ClientConnection"]


def is_amqp10(head: bytes) -> bool | None:
    """True/False once `head` (the first bytes) tells; None: more bytes needed. Only the
    two AMQP 1.0 headers themselves go to 1.0: any other `AMQP …` header, a 1.0 one with
    another version too, gets AMQP 0-9-1's header back and the socket closed, as
    RabbitMQ's reader does (`AMQP 3 7 0 0` → `AMQP 0 0 9 1`, checked against 3.10)."""
    for header in AMQP10_HEADERS:
        if head[:len(header)] == header[:len(head)]:
            return True if len(head) >= len(header) else None
    return False


class Sniffer(asyncio.Protocol):
    def __init__(self, ctx: FrontEnd, amqp091: Factory, amqp10: Factory) -> None:
        self.ctx = ctx
        self.amqp091 = amqp091
        self.amqp10 = amqp10
        self.head = b""
        self.transport: asyncio.Transport | None = None
        self.timer: Deadline | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        # a client that sends nothing is dropped as a silent 0-9-1 client is
        self.timer = Deadline(self.ctx.broker.timers, self.transport.close)
        self.timer.arm_in(self.ctx.config.handshake_timeout)

    def data_received(self, data: bytes) -> None:
        self.head += data
        which = is_amqp10(self.head)
        if which is None:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        t = self.transport
        assert t is not None
        conn = (self.amqp10 if which else self.amqp091)(self.ctx)
        t.set_protocol(conn)
        conn.connection_made(t)
        conn.data_received(self.head)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
