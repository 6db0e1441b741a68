"""W9: bad input is answered by an ERROR frame whose `message` names the problem, then
the connection closes; other connections go on and nothing receipted is lost.

Frame-level problems (unknown command, missing header) are checked against RabbitMQ
too; RabbitMQ answers them with the same ERROR but keeps the connection open (see
docs/stomp.md). Broken framing (bad escape, no NUL, limits) RabbitMQ answers by
dropping the socket without an ERROR, so those run against ackmq only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess
from support.stomphelp import Raw, Target

MAX_MESSAGE = 4096


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """An ackmq whose messages may be 4 KiB at most (so limits are cheap to reach)."""
    b = BrokerProcess(tmp_path_factory.mktemp("stomp-small"), "--max-message-size",
                      str(MAX_MESSAGE))
    b.start()
    yield b
    b.stop()
    log = "".join(b.log)
    assert "Traceback" not in log, log


def connect(b: BrokerProcess) -> Raw:
    r = Raw.open("127.0.0.1", b.stomp_port)
    r.connect(host="/")
    return r


def refused(r: Raw, data: bytes) -> tuple[str, bytes]:
    """Write `data`; the ERROR's message and body, after which the socket is closed."""
    r.write(data)
    f = r.expect("ERROR")
    assert r.closed(), "the connection stayed open after ERROR"
    return f.headers["message"], f.body


@pytest.mark.parametrize("data,message,detail", [
    (b"SEND\ndestination:/queue/x\nk:a\\tb\n\nbody\x00", "Bad escape",
     b"undefined escape sequence '\\\\t'"),
    (b"SEND\ndestination:/queue/x\ncontent-length:2\n\nbody\x00", "Bad frame",
     b"body longer than content-length 2"),
    (b"SEND\ndestination:/queue/x\ncontent-length:x1\n\nbody\x00", "Bad header",
     b"content-length is not a number"),
    (b"SEND\ndestination:/queue/x\n\n" + b"a" * 5000, "Frame too large",
     b"body over the limit of 4096 bytes (no NUL yet)"),
    (b"SEND\ndestination:/queue/x\ncontent-length:5000\n\n", "Frame too large",
     b"body of 5000 bytes is over the limit of 4096 bytes"),
    (b"SEND\nk:" + b"v" * 11000, "Frame too large", b"header line longer than 10240 bytes"),
    (b"SEND\n" + b"h:v\n" * 1001 + b"\n\x00", "Frame too large", b"more than 1000 headers"),
    (b"SEND\nheader-without-colon\n\n\x00", "Bad header", b"without a colon"),
    (b"SEND\nk:\xc3\x28\n\n\x00", "Bad encoding", b"not valid UTF-8"),
    (b"SE\rND\n\n\x00", "Bad command", b"Could not interpret command"),
])
def test_W9_broken_frames_are_an_error_then_close(small: BrokerProcess, data: bytes,
                                                  message: str, detail: bytes) -> None:
    with connect(small) as r:
        got_message, body = refused(r, data)
    assert got_message == message and detail in body, (got_message, body)


def test_W9_frames_ahead_of_the_bad_one_count(small: BrokerProcess) -> None:
    with connect(small) as r:
        r.receipt("SEND", {"destination": "/queue/w9.ahead"}, b"declare")
        refused(r, b"SEND\ndestination:/queue/w9.ahead\n\ngood\x00SEND\nno colon\n\n\x00")
    with connect(small) as r:
        r.subscribe("/queue/w9.ahead", "s")
        assert [m.body for m in r.frames(0.5)] == [b"declare", b"good"]


def test_W9_other_connections_go_on_and_receipted_messages_stay(small: BrokerProcess) -> None:
    with connect(small) as listener, connect(small) as bad:
        listener.subscribe("/queue/w9.others", "s", ack="client-individual")
        bad.receipt("SEND", {"destination": "/queue/w9.kept", "persistent": "true"}, b"kept")
        refused(bad, b"NOT-A-COMMAND\n\n\x00")
        with connect(small) as good:
            good.receipt("SEND", {"destination": "/queue/w9.others"}, b"still here")
        assert listener.expect("MESSAGE").body == b"still here"
    with connect(small) as r:
        r.subscribe("/queue/w9.kept", "k")
        assert r.expect("MESSAGE").body == b"kept"


@pytest.mark.parametrize("command,headers,message", [
    ("FROB", {}, "Bad command"),
    ("SEND", {}, "Missing destination"),
    ("SUBSCRIBE", {"id": "1"}, "Missing destination"),
    ("UNSUBSCRIBE", {}, "Missing destination or id"),
    ("UNSUBSCRIBE", {"id": "never-subscribed"}, "No subscription found"),
    ("BEGIN", {}, "Missing transaction"),
    ("ABORT", {"transaction": "none"}, "Bad transaction"),
    ("SEND", {"destination": "/queue/x", "message-id": "m"}, "Invalid header"),
    ("SUBSCRIBE", {"destination": "/topic/x", "durable": "true"}, "Missing Header"),
])
def test_W9_missing_or_bad_headers(target: Target, command: str, headers: dict[str, str],
                                   message: str) -> None:
    with target.raw() as r:
        r.send(command, headers, b"")
        f = r.expect("ERROR")
        assert f.headers["message"] == message
        assert f.body, "the ERROR explains itself in its body"
        if target.ackmq:
            assert r.closed()


def test_W9_duplicate_subscription_id_closes_on_both(target: Target, queue: str) -> None:
    with target.raw() as r:
        r.subscribe(f"/queue/{queue}", "1")
        r.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1"})
        f = r.expect("ERROR")
        assert f.headers["message"] == "Duplicated subscription identifier"
        assert b"A subscription identified by 'T_1' already exists." in f.body
        assert r.closed()


@pytest.mark.parametrize("headers,problem", [
    ({"priority": "urgent"}, b"'priority' must be an integer"),
    ({"expiration": "soon"}, b"invalid expiration"),
])
def test_W9_bad_property_headers(ackmq_target: Target, queue: str, headers: dict[str, str],
                                 problem: bytes) -> None:
    with ackmq_target.raw() as r:
        r.send("SEND", {"destination": f"/queue/{queue}", **headers}, b"x")
        f = r.expect("ERROR")
        assert problem in f.body
        assert r.closed()


def test_W9_bad_ack_mode(ackmq_target: Target, queue: str) -> None:
    with ackmq_target.raw() as r:
        r.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "sometimes"})
        f = r.expect("ERROR")
        assert f.headers["message"] == "Invalid header" and b"'ack' must be" in f.body


def test_W9_error_log_has_no_traceback(small: BrokerProcess, tmp_path: Path) -> None:
    """Every refusal above is a log line, not a traceback (checked again at teardown)."""
    with connect(small) as r:
        refused(r, b"SEND\ndestination:/queue/x\nk:\\q\n\n\x00")
    assert "Traceback" not in "".join(small.log)
