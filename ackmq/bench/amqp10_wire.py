"""A minimal asyncio AMQP 1.0 client for the bench's 1.0 workloads (amqp10_load.py), on
ackmq's own codec: SASL PLAIN, one session, one sending and one receiving link. Not a
general client: no reconnects, no multi-frame messages (the bench's are small)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from ackmq.protocol.amqp10 import AMQP_HEADER, SASL_HEADER, Composite, Decoder, encode_frame
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.transfer import delivery_frames
from ackmq.protocol.amqp10.types import UInt

WINDOW = 0x7FFFFFFF


class Amqp10Error(RuntimeError):
    pass


class Amqp10Connection(asyncio.Protocol):
    """The connection as an asyncio protocol: a read is decoded and handled where it
    arrives (no reader task to wake per read); what is written in one loop turn goes
    out in one write."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.dec = Decoder(max_frame_size=1 << 20)
        self.waiters: list[tuple[Callable[[Any], bool], asyncio.Future[Any]]] = []
        self.next_out = 0  # session delivery ids we send
        self.remote_in = 1  # the broker's incoming window left
        self.credit = 0  # our sending link's credit
        self.room = asyncio.Event()
        self.outcomes: dict[int, asyncio.Future[str]] = {}
        self.on_transfer: Callable[[Composite, bytes], None] | None = None
        self.error: str | None = None
        self.out: list[bytes] = []  # frames written this loop turn
        self._flush_soon = False
        self.max_frame = 512  # the broker's max-frame-size, from its open
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, url: str) -> Amqp10Connection:
        u = urlsplit(url)
        _, c = await asyncio.get_running_loop().create_connection(
            cls, u.hostname or "127.0.0.1", u.port or 5672)
        user, password = unquote(u.username or "guest"), unquote(u.password or "guest")
        vhost = unquote(u.path[1:]) if len(u.path) > 1 else "/"
        c.write(SASL_HEADER)
        await c.expect("sasl_mechanisms")
        c.write(encode_frame(0, Composite("sasl_init", mechanism="PLAIN",
                                          initial_response=f"\0{user}\0{password}".encode()),
                             b"", F.SASL_FRAME))
        outcome = await c.expect("sasl_outcome")
        if outcome.code != 0:
            raise Amqp10Error(f"SASL PLAIN refused for {user}")
        c.write(AMQP_HEADER + encode_frame(0, Composite(
            "open", container_id="ackmq-bench", hostname=f"vhost:{vhost}")))
        opened = await c.expect("open")
        c.max_frame = min(int(opened.max_frame_size), 1 << 20)
        c.write(encode_frame(0, Composite("begin", next_outgoing_id=UInt(0),
                                          incoming_window=UInt(WINDOW),
                                          outgoing_window=UInt(WINDOW))))
        begin = await c.expect("begin")
        c.remote_in = int(begin.incoming_window)
        return c

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            for ev in self.dec.feed(data):
                p = getattr(ev, "performative", None)
                if p is not None:
                    self._frame(p, ev.payload)
        except Exception as e:  # noqa: BLE001 - fail every waiter with it
            self._fail(e)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(Amqp10Error(self.error or "the broker closed the connection"))
        if not self.lost.done():
            self.lost.set_result(None)

    def _fail(self, e: BaseException) -> None:
        for _, fut in self.waiters:
            if not fut.done():
                fut.set_exception(e)
        for fut in self.outcomes.values():
            if not fut.done():
                fut.set_exception(e)
        self.room.set()

    def write(self, data: bytes) -> None:
        """Gathered and written once per loop turn, as proton writes what its engine
        holds: the client, not its syscalls, is what a send costs."""
        self.out.append(data)
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    async def expect(self, kind: str) -> Composite:
        fut: asyncio.Future[Composite] = asyncio.get_running_loop().create_future()
        self.waiters.append((lambda p: p.kind == kind, fut))
        return await fut

    def _frame(self, p: Composite, payload: bytes) -> None:
        if p.kind in ("close", "end", "detach") and getattr(p, "error", None) is not None:
            self.error = f"{p.kind}: {p.error.condition} {p.error.description}"
        if p.kind == "flow":
            nid = int(p.next_incoming_id or 0)
            self.remote_in = nid + int(p.incoming_window) - self.next_out
            if p.handle == 0 and p.link_credit is not None:
                self.credit = int(p.delivery_count or 0) + int(p.link_credit) - self.sent
            if self.credit > 0 and self.remote_in > 0:
                self.room.set()
        elif p.kind == "disposition" and p.role is True:
            state = p.state.descriptor if p.state is not None else None
            name = {0x24: "accepted", 0x25: "rejected", 0x26: "released"}.get(
                int(state) if state is not None else -1, "other")
            for did in range(int(p.first), int(p.last if p.last is not None else p.first) + 1):
                fut = self.outcomes.pop(did, None)
                if fut is not None and not fut.done():
                    fut.set_result(name)
        elif p.kind == "transfer" and self.on_transfer is not None:
            self.on_transfer(p, payload)
        for i, (match, waiter) in enumerate(self.waiters):
            if match(p):
                del self.waiters[i]
                if not waiter.done():
                    waiter.set_result(p)
                break

    # -- the sending link (handle 0) ------------------------------------------------------
    sent = 0

    async def attach_sender(self, address: str) -> None:
        self.write(encode_frame(0, Composite(
            "attach", name="bench-sender", handle=UInt(0), role=False, snd_settle_mode=0,
            source=Composite("source"), target=Composite("target", address=address),
            initial_delivery_count=UInt(0))))
        await self.expect("attach")

    async def send(self, payload: bytes) -> asyncio.Future[str]:
        """Send one unsettled message (waiting for credit and window); the future is its
        outcome."""
        while self.credit <= 0 or self.remote_in <= 0:
            self.room.clear()
            await self.room.wait()
            if self.error:
                raise Amqp10Error(self.error)
        did = self.next_out
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.outcomes[did] = fut
        # message-format 0, settled absent: encode_frame's bytes, without a Composite
        self.write(b"".join(delivery_frames(0, 0, did, did.to_bytes(4, "big"), False, payload,
                                            self.max_frame)))
        self.next_out += 1
        self.sent += 1
        self.credit -= 1
        self.remote_in -= 1
        return fut

    # -- the receiving link (handle 1) ----------------------------------------------------
    def attach_receiver(self, address: str, credit: int, received: int = 0) -> None:
        self.write(encode_frame(0, Composite(
            "attach", name="bench-receiver", handle=UInt(1), role=True, rcv_settle_mode=0,
            source=Composite("source", address=address), target=Composite("target"))))
        self.flow(credit, received)

    def flow(self, credit: int, received: int) -> None:
        self.write(encode_frame(0, Composite(
            "flow", next_incoming_id=UInt(0), incoming_window=UInt(WINDOW),
            next_outgoing_id=UInt(self.next_out), outgoing_window=UInt(WINDOW),
            handle=UInt(1), delivery_count=UInt(received), link_credit=UInt(credit))))

    def accept(self, first: int, last: int) -> None:
        self.write(encode_frame(0, Composite("disposition", role=True, first=UInt(first),
                                             last=UInt(last), settled=True,
                                             state=Composite("accepted"))))

    async def close(self) -> None:
        """Our close, then the socket's (its buffered output is written first)."""
        self.write(encode_frame(0, Composite("close")))
        self._flush()
        if self.transport is not None:
            self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), 5)
        except TimeoutError:
            pass
