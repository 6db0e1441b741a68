"""The management HTTP listener (SPEC M1): aiohttp on the broker's own loop.

Why aiohttp: it is asyncio-native (the handlers read the model on the loop that owns
it, between two event-loop turns, so no locks and no thread hand-over), mature, and its
low-level server bounds what a client may send (request line, header sizes, body size).
`HttpListener` is all server/server.py knows of it: start on a port (0: a free one),
optionally with TLS (`--https-port`), stop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

log = logging.getLogger("ackmq.http")

# aiohttp's parser limits: a request line or one header field above these is a 400
MAX_LINE = 8190
MAX_FIELD = 8190
KEEPALIVE_TIMEOUT = 75.0
SHUTDOWN_TIMEOUT = 2.0  # a broker stopping waits this long for requests in flight
# lingering_time=0: a body left unread (refused with 413) closes the connection at
# once instead of being read and thrown away for up to 10 s


class _ServerLog(logging.Logger):
    """aiohttp's request handler logs a malformed request, an over-long header line or
    a client that hung up mid-body as "Error handling request" with a traceback (at
    ERROR or DEBUG); those are the client's doing, answered with 400 (or with nothing,
    the client being gone): one debug line without traceback. Anything else (a bug in
    a handler) keeps its level and traceback."""

    def _log(self, level: int, msg: object, args: Any, exc_info: Any = None,
             extra: Mapping[str, object] | None = None, stack_info: bool = False,
             stacklevel: int = 1) -> None:
        from aiohttp.http_exceptions import HttpProcessingError
        exc = exc_info if isinstance(exc_info, BaseException) else (
            sys.exc_info()[1] if exc_info is True else None)
        if isinstance(exc, HttpProcessingError | ConnectionError | TimeoutError):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            super()._log(logging.DEBUG, "%s: %s", (str(msg) % args if args else msg, first))
            return
        super()._log(level, msg, args, exc_info=exc_info, extra=extra, stack_info=stack_info,
                     stacklevel=stacklevel)


def _server_log() -> logging.Logger:
    logger = _ServerLog("ackmq.http.server")
    logger.parent = log
    return logger


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpListener:
    """The HTTP (and/or HTTPS) listener of one broker, on its HttpContext."""

    def __init__(self, server: HttpContext) -> None:
        self.server = server
        server.http = self  # its ports, for /api/overview's listeners
        self._runner: Any = None
        self.port = 0
        self.url = ""
        self.https_port = 0
        self.https_url = ""
        self.bound: list[str] = []

    async def start(self, host: str, http_port: int | None, https_port: int | None,
                    ssl_context: Any = None) -> None:
        """`host`: where a client on this machine connects (for the URLs). An OSError
        names the listener in `.listener`, as the others."""
        from aiohttp import web

        from ackmq.server.http.app import build_app
        cfg = self.server.config
        runner = web.AppRunner(build_app(self.server), access_log=None, logger=_server_log(),
                               max_line_size=MAX_LINE, max_field_size=MAX_FIELD,
                               keepalive_timeout=KEEPALIVE_TIMEOUT, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_TIMEOUT, lingering_time=0)
        await runner.setup()
        self._runner = runner
        for port, ctx, what in ((http_port, None, "HTTP"), (https_port, ssl_context, "HTTPS")):
            if port is None:
                continue
            site = web.TCPSite(runner, cfg.host or None, port, ssl_context=ctx,
                               backlog=128, reuse_address=True)
            try:
                await site.start()
            except OSError as e:
                await runner.cleanup()
                self._runner = None
                e.listener = f"{_host_port(cfg.host, port)} ({what})"  # type: ignore[attr-defined]
                raise
            socks = list(site._server.sockets)  # type: ignore[union-attr]
            sock = next((s for s in socks if s.family == socket.AF_INET), socks[0])
            bound = sock.getsockname()[1]
            self.bound += [_host_port(s.getsockname()[0], s.getsockname()[1]) for s in socks]
            if ctx is None:
                self.port, self.url = bound, f"http://{_host_port(host, bound)}"
            else:
                self.https_port, self.https_url = bound, f"https://{_host_port(host, bound)}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            # let the request handlers cancelled by the cleanup finish before the loop
            # closes (else: "Task was destroyed but it is pending")
            for _ in range(3):
                await asyncio.sleep(0)
