"""U6: per-vhost max-connections/max-queues and per-user max-connections/max-channels,
set with `ackmq ctl set_vhost_limits/set_user_limits` (rabbitmqctl's verbs) on a real
broker and answered as RabbitMQ 3.10 answers them (the same scenario run there with rabbitmqctl)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.mgmthelp import Target as Api
from support.mgmthelp import q, rabbit_http
from support.stomphelp import RABBITMQ_STOMP
from test_access import PW, connect_error, params

VHOST, USER = "ackU_limits", "ackU_limuser"


def actl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=60)


def rctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)


def rabbit_forget(user: str, vhost: str) -> None:
    """Delete a scenario's user and vhost on RabbitMQ, through its management API (not
    part of what is compared; a rabbitmqctl call costs an Erlang VM start)."""
    api = Api("rabbitmq", rabbit_http(), rabbitmq_url())
    api.call("DELETE", f"/api/users/{q(user)}")
    api.call("DELETE", f"/api/vhosts/{q(vhost)}")


def scenario(port: int, ctl: Callable[..., subprocess.CompletedProcess[str]]) -> list[object]:
    """Everything a client and an operator see, as a list to compare between brokers."""
    seen: list[object] = []
    for args in (("add_user", USER, PW), ("add_vhost", VHOST),
                 ("set_permissions", "-p", VHOST, USER, ".*", ".*", ".*")):
        assert ctl(*args).returncode == 0
    r = ctl("set_vhost_limits", "-p", VHOST, '{"max-connections": 1, "max-queues": 1}')
    seen.append(("set_vhost_limits", r.returncode))
    seen.append(ctl("-q", "list_vhost_limits", "-p", VHOST).stdout.strip())
    first = pika.BlockingConnection(params(port, USER, PW, VHOST))
    seen.append(("second connection", connect_error(params(port, USER, PW, VHOST))))
    ch = first.channel()
    ch.queue_declare("lq1")
    ch.queue_declare("lq1")  # an existing queue is no new queue
    try:
        ch.queue_declare("lq2")
        seen.append("lq2 declared")
    except pika.exceptions.ChannelClosedByBroker as e:
        seen.append((e.reply_code, e.reply_text))
    ctl("set_vhost_limits", "-p", VHOST, '{"max-connections": -1}')  # negative: no limit
    seen.append(("unlimited again", connect_error(params(port, USER, PW, VHOST))))
    ch = first.channel()
    ch.queue_declare("lq2")  # set_vhost_limits replaced max-queues too
    seen.append("lq2 declared after replace")
    ctl("set_user_limits", USER, '{"max-connections": 1}')
    seen.append(("user limit", connect_error(params(port, USER, PW, VHOST))))
    seen.append(ctl("-q", "list_user_limits", "--user", USER).stdout.strip())
    ctl("set_user_limits", USER, '{"max-connections": 0}')
    first.close()
    seen.append(("user limit 0", connect_error(params(port, USER, PW, VHOST))))
    ctl("clear_user_limits", USER, "all")
    seen.append(("cleared", connect_error(params(port, USER, PW, VHOST))))
    ctl("set_user_limits", USER, '{"max-channels": 2}')
    one, two = (pika.BlockingConnection(params(port, USER, PW, VHOST)) for _ in range(2))
    one.channel()
    two.channel()
    try:
        two.channel()
        seen.append("third channel opened")
    except pika.exceptions.ConnectionClosedByBroker as e:
        seen.append(("max-channels", e.reply_code, e.reply_text, one.is_open))
    one.close()
    ctl("clear_user_limits", USER, "max-channels")
    for bad in ('{"max-conn": 1}', '{"max-queues": "x"}', "notjson"):
        r = ctl("set_vhost_limits", "-p", VHOST, bad)
        seen.append((bad, r.returncode))
        assert "Traceback" not in r.stderr
    seen.append(("missing vhost", ctl("set_vhost_limits", "-p", "ackU_none",
                                      '{"max-queues": 1}').returncode))
    return seen


@pytest.fixture
def ackmq_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    b.stop()


def test_U6_limits_on_ackmq(ackmq_broker: BrokerProcess) -> None:
    seen = scenario(ackmq_broker.port, lambda *a: actl(ackmq_broker.data_dir, *a))
    assert seen == [
        ("set_vhost_limits", 0),
        '{"max-connections":1,"max-queues":1}',
        ("second connection", (530, f"NOT_ALLOWED - access to vhost '{VHOST}' refused for "
                                     f"user '{USER}': connection limit (1) is reached")),
        (406, f"PRECONDITION_FAILED - cannot declare queue 'lq2': queue limit in vhost "
              f"'{VHOST}' (1) is reached"),
        ("unlimited again", None),
        "lq2 declared after replace",
        ("user limit", (530, f"NOT_ALLOWED - connection refused for user '{USER}': user "
                             "connection limit (1) is reached")),
        '{"max-connections":1}',
        ("user limit 0", (530, f"NOT_ALLOWED - connection refused for user '{USER}': user "
                               "connection limit (0) is reached")),
        ("cleared", None),
        ("max-channels", 530, f"NOT_ALLOWED - number of channels opened for user '{USER}' "
                              "has reached the maximum allowed user limit of (2)", True),
        ('{"max-conn": 1}', 69), ('{"max-queues": "x"}', 69), ("notjson", 69),
        ("missing vhost", 65),
    ]


def test_U6_limits_survive_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = BrokerProcess(data)
    b.start()
    try:
        assert actl(data, "set_vhost_limits", '{"max-connections": 0}').returncode == 0
    finally:
        b.stop()
    b2 = BrokerProcess(data)
    b2.start()
    try:
        assert connect_error(params(b2.port, "guest", "guest")) == (
            530, "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection "
                 "limit (0) is reached")
        assert actl(data, "clear_vhost_limits").returncode == 0
        assert connect_error(params(b2.port, "guest", "guest")) is None
    finally:
        b2.stop()


def test_U6_limits_same_as_rabbitmq(ackmq_broker: BrokerProcess) -> None:
    url = rabbitmq_url()
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not on PATH: needed to set RabbitMQ's limits")
    rabbit_forget(USER, VHOST)
    try:
        theirs = scenario(pika.URLParameters(url).port, rctl)
    finally:
        rabbit_forget(USER, VHOST)
    mine = scenario(ackmq_broker.port, lambda *a: actl(ackmq_broker.data_dir, *a))
    assert mine == theirs


# ------------------------------------------------------------------ STOMP at CONNECT

SVHOST, SUSER = "ackU_slimits", "ackU_slimuser"


def stomp_connect(port: int, login: str, host: str) -> tuple[socket.socket, str]:
    """A raw STOMP 1.2 CONNECT; the answer's command and body (ERROR) or command."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"CONNECT\naccept-version:1.2\nhost:{host}\nlogin:{login}\npasscode:{PW}"
              "\n\n\0".encode())
    data = b""
    while b"\0" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\n\n")
    command = head.split(b"\n", 1)[0].decode()
    message = next((line[8:].decode() for line in head.split(b"\n")
                    if line.startswith(b"message:")), "")
    return s, f"{command} {message} {body.split(bytes(1))[0].decode()}".strip()


