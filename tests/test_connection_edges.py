"""Connection edges, as RabbitMQ 3.10 handles them: frames read together with a bad one,
confirms owed when a connection error comes, a client that stops reading, methods only a
server may send, tune-ok outside the proposed limits, guest from a remote address.

Why: each is a way for a client to lose confirms, to be told the wrong thing, or to make
the broker grow without bound. Every check here also runs against RabbitMQ
(ACKMQ_TEST_URL=amqp://guest:guest@127.0.0.1:5672/), except where it says ackmq only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from conftest import BrokerProcess
from pamqp import commands
from support.rawamqp import (
    ConnectionClosedByPeer,
    Message,
    RawConnection,
    body_frame,
    header_frame,
    method_frame,
    raw_frame,
    safe_name,
)

from ackmq.protocol.amqp import Decoder, FrameError, Publish


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A transient ackmq of this module's own, for what needs its log or its pid."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("needs an ackmq process of its own (log, pid)")
    broker = BrokerProcess(tmp_path_factory.mktemp("edges"), "--no-persistence")
    broker.start()
    yield broker
    broker.stop()


def _publish(channel: int, routing_key: str, body: bytes, mandatory: bool = False) -> bytes:
    return (method_frame(channel, commands.Basic.Publish(exchange="", routing_key=routing_key,
                                                         mandatory=mandatory))
            + header_frame(channel, len(body)) + body_frame(channel, body))


def _until_close(conn: RawConnection, timeout: float = 5.0
                 ) -> tuple[list[tuple[int, object]], commands.Connection.Close]:
    """Every frame up to the connection.close (answered with close-ok), and the close."""
    frames: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    while True:
        ch, value = conn.recv(max(deadline - time.monotonic(), 0.001))
        if isinstance(value, commands.Connection.Close):
            conn.send(0, commands.Connection.CloseOk())
            return frames, value
        frames.append((ch, value))


def _confirmed(frames: list[tuple[int, object]], channel: int = 1) -> set[int]:
    """Publish sequence numbers acked on `channel` (multiple=true expanded)."""
    done: set[int] = set()
    for ch, value in frames:
        if ch == channel and isinstance(value, commands.Basic.Ack):
            if value.multiple:
                done.update(range(1, value.delivery_tag + 1))
            else:
                done.add(value.delivery_tag)
    return done


@pytest.fixture
def queue(broker_url: str, qname: str) -> Iterator[str]:
    """A durable-less, non-auto-delete queue that outlives the connections that die here."""
    name = safe_name(qname)
    admin = RawConnection.open(broker_url)
    admin.open_channel(1)
    admin.rpc(1, commands.Queue.Declare(queue=name), commands.Queue.DeclareOk)
    yield name
    admin.rpc(1, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)
    admin.close()


def _depth(broker_url: str, name: str) -> int:
    conn = RawConnection.open(broker_url)
    try:
        conn.open_channel(1)
        return conn.rpc(1, commands.Queue.Declare(queue=name, passive=True),
                        commands.Queue.DeclareOk).message_count
    finally:
        conn.close()


def _confirming(broker_url: str) -> RawConnection:
    conn = RawConnection.open(broker_url)
    conn.open_channel(1)
    conn.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    return conn


# ---- frames read together with a bad one --------------------------------------------

def test_decoder_hands_over_the_events_before_a_bad_frame() -> None:
    """Sans-IO: the FrameError carries what was decoded ahead of the bad frame, once."""
    dec = Decoder(expect_header=False)
    bad = raw_frame(1, 1, b"\x00\x3c\x00\x0a", end=0)
    with pytest.raises(FrameError) as info:
        dec.feed(_publish(1, "q", b"a") + _publish(1, "q", b"b") + bad)
    assert info.value.reply_code == 501
    assert [(e.routing_key, e.body) for e in info.value.events
            if isinstance(e, Publish)] == [("q", b"a"), ("q", b"b")]
    with pytest.raises(FrameError) as again:  # dead: same error, nothing handed over twice
        dec.feed(_publish(1, "q", b"c"))
    assert again.value.events == []


def test_P4_publishes_before_a_bad_frame_are_queued_and_confirmed(
        broker_url: str, queue: str, is_rabbitmq: bool) -> None:
    """Two confirmed publishes and a bad frame-end octet in one write: both are queued (and
    confirmed, before the 501 close), as RabbitMQ handles every frame ahead of the bad one."""
    conn = _confirming(broker_url)
    try:
        conn.send_raw(_publish(1, queue, b"1") + _publish(1, queue, b"2")
                      + raw_frame(1, 1, b"\x00\x3c\x00\x0a", end=0))
        frames, close = _until_close(conn)
    finally:
        conn.abort()
    assert close.reply_code == 501
    assert "invalid_frame_end_marker" in close.reply_text
    assert _depth(broker_url, queue) == 2
    # RabbitMQ's channel races its reader here: its acks may come after the close (or
    # never reach the socket). ackmq answers what it handled before saying goodbye.
    if not is_rabbitmq:
        assert _confirmed(frames) == {1, 2}


def test_P4_confirms_are_sent_before_a_connection_error(broker_url: str, queue: str) -> None:
    """Two confirmed publishes, then a method on a channel never opened: RabbitMQ acks both
    (basic.ack) and only then closes the connection with 504."""
    conn = _confirming(broker_url)
    try:
        conn.send_raw(_publish(1, queue, b"1") + _publish(1, queue, b"2")
                      + method_frame(3, commands.Basic.Qos(0, 1)))
        frames, close = _until_close(conn)
    finally:
        conn.abort()
    assert close.reply_code == 504
    assert (close.class_id, close.method_id) == (60, 10)
    assert _confirmed(frames) == {1, 2}
    assert _depth(broker_url, queue) == 2


# ---- methods only a server sends --------------------------------------------------------

SERVER_ONLY = [
    commands.Queue.DeclareOk(queue="x", message_count=0, consumer_count=0),
    commands.Exchange.DeclareOk(),
    commands.Basic.ConsumeOk(consumer_tag="x"),
    commands.Basic.CancelOk(consumer_tag="x"),
    commands.Basic.GetEmpty(),
    commands.Basic.QosOk(),
    commands.Confirm.SelectOk(),
    commands.Tx.CommitOk(),
    commands.Channel.FlowOk(active=True),
    commands.Channel.OpenOk(),
    commands.Channel.CloseOk(),      # on an open channel: nothing asked for it
    commands.Connection.Tune(),      # a connection method off channel 0
]
CONTENT_FROM_SERVER = [
    commands.Basic.Deliver(consumer_tag="x", delivery_tag=1, exchange="", routing_key="q"),
    commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="q"),
    commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key="q", message_count=0),
]


def _unimplemented(close: commands.Connection.Close, method: object) -> None:
    assert (close.reply_code, close.reply_text) == (503, "COMMAND_INVALID - unimplemented method")
    assert (close.class_id, close.method_id) == divmod(method.index, 0x10000)


@pytest.mark.parametrize("method", SERVER_ONLY, ids=[m.name for m in SERVER_ONLY])
def test_server_only_method_from_client_is_503(broker_url: str, method: object) -> None:
    with RawConnection.open(broker_url) as conn:
        conn.open_channel(1)
        conn.send(1, method)
        _, close = _until_close(conn)
        _unimplemented(close, method)


@pytest.mark.parametrize("method", CONTENT_FROM_SERVER, ids=[m.name for m in CONTENT_FROM_SERVER])
def test_server_content_method_from_client_is_503(broker_url: str, method: object) -> None:
    """basic.deliver / return / get-ok with their content: not swallowed, a 503 close; the
    basic.qos behind it is never answered."""
    with RawConnection.open(broker_url) as conn:
        conn.open_channel(1)
        conn.send_raw(method_frame(1, method) + header_frame(1, 3) + body_frame(1, b"abc")
                      + method_frame(1, commands.Basic.Qos(0, 1)))
        frames, close = _until_close(conn)
        _unimplemented(close, method)
        assert frames == []


def test_server_content_method_on_unopened_channel_is_504(broker_url: str) -> None:
    method = CONTENT_FROM_SERVER[0]
    with RawConnection.open(broker_url) as conn:
        conn.send_raw(method_frame(7, method) + header_frame(7, 1) + body_frame(7, b"a"))
        _, close = _until_close(conn)
        assert close.reply_code == 504
        assert (close.class_id, close.method_id) == (60, 60)


# ---- tune-ok outside what connection.tune proposed ------------------------------------

def _tuned(url: str, channel_max: int | str | None, frame_max: int | str | None
           ) -> RawConnection:
    """start / start-ok / tune, then tune-ok and connection.open in one write. A value is
    None for the server's proposal, "+1" for one above it, or a number."""
    conn = RawConnection.connect(url)
    conn.start()
    conn.send(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                             response="\0guest\0guest", locale="en_US"))
    tune = conn.expect(commands.Connection.Tune)

    def value(v: int | str | None, proposed: int) -> int:
        return proposed if v is None else proposed + 1 if v == "+1" else int(v)

    conn.send_raw(method_frame(0, commands.Connection.TuneOk(
                      value(channel_max, tune.channel_max), value(frame_max, tune.frame_max), 0))
                  + method_frame(0, commands.Connection.Open(virtual_host="/")))
    return conn


