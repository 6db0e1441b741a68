"""AMQP 1.0 test helpers: brokers to run the same case against (ackmq, and RabbitMQ
3.10's rabbitmq_amqp1_0 plugin on 127.0.0.1:5672 when it is there), proton's blocking
client, and `RawPeer`: a hand-driven 1.0 client on ackmq's own codec, for the cases
proton will not produce (bad frames, out-of-order performatives, SASL left unfinished).
"""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any

from ackmq.protocol.amqp10 import AMQP_HEADER, SASL_HEADER, Composite, Decoder, encode_frame
from ackmq.protocol.amqp10 import frames as F

WAIT = 20.0


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(port: int, user: str = "guest", password: str = "guest",
            host: str = "127.0.0.1", vhost: str | None = None, **kw: Any) -> Any:
    from proton.utils import BlockingConnection
    url = f"amqp://{user}:{password}@{host}:{port}"
    if vhost is not None:
        kw["virtual_host"] = vhost
    return BlockingConnection(url, timeout=WAIT, allowed_mechs="PLAIN", **kw)


class RawPeer:
    """A 1.0 client written by hand: `login()` does SASL PLAIN + open; `send(frame
    bytes)`; `frames()` reads what came back until the socket closes or `until`
    returns True."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=WAIT)
        self.dec = Decoder(max_frame_size=1 << 20)
        self.got: list[Any] = []
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, until: Any = None, timeout: float = WAIT) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed:
            if until is not None and until(self.got):
                break
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                break
            try:
                self.got += self.dec.feed(data)
            except F.BadHeader as e:
                self.got.append(("bad-header", e.raw))
        return self.got

    def kinds(self) -> list[str]:
        return [getattr(getattr(e, "performative", None), "kind", type(e).__name__)
                for e in self.got]

    def performative(self, kind: str) -> Composite | None:
        for e in self.got:
            p = getattr(e, "performative", None)
            if p is not None and p.kind == kind:
                return p
        return None

    def login(self, user: str = "guest", password: str = "guest", open_: bool = True,
              hostname: str = "vhost:/") -> None:
        self.send(SASL_HEADER)
        self.read(until=lambda g: any(getattr(getattr(e, "performative", None), "kind", "")
                                      == "sasl_mechanisms" for e in g))
        self.send(encode_frame(0, Composite("sasl_init", mechanism="PLAIN",
                                            initial_response=f"\0{user}\0{password}".encode()),
                               b"", F.SASL_FRAME))
        self.read(until=lambda g: self.performative("sasl_outcome") is not None)
        if not open_:
            return
        self.send(AMQP_HEADER + encode_frame(0, Composite("open", container_id="raw",
                                                          hostname=hostname)))
        self.read(until=lambda g: self.performative("open") is not None)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
