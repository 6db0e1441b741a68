"""Send malformed frames to a reference broker and print how it closes.

Why: the decoder's error codes and texts are copied from RabbitMQ 3.10's answers; this
script is how they were (and can be re-) observed. Usage:

    python -m ackmq.bench.frame_probe [host] [port]
"""

from __future__ import annotations

import socket
import struct
import sys

from pamqp import commands, frame
from pamqp.header import ContentHeader

from ackmq.protocol.amqp.constants import FRAME_END, FRAME_MAX_DEFAULT, PROTOCOL_HEADER


def _frame(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def _method(channel: int, method: commands.base.Frame) -> bytes:
    return frame.marshal(method, channel)


class Probe:
    """A raw-socket AMQP client: handshake with pamqp, then arbitrary bytes."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5672) -> None:
        self.sock = socket.create_connection((host, port), timeout=2)
        self.buf = b""

    def read(self) -> tuple[int, object] | None:
        while True:
            if self.buf:
                try:
                    used, channel, value = frame.unmarshal(self.buf)
                except Exception:  # noqa: BLE001 - incomplete frame, read more
                    pass
                else:
                    self.buf = self.buf[used:]
                    return channel, value
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                return (-1, "no reply within 2 s")
            if not data:
                return None
            self.buf += data

    def handshake(self, frame_max: int = FRAME_MAX_DEFAULT) -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        self.read()  # connection.start
        self.sock.sendall(
            _method(0, commands.Connection.StartOk(response="\0guest\0guest"))
        )
        _, tune = self.read()
        self.sock.sendall(
            _method(0, commands.Connection.TuneOk(tune.channel_max, frame_max, 0))
            + _method(0, commands.Connection.Open("/"))
        )
        self.read()  # open-ok
        self.sock.sendall(_method(1, commands.Channel.Open()))
        self.read()  # channel.open-ok

    def outcome(self, data: bytes) -> str:
        self.sock.sendall(data)
        while True:
            got = self.read()
            if got is None:
                return f"socket closed without close method, unread {self.buf!r}"
            channel, value = got
            if channel == -1:
                return str(value)
            if isinstance(value, commands.Connection.Close | commands.Channel.Close):
                return (
                    f"{value.name} ch={channel} {value.reply_code} {value.reply_text!r} "
                    f"class={value.class_id} method={value.method_id}"
                )


def _cases() -> dict[str, bytes]:
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


def main() -> None:
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 5672
    sock = socket.create_connection((host, port), timeout=2)
    sock.sendall(b"AMQP\x00\x00\x08\x00")
    print(f"{'bad protocol header':45} -> {sock.recv(100)!r}")
    sock.close()
    for name, data in _cases().items():
        probe = Probe(host, port)
        probe.handshake()
        try:
            print(f"{name:45} -> {probe.outcome(data)}")
        finally:
            probe.sock.close()


if __name__ == "__main__":
    main()
