"""A minimal asyncio AMQP 0-9-1 peer for the hostile-input runs (docs/robustness.md).

Why not the bench's `wire.Connection` or `ackmq.client`: these runs need to write
arbitrary bytes (mutated sessions, half-open handshakes), keep a thousand idle
connections cheaply, and still check that what the broker writes back is well framed.
So this peer pipelines its handshake, parses frames itself and exposes them raw.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import defaultdict
from collections.abc import Callable

from pamqp import commands

from ackmq.protocol.amqp import FRAME_END, PROTOCOL_HEADER, encode_method
from ackmq.protocol.amqp.constants import FRAME_MAX_DEFAULT
from ackmq.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER

FRAME_MAX = FRAME_MAX_DEFAULT
_HDR = struct.Struct(">BHI")
_CM = struct.Struct(">HH")
_ACK = struct.Struct(">QB")
_CLOSE = struct.Struct(">H")

BodyCallback = Callable[[int, bytes], None]     # (channel, body)
ConfirmCallback = Callable[[int, bool, bool], None]  # (tag, multiple, is_ack)


def handshake_bytes(user: str = "guest", password: str = "guest", vhost: str = "/",
                    channels: tuple[int, ...] = (1,)) -> bytes:
    """A whole client handshake written at once (brokers read it in order), then
    channel.open on `channels`."""
    out = [PROTOCOL_HEADER,
           encode_method(0, commands.Connection.StartOk(
               client_properties={"product": "ackmq-robustness",
                                  "capabilities": {"publisher_confirms": True}},
               mechanism="PLAIN", response=f"\0{user}\0{password}")),
           encode_method(0, commands.Connection.TuneOk(2047, FRAME_MAX, 0)),
           encode_method(0, commands.Connection.Open(vhost))]
    out += [encode_method(ch, commands.Channel.Open()) for ch in channels]
    return b"".join(out)


class BadOutput(Exception):
    """The broker wrote something that is not a well-formed AMQP frame."""


class Peer(asyncio.Protocol):
    """Frames in, bytes out. `closed` resolves on connection.close (answered with
    close-ok, its reply code kept) or on EOF; `bad_output` names a malformed frame."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.header_seen = False
        self.closed: asyncio.Future[None] = loop.create_future()
        self.close_code: int | None = None
        self.close_text = ""
        self.eof_at: float | None = None
        self.bad_output = ""
        self.protocol_header_reply = False
        self.amqp10 = False  # the broker answered a 1.0 header in kind
        self.channel_closes: list[tuple[int, int, str]] = []  # (channel, code, text)
        self.methods: list[tuple[int, int, int]] = []  # (channel, class, method) if kept
        self.keep_methods = False
        self.close_ok = False  # the broker answered our connection.close
        self.on_body: BodyCallback | None = None
        self.on_confirm: ConfirmCallback | None = None
        self._waiters: dict[tuple[int, int, int], list[asyncio.Future[bytes]]] = \
            defaultdict(list)
        self._content: dict[int, list] = {}  # channel -> [remaining, parts]

    # -- asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def eof_received(self) -> bool:
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if self.eof_at is None:
            self.eof_at = time.monotonic()
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_exception(ConnectionError(self.describe()))
        self._waiters.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def describe(self) -> str:
        if self.close_code is not None:
            return f"connection.close {self.close_code} {self.close_text}"
        return "socket closed"

    def data_received(self, data: bytes) -> None:
        if self.amqp10:  # AMQP 1.0's frames: not judged by this 0-9-1 peer
            return
        buf = self.buf
        buf += data
        if not buf:
            return
        if buf[:1] == b"A":  # a protocol header instead of frames: the broker refuses ours
            if len(buf) < 8:
                return
            if bytes(buf[:8]) in (SASL_HEADER, AMQP_HEADER):
                # a mutated header that asked for AMQP 1.0 got it: the AMQP port speaks
                # both, picked by the header (SPEC A1); what follows is 1.0's, not 0-9-1's
                self.protocol_header_reply = self.amqp10 = True
                buf.clear()
                return
            if bytes(buf[:8]) != PROTOCOL_HEADER and not self.bad_output:
                self.bad_output = f"bad protocol header reply {bytes(buf[:8])!r}"
            self.protocol_header_reply = True
            del buf[:8]
        pos, n = 0, len(buf)
        while n - pos >= 8:
            ftype, ch, size = _HDR.unpack_from(buf, pos)
            if ftype not in (1, 2, 3, 8) and not self.bad_output:
                self.bad_output = f"frame type {ftype} from the broker"
            if size > FRAME_MAX and not self.bad_output:
                self.bad_output = f"frame of {size} bytes from the broker"
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != FRAME_END and not self.bad_output:
                self.bad_output = "frame without frame-end from the broker"
            self._frame(ftype, ch, bytes(buf[pos + 7:end]))
            pos = end + 1
        del buf[:pos]

    # -- frames -------------------------------------------------------------------
    def _frame(self, ftype: int, ch: int, payload: bytes) -> None:
        if ftype == 1 and len(payload) >= 4:
            cls, meth = _CM.unpack_from(payload)
            if self.keep_methods:
                self.methods.append((ch, cls, meth))
            if (cls, meth) == (20, 40) and len(payload) >= 7:
                tlen = payload[6]
                self.channel_closes.append((ch, _CLOSE.unpack_from(payload, 4)[0],
                                            payload[7:7 + tlen].decode("utf-8", "surrogateescape")))
            if (cls, meth) == (10, 51) and ch == 0:
                self.close_ok = True
            if (cls, meth) == (10, 50) and ch == 0:
                self.close_code = _CLOSE.unpack_from(payload, 4)[0] if len(payload) >= 6 else 0
                tlen = payload[6] if len(payload) > 6 else 0
                self.close_text = payload[7:7 + tlen].decode("utf-8", "surrogateescape")
                self.write(encode_method(0, commands.Connection.CloseOk()))
                self._finish()
                return
            if cls == 60 and meth in (80, 120) and self.on_confirm is not None:
                tag, bits = _ACK.unpack_from(payload, 4)
                self.on_confirm(tag, bool(bits & 1), meth == 80)
                return
            if cls == 60 and meth in (60, 71):  # deliver, get-ok: content follows
                self._content[ch] = [-1, []]
            waiters = self._waiters.get((ch, cls, meth))
            if waiters:
                w = waiters.pop(0)
                if not w.done():
                    w.set_result(payload)
        elif ftype == 2:
            c = self._content.get(ch)
            if c is not None and len(payload) >= 12:
                c[0] = struct.unpack_from(">Q", payload, 4)[0]
                if c[0] == 0:
                    self._deliver(ch, c)
        elif ftype == 3:
            c = self._content.get(ch)
            if c is not None:
                c[1].append(payload)
                c[0] -= len(payload)
                if c[0] <= 0:
                    self._deliver(ch, c)

    def _deliver(self, ch: int, c: list) -> None:
        del self._content[ch]
        if self.on_body is not None:
            self.on_body(ch, b"".join(c[1]))

    def expect(self, ch: int, cls: int, meth: int) -> asyncio.Future[bytes]:
        """A future for the next method (ch, class, method); register before sending."""
        fut: asyncio.Future[bytes] = self.loop.create_future()
        if self.closed.done():
            fut.set_exception(ConnectionError(self.describe()))
        else:
            self._waiters[(ch, cls, meth)].append(fut)
        return fut

    async def call(self, ch: int, method: object, reply: tuple[int, int],
                   timeout: float = 30.0) -> bytes:
        fut = self.expect(ch, *reply)
        self.write(encode_method(ch, method))
        return await asyncio.wait_for(fut, timeout)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def connect(host: str, port: int, timeout: float = 30.0) -> Peer:
    loop = asyncio.get_running_loop()
    _, peer = await asyncio.wait_for(loop.create_connection(Peer, host, port), timeout)
    return peer


async def open_peer(host: str, port: int, user: str = "guest", password: str = "guest",
                    vhost: str = "/", channels: tuple[int, ...] = (1,),
                    timeout: float = 60.0) -> Peer:
    """A connection with `channels` open (waits for the last channel.open-ok)."""
    peer = await connect(host, port, timeout)
    ok = peer.expect(channels[-1], 20, 11)
    peer.write(handshake_bytes(user, password, vhost, channels))
    try:
        await asyncio.wait_for(ok, timeout)
    except BaseException:
        peer.abort()
        raise
    return peer


def rss_of(pid: int) -> int:
    """Resident set size in bytes (Linux /proc; 0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def host_port(url: str) -> tuple[str, int, str, str, str]:
    """host, port, user, password, vhost of an amqp:// URL."""
    from ackmq.bench.wire import parse_url  # the bench's URL rules (defaults, errors)
    p = parse_url(url)
    return p.host, p.port, p.user, p.password, p.vhost