# (channel_max, frame_max) given relative to the proposal: "+1" is one above it
BAD_TUNE_OK = {
    "channel_max 0 (no limit)": (0, None),
    "channel_max above": ("+1", None),
    "frame_max 0 (no limit)": (None, 0),
    "frame_max above": (None, "+1"),
    "frame_max below 4096": (None, 4095),
}
BAD_TUNE_OK_REASON = {
    "channel_max 0 (no limit)": "negotiated channel_max = 0 (no limit) is higher than the "
                                "maximum allowed value (2047)",
    "channel_max above": "negotiated channel_max = 2048 is higher than the maximum allowed "
                         "value (2047)",
    "frame_max 0 (no limit)": "negotiated frame_max = 0 is higher than the maximum allowed "
                              "value (131072)",
    "frame_max above": "negotiated frame_max = 131073 is higher than the maximum allowed "
                       "value (131072)",
    "frame_max below 4096": "negotiated frame_max = 4095 is lower than the minimum allowed "
                            "value (4096)",
}


def _tune_ok_outside_limits(url: str) -> dict[str, list[object]]:
    """Every bad case at once (each costs the broker's silent-close delay): what each
    connection received before EOF."""
    conns = {name: _tuned(url, cm, fm) for name, (cm, fm) in BAD_TUNE_OK.items()}
    seen: dict[str, list[object]] = {}
    try:
        for name, conn in conns.items():
            got: list[object] = []
            try:
                while True:
                    got.append(conn.recv(10)[1])
            except ConnectionClosedByPeer:
                got.append("EOF")
            except TimeoutError:
                got.append("still open after 10 s")
            seen[name] = got
    finally:
        for conn in conns.values():
            conn.abort()
    return seen


