"""STOMP test helpers: the brokers under test and a raw-frame client.

`target` (a fixture, parametrized) is ackmq (an `ackmq serve` of the test session) or
RabbitMQ's STOMP plugin at 127.0.0.1:61623 (skipped, with the reason, when nothing
listens there), so a protocol-level test asserts behaviour a real broker has.

`Raw` speaks STOMP over a plain socket with its own small parser (not ackmq's codec),
so a test sees the bytes the broker wrote.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pika
import pytest
import stomp
from conftest import BrokerProcess

from support.net import listening

RABBITMQ_STOMP = ("127.0.0.1", int(os.environ.get("RABBITMQ_STOMP_PORT", "61623")))
RABBITMQ_AMQP = os.environ.get("RABBITMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


@dataclass
class Target:
    """A broker with a STOMP listener and an AMQP one (for checking from pika)."""

    name: str  # "ackmq" | "rabbitmq"
    host: str
    port: int
    amqp_url: str
    vhost: str = "/"

    @property
    def ackmq(self) -> bool:
        return self.name == "ackmq"

    def pika(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.amqp_url))

    def raw(self, version: str = "1.2", **headers: str) -> Raw:
        r = Raw.open(self.host, self.port)
        r.connect(version, host=self.vhost, **headers)
        return r

    def client(self, version: str = "1.2", heartbeats: tuple[int, int] = (0, 0)) \
            -> tuple[stomp.Connection, Listener]:
        cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11,
               "1.2": stomp.Connection12}[version]
        kw = {} if version == "1.0" else {"heartbeats": heartbeats}
        conn = cls([(self.host, self.port)], vhost=self.vhost, **kw)
        listener = Listener()
        conn.set_listener("t", listener)
        conn.connect("guest", "guest", wait=True)
        return conn, listener


@pytest.fixture(scope="session")
def ackmq_stomp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One `ackmq serve` for the STOMP tests (fsync on), STOMP on a free port."""
    b = BrokerProcess(tmp_path_factory.mktemp("stomp-data"))
    b.start()
    yield b
    b.stop()


