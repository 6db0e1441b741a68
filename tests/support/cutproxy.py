"""A TCP proxy for tests that cuts every link through it on demand (mid-stream: bytes in
flight either way are lost, the peers see a reset), as a failing network does."""

from __future__ import annotations

import socket
import struct
import threading


class CutProxy:
    """Listens on 127.0.0.1:<port>, forwards each accepted connection to `upstream`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._links: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.cuts = 0
        self.connections = 0
        # cut once, after this many bytes went client -> broker (None: only by cut())
        self.cut_after: int | None = None
        self._sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._links += [client, server]
                self.connections += 1
            for a, b, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(a, b, up), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if up and self.cut_after is not None:
                    self._sent += len(data)
                    if self._sent >= self.cut_after:
                        self.cut_after = None
                        dst.sendall(data[: len(data) // 2])  # half a frame, then nothing
                        self.cut()
                        return
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every link now, with a reset (SO_LINGER 0): what is in flight is lost."""
        with self._lock:
            links, self._links = self._links, []
            self.cuts += 1
        for s in links:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.cut()