def test_tune_ok_outside_the_proposal_is_refused_silently(broker_url: str) -> None:
    """tune-ok may lower the proposed channel_max / frame_max, not raise them or ask for no
    limit, and frame_max may not go below 4096. RabbitMQ sends no connection.close (the
    client is not trusted yet): it waits 3 s and drops the socket, open-ok never comes."""
    seen = _tune_ok_outside_limits(broker_url)
    assert seen == {name: ["EOF"] for name in BAD_TUNE_OK}


def test_tune_ok_reasons_are_logged_as_rabbitmq(own_broker: BrokerProcess) -> None:
    """ackmq only: the reason goes to the log, in RabbitMQ's words."""
    _tune_ok_outside_limits(own_broker.url)
    log = "".join(own_broker.log)
    for name, reason in BAD_TUNE_OK_REASON.items():
        assert f"failed to negotiate connection parameters: {reason}" in log, name


@pytest.mark.parametrize(("channel_max", "frame_max"), [(1, 4096), (None, None)])
def test_tune_ok_within_the_proposal_opens(broker_url: str, channel_max: int | None,
                                           frame_max: int | None) -> None:
    conn = _tuned(broker_url, channel_max, frame_max)
    try:
        conn.expect(commands.Connection.OpenOk)
    finally:
        conn.close()


