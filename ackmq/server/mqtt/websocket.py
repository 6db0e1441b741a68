"""MQTT over WebSocket (N1), as RabbitMQ's web_mqtt plugin: path `/ws`, subprotocol `mqtt`,
MQTT packets in binary messages, on `ws://` or, with the broker's TLS context, `wss://`. Each WebSocket is an `MQTTConnection` like a TCP one:
its bytes go to `data_received`, and `WSTransport` stands for the asyncio transport it
writes to (one WebSocket message per loop turn's output, as the TCP transports get one
`writelines`)."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.mqtt")
PATH = "/ws"


class WSTransport(asyncio.Transport):
    """The part of asyncio.Transport a ClientConnection uses, over an aiohttp WebSocket."""

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        super().__init__()
        self.ws = ws
        self.tcp = request.transport
        self.closing = False
        self.sending: asyncio.Future[Any] | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":  # TCP_NODELAY is aiohttp's business
            return None
        return self.tcp.get_extra_info(name, default) if self.tcp is not None else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writelines([bytes(data)])

    def writelines(self, chunks: Any) -> None:
        if self.closing or self.ws.closed:
            return
        data = b"".join(chunks)
        # once per loop turn (ClientConnection.flush); sends keep their order: each
        # waits for the one before it
        self.sending = asyncio.ensure_future(self._send(self.sending, data))

    async def _send(self, before: asyncio.Future[Any] | None, data: bytes) -> None:
        if before is not None:
            await asyncio.wait([before])
        try:
            await self.ws.send_bytes(data)
        except (ConnectionError, RuntimeError):
            pass  # the peer went: connection_lost follows

    def is_closing(self) -> bool:
        return self.closing or self.ws.closed

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.ensure_future(self._close(self.sending))

    async def _close(self, before: asyncio.Future[Any] | None) -> None:
        if before is not None:
            await asyncio.wait([before])
        await self.ws.close()

    def abort(self) -> None:
        self.closing = True
        if self.tcp is not None:
            self.tcp.abort()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.tcp.get_write_buffer_size() if self.tcp is not None else 0

    def pause_reading(self) -> None:
        if self.tcp is not None:
            self.tcp.pause_reading()

    def resume_reading(self) -> None:
        if self.tcp is not None:
            self.tcp.resume_reading()


class MQTTWebSocketListener:
    """`/ws` on its own port (RabbitMQ's web_mqtt.tcp.port, 15675, or over TLS its
    web_mqtt.ssl.port, 15676). Over TLS a connection's `certificate_user` is the client
    certificate's CN, as over MQTT's own TLS port (`--mqtt-ssl-cert-login`)."""

    def __init__(self, ctx: FrontEnd) -> None:
        self.ctx = ctx
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.bound: list[str] = []

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None
                    ) -> None:
        from aiohttp import web
        app = web.Application()
        app.router.add_get(PATH, self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host or None, port, backlog=1024, reuse_address=True,
                           ssl_context=ssl_context)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self.runner = runner
        socks = list(site._server.sockets)  # type: ignore[union-attr]
        sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
        self.port = sock.getsockname()[1]
        self.bound = [f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s in socks]

    async def _handle(self, request: web.Request) -> web.WebSocketResponse:
        from aiohttp import WSMsgType, web

        from ackmq.server.mqtt.connection import MQTTConnection
        ws = web.WebSocketResponse(protocols=("mqtt",), max_msg_size=self.ctx.config.mqtt_packet_limit())
        await ws.prepare(request)
        conn = MQTTConnection(self.ctx)
        conn.connection_made(WSTransport(ws, request))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    conn.data_received(msg.data)
                elif msg.type == WSMsgType.TEXT:  # MQTT over WebSocket is binary only
                    break
        finally:
            conn.connection_lost(None)
        return ws

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
