"""W1 (CONNECT, versions, login, vhost) and W2 (heart-beats) over real sockets, against
ackmq and, where the behaviour is RabbitMQ's too, against RabbitMQ's STOMP plugin."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import stomp
from conftest import BrokerProcess
from support.stomphelp import Raw, Target

import ackmq


@pytest.mark.parametrize("offered,agreed", [
    ("1.0,1.1,1.2", "1.2"), ("1.2,1.0", "1.2"), ("1.0,1.1", "1.1"), ("1.1", "1.1"),
    ("1.0", "1.0"), ("1.1,2.0", "1.1"), ("1.0,1.1,1.2,1.3", "1.2")])
def test_W1_highest_common_version_wins(target: Target, offered: str, agreed: str) -> None:
    with Raw.open(target.host, target.port) as r:
        f = r.connect(offered, host=target.vhost)
        assert f.headers["version"] == agreed


def test_W1_connect_without_accept_version_is_stomp_1_0(target: Target) -> None:
    with Raw.open(target.host, target.port) as r:
        r.send("CONNECT", {"login": "guest", "passcode": "guest", "host": target.vhost})
        assert r.expect("CONNECTED").headers["version"] == "1.0"


def test_W1_stomp_command_connects_like_connect(target: Target) -> None:
    with Raw.open(target.host, target.port) as r:
        r.send("STOMP", {"accept-version": "1.2", "host": target.vhost,
                         "login": "guest", "passcode": "guest"})
        assert r.expect("CONNECTED").headers["version"] == "1.2"


def test_W1_connected_carries_version_heart_beat_server_session(target: Target) -> None:
    with Raw.open(target.host, target.port) as r:
        f = r.connect("1.2", host=target.vhost, heart_beat="0,0")
    assert set(f.headers) >= {"version", "heart-beat", "server", "session"}
    assert f.headers["heart-beat"] == "0,0"
    product = "ackmq/" if target.ackmq else "RabbitMQ/"
    assert f.headers["server"].startswith(product)
    with Raw.open(target.host, target.port) as r2:
        assert r2.connect("1.2", host=target.vhost).headers["session"] != f.headers["session"]


def test_W1_no_common_version_is_an_error_listing_ours(target: Target) -> None:
    with Raw.open(target.host, target.port) as r:
        r.send("CONNECT", {"accept-version": "2.0,3.1", "host": target.vhost,
                           "login": "guest", "passcode": "guest"})
        f = r.expect("ERROR")
        assert f.headers["message"] == "Version mismatch"
        assert f.headers["version"] == "1.0,1.1,1.2"
        assert b"Supported versions are 1.0,1.1,1.2" in f.body
        if target.ackmq:  # the spec's "then close"; RabbitMQ waits for another CONNECT
            assert r.closed()


@pytest.mark.parametrize("login,passcode", [("guest", "wrong"), ("nobody", "guest")])
def test_W1_bad_login_is_an_error_then_close(target: Target, login: str, passcode: str) -> None:
    with Raw.open(target.host, target.port) as r:
        r.send("CONNECT", {"accept-version": "1.2", "host": target.vhost,
                           "login": login, "passcode": passcode})
        f = r.expect("ERROR")
        assert f.headers["message"] == "Bad CONNECT"
        assert f"Access refused for user '{login}'".encode() in f.body
        if target.ackmq:  # RabbitMQ leaves it open
            assert r.closed()


def test_W1_frames_before_connect_are_refused(target: Target) -> None:
    with Raw.open(target.host, target.port) as r:
        r.send("SEND", {"destination": "/queue/x"}, b"early")
        f = r.expect("ERROR")
        assert f.headers["message"] == "Illegal command"
        assert b"You must log in using CONNECT first" in f.body


def test_W1_stomp_py_connects_unchanged_with_its_default_host_header(
        ackmq_target: Target) -> None:
    """stomp.py sends host:<the host it dialled>; ActiveMQ ignores it. ackmq takes a host
    that names no vhost as the server's name and uses "/" (RabbitMQ refuses it)."""
    conn = stomp.Connection12([(ackmq_target.host, ackmq_target.port)])
    conn.connect("guest", "guest", wait=True)
    assert conn.is_connected()
    conn.disconnect()


