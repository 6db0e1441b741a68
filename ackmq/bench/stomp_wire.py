"""A raw-socket STOMP 1.2 client for load generation, on ackmq's sans-IO codec.

stomp.py in the hot loop would measure stomp.py (a thread, a listener dispatch and a
header dict copy per frame); this client only encodes pre-built frames, feeds bytes to
`ackmq.protocol.stomp.Decoder` and hands MESSAGE and RECEIPT frames to callbacks, so
the broker, not the client, is what a run measures. Writes are batched per event-loop
turn; TCP backpressure (`pause_writing`) bounds what is in flight, as in `wire`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from ackmq.bench.wire import WireProtocol
from ackmq.protocol.stomp import Decoder, Frame, StompError, encode_frame

STOMP_URL_FORM = "stomp://user:pass@host:port/vhost (e.g. stomp://guest:guest@127.0.0.1:61613/)"

MessageCallback = Callable[[Frame], None]
ReceiptCallback = Callable[[str], None]


class StompWireError(Exception):
    """The broker sent ERROR or closed the connection."""


@dataclass(frozen=True)
class StompURL:
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_stomp_url(url: str) -> StompURL:
    """stomp://user:pass@host:port/vhost; defaults guest/guest, 127.0.0.1, 61613, '/'.

    The vhost goes in CONNECT's `host` header: RabbitMQ refuses any host that is not a
    vhost, ActiveMQ ignores it, ackmq takes it as a vhost when one has that name."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"not a STOMP URL: {url!r}; expected {STOMP_URL_FORM}")
    u = urlparse(url)
    try:
        port = u.port
    except ValueError as exc:
        raise ValueError(f"bad STOMP URL {url!r} ({exc}); expected {STOMP_URL_FORM}") from None
    if u.scheme.lower() != "stomp":
        raise ValueError(f"unsupported scheme {u.scheme}:// in {url!r}; expected {STOMP_URL_FORM}")
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return StompURL(u.hostname or "127.0.0.1", port or 61613, unquote(u.username or "guest"),
                    unquote(u.password or "guest"), vhost)


def connect_frame(parts: StompURL) -> bytes:
    return encode_frame("CONNECT", [("accept-version", "1.2"), ("host", parts.vhost),
                                    ("login", parts.user), ("passcode", parts.password),
                                    ("heart-beat", "0,0")])


def probe_stomp(url: str, timeout: float = 10.0) -> dict[str, str]:
    """CONNECTED's headers (blocking): `server` names the broker (RabbitMQ/3.10.8,
    ActiveMQ/5.17.2, ackmq/...). Raises OSError or StompWireError."""
    parts = parse_stomp_url(url)
    dec = Decoder(version="1.2")
    with socket.create_connection((parts.host, parts.port), timeout=timeout) as s:
        s.sendall(connect_frame(parts))
        while True:
            data = s.recv(65536)
            if not data:
                raise StompWireError("connection closed before CONNECTED")
            for ev in dec.feed(data):
                if isinstance(ev, Frame):
                    if ev.command != "CONNECTED":
                        raise StompWireError(f"{ev.command}: {ev.headers.get('message', '')} "
                                             f"{ev.body[:200]!r}")
                    s.sendall(encode_frame("DISCONNECT"))
                    return dict(ev.headers)


class StompWireConnection(WireProtocol):
    """One STOMP 1.2 connection; frames are dispatched from `data_received`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.decoder = Decoder(version="1.2")  # the server's frames; never paused
        self.on_message: MessageCallback | None = None
        self.on_receipt: ReceiptCallback | None = None
        self.connected: dict[str, str] = {}
        self._receipts: dict[str, asyncio.Future[None]] = {}
        self._connect_fut: asyncio.Future[None] = loop.create_future()

    @classmethod
    async def open(cls, url: str) -> StompWireConnection:
        loop = asyncio.get_running_loop()
        parts = parse_stomp_url(url)
        _, conn = await loop.create_connection(lambda: cls(loop), parts.host, parts.port)
        conn.write(connect_frame(parts))
        await asyncio.wait_for(conn._connect_fut, 30)
        return conn

    def expect_receipt(self, receipt: str) -> asyncio.Future[None]:
        """A future settled when RECEIPT `receipt` arrives (register before sending)."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self._receipts[receipt] = fut
        return fut

    async def request(self, frame: bytes, receipt: str, timeout: float = 120.0) -> None:
        """Send a frame that carries `receipt:<receipt>` and wait for its RECEIPT."""
        fut = self.expect_receipt(receipt)
        self.write(frame)
        await asyncio.wait_for(fut, timeout)

    async def close(self) -> None:
        """DISCONNECT with a receipt (so every owed receipt came first), then close."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self.error:
            try:
                await self.request(encode_frame("DISCONNECT", [("receipt", "bye")]), "bye", 10)
            except (StompWireError, TimeoutError, ConnectionError):
                pass
        self.transport.close()

    # --- asyncio.Protocol ------------------------------------------------------------
    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(self.error or StompWireError(f"connection lost: {exc}"))

    def _fail(self, err: Exception) -> None:
        self.error = err
        waiters = [self._connect_fut, self._drain_waiter, *self._receipts.values()]
        self._receipts.clear()
        for w in waiters:
            if w is not None and not w.done():
                w.set_exception(err)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.decoder.feed(data)
        except StompError as exc:
            self._dispatch(exc.frames)
            self._fail(StompWireError(f"undecodable input from the broker: {exc}"))
            if self.transport is not None:
                self.transport.close()
            return
        self._dispatch(events)
        self.flush()

    def _dispatch(self, events: list) -> None:
        on_message = self.on_message
        for ev in events:
            if type(ev) is not Frame:
                continue  # heart-beat EOLs
            cmd = ev.command
            if cmd == "MESSAGE":
                if on_message is not None:
                    on_message(ev)
            elif cmd == "RECEIPT":
                rid = ev.headers.get("receipt-id", "")
                fut = self._receipts.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
                if self.on_receipt is not None:
                    self.on_receipt(rid)
            elif cmd == "CONNECTED":
                self.connected = dict(ev.headers)
                if not self._connect_fut.done():
                    self._connect_fut.set_result(None)
            elif cmd == "ERROR":
                text = ev.headers.get("message", "")
                body = ev.body[:300].decode("utf-8", "replace")
                self._fail(StompWireError(f"ERROR from broker: {text} {body}".strip()))
                return