# ---- a client that stops reading ----------------------------------------------------------

@pytest.fixture
def broker_and_pid(request: pytest.FixtureRequest, broker_url: str
                   ) -> tuple[str, int | None]:
    """ackmq: this module's own broker and its pid (to watch its memory); with
    ACKMQ_TEST_URL, that broker and no pid."""
    if os.environ.get("ACKMQ_TEST_URL"):
        return broker_url, None
    broker: BrokerProcess = request.getfixturevalue("own_broker")
    assert broker.proc is not None
    return broker.url, broker.proc.pid


class _Rss:
    """Peak resident memory of a process, sampled every 50 ms in a thread."""

    def __init__(self, pid: int | None) -> None:
        self.proc = psutil.Process(pid) if pid else None
        self.base = self.peak = self._now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _now(self) -> int:
        return self.proc.memory_info().rss if self.proc else 0

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._now())

    def stop(self) -> int:
        """Growth of the peak over the start, in MiB."""
        self._stop.set()
        self._thread.join()
        return (self.peak - self.base) >> 20


def _flood_without_reading(url: str, count: int, size: int, heartbeat: int = 0,
                           stall: float = 1.5, quiet: float = 1.5,
                           while_held: Callable[[], None] | None = None
                           ) -> tuple[RawConnection, list[int], bool]:
    """Publish `count` mandatory, unroutable `size`-byte messages from a thread without
    reading a thing, until the broker stops taking them (no progress for `stall` s) or all
    are sent; stay deaf `quiet` s more and run `while_held`. Then read every basic.return
    (with `heartbeat`, the sender sends heartbeats once its publishes are out). Returns the connection, the sequence numbers
    of the returns in arrival order, and whether the sender was held back."""
    conn = RawConnection.open(url, heartbeat=heartbeat)
    conn.open_channel(1)
    out = conn.sock.dup()  # its own timeout; the reader's settimeout must not touch it
    out.settimeout(120)
    progress = [0, time.monotonic()]
    errors: list[BaseException] = []
    done = threading.Event()
    pad = b"r" * (size - 4)

    def send() -> None:
        try:
            for first in range(0, count, 10):
                out.sendall(b"".join(
                    _publish(1, "no-such-queue.edges", struct.pack(">I", i) + pad, True)
                    for i in range(first, min(first + 10, count))))
                progress[:] = [min(first + 10, count), time.monotonic()]
            while heartbeat and not done.wait(heartbeat / 4):
                out.sendall(raw_frame(8, 0, b""))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    while progress[0] < count and time.monotonic() - progress[1] < stall:
        time.sleep(0.05)
    held_back = progress[0] < count
    time.sleep(quiet)  # go on reading nothing a while (memory, heartbeats)
    if while_held is not None:
        while_held()
    seqs: list[int] = []
    try:
        while len(seqs) < count:
            _, msg = conn.recv(30)
            assert isinstance(msg, Message), f"expected basic.return, got {msg!r}"
            assert isinstance(msg.method, commands.Basic.Return)
            assert msg.method.reply_code == 312 and len(msg.body) == size
            seqs.append(struct.unpack(">I", msg.body[:4])[0])
    finally:
        done.set()
        sender.join(30)
        out.close()
    assert not errors, errors
    return conn, seqs, held_back


def test_client_not_reading_is_held_back_not_buffered(
        broker_and_pid: tuple[str, int | None], is_rabbitmq: bool) -> None:
    """6000 x 20 KB mandatory unroutable publishes (120 MB of basic.return) from a client
    that reads nothing. Another connection is served meanwhile; then the client reads
    every return, in order (both as RabbitMQ). ackmq goes further: once its replies back
    up it stops reading that client (whose sends then block in TCP) instead of holding
    120 MB of returns; RabbitMQ 3.10 buffers them until its memory alarm."""
    url, pid = broker_and_pid
    rss = _Rss(pid)
    count = 6000

    def others_are_served() -> None:
        with _confirming(url) as other:
            q = other.rpc(1, commands.Queue.Declare(queue="", exclusive=True),
                          commands.Queue.DeclareOk).queue
            other.publish(1, "", q, b"meanwhile")
            other.expect(commands.Basic.Ack, channel=1)
            other.send(1, commands.Basic.Get(queue=q, no_ack=True))
            assert other.expect(commands.Basic.GetOk, channel=1).body == b"meanwhile"

    conn, seqs, held_back = _flood_without_reading(url, count, 20_000,
                                                   while_held=others_are_served)
    growth = rss.stop()
    try:
        assert seqs == list(range(count))
        if pid is not None:
            assert growth < 50, f"broker memory grew {growth} MiB for 120 MB of returns"
        if not is_rabbitmq:
            assert held_back, "the broker read every publish of a client that reads nothing"
        conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)  # still in business
    finally:
        conn.close()


