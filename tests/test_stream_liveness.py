"""A stream-protocol connection's life (SPEC C3), from the connection life shared by
every protocol (server/transport.py): heartbeats as negotiated in tune, a silent peer
dropped, a half-open handshake dropped after --handshake-timeout. Heartbeats are compared
with RabbitMQ 3.10's stream plugin (127.0.0.1:5552): it sends its Heartbeat after one
interval of quiet and drops a peer silent for two to three intervals; ackmq sends one
after half an interval and drops the peer after two (docs/stream-protocol.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from conftest import BrokerProcess, rabbitmq_url
from rstream import AMQPMessage, schema
from support.net import need
from support.streamraw import StreamPeer

HANDSHAKE_TIMEOUT = 1.0  # --handshake-timeout of this module's broker
RABBIT_STREAM_PORT = 5552

pytestmark = pytest.mark.skipif(bool(os.environ.get("ACKMQ_TEST_URL")),
                                reason="needs a broker of its own (its options)")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("stream-life"), "--no-stomp",
                      "--handshake-timeout", str(HANDSHAKE_TIMEOUT))
    b.start()
    assert b.stream_port, "no rabbitmq-stream:// URL in the broker's log line"
    yield b
    b.stop()
    assert not any("Traceback" in line for line in b.log)


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def port(request: pytest.FixtureRequest) -> int:
    if request.param == "rabbitmq":
        rabbitmq_url()  # a skip saying why when the reference broker is not there
        need(("127.0.0.1", RABBIT_STREAM_PORT), "RabbitMQ's stream plugin")
        return RABBIT_STREAM_PORT
    b: BrokerProcess = request.getfixturevalue("broker")
    return b.stream_port


def _until_closed(peer: StreamPeer, limit: float) -> tuple[float, list[object]]:
    """Read (and never answer) until the broker closes the socket: the seconds that took
    and the frames read meanwhile."""
    t0 = time.monotonic()
    frames: list[object] = []
    peer.sock.settimeout(limit)
    try:
        while True:
            frames.append(peer.read())
    except (EOFError, ConnectionResetError):
        return time.monotonic() - t0, frames
    except TimeoutError:
        pytest.fail(f"still open after {limit} s of silence; read {frames}")


def test_C3_stream_silent_peer_gets_heartbeats_then_is_dropped(port: int) -> None:
    """Tune with a 1 s heartbeat, then silence: the broker sends Heartbeat commands and
    closes the socket once two intervals have passed without a word from the peer (no
    Close command: as RabbitMQ, a dead peer is not written to)."""
    peer = StreamPeer(port)
    try:
        assert peer.login(heartbeat=1) == 1
        took, frames = _until_closed(peer, 20.0)
    finally:
        peer.close()
    assert frames and all(isinstance(f, schema.Heartbeat) for f in frames), frames
    assert took >= 1.5, took  # not before two intervals of silence (less the tick)


def test_C3_stream_peer_sending_heartbeats_stays_open(port: int) -> None:
    """The same 1 s heartbeat, the peer sending its own every 0.3 s: after four
    intervals the connection still answers a call."""
    peer = StreamPeer(port)
    try:
        assert peer.login(heartbeat=1) == 1
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            peer.send(schema.Heartbeat())
            time.sleep(0.3)
        r = peer.call(schema.Metadata(peer.next_corr(), streams=["c3-none"]),
                      schema.MetadataResponse)
        assert r.metadata[0].response_code == 2  # stream does not exist: still served
    finally:
        peer.close()


def test_C3_stream_handshake_timeout_drops_half_open(broker: BrokerProcess) -> None:
    """A connection that stops mid-handshake (peer properties exchanged, no SASL) and
    one that sends nothing are closed once --handshake-timeout has passed, not before;
    an open connection is not (RabbitMQ's handshake_timeout, 10 s by default)."""
    opened = StreamPeer(broker.stream_port)
    t0 = time.monotonic()
    mid = StreamPeer(broker.stream_port)
    bare = StreamPeer(broker.stream_port)
    try:
        assert opened.login() == 1
        mid.call(schema.PeerProperties(mid.next_corr(), properties=[]),
                 schema.PeerPropertiesResponse)
        for p in (mid, bare):
            _, frames = _until_closed(p, HANDSHAKE_TIMEOUT + 10)
            assert frames == [], frames
        assert time.monotonic() - t0 >= HANDSHAKE_TIMEOUT * 0.9
        time.sleep(HANDSHAKE_TIMEOUT)
        r = opened.call(schema.Metadata(opened.next_corr(), streams=["c3-none"]),
                        schema.MetadataResponse)
        assert r.metadata[0].response_code == 2
    finally:
        for p in (opened, mid, bare):
            p.close()


def _ctl(b: BrokerProcess, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(b.data_dir),
                        *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_C3_U5_stream_publisher_blocked_by_an_alarm_alive_and_confirmed_after(
        broker: BrokerProcess) -> None:
    """A Publish during a memory alarm: the connection is not read (no PublishConfirm,
    its Heartbeats unread; ours still go out) and, with a 1 s heartbeat, is not dropped for the silence
    that causes (the silence is the broker's); once the alarm clears the publish is
    confirmed. ackmq only: the alarm would block RabbitMQ's other users."""
    stream = f"c3-alarm-{uuid.uuid4().hex[:8]}"
    peer = StreamPeer(broker.stream_port)
    try:
        assert peer.login(heartbeat=1) == 1
        assert peer.call(schema.Create(peer.next_corr(), stream=stream, arguments=[]),
                         schema.CreateResponse).response_code == 1
        assert peer.call(schema.DeclarePublisher(peer.next_corr(), publisher_id=1,
                                                 reference="", stream=stream),
                         schema.DeclarePublisherResponse).response_code == 1
        # our Heartbeats go on while ctl sets the alarm and the monitor sees it (ctl's
        # start alone may take longer than two 1 s heartbeats on a loaded machine)
        beating = threading.Event()

        def beat() -> None:
            while not beating.wait(0.3):
                peer.send(schema.Heartbeat())

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        _ctl(broker, "set_vm_memory_high_watermark", "0.0000001")
        try:
            time.sleep(1.5)  # the monitor sees the new watermark
            beating.set()
            beater.join()
            peer.send(schema.Publish(publisher_id=1, messages=[schema.Message(
                publishing_id=1, filter_value=None, data=bytes(AMQPMessage(body=b"a")))]))
            seen: list[object] = []
            end = time.monotonic() + 4.0  # four heartbeat intervals, all of it silent
            while (left := end - time.monotonic()) > 0:
                peer.sock.settimeout(left)
                try:
                    seen.append(peer.read())
                except TimeoutError:
                    break
            assert seen and all(isinstance(f, schema.Heartbeat) for f in seen), seen
        finally:
            _ctl(broker, "set_vm_memory_high_watermark", "0.4")
        peer.sock.settimeout(20.0)
        confirm = peer.wait(schema.PublishConfirm)
        assert list(confirm.publishing_ids) == [1]
        peer.send(schema.Heartbeat())
        assert peer.call(schema.Delete(peer.next_corr(), stream=stream),
                         schema.DeleteResponse).response_code == 1
    finally:
        peer.close()
