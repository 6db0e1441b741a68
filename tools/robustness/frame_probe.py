"""Send malformed frames to a broker and print how it closes.

Why: the decoder's error codes and texts are copied from RabbitMQ 3.10's answers; this
script is how they were (and can be re-) observed, and tests/test_frame_probe.py runs
every case against ackmq and RabbitMQ to keep them equal. Usage:

    python -m tools.robustness.frame_probe [host] [port]

Each case opens a connection and channel 1 with ackmq.client.lowlevel, writes its bytes
with `conn.write`, and reports the broker's answer from the client's error: the
connection.close or channel.close (code, text, class and method ids), the socket's end
without a close, or nothing within the wait.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from dataclasses import dataclass

from pamqp import commands, frame
from pamqp.header import ContentHeader

from ackmq.client.errors import ChannelClosed, ClientError, ConnectionLost
from ackmq.client.lowlevel import open_connection
from ackmq.protocol.amqp.constants import FRAME_END

WAIT = 2.0  # seconds a case waits for the broker's answer


def _frame(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def _method(channel: int, method: commands.base.Frame) -> bytes:
    return frame.marshal(method, channel)


@dataclass(frozen=True)
class Outcome:
    """How the broker ended a case. `kind`: "Connection.Close", "Channel.Close", "EOF"
    (the socket closed without a close method) or "none" (no answer within the wait)."""

    kind: str
    code: int = 0
    text: str = ""
    class_id: int = 0
    method_id: int = 0
    channel: int = 0

    def __str__(self) -> str:
        if self.kind == "EOF":
            return "socket closed without close method"
        if self.kind == "none":
            return f"no reply within {WAIT:g} s"
        return (f"{self.kind} ch={self.channel} {self.code} {self.text!r} "
                f"class={self.class_id} method={self.method_id}")


def outcome_of(error: ClientError | None) -> Outcome:
    """The client's error as the broker's answer."""
    if error is None:
        return Outcome("none")
    if isinstance(error, ChannelClosed):
        return Outcome("Channel.Close", error.code, error.text, error.class_id,
                       error.method_id, 1)
    if isinstance(error, ConnectionLost) and error.code:
        return Outcome("Connection.Close", error.code, error.text, error.class_id,
                       error.method_id)
    return Outcome("EOF")  # EOF or reset: no close method, nothing more to compare


async def probe(url: str, data: bytes, wait: float = WAIT) -> Outcome:
    """Handshake, channel 1, then `data`; the broker's answer."""
    conn = await open_connection(url, connection_name="ackmq-frame-probe")
    try:
        ch = await conn.channel()
        conn.write(data)
        return outcome_of(await ch.wait_closed(wait))
    finally:
        conn.abort()


def bad_protocol_header(host: str, port: int) -> bytes:
    """What the broker answers to an AMQP 0-8 protocol header (before any frame)."""
    with socket.create_connection((host, port), timeout=WAIT) as sock:
        sock.sendall(b"AMQP\x00\x00\x08\x00")
        return sock.recv(100)


def cases() -> dict[str, bytes]:
    """Name -> the bytes written on an open channel 1."""
    pub = _method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    hdr = frame.marshal(ContentHeader(0, 5, commands.Basic.Properties()), 1)
    body = _frame(3, 1, b"hello")
    return {
        "frame larger than frame_max": _frame(3, 1, b"x" * 200000),
        "bad frame end": _frame(1, 1, struct.pack(">HH", 20, 40), end=0),
        "unknown frame type 9": _frame(9, 1, b"abc"),
        "heartbeat on channel 1": _frame(8, 1, b""),
        "unknown class 99": _frame(1, 1, struct.pack(">HH", 99, 10)),
        "unknown method basic.99": _frame(1, 1, struct.pack(">HH", 60, 99)),
        "truncated queue.declare": _frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x05ab"),
        "header with no method": hdr,
        "body with no method": body,
        "method while awaiting header": pub + _method(1, commands.Basic.Qos(0, 1)),
        "method while awaiting body": pub + hdr + _method(1, commands.Basic.Qos(0, 1)),
        "body bigger than declared": pub + hdr + _frame(3, 1, b"hello!"),
        "two bodies bigger than declared": pub + hdr + _frame(3, 1, b"hel") + _frame(3, 1, b"lo!"),
        "header class mismatch": pub + _frame(2, 1, struct.pack(">HHQH", 50, 0, 5, 0)),
        "header weight non-zero": pub + _frame(2, 1, struct.pack(">HHQH", 60, 1, 5, 0)),
        "oversize body_size": pub + _frame(2, 1, struct.pack(">HHQH", 60, 0, 200 * 2**20, 0)),
        "method on channel 0 basic.qos": _method(0, commands.Basic.Qos(0, 1)),
        "trailing bytes after basic.qos": _frame(1, 1, struct.pack(">HHIHB", 60, 10, 0, 1, 0) + b"zz"),
        "content method on channel while other awaits": pub + _method(2, commands.Channel.Open()),
        "truncated content header": pub + _frame(2, 1, struct.pack(">HHQ", 60, 0, 5)),
        "bad property list": pub + _frame(2, 1, struct.pack(">HHQH", 60, 0, 5, 0x8000) + b"\x09ab"),
    }


async def _run(host: str, port: int) -> None:
    url = f"amqp://guest:guest@{host}:{port}/"
    for name, data in cases().items():
        print(f"{name:45} -> {await probe(url, data)}", flush=True)


def main() -> None:
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 5672
    print(f"{'bad protocol header':45} -> {bad_protocol_header(host, port)!r}")
    asyncio.run(_run(host, port))


if __name__ == "__main__":
    main()
