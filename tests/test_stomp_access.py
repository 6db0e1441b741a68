"""U3 over STOMP: a user's permissions apply to what STOMP frames do (SEND declares and
publishes, SUBSCRIBE declares, binds and consumes), and CONNECT to a vhost without
permissions is refused; the same frames sent to RabbitMQ's STOMP plugin (users made with
its management API) give the same ERROR frames."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from support.mgmthelp import Target as Api
from support.mgmthelp import q as seg
from support.mgmthelp import rabbit_http
from support.net import listening
from support.stomphelp import RABBITMQ_STOMP, Raw

from ackmq.ctl.socket_client import request

PW = "stomp-pw"
# user -> (configure, write, read)
USERS = {"ackU_s_all": (".*", ".*", ".*"), "ackU_s_noconf": ("", ".*", ".*"),
         "ackU_s_nowrite": (".*", "", ".*"), "ackU_s_noread": (".*", ".*", "")}
NOVHOST = "ackU_s_none"  # exists, no permissions on it


def _frames(host: str, port: int, user: str, vhost: str, queue: str) -> list[tuple[str, ...]]:
    """CONNECT, SEND to /queue/<queue> with a receipt, SUBSCRIBE to it and to a topic;
    what came back, as (command, message header, body) per frame."""
    seen: list[tuple[str, ...]] = []
    steps: list[tuple[str, dict[str, str]]] = [
        ("SEND", {"destination": f"/queue/{queue}", "receipt": "r1"}),
        ("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "s1", "receipt": "r2"}),
        ("SUBSCRIBE", {"destination": f"/topic/{queue}", "id": "s2", "receipt": "r3"}),
    ]
    with Raw.open(host, port) as r:
        r.send("CONNECT", {"accept-version": "1.2", "host": vhost, "login": user,
                           "passcode": PW})
        f = r.recv()
        seen.append((f.command, f.headers.get("message", ""), f.body.decode().strip()))
        if f.command != "CONNECTED":
            return seen
        for command, headers in steps:
            r.send(command, headers, b"hello" if command == "SEND" else b"")
            try:
                f = r.recv()
            except Exception as e:  # noqa: BLE001 - closed after an ERROR
                seen.append(("closed", type(e).__name__))
                return seen
            seen.append((f.command, f.headers.get("message", ""), f.body.decode().strip()))
            if f.command == "ERROR":
                return seen
    return seen


@pytest.fixture(scope="module")
def ackmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, object]]:
    from conftest import BrokerProcess
    b = BrokerProcess(tmp_path_factory.mktemp("stomp-access"))
    b.start()
    sock = b.data_dir / "ctl.sock"
    assert request(sock, "add_vhost", [NOVHOST])["ok"]
    for user, perms in USERS.items():
        assert request(sock, "add_user", [user, PW])["ok"]
        assert request(sock, "set_permissions", [user, *perms])["ok"]
    yield b.stomp_port, b
    b.stop()


@pytest.fixture(scope="module")
def rabbit() -> Iterator[tuple[str, int]]:
    """RabbitMQ's users and vhost, made through its management API (a rabbitmqctl call
    is an Erlang VM start: seconds each)."""
    if not listening(RABBITMQ_STOMP):
        pytest.skip("RabbitMQ's STOMP plugin is not there")
    api = Api("rabbitmq", rabbit_http(), "")

    def put(path: str, body: dict[str, str] | None = None) -> None:
        r = api.call("PUT", path, body)
        assert r.status in (201, 204), (path, r)

    put(f"/api/vhosts/{seg(NOVHOST)}")
    for user, (configure, write, read) in USERS.items():
        api.call("DELETE", f"/api/users/{seg(user)}")
        put(f"/api/users/{seg(user)}", {"password": PW, "tags": ""})
        put(f"/api/permissions/%2F/{seg(user)}",
            {"configure": configure, "write": write, "read": read})
    yield RABBITMQ_STOMP
    for user in USERS:
        api.call("DELETE", f"/api/users/{seg(user)}")
    api.call("DELETE", f"/api/vhosts/{seg(NOVHOST)}")


def _queue() -> str:
    return f"ackU-stomp-{uuid.uuid4().hex[:8]}"


def test_U3_stomp_vhost_without_permissions_is_refused(ackmq_broker: tuple[int, object]) -> None:
    seen = _frames("127.0.0.1", ackmq_broker[0], "ackU_s_all", NOVHOST, _queue())
    assert seen == [("ERROR", "Bad CONNECT", f"Virtual host '{NOVHOST}' access denied")]


@pytest.mark.parametrize("user", list(USERS))
def test_U3_stomp_frames_checked_as_rabbitmq(ackmq_broker: tuple[int, object],
                                             rabbit: tuple[str, int], user: str) -> None:
    q = _queue()
    mine = _frames("127.0.0.1", ackmq_broker[0], user, "/", q)
    theirs = _frames(rabbit[0], rabbit[1], user, "/", q)
    Api("rabbitmq", rabbit_http(), "").call("DELETE", f"/api/queues/%2F/{seg(q)}")
    assert mine == theirs
    if user == "ackU_s_all":
        # (the SEND's message arrives on the queue subscription before the third receipt)
        assert [f[0] for f in mine][:3] == ["CONNECTED", "RECEIPT", "RECEIPT"]
        assert "ERROR" not in [f[0] for f in mine], mine
    else:
        assert mine[-1][:2] == ("ERROR", "access_refused"), mine


def test_U3_stomp_vhost_refusal_same_as_rabbitmq(ackmq_broker: tuple[int, object],
                                                 rabbit: tuple[str, int]) -> None:
    q = _queue()
    assert _frames("127.0.0.1", ackmq_broker[0], "ackU_s_all", NOVHOST, q) == \
        _frames(rabbit[0], rabbit[1], "ackU_s_all", NOVHOST, q)