@pytest.fixture(params=["ackmq", "rabbitmq"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "rabbitmq":
        if not listening(RABBITMQ_STOMP):
            pytest.skip(f"RabbitMQ's STOMP plugin is not reachable at "
                        f"{RABBITMQ_STOMP[0]}:{RABBITMQ_STOMP[1]} (start it with "
                        "../shared/tools/rabbitmq-local start)")
        return Target("rabbitmq", *RABBITMQ_STOMP, RABBITMQ_AMQP)
    b = request.getfixturevalue("ackmq_stomp")
    return Target("ackmq", "127.0.0.1", b.stomp_port, b.url)


@pytest.fixture
def ackmq_target(ackmq_stomp: BrokerProcess) -> Target:
    """ackmq only: for what RabbitMQ does differently (see docs/stomp.md)."""
    return Target("ackmq", "127.0.0.1", ackmq_stomp.stomp_port, ackmq_stomp.url)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> Iterator[str]:
    """A queue name unique to the test, deleted afterwards from the broker under test
    (durable /queue/ destinations would otherwise pile up in RabbitMQ)."""
    name = f"stomp.{request.node.name[:50]}.{uuid.uuid4().hex[:8]}"
    yield name
    t = request.getfixturevalue("target") if "target" in request.fixturenames else \
        request.getfixturevalue("ackmq_target")
    for n in (name, name + ".dlq"):
        try:
            delete_queue(t, n)
        except Exception:
            pass


# -- raw frames -------------------------------------------------------------------------

@dataclass
class RawFrame:
    command: str
    headers: dict[str, str] = field(default_factory=dict)  # first of each name wins
    body: bytes = b""
    items: list[tuple[str, str]] = field(default_factory=list)  # every header, in order


class Closed(Exception):
    """The broker closed the socket."""


class Raw:
    """A STOMP client that writes the bytes it is given and parses what comes back with
    a parser of its own (1.2 unescaping, content-length, first header wins)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.version = "1.2"
        self.connected: RawFrame | None = None
        self.heartbeats = 0  # EOLs seen between frames
        self.stash: list[RawFrame] = []  # frames read while waiting for a RECEIPT

    @classmethod
    def open(cls, host: str, port: int) -> Raw:
        return cls(socket.create_connection((host, port), timeout=5))

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"",
             content_length: bool = True) -> None:
        lines = [command] + [f"{k}:{v}" for k, v in (headers or {}).items()]
        if body and content_length:
            lines.append(f"content-length:{len(body)}")
        self.write(("\n".join(lines) + "\n\n").encode() + body + b"\x00")

    def connect(self, version: str = "1.2", **headers: str) -> RawFrame:
        h = {"accept-version": version, "login": "guest", "passcode": "guest"}
        h.update({k.replace("_", "-"): v for k, v in headers.items()})
        self.send("CONNECT", h)
        f = self.recv()
        assert f.command == "CONNECTED", f
        self.version = f.headers.get("version", "1.0")
        self.connected = f
        return f

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no frame from the broker")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no frame from the broker") from None
        except ConnectionResetError:
            data = b""
        if not data:
            raise Closed()
        self.buf += data

    def recv(self, timeout: float = 5.0) -> RawFrame:
        """The next frame (EOLs between frames are counted as heart-beats)."""
        if self.stash:
            return self.stash.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            while self.buf[:1] in (b"\n", b"\r") and self.buf:
                if self.buf.startswith(b"\r\n"):
                    self.buf = self.buf[2:]
                elif self.buf.startswith(b"\r"):
                    break
                else:
                    self.buf = self.buf[1:]
                self.heartbeats += 1
            end = self.buf.find(b"\n\n")
            if end >= 0:
                head = self.buf[:end].decode()
                lines = head.split("\n")
                headers: dict[str, str] = {}
                items = []
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    k, v = _unescape(k), _unescape(v)
                    headers.setdefault(k, v)
                    items.append((k, v))
                start = end + 2
                if "content-length" in headers:
                    n = int(headers["content-length"])
                    if len(self.buf) >= start + n + 1:
                        assert self.buf[start + n] == 0, "no NUL after content-length"
                        body = self.buf[start:start + n]
                        self.buf = self.buf[start + n + 1:]
                        return RawFrame(lines[0], headers, body, items)
                else:
                    nul = self.buf.find(b"\x00", start)
                    if nul >= 0:
                        body = self.buf[start:nul]
                        self.buf = self.buf[nul + 1:]
                        return RawFrame(lines[0], headers, body, items)
            self._fill(deadline)

    def frames(self, timeout: float = 1.0) -> list[RawFrame]:
        """Every frame that arrives within `timeout` seconds."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                out.append(self.recv(max(0.01, deadline - time.monotonic())))
            except TimeoutError:
                return out

    def expect(self, command: str, timeout: float = 5.0) -> RawFrame:
        f = self.recv(timeout)
        assert f.command == command, f
        return f

    def closed(self, timeout: float = 3.0) -> bool:
        """True when the broker closes the socket within `timeout` (frames are skipped)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.recv(max(0.01, deadline - time.monotonic()))
        except Closed:
            return True
        except (TimeoutError, OSError):
            return False

    def subscribe(self, destination: str, sub_id: str, ack: str = "auto",
                  receipt: bool = True, **headers: str) -> None:
        h = {"destination": destination, "id": sub_id, "ack": ack}
        h.update(headers)
        if receipt:
            h["receipt"] = f"sub-{sub_id}"
        self.send("SUBSCRIBE", h)
        if receipt:
            self.wait_receipt(f"sub-{sub_id}")

    def wait_receipt(self, receipt: str) -> RawFrame:
        """The RECEIPT for `receipt`; MESSAGEs before it wait in `stash` for recv()."""
        kept = []
        try:
            while True:
                f = self.recv()
                if f.command == "MESSAGE":
                    kept.append(f)
                    continue
                assert f.command == "RECEIPT" and f.headers["receipt-id"] == receipt, f
                return f
        finally:
            self.stash[:0] = kept

    def ack_id(self, message: RawFrame) -> str:
        return message.headers["ack" if self.version == "1.2" else "message-id"]

    def ack(self, message: RawFrame, command: str = "ACK", **headers: str) -> None:
        name = "id" if self.version == "1.2" else "message-id"
        self.send(command, {name: self.ack_id(message), **headers})

    def receipt(self, command: str, headers: dict[str, str] | None = None,
                body: bytes = b"", receipt: str = "r") -> RawFrame:
        """Send a frame with a receipt and return the RECEIPT (MESSAGEs before it are
        kept for recv())."""
        self.send(command, {**(headers or {}), "receipt": receipt}, body)
        return self.wait_receipt(receipt)


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append({"n": "\n", "c": ":", "\\": "\\", "r": "\r"}[text[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


# -- stomp.py ---------------------------------------------------------------------------

class Listener(stomp.ConnectionListener):
    """Collects what stomp.py hands its listener."""

    def __init__(self) -> None:
        self.messages: list[stomp.utils.Frame] = []
        self.errors: list[stomp.utils.Frame] = []
        self.receipts: list[str] = []
        self.disconnected = False

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.messages.append(frame)

    def on_error(self, frame: stomp.utils.Frame) -> None:
        self.errors.append(frame)

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.receipts.append(frame.headers["receipt-id"])

    def on_disconnected(self) -> None:
        self.disconnected = True

    def wait(self, what: str, n: int = 1, timeout: float = 5.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = getattr(self, what)
            if len(got) >= n:
                return got
            time.sleep(0.01)
        raise AssertionError(f"{len(getattr(self, what))} {what} after {timeout} s, "
                             f"wanted {n}: {getattr(self, what)!r}")


def queue_depth(target: Target, queue: str) -> int:
    conn = target.pika()
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def wait_depth(target: Target, queue: str, n: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        got = queue_depth(target, queue)
        if got == n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def delete_queue(target: Target, queue: str) -> None:
    conn = target.pika()
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()