def stomp_scenario(port: int, ctl: Callable[..., subprocess.CompletedProcess[str]]
                   ) -> list[str]:
    """U6 on STOMP: the vhost's and the user's max-connections refuse a CONNECT."""
    for args in (("add_user", SUSER, PW), ("add_vhost", SVHOST),
                 ("set_permissions", "-p", SVHOST, SUSER, ".*", ".*", ".*"),
                 ("set_permissions", "-p", "/", SUSER, ".*", ".*", ".*"),
                 ("set_vhost_limits", "-p", SVHOST, '{"max-connections": 1}')):
        assert ctl(*args).returncode == 0
    seen, held = [], []
    for host in (SVHOST, SVHOST):  # the second is past the vhost's limit
        s, answer = stomp_connect(port, SUSER, host)
        held.append(s)
        seen.append(answer)
    assert ctl("set_user_limits", SUSER, '{"max-connections": 1}').returncode == 0
    s, answer = stomp_connect(port, SUSER, "/")  # one open already (in SVHOST)
    held.append(s)
    seen.append(answer)
    for s in held:
        s.close()
    return seen


def test_U6_stomp_connect_refused_past_the_connection_limits(
        ackmq_broker: BrokerProcess) -> None:
    seen = stomp_scenario(ackmq_broker.stomp_port, lambda *a: actl(ackmq_broker.data_dir, *a))
    assert seen == ["CONNECTED",
                    f"ERROR Bad CONNECT Virtual host '{SVHOST}' access denied",
                    "ERROR Bad CONNECT Virtual host '/' access denied"]


def test_U6_stomp_connection_limits_same_as_rabbitmq(ackmq_broker: BrokerProcess) -> None:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not on PATH: needed to set RabbitMQ's limits")
    rabbit_forget(SUSER, SVHOST)
    try:
        theirs = stomp_scenario(RABBITMQ_STOMP[1], rctl)
    finally:
        rabbit_forget(SUSER, SVHOST)
    mine = stomp_scenario(ackmq_broker.stomp_port, lambda *a: actl(ackmq_broker.data_dir, *a))
    assert mine == theirs
