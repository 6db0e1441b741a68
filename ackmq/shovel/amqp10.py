"""The shovel's AMQP 1.0 peer: one connection, one session, one link (a receiver at a
source, a sender at a destination), on the project's sans-IO 1.0 codec
(protocol/amqp10/), as an asyncio Protocol with no task per message: transfers and
dispositions are callbacks of `data_received`.

Not a general AMQP 1.0 client (the project has one AMQP client, ackmq.client, for 0-9-1):
just what a shovel needs, as RabbitMQ's amqp10 shovel uses amqp10_client:
- SASL PLAIN with the URI's credentials (ANONYMOUS without any; `sasl=none` in the
  query: no SASL layer), open with `hostname` from the query (RabbitMQ's
  `?hostname=vhost:<vhost>`; else `vhost:<path>` when the URI has a path, else the host);
- a receiver grants `credit` (prefetch-count) and tops it up as messages are settled,
  so at most `credit` are unsettled; `settle(first, last, outcome)`;
- a sender sends within the link credit and the session window the peer grants
  (transfers wait in a deque otherwise) and reports each disposition's outcome;
- heartbeats (empty frames) at half the peer's idle-time-out; ours is 60 s, and a peer
  silent for twice that is taken for gone (a host that died without a word).

The end of the connection, a close, end or detach from the peer: `ended` is set with a
ConnectionLost saying why.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from ackmq.client.errors import ConnectionLost
from ackmq.client.tls import TLS_KEYS, tls_options
from ackmq.protocol.amqp10 import (
    AMQP_HEADER,
    HEARTBEAT,
    SASL_HEADER,
    BadHeader,
    Composite,
    Decoder,
    Described,
    Frame,
    FramingError,
    ProtocolHeader,
    Symbol,
    encode_frame,
)
from ackmq.protocol.amqp10.composite import descriptor_name
from ackmq.protocol.amqp10.frames import SASL_FRAME, encode_frames
from ackmq.protocol.amqp10.types import UInt

MAX_FRAME = 1 << 20  # what this peer reads
IDLE_TIME_OUT = 60.0  # seconds: what we ask of the peer; silent twice as long: gone
WINDOW = 0x7FFFFFFF  # session incoming window offered (never the limit: credit is)
SETTLED_MODE, UNSETTLED_MODE = 1, 0  # snd-settle-mode


@dataclass
class Target10:
    """Where and how a 1.0 URI connects."""

    host: str
    port: int
    user: str | None
    password: str | None
    hostname: str | None  # open's hostname
    sasl: str  # PLAIN | ANONYMOUS | none
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None


def target_of(uri: str, local: Any, user: str) -> Target10:
    """An `amqp://` / `amqps://` URI as amqp10_client reads it; no host: this broker (as
    the user who set the shovel, with the one-off loopback password), an ackmq
    extension (RabbitMQ's amqp10 shovel needs a host)."""
    p = urlsplit(uri)
    query = parse_qsl(p.query)
    q = dict(query)
    path = unquote(p.path[1:]) if p.path.startswith("/") else unquote(p.path)
    if not p.hostname:
        url = urlsplit(local.amqp_url(user, path or "/"))
        return Target10(url.hostname or "127.0.0.1", url.port or 5672,
                        unquote(url.username or ""), unquote(url.password or ""),
                        f"vhost:{path or '/'}", "PLAIN")
    hostname = q.get("hostname") or (f"vhost:{path}" if path else p.hostname)
    tls = None
    server = None
    if p.scheme == "amqps":
        opts = tls_options([(k, v) for k, v in query if k in TLS_KEYS])
        tls, server = opts.context(), opts.server_hostname(p.hostname)
    user_ = unquote(p.username) if p.username is not None else None
    password = unquote(p.password) if p.password is not None else None
    sasl = q.get("sasl", "plain" if user_ is not None else "anon")
    mech = {"plain": "PLAIN", "anon": "ANONYMOUS", "none": "none"}.get(sasl, "PLAIN")
    return Target10(p.hostname, p.port or (5671 if p.scheme == "amqps" else 5672), user_,
                    password, hostname, mech, tls, server)


class Peer10(asyncio.Protocol):
    """One link over its own connection and session. `role` "receiver" (a source) or
    "sender" (a destination)."""

    def __init__(self, role: str, address: str, container: str, settled: bool,
                 credit: int = 0) -> None:
        self.loop = asyncio.get_running_loop()
        self.role, self.address, self.container = role, address, container
        self.settled = settled  # pre-settled transfers (no-ack / on-publish)
        self.credit = credit  # receiver: the most unsettled messages
        self.ended: asyncio.Future[ConnectionLost] = self.loop.create_future()
        self.attached: asyncio.Future[None] = self.loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.decoder = Decoder(MAX_FRAME)
        self.target: Target10 | None = None
        self.peer_max_frame = 512
        self._heartbeat: asyncio.TimerHandle | None = None
        self._idle = IDLE_TIME_OUT / 2  # between our heartbeats / silence checks
        self._read_at = self.loop.time()
        self._wrote = False
        # session
        self.next_outgoing_id = 0
        self.remote_window = 0
        # link
        self.delivery_count = 0
        self.link_credit = 0  # sender: what the peer granted; receiver: what we did
        # receiver: what it received, settled, and the partial transfer
        self.received = 0
        self.settled_count = 0
        self._granted_to = 0  # delivery_count + link_credit of our last flow
        self._partial: list[bytes] = []
        self._partial_id = 0
        self._next_incoming = 0  # the peer's transfer-ids (session)
        self.on_message: Callable[[int, bytes, bool], None] = lambda i, p, s: None
        # sender: transfers waiting for credit; outcomes
        self._waiting: deque[tuple[int, bytes]] = deque()
        self._next_delivery = 0  # delivery ids: 0, 1, 2... in the order of send()
        self.on_outcome: Callable[[int, int, bool], None] = lambda f, last, ok: None

    # -- connecting ---------------------------------------------------------------------
    async def open(self, target: Target10, timeout: float) -> None:
        self.target = target
        # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel (the
        # shovel's stop) landing as the connect completes, and the stop then waits forever
        async with asyncio.timeout(timeout):
            await self.loop.create_connection(
                lambda: self, target.host, target.port, ssl=target.tls,
                server_hostname=target.server_hostname if target.tls else None)
        waits: list[asyncio.Future[Any]] = [self.attached, self.ended]
        done, _ = await asyncio.wait(waits, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if self.ended.done():
            raise self.ended.result()
        if not done:
            self.abort()
            raise ConnectionLost(f"no AMQP 1.0 attach from {target.host}:{target.port} "
                                 f"within {timeout} s")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert self.target is not None
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if self.target.sasl == "none":
            self._write(AMQP_HEADER)
            self._send_open()
        else:
            self._write(SASL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ConnectionLost(f"AMQP 1.0 connection lost: {exc!r}" if exc else
                                 "AMQP 1.0 connection closed by the peer"))

    def _end(self, error: ConnectionLost) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if not self.ended.done():
            self.ended.set_result(error)
        if self.transport is not None:
            self.transport.abort()

    def abort(self) -> None:
        self._end(ConnectionLost("closed by the shovel"))

    async def close(self, timeout: float = 5.0) -> None:
        """close, then wait (briefly) for the peer's close or the socket's end."""
        if self.ended.done() or self.transport is None:
            self.abort()
            return
        self._write(encode_frame(0, Composite("close")))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.ended)
        except TimeoutError:
            pass
        self.abort()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self._wrote = True

    # -- reading ------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._read_at = self.loop.time()
        try:
            events = self.decoder.feed(data)
        except (FramingError, BadHeader) as e:
            self._end(ConnectionLost(f"AMQP 1.0 peer sent bad bytes: {e}"))
            return
        for ev in events:
            if isinstance(ev, Frame):
                try:
                    self._frame(ev)
                except (ValueError, TypeError, AttributeError) as e:
                    self._end(ConnectionLost(f"unexpected AMQP 1.0 frame {ev.performative!r}: "
                                             f"{e}"))
                    return
            elif isinstance(ev, ProtocolHeader) and ev.protocol_id == 0 \
                    and self.target is not None and self.target.sasl != "none":
                pass  # the AMQP header after the SASL outcome: open was sent with ours
            if self.ended.done():
                return

    def _frame(self, f: Frame) -> None:
        p = f.performative
        kind = p.kind
        if f.type == SASL_FRAME:
            self._sasl(p)
        elif kind == "open":
            self.peer_max_frame = max(512, min(int(p.max_frame_size), MAX_FRAME))
            idle = p.idle_time_out
            if idle:
                self._idle = min(self._idle, max(0.05, int(idle) / 2000.0))
            self._heartbeat = self.loop.call_later(self._idle, self._beat)
        elif kind == "begin":
            self.remote_window = int(p.incoming_window)
            self._next_incoming = int(p.next_outgoing_id)
        elif kind == "attach":
            if self.role == "sender":
                pass  # credit comes with a flow
            elif p.initial_delivery_count is not None:
                self.delivery_count = int(p.initial_delivery_count)
            # a refused link: attach with a null terminus, then detach with the error
            if (p.source if self.role == "receiver" else p.target) is None:
                return
            if self.role == "receiver":
                self.received = self.settled_count = 0
                self._flow(self.credit)
            if not self.attached.done():
                self.attached.set_result(None)
        elif kind == "flow":
            self._on_flow(p)
        elif kind == "transfer":
            self._on_transfer(p, f.payload)
        elif kind == "disposition":
            self._on_disposition(p)
        elif kind in ("detach", "end", "close"):
            err = p.error
            why = f"{err.condition}: {err.description}" if err is not None else \
                f"{kind} by the peer"
            if kind == "close":
                self._write(encode_frame(0, Composite("close")))
            self._end(ConnectionLost(f"AMQP 1.0 {kind}: {why}"))

    def _sasl(self, p: Composite) -> None:
        assert self.target is not None
        t = self.target
        if p.kind == "sasl_mechanisms":
            offered = [str(m) for m in p.sasl_server_mechanisms or []]
            mech = t.sasl if t.sasl in offered else ("ANONYMOUS" if "ANONYMOUS" in offered
                                                    and t.user is None else t.sasl)
            response = None
            if mech == "PLAIN":
                response = b"\x00" + (t.user or "").encode() + b"\x00" + \
                    (t.password or "").encode()
            self._write(encode_frame(0, Composite("sasl_init", mechanism=Symbol(mech),
                                                  initial_response=response,
                                                  hostname=t.host), b"", SASL_FRAME))
        elif p.kind == "sasl_outcome":
            if int(p.code) != 0:
                self._end(ConnectionLost(f"AMQP 1.0 login refused (sasl-outcome "
                                         f"{int(p.code)}) for user {t.user!r}"))
                return
            self._write(AMQP_HEADER)
            self._send_open()

    def _send_open(self) -> None:
        t = self.target
        assert t is not None
        self._write(encode_frame(0, Composite(
            "open", container_id=self.container, hostname=t.hostname,
            max_frame_size=UInt(MAX_FRAME), channel_max=0,
            idle_time_out=UInt(int(IDLE_TIME_OUT * 1000)))))
        self._write(encode_frame(0, Composite(
            "begin", next_outgoing_id=UInt(0), incoming_window=UInt(WINDOW),
            outgoing_window=UInt(WINDOW))))
        receiver = self.role == "receiver"
        term = Composite("source" if receiver else "target", address=self.address,
                         durable=UInt(2) if not receiver else UInt(0))
        other = Composite("target" if receiver else "source")
        mode = SETTLED_MODE if self.settled else UNSETTLED_MODE
        self._write(encode_frame(0, Composite(
            "attach", name=f"{self.container}-{self.role}", handle=UInt(0), role=receiver,
            snd_settle_mode=mode, rcv_settle_mode=0,
            source=term if receiver else other, target=other if receiver else term,
            initial_delivery_count=None if receiver else UInt(0))))

    def _beat(self) -> None:
        """An empty frame if we wrote nothing since the last beat (part 2.4.5); a peer
        silent for twice the idle-time-out we sent is gone."""
        if self.loop.time() - self._read_at > 2 * IDLE_TIME_OUT:
            self._end(ConnectionLost(f"no frame from the AMQP 1.0 peer for "
                                     f"{2 * IDLE_TIME_OUT:.0f} s"))
            return
        if not self._wrote:
            self._write(HEARTBEAT)
        self._wrote = False
        if not self.ended.done():
            self._heartbeat = self.loop.call_later(self._idle, self._beat)

    # -- receiver -----------------------------------------------------------------------
    def _flow(self, credit: int) -> None:
        self._granted_to = self.delivery_count + credit
        self._write(encode_frame(0, Composite(
            "flow", next_incoming_id=UInt(self._next_incoming), incoming_window=UInt(WINDOW),
            next_outgoing_id=UInt(self.next_outgoing_id), outgoing_window=UInt(WINDOW),
            handle=UInt(0), delivery_count=UInt(self.delivery_count & 0xFFFFFFFF),
            link_credit=UInt(credit))))

    def _on_transfer(self, p: Composite, payload: bytes) -> None:
        self._next_incoming = (self._next_incoming + 1) & 0xFFFFFFFF
        if p.delivery_id is not None and not self._partial:
            self._partial_id = int(p.delivery_id)
        if p.aborted:
            self._partial.clear()
            return
        if p.more:
            self._partial.append(payload)
            return
        if self._partial:
            self._partial.append(payload)
            payload = b"".join(self._partial)
            self._partial.clear()
        self.delivery_count += 1
        self.received += 1
        settled = bool(p.settled) or self.settled
        if settled:
            self.settled_count += 1
        self.on_message(self._partial_id, payload, settled)
        if settled:
            self._top_up()

    def settle(self, first: int, last: int, count: int, outcome: str) -> None:
        """Settle delivery ids first..last (`count` messages) with `accepted` or
        `released` (back to the queue), then top up the credit."""
        self._write(encode_frame(0, Composite(
            "disposition", role=True, first=UInt(first), last=UInt(last), settled=True,
            state=Composite(outcome))))
        self.settled_count += count
        self._top_up()

    def _top_up(self) -> None:
        want = self.credit - (self.received - self.settled_count)
        have = self._granted_to - self.delivery_count
        if want - have >= max(1, self.credit // 2):
            self._flow(want)

    # -- sender -------------------------------------------------------------------------
    def _on_flow(self, p: Composite) -> None:
        if p.incoming_window is not None:
            nxt = int(p.next_incoming_id) if p.next_incoming_id is not None else 0
            self.remote_window = nxt + int(p.incoming_window) - self.next_outgoing_id
        if self.role == "sender" and p.handle is not None and p.link_credit is not None:
            count = int(p.delivery_count) if p.delivery_count is not None else 0
            self.link_credit = count + int(p.link_credit) - self.delivery_count
        self._send_waiting()

    def send(self, payload: bytes) -> int:
        """Queue one message; returns its delivery id (0, 1, 2...: a disposition names
        it)."""
        delivery_id = self._next_delivery
        self._next_delivery += 1
        self._waiting.append((delivery_id, payload))
        self._send_waiting()
        return delivery_id

    def _send_waiting(self) -> None:
        waiting = self._waiting
        while waiting and self.link_credit > 0 and self.remote_window > 0 \
                and not self.ended.done():
            delivery_id, payload = waiting.popleft()
            frames = encode_frames(0, Composite(
                "transfer", handle=UInt(0), delivery_id=UInt(delivery_id & 0xFFFFFFFF),
                delivery_tag=delivery_id.to_bytes(8, "big"), message_format=UInt(0),
                settled=self.settled),
                payload, self.peer_max_frame)
            self._write(b"".join(frames))
            self.next_outgoing_id = (self.next_outgoing_id + len(frames)) & 0xFFFFFFFF
            self.remote_window -= len(frames)
            self.delivery_count += 1
            self.link_credit -= 1

    def _on_disposition(self, p: Composite) -> None:
        if not p.role:  # from a sender: a receiver's settlement is ours, nothing to do
            return
        first = int(p.first)
        last = int(p.last) if p.last is not None else first
        state = p.state
        ok = isinstance(state, Described) and descriptor_name(state.descriptor) == "accepted"
        if not p.settled:
            self._write(encode_frame(0, Composite(
                "disposition", role=False, first=UInt(first), last=UInt(last),
                settled=True, state=state)))
        self.on_outcome(first, last, ok)
