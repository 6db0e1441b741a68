"""What the bench's drivers share below the clients: broker URLs (parse, redact) and
WireProtocol, the base of the STOMP load driver (output queued during a read and written
once, TCP backpressure awaited in `drain`).

The AMQP drivers run on ackmq.client (its low-level channels, ackmq/client/lowlevel.py):
one AMQP client in the project, with the flat parser for confirms and deliveries that
this module used to have.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from ackmq.client.options import parse_url as client_parse_url


@dataclass(frozen=True)
class URLParts:
    host: str
    port: int
    user: str
    password: str
    vhost: str


URL_FORM = "amqp://user:pass@host:port/vhost (e.g. amqp://guest:guest@127.0.0.1:5672/)"


def redact(url: str) -> str:
    """The URL without its password, for messages and reports."""
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


class BadURL(ValueError):
    """A broker URL the bench cannot use; the message says what form is expected."""


def parse_url(url: str) -> URLParts:
    """amqp://user:pass@host:port/vhost, with the usual defaults (vhost '/' when empty).

    Anything else raises BadURL with a one-line message naming the expected form."""
    shown = redact(url) if isinstance(url, str) else url
    if not isinstance(url, str) or "://" not in url:
        raise BadURL(f"not a broker URL: {shown!r}; expected {URL_FORM}")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "amqps":
        raise BadURL(f"amqps:// (TLS) is not supported by the bench: {shown!r}; "
                     f"use a plain {URL_FORM}")
    if scheme != "amqp":
        raise BadURL(f"unsupported scheme {url.split('://', 1)[0]}:// in {shown!r}; "
                     f"expected {URL_FORM}")
    try:  # the client's URL rules and defaults: one parser for both
        o = client_parse_url(url)
    except ValueError as exc:  # bad port: "Port could not be cast...", "out of range"
        raise BadURL(f"bad broker URL {shown!r} ({exc}); expected {URL_FORM}") from exc
    return URLParts(o.host, o.port, o.username, o.password, o.vhost)


class WireProtocol(asyncio.Protocol):
    """What the bench's AMQP and STOMP drivers share: output queued during a
    `data_received` and written once, and TCP backpressure awaited in `drain`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.error: Exception | None = None
        self._paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if self.error:
            raise self.error
        assert self.transport is not None
        self.transport.write(data)

    def queue(self, data: bytes) -> None:
        """Queue bytes for the next `flush` (acks written from data_received)."""
        self.out.append(data)

    def flush(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    @property
    def paused(self) -> bool:
        return self._paused

    async def drain(self) -> None:
        """Wait while the kernel socket buffer is full (TCP backpressure from the broker)."""
        if self.error:
            raise self.error
        if self._paused:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = self.loop.create_future()
            await self._drain_waiter

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types it BaseTransport; a TCP connection's is a Transport
        self.transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
