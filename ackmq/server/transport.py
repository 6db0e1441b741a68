"""What every client connection does with its socket, whatever its protocol: TCP
settings, the handshake timer, output gathered per loop turn and written at once, and
flow control (a peer that stops reading is stopped from sending too), and the resource
alarm block (U5: a connection that publishes during an alarm is not read until it
clears)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.server.context import FrontEnd

WRITE_HIGH = 4 * 1024 * 1024   # pause_writing above this much unsent output
WRITE_LOW = 1024 * 1024        # resume_writing below this
# Output one connection may gather in one loop turn before its deliveries stop until the
# next turn: a no-ack consumer on a deep (paged) queue would otherwise get the whole queue
# encoded in memory at once, and every other client would wait for it (B3).
TURN_OUTPUT_MAX = WRITE_HIGH
CLOSING_TIMEOUT = 30.0  # s a closed connection's output may take to drain (no heartbeats)


def events_from(events: list[Any], first: Any) -> list[Any]:
    """`events` from `first` on (found by identity: equal events may repeat)."""
    i = next(k for k, e in enumerate(events) if e is first)  # once per block: O(one read)
    return events[i:]


class ClientConnection(asyncio.Protocol):
    """Base of AMQPConnection and StompConnection. Subclasses implement
    `_handshake_timeout` (the peer never finished opening) and `_wake` (room for
    deliveries again)."""

    state: str  # each protocol's states; "open" once logged in and on a vhost (U6 counts)
    # what the management plane shows as the connection's protocol, RabbitMQ's spelling
    # ("AMQP 0-9-1", "STOMP 1.2"): each connection class states its own
    protocol: str = ""

    def __init__(self, ctx: FrontEnd) -> None:
        self.ctx = ctx
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.user = ""
        self.out: list[bytes] = []
        self.out_bytes = 0  # in `out`
        # the management API's recv_oct/recv_cnt/send_oct/send_cnt: bumped once per
        # read (data_received) and once per write (flush), never per frame
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.queued = False
        self.writable = True  # deliveries may go on: neither of the two below
        self.write_paused = False  # the transport's buffer is above WRITE_HIGH
        self.turn_full = False  # TURN_OUTPUT_MAX gathered this turn
        self._turn_handle: asyncio.Handle | None = None  # _next_turn, when scheduled
        self.reading_paused = False  # our output is backed up: the client's input waits
        self.alarm_blocked = False  # U5: published during a resource alarm: not read
        self.held: list[Any] = []  # what was read past the blocking publish, for later
        self.last_recv = self.last_sent = time.monotonic()
        self._hb_timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.peer} {self.user}>"

    # -- asyncio.Protocol -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # a stream's
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        self.ctx.connections.add(self)
        # a client that never completes the handshake is dropped (RabbitMQ: 10 s)
        self._close_timer = self.ctx.loop.call_later(
            self.ctx.config.handshake_timeout, self._handshake_timeout)

    @property
    def vhost_name(self) -> str | None:
        """The vhost the connection opened; None before it opened one."""
        return None

    @property
    def channel_count(self) -> int:
        """Open channels, for the user's max-channels (U6)."""
        return 0

    def open_channels(self) -> list[tuple[int, ChannelModel]]:
        """(number, model channel) of each channel open now, by number: what the
        management views list (a channel closed by its client is not there)."""
        return []

    def force_close(self, text: str) -> None:
        """Close with 320 CONNECTION_FORCED (shutdown, the vhost or user deleted)."""
        raise NotImplementedError

    def _handshake_timeout(self) -> None:
        raise NotImplementedError

    def close_transport(self, grace: float = CLOSING_TIMEOUT) -> None:
        """Close the socket once the output queued in it is written (the caller flushed
        first); a peer that reads none of it for `grace` seconds is cut off, so it cannot
        hold the socket and its buffered output forever. Every front end's shutdown."""
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()
            if t.get_write_buffer_size():
                self._close_timer = self.ctx.loop.call_later(grace, t.abort)

    # -- output -----------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.out.append(data)
        self.out_bytes += len(data)
        if not self.queued:
            self.queued = True
            self.ctx.dirty.append(self)
        if self.out_bytes > TURN_OUTPUT_MAX and not self.turn_full:
            self.turn_full = True
            self.writable = False

    def flush(self) -> None:
        self.queued = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            out, self.out = self.out, []
            self.transport.writelines(out)
            self.send_oct += self.out_bytes
            self.send_cnt += 1
            self.last_sent = time.monotonic()
        else:
            self.out.clear()
        self.out_bytes = 0
        if self.turn_full and self._turn_handle is None:
            # the rest on the next turn, after other clients' input and output
            self._turn_handle = self.ctx.loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_handle = None
        self.turn_full = False
        if not self.write_paused and self.transport is not None \
                and not self.transport.is_closing():
            self.writable = True
            self._wake()
            self.ctx.request_flush()

    def pause_writing(self) -> None:
        """The socket's write buffer is above its high-water mark: the client is not
        reading. Stop deliveries, and stop reading its requests too, or the replies they
        cause (confirms, returns, get-ok, receipts) pile up here without bound: the
        client's sends block in TCP instead. (RabbitMQ 3.10 goes on reading such a client
        and buffers its replies until the memory alarm blocks every publisher; this costs
        only the client that does not read.)"""
        self.writable = False
        self.write_paused = True
        t = self.transport
        if t is not None and not t.is_closing() and not self.reading_paused:
            self.reading_paused = True
            t.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.writable = not self.turn_full
        if self.reading_paused:
            self.reading_paused = False
            # heartbeats were not read meanwhile: the silence so far is ours, not the peer's
            self.last_recv = time.monotonic()
            t = self.transport
            if t is not None and not t.is_closing() and not self.alarm_blocked:
                t.resume_reading()
        self._wake()
        self.ctx.request_flush()

    # -- resource alarms (U5) -------------------------------------------------------------
    def block_for_alarm(self, held: list[Any]) -> None:
        """A publish arrived while an alarm is set: as RabbitMQ's reader, stop reading this
        connection (its acks too: RabbitMQ blocks the whole reader) until every alarm
        clears. `held`: what was decoded but not handled yet, handled after it clears.
        Deliveries still go out."""
        self.held = held
        self.alarm_blocked = True
        t = self.transport
        if t is not None and not t.is_closing():
            t.pause_reading()
        self._notify_blocked(self.ctx.alarm_reason())

    def alarm_cleared(self) -> None:
        """Every alarm cleared: handle what was held back, then read again."""
        if not self.alarm_blocked:
            return
        self.alarm_blocked = False
        self.last_recv = time.monotonic()  # the peer's heartbeats waited unread
        self._notify_unblocked()
        held, self.held = self.held, []
        if held:
            self._handle_held(held)
        t = self.transport
        if (t is not None and not t.is_closing() and not self.alarm_blocked
                and not self.reading_paused):
            t.resume_reading()
        self.ctx.request_flush()

    def _notify_blocked(self, reason: str) -> None:
        """AMQP: connection.blocked to a client with the capability; STOMP: nothing."""

    def _notify_unblocked(self) -> None:
        """AMQP: connection.unblocked after a connection.blocked."""

    def _handle_held(self, held: list[Any]) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        """Room again: let the protocol's channels deliver."""
