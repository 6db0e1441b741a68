"""A tiny blocking AMQP 0-9-1 client for tests that must see (or send) exact frames.

Why: pika hides sequence numbers, `multiple` bits, frame order and malformed input;
conformance tests need all of them. Built on pamqp 4 so the codec is not ours.

Typical use::

    conn = RawConnection.open(url)                  # handshake, PLAIN guest/guest
    conn.open_channel(1)
    conn.send(1, commands.Confirm.Select())
    conn.expect(commands.Confirm.SelectOk)
    conn.publish(1, "", "no-such-queue", b"x", mandatory=True)
    ret = conn.expect(commands.Basic.Return)         # a Message: .method, .properties, .body
    ack = conn.expect(commands.Basic.Ack)            # a pamqp command
    conn.send_raw(b"garbage")
    close = conn.wait_close()                        # Connection.Close / Channel.Close / None
    conn.abort()

API summary (all waits take `timeout` seconds and raise `TimeoutError` when it runs out):

- `RawConnection.connect(url)`: TCP only, no handshake (send your own bytes).
- `RawConnection.open(url, heartbeat=0, frame_max=131072, channel_max=0,
  mechanism="PLAIN", vhost=None, username=None, password=None)`: full handshake.
  After it: `server_properties`, `tune` (the server's Connection.Tune), and the
  negotiated `frame_max`, `channel_max`, `heartbeat`.
- Frame builders for malformed/edge input: `raw_frame`, `method_frame`, `header_frame`,
  `body_frame`, `ack_frame`/`nack_frame` (unsigned 64-bit tags); `safe_name(qname)`.
- `send(channel, method)`, `send_raw(bytes)`, `send_heartbeat()`,
  `publish(channel, exchange, routing_key, body, properties=None, mandatory=False)`.
- `recv(timeout) -> (channel, frame)`: the next frame. Content-carrying methods
  (Basic.Deliver, Basic.GetOk, Basic.Return) come back assembled as a `Message` unless
  `assemble=False`. Heartbeats are skipped unless `heartbeats=True`. EOF raises
  `ConnectionClosedByPeer` and sets `closed`.
- `expect(method_class, timeout, channel=None, skip_others=False)`: the next
  non-heartbeat frame, asserted to be of that class (and channel); returns it. With
  `skip_others`, other frames are set aside in `pending` (recv returns them later).
- `rpc(channel, method, reply_class)`: send then expect(skip_others=True), so a
  delivery racing the reply is not lost but comes out of the next `recv`.
- `wait_close(timeout)`: reads until a Connection.Close or Channel.Close arrives and
  returns it (answering it with the matching close-ok unless `reply=False`); returns
  None if the socket reaches EOF first. `wait_eof(timeout)` waits for the socket to close.
- `close()`: polite connection.close handshake; `abort()`: drop the socket.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from pamqp import commands, frame
from pamqp import encode as pamqp_encode
from pamqp.body import ContentBody
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CONTENT_METHODS = (commands.Basic.Deliver, commands.Basic.GetOk, commands.Basic.Return)


class ConnectionClosedByPeer(ConnectionError):
    """The broker closed the TCP connection (EOF)."""


@dataclass
class Message:
    """A content-carrying method with its header and body, assembled."""

    channel: int
    method: Any
    header: ContentHeader | None = None
    body: bytes = b""
    frames: list[Any] = field(default_factory=list)
    raw_properties: bytes = b""  # the content header's property bytes as they came


    @property
    def properties(self) -> commands.Basic.Properties:
        assert self.header is not None
        return self.header.properties

    def __getattr__(self, name: str) -> Any:
        # Convenience: msg.delivery_tag, msg.redelivered, msg.reply_code, ...
        if name.startswith("__") or name in ("method", "header", "body", "frames", "channel"):
            raise AttributeError(name)
        return getattr(self.method, name)


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    """Bytes of one frame with an arbitrary type/payload/end octet (for malformed input)."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def method_frame(channel: int, method: Any) -> bytes:
    """Bytes of one well-formed method frame."""
    return frame.marshal(method, channel)


def header_frame(channel: int, body_size: int,
                 properties: commands.Basic.Properties | None = None) -> bytes:
    """Bytes of a basic content header frame declaring `body_size`."""
    return frame.marshal(ContentHeader(0, body_size, properties or commands.Basic.Properties()),
                         channel)


