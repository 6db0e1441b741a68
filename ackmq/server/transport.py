"""What every client connection does with its socket, whatever its protocol: TCP
settings, output gathered per loop turn and written at once, flow control (a peer that
stops reading is stopped from sending too), the resource alarm block (U5: a connection
that publishes during an alarm is not read until it clears), and its life (C3), written
once for every protocol: the handshake timeout, heartbeats sent and expected, the
release of its channels, close and force_close, connection_lost.

A protocol supplies only its part, as data and a few hooks (h11's manner): its state
table (`transitions`; every protocol's states include "open", "closing" and "closed"),
its heartbeat frame's bytes (`heartbeat_frame`), and the hooks `_input` (decode a read),
`_release_channels`, `_close_forced` (its close frame for a forced close) and, when a
silent peer is not simply dropped, `_heartbeats_missed` (its error). docs/DESIGN.md,
"Adding a protocol", shows how a front end adopts it."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, cast

from mypy_extensions import mypyc_attr

from ackmq.broker.timers import Deadline
from ackmq.server.states import check_transition
from ackmq.server.tls import certificate_user

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.vhost import VHost
    from ackmq.server.context import FrontEnd

WRITE_HIGH = 4 * 1024 * 1024   # pause_writing above this much unsent output
WRITE_LOW = 1024 * 1024        # resume_writing below this
# Output one connection may gather in one loop turn before its deliveries stop until the
# next turn: a no-ack consumer on a deep (paged) queue would otherwise get the whole queue
# encoded in memory at once, and every other client would wait for it (B3).
TURN_OUTPUT_MAX = WRITE_HIGH
CLOSING_TIMEOUT = 30.0  # s a closed connection's output may take to drain (no heartbeats)
CLOSE_OK_WAIT = 1.0  # s the peer has to answer our close frame before the socket goes
HEARTBEAT_TICK_MIN = 0.05  # s: the shortest heartbeat timer, whatever a peer asks for
_ENDING = ("closing", "closed")  # states in which heartbeats stop


def events_from(events: list[Any], first: Any) -> list[Any]:
    """`events` from `first` on (found by identity: equal events may repeat)."""
    i = next(k for k, e in enumerate(events) if e is first)  # once per block: O(one read)
    return events[i:]


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled; the other protocols' are not
class ClientConnection(asyncio.Protocol):
    """Base of every protocol's connection (AMQP 0-9-1, AMQP 1.0, STOMP, ...). A
    subclass supplies its part of the life (the module's docstring) and `_wake` (room
    for deliveries again)."""

    # each protocol's states (a StrEnum); "open" once logged in and on a vhost (U6 counts)
    state: StrEnum
    # what the management plane shows as the connection's protocol, RabbitMQ's spelling
    # ("AMQP 0-9-1", "STOMP 1.2"): each connection class states its own
    protocol: str = ""
    # -- the protocol's part of the life, as data -------------------------------------
    transitions: ClassVar[Mapping[Any, frozenset[Any]]]  # its states.py's TRANSITIONS
    heartbeat_frame: ClassVar[bytes] = b""  # sent when we have been quiet too long
    # states in which force_close sends the protocol's close (`_close_forced`); in the
    # others the socket just closes
    forced_close_states: ClassVar[frozenset[str]] = frozenset({"open"})
    log: ClassVar[logging.Logger] = logging.getLogger("ackmq.connection")

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
        self.vhost: VHost | None = None  # the vhost it opened (set by the protocol)
        timers = ctx.broker.timers  # C5: the broker's one timer service
        self._hb = Deadline(timers, self._heartbeat_tick)
        # the handshake timeout, then the wait for the peer's answer to our close
        self._close = Deadline(timers, self._handshake_timeout)
        self._hb_send = self._hb_expect = self._hb_tick = 0.0  # start_heartbeats

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
        self._close.arm_in(self.ctx.config.handshake_timeout, self._handshake_timeout)

    def certificate_user(self) -> str | None:
        """The CN of the client's verified TLS certificate (None: no TLS, no certificate):
        the user of EXTERNAL (every protocol's SASL, admission.sasl_login) and of STOMP's
        and MQTT's ssl_cert_login (U4)."""
        t = self.transport
        return None if t is None else certificate_user(t.get_extra_info("peercert"))

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.reading_paused and self.transport is not None:
            self.transport.pause_reading()  # the one read a heartbeat tick let through
        self._input(data)

    def _input(self, data: bytes) -> None:
        """The protocol's decoding and handling of one read (its state permitting)."""
        raise NotImplementedError

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self._to("closed")
        self.out.clear()
        self.ctx.connections.discard(self)

    def _to(self, new: str) -> None:
        """Change state; one the protocol's table (its states.py) does not allow is a
        bug in the server (raises)."""
        self.state = check_transition(self.transitions, self.state, type(self.state)(new))

    @property
    def vhost_name(self) -> str | None:
        """The vhost the connection opened; None before it opened one."""
        return None if self.vhost is None else self.vhost.name

    @property
    def channel_count(self) -> int:
        """Open channels, for the user's max-channels (U6)."""
        return 0

    def open_channels(self) -> list[tuple[int, ChannelModel]]:
        """(number, model channel) of each channel open now, by number: what the
        management views list (a channel closed by its client is not there)."""
        return []

    # -- the handshake timer ---------------------------------------------------------
    def _handshake_timeout(self) -> None:
        if self.state != "open":
            self.log.info("%s handshake timeout from %s", self.protocol, self.peer)
            self._shutdown()

    def _handshake_done(self) -> None:
        """Opened: the handshake timer stops."""
        self._close.cancel()

    # -- heartbeats (H1, W2, A: idle-time-out) ------------------------------------------
    def start_heartbeats(self, send: float, expect: float, tick: float = 0.0) -> None:
        """Heartbeats as negotiated, in seconds: write `heartbeat_frame` once we have
        sent nothing for `send`; a peer we have heard nothing from for more than
        `expect` is dead (`_heartbeats_missed`). 0 turns either off. One timer, every
        `tick` (by default a quarter of `expect` or `send`, the smaller)."""
        self._hb_send, self._hb_expect = send, expect
        if not tick:
            tick = min(x for x in (send, expect / 4) if x > 0) if send or expect else 0.0
        self._hb_tick = max(HEARTBEAT_TICK_MIN, tick)
        if send or expect:
            self._hb.arm_in(self._hb_tick)

    def _heartbeat_tick(self) -> None:
        t = self.transport
        if self.state in _ENDING or t is None:
            return
        now = time.monotonic()
        if self.reading_paused and not self.alarm_blocked:
            # We stopped reading this peer, so its heartbeats wait unread: let one read
            # through per tick (data_received pauses again). A live peer that is only
            # slow to read has frames waiting and stays alive; a hung one (its kernel
            # still ACKs, so TCP never fails) sends nothing and is dead after `expect`,
            # and its deliveries go back (D8). Costs one read's replies a tick.
            t.resume_reading()
        # blocked by an alarm, we read nothing: as RabbitMQ, the peer's silence is ours
        if self._hb_expect and now - self.last_recv > self._hb_expect \
                and not self.alarm_blocked:
            self._heartbeats_missed()
            return
        if self._hb_send and now - self.last_sent >= self._hb_send:
            self.write(self.heartbeat_frame)
            self.ctx.request_flush()
        self._hb.arm_in(self._hb_tick)

    def _heartbeats_missed(self) -> None:
        """The peer fell silent: dropped without a word (AMQP 0-9-1, STOMP); a protocol
        that owes the peer an error first overrides this."""
        self.log.info("%s: missed heartbeats from %s, closing", self.protocol, self.peer)
        self._release()
        self._to("closed")
        if self.transport is not None:
            self.transport.abort()

    # -- release and close ------------------------------------------------------------
    def _release(self) -> None:
        """D8: the timers stop, every channel's unacked deliveries go back, exclusive
        queues go. Idempotent: each way out calls it."""
        self._hb.cancel()
        self._close.cancel()
        self._release_channels()
        if self.vhost is not None:
            self.vhost.connection_closed(self)
        self.ctx.request_flush()

    def _release_channels(self) -> None:
        """The protocol closes its channels (sessions, subscriptions, transactions)."""

    def _close_with(self, frame: bytes) -> None:
        """An error or a forced close, in the protocol's close `frame`: what is settled is
        confirmed first (P4: RabbitMQ's channels ack ahead of the reader's close), the
        channels are released, and the peer has CLOSE_OK_WAIT to answer."""
        for _, ch in self.open_channels():
            ch.flush_confirms()
        self._release()
        self._to("closing")
        self._send_close(frame)

    def _send_close(self, frame: bytes) -> None:
        """Our close frame out; the socket goes once the peer answers (`_shutdown`) or
        after CLOSE_OK_WAIT."""
        self.write(frame)
        self.ctx.request_flush()
        self._close.arm_in(CLOSE_OK_WAIT, self._shutdown)

    def _shutdown(self) -> None:
        """Flush what is queued and close the socket (see close_transport)."""
        self._release()
        self._to("closed")
        self.flush()
        self.close_transport(self._closing_grace())

    def _closing_grace(self) -> float:
        return CLOSING_TIMEOUT

    def force_close(self, text: str) -> None:
        """Broker shutdown, the vhost or user deleted: the protocol's CONNECTION_FORCED
        close while it is open, else the socket just closes."""
        if self.state in self.forced_close_states:
            self._close_forced(text)
        else:
            self._shutdown()

    def _close_forced(self, text: str) -> None:
        """The protocol's close frame for a forced close (`text` says why)."""
        self._shutdown()

    def close_transport(self, grace: float = CLOSING_TIMEOUT) -> None:
        """Close the socket once the output queued in it is written (the caller flushed
        first); a peer that reads none of it for `grace` seconds is cut off, so it cannot
        hold the socket and its buffered output forever. Every front end's shutdown."""
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()
            if t.get_write_buffer_size():
                self._close.arm_in(grace, t.abort)

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
