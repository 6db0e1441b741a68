"""close() is bounded by close_timeout and does not raise when the broker stops
answering (seen in `ackmq bench client-publish`: RabbitMQ under a memory alarm blocks a
publishing connection and reads nothing, so channel.close-ok never comes)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from ackmq.client import connect, connect_async


class _MutingProxy:
    """TCP proxy to the broker that can stop passing the broker's bytes on (the socket
    stays open: a broker that no longer answers)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        port = self.srv.getsockname()[1]
        self.url = f"amqp://{parts.username}:{parts.password}@127.0.0.1:{port}{parts.path}"
        self.muted = threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            client, _ = self.srv.accept()
        except OSError:
            return
        upstream = socket.create_connection(self.target)
        self.socks += [client, upstream]
        threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_broker: bool) -> None:
        try:
            while data := src.recv(65536):
                if not (from_broker and self.muted.is_set()):
                    dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for s in [self.srv, *self.socks]:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def proxy(broker_url: str):  # type: ignore[no-untyped-def]
    p = _MutingProxy(broker_url)
    yield p
    p.close()


def test_sync_close_gives_up_after_close_timeout(proxy: _MutingProxy) -> None:
    conn = connect(proxy.url, heartbeat=0, close_timeout=0.5)
    conn.session().producer("ackmq-test.close-timeout")
    proxy.muted.set()
    t0 = time.monotonic()
    conn.close()  # raised TimeoutError from the session's channel.close before the fix
    assert time.monotonic() - t0 < 3.0
    assert not conn.is_open


def test_asyncio_close_gives_up_after_close_timeout(proxy: _MutingProxy) -> None:
    async def go() -> None:
        conn = await connect_async(proxy.url, heartbeat=0, close_timeout=0.5)
        await (await conn.session()).producer("ackmq-test.close-timeout")
        proxy.muted.set()
        t0 = time.monotonic()
        await conn.close()
        assert time.monotonic() - t0 < 3.0
        assert not conn.is_open

    asyncio.run(go())