def body_frame(channel: int, body: bytes) -> bytes:
    """Bytes of one content body frame."""
    return frame.marshal(ContentBody(body), channel)


def ack_frame(channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """basic.ack with an unsigned 64-bit tag (pamqp only encodes signed long-longs)."""
    return raw_frame(FRAME_METHOD, channel, struct.pack(">HHQB", 60, 80, delivery_tag,
                                                        int(multiple)))


def nack_frame(channel: int, delivery_tag: int, multiple: bool = False,
               requeue: bool = True) -> bytes:
    """basic.nack with an unsigned 64-bit tag."""
    bits = int(multiple) | (int(requeue) << 1)
    return raw_frame(FRAME_METHOD, channel, struct.pack(">HHQB", 60, 120, delivery_tag, bits))


def safe_name(name: str) -> str:
    """A queue/exchange name pamqp accepts (it rejects e.g. the brackets of test ids)."""
    return re.sub(r"[^-_.:a-zA-Z0-9]", "_", name)


def _parse_url(url: str) -> tuple[str, int, str, str, str]:
    u = urlparse(url)
    vhost = unquote(u.path[1:]) if u.path and u.path != "/" else "/"
    return (u.hostname or "127.0.0.1", u.port or 5672, unquote(u.username or "guest"),
            unquote(u.password or "guest"), vhost)


def amqplain_response(username: str, password: str) -> str:
    """AMQPLAIN response: a field table without its length prefix (as a str for pamqp)."""
    table = pamqp_encode.field_table({"LOGIN": username, "PASSWORD": password})[4:]
    return table.decode("latin-1")


class RawConnection:
    """One blocking socket speaking AMQP 0-9-1 frame by frame."""

    def __init__(self, sock: socket.socket, url: str) -> None:
        self.sock = sock
        self.url = url
        self.buf = b""
        self.last_raw = b""  # the bytes of the last frame read
        self.pending: list[tuple[int, Any]] = []  # frames set aside by expect(skip_others)
        self.closed = False
        self.server_properties: dict[str, Any] = {}
        self.mechanisms: str = ""
        self.tune: commands.Connection.Tune | None = None
        self.frame_max = 131072
        self.channel_max = 0
        self.heartbeat = 0

    # ---- construction -------------------------------------------------------------
    @classmethod
    def connect(cls, url: str, timeout: float = 5.0) -> RawConnection:
        """TCP connection only; nothing sent yet."""
        host, port, *_ = _parse_url(url)
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, url)

    @classmethod
    def open(cls, url: str, heartbeat: int = 0, frame_max: int = 131072, channel_max: int = 0,
             mechanism: str = "PLAIN", vhost: str | None = None, username: str | None = None,
             password: str | None = None, timeout: float = 5.0,
             capabilities: dict[str, Any] | None = None) -> RawConnection:
        """Connect and run the whole handshake up to connection.open-ok.

        The tune-ok carries min(server, ours) for each field where ours is non-zero
        (0 meaning "no limit" on our side, so the server's value wins).
        """
        conn = cls.connect(url, timeout)
        conn.handshake(heartbeat=heartbeat, frame_max=frame_max, channel_max=channel_max,
                       mechanism=mechanism, vhost=vhost, username=username,
                       password=password, timeout=timeout, capabilities=capabilities)
        return conn

    def start(self, timeout: float = 5.0) -> commands.Connection.Start:
        """Send the protocol header and read connection.start."""
        self.send_raw(PROTOCOL_HEADER)
        start = self.expect(commands.Connection.Start, timeout)
        self.server_properties = dict(start.server_properties or {})
        mech = start.mechanisms
        self.mechanisms = mech.decode() if isinstance(mech, bytes) else str(mech)
        return start

    def handshake(self, heartbeat: int = 0, frame_max: int = 131072, channel_max: int = 0,
                  mechanism: str = "PLAIN", vhost: str | None = None,
                  username: str | None = None, password: str | None = None,
                  timeout: float = 5.0, capabilities: dict[str, Any] | None = None) -> None:
        """`capabilities`: added to the client's (e.g. {"connection.blocked": True})."""
        _, _, url_user, url_pass, url_vhost = _parse_url(self.url)
        user = url_user if username is None else username
        pw = url_pass if password is None else password
        self.start(timeout)
        if mechanism == "AMQPLAIN":
            response = amqplain_response(user, pw)
        else:
            response = f"\0{user}\0{pw}"
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "ackmq-tests-rawamqp",
                               "capabilities": {"authentication_failure_close": True,
                                                "basic.nack": True,
                                                "publisher_confirms": True,
                                                "consumer_cancel_notify": True,
                                                **(capabilities or {})}},
            mechanism=mechanism, response=response, locale="en_US"))
        tune = self.expect(commands.Connection.Tune, timeout)
        self.tune = tune

        def neg(server: int, ours: int) -> int:
            if server == 0:
                return ours
            if ours == 0:
                return server
            return min(server, ours)

        self.channel_max = neg(tune.channel_max, channel_max)
        self.frame_max = neg(tune.frame_max, frame_max)
        self.heartbeat = heartbeat if tune.heartbeat == 0 else min(tune.heartbeat, heartbeat)
        self.send(0, commands.Connection.TuneOk(self.channel_max, self.frame_max,
                                                self.heartbeat))
        self.send(0, commands.Connection.Open(virtual_host=url_vhost if vhost is None
                                              else vhost))
        self.expect(commands.Connection.OpenOk, timeout)

    # ---- sending ---------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, method: Any) -> None:
        """Send one frame (a pamqp command, ContentHeader, ContentBody or Heartbeat)."""
        self.sock.sendall(frame.marshal(method, channel))

    def send_heartbeat(self) -> None:
        self.sock.sendall(Heartbeat().marshal())

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                properties: commands.Basic.Properties | None = None,
                mandatory: bool = False, immediate: bool = False,
                raw_properties: bytes | None = None) -> None:
        """basic.publish + content header + body frames (split at frame_max), one write.
        `raw_properties` (flags + property list, as on the wire) replaces `properties`."""
        header = header_frame(channel, len(body), properties) if raw_properties is None \
            else raw_frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, len(body))
                           + raw_properties)
        parts = [method_frame(channel, commands.Basic.Publish(
                     exchange=exchange, routing_key=routing_key, mandatory=mandatory,
                     immediate=immediate)),
                 header]
        chunk = max(1, self.frame_max - 8)
        for i in range(0, len(body), chunk):
            parts.append(body_frame(channel, body[i:i + chunk]))
        self.sock.sendall(b"".join(parts))

    def open_channel(self, channel: int = 1, timeout: float = 5.0) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, timeout, channel=channel)

    def rpc(self, channel: int, method: Any, reply_class: type, timeout: float = 5.0,
            skip_others: bool = True) -> Any:
        """Send `method`, return its reply; frames racing the reply stay in `pending`."""
        self.send(channel, method)
        return self.expect(reply_class, timeout, channel=channel, skip_others=skip_others)

    # ---- receiving -------------------------------------------------------------------
    def _read_more(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from the broker in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(262144)
        except TimeoutError:
            raise TimeoutError("no frame from the broker in time") from None
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            raise ConnectionClosedByPeer("broker closed the connection")
        self.buf += data

    def _next_frame(self, deadline: float) -> tuple[int, Any]:
        while True:
            if self.buf.startswith(b"AMQP") and len(self.buf) >= 8:
                header = ProtocolHeader(self.buf[5], self.buf[6], self.buf[7])
                self.buf = self.buf[8:]
                return 0, header
            if len(self.buf) >= 7 and not self.buf.startswith(b"AMQP"):
                _, _, size = struct.unpack(">BHI", self.buf[:7])
                if len(self.buf) >= size + 8:
                    used, channel, value = frame.unmarshal(self.buf[:size + 8])
                    self.last_raw = bytes(self.buf[:used])
                    self.buf = self.buf[used:]
                    return channel, value
            self._read_more(deadline)

    def recv(self, timeout: float = 5.0, assemble: bool = True,
             heartbeats: bool = False) -> tuple[int, Any]:
        """Next frame as (channel, pamqp object or Message)."""
        if self.pending:
            return self.pending.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            channel, value = self._next_frame(deadline)
            if isinstance(value, Heartbeat) and not heartbeats:
                continue
            if assemble and isinstance(value, CONTENT_METHODS):
                return channel, self._assemble(channel, value, deadline)
            return channel, value

    def _assemble(self, channel: int, method: Any, deadline: float) -> Message:
        msg = Message(channel, method)
        while True:
            ch, value = self._next_frame(deadline)
            if isinstance(value, Heartbeat):
                continue
            msg.frames.append((ch, value))
            if ch != channel:
                raise AssertionError(f"content of {method.name} on channel {channel} "
                                     f"interleaved with a frame on channel {ch}: {value!r}")
            if isinstance(value, ContentHeader):
                msg.header = value
                # frame header (7) + class, weight, body size (12) ... frame end (1)
                msg.raw_properties = self.last_raw[19:-1]
            elif isinstance(value, ContentBody):
                msg.body += value.value
            else:
                raise AssertionError(f"expected content frames after {method.name}, "
                                     f"got {value!r}")
            if msg.header is not None and len(msg.body) >= msg.header.body_size:
                return msg

    def expect(self, method_class: type, timeout: float = 5.0, channel: int | None = None,
               assemble: bool = True, skip_others: bool = False) -> Any:
        """Next frame, asserted to be `method_class` (on `channel` if given).

        With `skip_others`, non-matching frames (e.g. deliveries racing an rpc reply)
        are kept in `pending` and handed out by later `recv` calls in arrival order;
        a Connection.Close, or a Channel.Close on `channel`, still fails at once.
        """
        deadline = time.monotonic() + timeout
        skipped: list[tuple[int, Any]] = []
        try:
            while True:
                ch, value = self.recv(max(deadline - time.monotonic(), 0.001), assemble=assemble)
                got = value.method if isinstance(value, Message) else value
                if isinstance(got, method_class) and (channel is None or ch == channel):
                    return value
                fatal = isinstance(got, commands.Connection.Close) or (
                    isinstance(got, commands.Channel.Close) and ch == channel)
                if not skip_others or fatal:
                    raise AssertionError(
                        f"expected {method_class.__qualname__}"
                        f"{'' if channel is None else f' on channel {channel}'}, "
                        f"got {getattr(got, 'name', type(got).__name__)} on "
                        f"channel {ch}: {vars_of(got)}")
                skipped.append((ch, value))
        finally:
            self.pending[:0] = skipped

    def drain(self, timeout: float = 0.3) -> list[tuple[int, Any]]:
        """Every frame that arrives within `timeout` (stops early on EOF)."""
        out: list[tuple[int, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            try:
                out.append(self.recv(remaining))
            except (TimeoutError, ConnectionClosedByPeer):
                return out

    def wait_close(self, timeout: float = 5.0, reply: bool = True
                   ) -> commands.Connection.Close | commands.Channel.Close | None:
        """Read until a Connection.Close or Channel.Close; None on EOF first.

        With `reply`, answers close-ok so the broker sees a polite handshake.
        Attribute `close_channel` holds the channel number of the returned close.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                ch, value = self.recv(max(remaining, 0.001))
            except ConnectionClosedByPeer:
                return None
            if isinstance(value, commands.Connection.Close | commands.Channel.Close):
                self.close_channel = ch
                if reply:
                    try:
                        if isinstance(value, commands.Connection.Close):
                            self.send(0, commands.Connection.CloseOk())
                        else:
                            self.send(ch, commands.Channel.CloseOk())
                    except OSError:
                        pass
                return value

    def wait_eof(self, timeout: float = 5.0) -> bool:
        """True once the broker has closed the socket (frames before EOF are discarded)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._read_more(deadline)
                self.buf = b""
            except ConnectionClosedByPeer:
                return True
            except TimeoutError:
                return False

    def read_raw(self, timeout: float = 5.0) -> bytes:
        """All bytes until EOF or timeout (whatever is buffered first)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._read_more(deadline)
        except (ConnectionClosedByPeer, TimeoutError):
            pass
        data, self.buf = self.buf, b""
        return data

    def close(self, timeout: float = 5.0) -> None:
        """connection.close / close-ok, then drop the socket."""
        try:
            if not self.closed:
                self.send(0, commands.Connection.Close(200, "bye", 0, 0))
                deadline = time.monotonic() + timeout
                while True:
                    _, value = self.recv(max(deadline - time.monotonic(), 0.001))
                    if isinstance(value, commands.Connection.CloseOk | commands.Connection.Close):
                        break
        except (OSError, ConnectionClosedByPeer, TimeoutError):
            pass
        finally:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


def vars_of(obj: Any) -> dict[str, Any]:
    """Attributes of a pamqp object for assertion messages."""
    slots = getattr(obj, "__slots__", None)
    if slots:
        return {s: getattr(obj, s, None) for s in slots}
    return dict(getattr(obj, "__dict__", {}))