def test_H1_client_held_back_is_not_taken_for_dead(broker_url: str) -> None:
    """heartbeat=1 and a client that reads nothing for 4 s (its later frames, heartbeats
    included, stuck behind the publishes the broker no longer reads): the silence is the
    broker's doing, so it must not close the connection for missed heartbeats."""
    # stall 0.4 s: while held back, ackmq lets one read through per heartbeat tick (0.5 s,
    # to see that the peer lives), so the sender still inches forward between ticks
    conn, seqs, _ = _flood_without_reading(broker_url, 2000, 20_000, heartbeat=1, stall=0.4,
                                           quiet=4.0)
    try:
        assert seqs == list(range(2000))
        conn.rpc(1, commands.Basic.Qos(0, 1), commands.Basic.QosOk)
    finally:
        conn.close()


def test_H1_D8_hung_consumer_behind_a_full_socket_is_dead_and_its_deliveries_come_back(
        broker_url: str) -> None:
    """A consumer process that hangs (reads nothing, sends nothing; its kernel still ACKs,
    so TCP never fails) while 30 MB of deliveries are on their way: the broker's output
    to it backs up and ackmq stops reading it, but it must still see the silence (two
    heartbeat intervals), close the connection and give every delivery back (D8), as
    RabbitMQ does."""
    queue, n = f"edges.hung.{os.getpid()}", 1500
    filler = _fill(broker_url, queue, n, 20_000)
    hung = RawConnection.open(broker_url, heartbeat=1)
    hung.open_channel(1)
    hung.rpc(1, commands.Basic.Consume(queue=queue), commands.Basic.ConsumeOk)
    try:  # from here on `hung` neither reads nor sends
        deadline = time.monotonic() + 20
        while True:
            ok = filler.rpc(1, commands.Queue.Declare(queue=queue, passive=True),
                            commands.Queue.DeclareOk)
            if ok.consumer_count == 0 and ok.message_count == n:
                break
            assert time.monotonic() < deadline, (
                f"hung consumer still attached after 20 s: {ok.consumer_count} consumers, "
                f"{ok.message_count} of {n} ready")
            time.sleep(0.25)
        filler.rpc(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    finally:
        hung.sock.close()
        filler.close()


def _fill(url: str, queue: str, n: int, size: int) -> RawConnection:
    """A connection that declared `queue` and waited until it holds n messages."""
    filler = RawConnection.open(url)
    filler.open_channel(1)
    filler.rpc(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    body = b"h" * size
    for _ in range(n):
        filler.publish(1, "", queue, body)
    deadline = time.monotonic() + 20  # RabbitMQ's queue may count them a moment later
    while filler.rpc(1, commands.Queue.Declare(queue=queue, passive=True),
                     commands.Queue.DeclareOk).message_count < n:
        assert time.monotonic() < deadline, "the queue never held every message"
        time.sleep(0.05)
    return filler


def test_closed_connection_whose_peer_reads_nothing_is_cut_off(
        own_broker: BrokerProcess) -> None:
    """A consumer that stops reading with 30 MB of deliveries on their way, then sends a
    bad frame: the broker sees it (one read per heartbeat tick), sends connection.close
    and closes, but the peer reads none of its output. The socket must not stay open
    waiting for that output to drain: cut off after two heartbeat intervals."""
    assert own_broker.proc is not None
    broker = psutil.Process(own_broker.proc.pid)
    queue = f"edges.deaf.{os.getpid()}"
    filler = _fill(own_broker.url, queue, 1500, 20_000)
    deaf = RawConnection.open(own_broker.url, heartbeat=1)
    deaf.open_channel(1)
    deaf.rpc(1, commands.Basic.Consume(queue=queue, no_ack=True), commands.Basic.ConsumeOk)
    port = deaf.sock.getsockname()[1]

    def held_by_broker() -> bool:
        return any(c.raddr and c.raddr.port == port for c in broker.net_connections("tcp"))

    try:
        time.sleep(1.0)  # the deliveries back up
        deaf.sock.sendall(raw_frame(1, 1, b"\x00\x3c\x00\x0a", end=0))  # 501, then deaf
        deadline = time.monotonic() + 15
        while held_by_broker():
            assert time.monotonic() < deadline, "the broker still holds the deaf socket"
            time.sleep(0.2)
    finally:
        deaf.sock.close()
        filler.rpc(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        filler.close()


# ---- bound to all interfaces ----------------------------------------------------------------

def _local_address(family: socket.AddressFamily) -> str | None:
    """A non-loopback address of this machine in that family, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family != family or "%" in a.address:  # link-local v6 needs a scope
                continue
            try:
                ip = ipaddress.ip_address(a.address)
            except ValueError:
                continue
            if not (ip.is_loopback or ip.is_link_local):
                return a.address
    return None


@pytest.fixture(scope="module")
def wildcard_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """An ackmq bound to 0.0.0.0."""
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("needs an ackmq of its own bound to all interfaces")
    broker = BrokerProcess(tmp_path_factory.mktemp("wildcard"), "--no-persistence",
                           "--host", "0.0.0.0")
    broker.start()
    yield broker
    broker.stop()


def test_all_interfaces_logs_a_url_a_client_can_use(wildcard_broker: BrokerProcess) -> None:
    """--host 0.0.0.0: the URL logged is loopback's (0.0.0.0 is no place to connect to),
    and the log says the broker listens on all interfaces."""
    assert wildcard_broker.url == f"amqp://guest:guest@127.0.0.1:{wildcard_broker.port}/"
    line = next(x for x in wildcard_broker.log if "listening on" in x)
    assert f"all interfaces: 0.0.0.0:{wildcard_broker.port}" in line
    with RawConnection.open(wildcard_broker.url) as conn:
        conn.open_channel(1)


def test_all_interfaces_ipv6_logs_a_url_a_client_can_use(tmp_path: Path) -> None:
    if os.environ.get("ACKMQ_TEST_URL"):
        pytest.skip("needs an ackmq of its own bound to all interfaces")
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError as e:
        pytest.skip(f"no IPv6 loopback on this machine: {e}")
    broker = BrokerProcess(tmp_path, "--no-persistence", "--host", "::")
    broker.start()
    try:
        assert broker.url == f"amqp://guest:guest@[::1]:{broker.port}/"
        line = next(x for x in broker.log if "listening on" in x)
        assert f"all interfaces: [::]:{broker.port}" in line
        conn = RawConnection(socket.create_connection(("::1", broker.port), timeout=5),
                             broker.url)
        with conn:
            conn.handshake()
            conn.open_channel(1)
    finally:
        broker.stop()


def test_guest_from_a_non_loopback_address_is_refused(wildcard_broker: BrokerProcess) -> None:
    """guest/guest is right, but from another address than loopback RabbitMQ refuses it:
    403 "ACCESS_REFUSED - PLAIN login refused: user 'guest' can only connect via localhost"
    (with authentication_failure_close; no tune, no open)."""
    address = _local_address(socket.AF_INET)
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    sock = socket.create_connection((address, wildcard_broker.port), timeout=5)
    conn = RawConnection(sock, wildcard_broker.url)
    with conn:
        assert not ipaddress.ip_address(sock.getsockname()[0]).is_loopback
        conn.start()
        conn.send(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        close = conn.wait_close()
        assert isinstance(close, commands.Connection.Close), close
        assert close.reply_code == 403
        assert close.reply_text == ("ACCESS_REFUSED - PLAIN login refused: user 'guest' can "
                                    "only connect via localhost")
        assert conn.wait_eof(5)
