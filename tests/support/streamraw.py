"""A raw, synchronous stream-protocol peer for the tests (X1, X6): frames encoded and
decoded by rstream's own codec (not ackmq's), one request at a time, so a test can send
exactly the calls it compares between ackmq and RabbitMQ and read exactly the answers."""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from rstream import schema
from rstream.encoding import decode_frame, encode_frame, encode_publish


class StreamPeer:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0,
                 tls: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        self.sock = sock if tls is None else tls.wrap_socket(sock, server_hostname="localhost")
        self.corr = 0
        self.events: list[Any] = []  # frames read while waiting for another (Deliver, ...)

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def send(self, frame: Any) -> None:
        if isinstance(frame, schema.Publish):
            self.sock.sendall(encode_publish(frame))
        elif isinstance(frame, bytes):
            self.sock.sendall(frame)
        else:
            self.sock.sendall(encode_frame(frame))

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            d = self.sock.recv(n - len(out))
            if not d:
                raise EOFError("the broker closed the connection")
            out += d
        return out

    def read_raw(self) -> bytes:
        """One frame's bytes after its size, not decoded (what rstream cannot read:
        Deliver v2)."""
        (n,) = struct.unpack(">I", self._exact(4))
        return self._exact(n)

    def read(self) -> Any:
        return decode_frame(self.read_raw())

    def wait(self, cls: type) -> Any:
        while True:
            f = self.read()
            if isinstance(f, cls):
                return f
            self.events.append(f)

    def call(self, frame: Any, reply: type) -> Any:
        self.send(frame)
        return self.wait(reply)

    def login(self, user: str = "guest", password: str = "guest", vhost: str = "/",
              heartbeat: int = 0) -> int:
        """The opening sequence (our tune asks for `heartbeat` seconds, 0: none); the
        code of the first refusal, or 1 (OK) once open."""
        self.call(schema.PeerProperties(self.next_corr(), properties=[]),
                  schema.PeerPropertiesResponse)
        self.call(schema.SaslHandshake(self.next_corr()), schema.SaslHandshakeResponse)
        r = self.call(schema.SaslAuthenticate(self.next_corr(), mechanism="PLAIN",
                                              data=b"\0" + user.encode() + b"\0"
                                              + password.encode()),
                      schema.SaslAuthenticateResponse)
        if r.response_code != 1:
            return int(r.response_code)
        tune = self.wait(schema.Tune)
        self.send(schema.Tune(frame_max=tune.frame_max, heartbeat=heartbeat))
        r = self.call(schema.Open(self.next_corr(), virtual_host=vhost), schema.OpenResponse)
        return int(r.response_code)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