def test_W1_login_is_checked_against_the_amqp_users(ackmq_target: Target) -> None:
    conn = stomp.Connection12([(ackmq_target.host, ackmq_target.port)])
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("guest", "not-the-password", wait=True)


# -- W2 heart-beats -----------------------------------------------------------------

@pytest.mark.parametrize("offered,answer", [
    ("0,0", "0,0"), ("1000,0", "0,1000"), ("0,2000", "2000,0"), ("1500,300", "1000,1000")])
def test_W2_heart_beat_answer_as_rabbitmq(target: Target, offered: str, answer: str) -> None:
    """The server offers to send as often as the client wants to receive and wants what
    the client offers to send, in whole seconds (RabbitMQ's rounding)."""
    with Raw.open(target.host, target.port) as r:
        assert r.connect("1.2", host=target.vhost, heart_beat=offered) \
            .headers["heart-beat"] == answer


def test_W2_server_sends_heart_beats_when_quiet(target: Target) -> None:
    with Raw.open(target.host, target.port) as r:
        r.connect("1.2", host=target.vhost, heart_beat="0,1000")
        t0 = time.monotonic()
        while r.heartbeats < 3:
            with pytest.raises(TimeoutError):
                r.recv(timeout=0.5)
            assert time.monotonic() - t0 < 5, "fewer than 3 heart-beats in 5 s"


def test_W2_silent_client_is_dead_and_its_unacked_message_goes_back(
        target: Target, queue: str) -> None:
    """A client that promised heart-beats every second and sends none is closed within
    a few seconds, and the message it held unacked is delivered again (D8)."""
    silent = target.raw(heart_beat="1000,0")
    silent.subscribe(f"/queue/{queue}", "s", ack="client")
    with target.raw() as other:
        other.receipt("SEND", {"destination": f"/queue/{queue}"}, b"held")
        assert silent.expect("MESSAGE").body == b"held"
        t0 = time.monotonic()
        assert silent.closed(timeout=6), "the silent client was not closed"
        assert time.monotonic() - t0 < 6
        other.subscribe(f"/queue/{queue}", "o", ack="client")
        again = other.expect("MESSAGE")
        assert again.body == b"held" and again.headers["redelivered"] == "true"
        other.ack(again)
        other.receipt("DISCONNECT")


def test_W2_a_client_that_heart_beats_stays_connected(target: Target) -> None:
    with target.raw(heart_beat="1000,0") as r:
        for _ in range(6):
            time.sleep(0.5)
            r.write(b"\n")
        r.receipt("DISCONNECT")  # still there after 3 s


# -- the listener -------------------------------------------------------------------

def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=30)


def test_W1_busy_stomp_port_is_a_clear_error(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = _serve("--stomp-port", str(port), "--data-dir", str(tmp_path / "d"))
    finally:
        s.close()
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port} (STOMP)" in r.stdout + r.stderr


def test_W1_no_stomp_and_stomp_url_in_the_log(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "a", "--no-stomp")
    b.start()
    b.stop()
    assert b.stomp_url == "" and "stomp://" not in "".join(b.log)
    b = BrokerProcess(tmp_path / "b")
    b.start()
    try:
        assert b.stomp_url == f"stomp://127.0.0.1:{b.stomp_port}" and b.stomp_port > 0
        with Raw.open("127.0.0.1", b.stomp_port) as r:
            r.connect()
    finally:
        b.stop()


def test_W1_embedded_broker_listens_for_stomp_on_a_free_port() -> None:
    with ackmq.EmbeddedBroker(persistent=False) as b:
        assert b.stomp_url == f"stomp://127.0.0.1:{b.stomp_port}"
        conn = stomp.Connection12([("127.0.0.1", b.stomp_port)])
        conn.connect("guest", "guest", wait=True)
        conn.disconnect()
    with ackmq.EmbeddedBroker(persistent=False, stomp_port=None) as b:
        assert b.stomp_url == ""
