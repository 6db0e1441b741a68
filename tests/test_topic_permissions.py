"""U3, topic permissions as RabbitMQ 3.10: `set_topic_permissions [-p vhost] user exchange
write read` restricts the routing keys a user may publish with (write) and bind with
(read) on a topic exchange; `{username}` and `{vhost}` are filled in; a user without a
topic permission for an exchange may use any key; other exchange types are not checked.

The same operations run on ackmq and on the reference RabbitMQ (users made with its
management API), over AMQP (pika) and STOMP (raw frames), and the answers are compared code
for code and text for text; each cell is also checked against the rule on ackmq alone,
so the tests fail on ackmq without the feature even where RabbitMQ is not there.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from conftest import BrokerProcess, rabbitmq_url
from support.mgmthelp import Target as Api
from support.mgmthelp import q as seg
from support.mgmthelp import rabbit_http
from support.net import listening
from support.stomphelp import RABBITMQ_STOMP, Raw

from ackmq.broker.access import hash_password
from ackmq.ctl.socket_client import request

VHOST = "ackU_topic"
PW = "topic-pw"
LIMITED, EMPTY, NONE, OTHER, NOCONF = ("ackU_t_limited", "ackU_t_empty", "ackU_t_none",
                                        "ackU_t_other", "ackU_t_noconf")
# user -> (configure, write, read), [(exchange, topic write, topic read)]
USERS: dict[str, tuple[tuple[str, str, str], list[tuple[str, str, str]]]] = {
    LIMITED: ((".*", ".*", ".*"), [
        ("amq.topic", r"^ok\.", r"^ok\."),
        ("tx", r"^{username}\.", r"^{vhost}\.|^{client_id}$"),
        ("amq.direct", "", ""),  # not a topic exchange: never checked
        ("tx_internal", "", ""),  # internal: that refusal comes first
    ]),
    EMPTY: ((".*", ".*", ".*"), [("amq.topic", "", "")]),  # "" = ^$: only the empty key
    NONE: ((".*", ".*", ".*"), []),
    OTHER: ((".*", ".*", ".*"), [("tx_unrelated", "", "")]),
    NOCONF: (("", ".*", ".*"), [("amq.topic", r"^ok\.", r"^ok\.")]),
}
AMQP_USERS = [LIMITED, EMPTY, NONE, OTHER]
STOMP_USERS = [LIMITED, EMPTY, NONE, NOCONF]


# -- AMQP operations -----------------------------------------------------------------
def _publish(exchange: str, key: str | Callable[[str], str]) -> Callable[[Any, str], None]:
    def run(ch: Any, user: str) -> None:
        ch.confirm_delivery()
        ch.basic_publish(exchange, key(user) if callable(key) else key, b"x")
    return run


def _bind(exchange: str, key: str, queue: str | None = None) -> Callable[[Any, str], None]:
    def run(ch: Any, user: str) -> None:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q if queue is None else queue, exchange, key)
    return run


def _unbind(exchange: str, key: str) -> Callable[[Any, str], None]:
    def run(ch: Any, user: str) -> None:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_unbind(q, exchange, key)
    return run


def _xbind(source: str, key: str, unbind: bool = False) -> Callable[[Any, str], None]:
    def run(ch: Any, user: str) -> None:
        (ch.exchange_unbind if unbind else ch.exchange_bind)("tdest", source, key)
    return run


T = "topic"  # refused by the topic permission (403, RabbitMQ's topic text)
OK = "ok"
# op -> (its call, expected for LIMITED, expected for EMPTY); NONE and OTHER: always OK
# (except where a third value says what everyone gets)
OPS: dict[str, tuple[Callable[[Any, str], None], str, str]] = {
    "publish amq.topic allowed key": (_publish("amq.topic", "ok.1"), OK, T),
    "publish amq.topic refused key": (_publish("amq.topic", "no.1"), T, T),
    "publish amq.topic empty key": (_publish("amq.topic", ""), T, OK),
    "publish {username} key": (_publish("tx", lambda u: f"{u}.a"), OK, OK),
    "publish other user's key": (_publish("tx", "someone.a"), T, OK),
    "publish direct exchange": (_publish("amq.direct", "no.1"), OK, OK),
    "publish internal topic exchange": (_publish("tx_internal", "no.1"), "403 internal",
                                        "403 internal"),
    "publish missing exchange": (_publish("tx_missing", "no.1"), "404", "404"),
    "queue.bind allowed key": (_bind("amq.topic", "ok.#"), OK, T),
    "queue.bind refused key": (_bind("amq.topic", "no.#"), T, T),
    "queue.bind {vhost} key": (_bind("tx", f"{VHOST}.x"), OK, OK),
    "queue.bind {client_id} literal": (_bind("tx", "{client_id}"), OK, OK),
    "queue.bind other key": (_bind("tx", "x"), T, OK),
    "queue.bind empty key = queue name": (_bind("amq.topic", "", queue=""), T, T),
    "queue.bind direct exchange": (_bind("amq.direct", "no.1"), OK, OK),
    "queue.bind missing exchange": (_bind("tx_missing", "no.1"), "404", "404"),
    "queue.unbind refused key": (_unbind("amq.topic", "no.#"), T, T),
    "queue.unbind allowed key": (_unbind("amq.topic", "ok.#"), OK, T),
    "exchange.bind refused key": (_xbind("amq.topic", "no.#"), T, T),
    "exchange.bind allowed key": (_xbind("amq.topic", "ok.#"), OK, T),
    "exchange.bind missing source": (_xbind("tx_missing", "no.#"), "404", "404"),
    "exchange.unbind refused key": (_xbind("amq.topic", "no.#", unbind=True), T, T),
}


def _answer(params: pika.ConnectionParameters, fn: Callable[[Any, str], None],
            user: str) -> tuple[Any, ...]:
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        try:
            fn(ch, user)
            ch.basic_qos(prefetch_count=0)  # a round trip: an async refusal shows up here
            return ("ok",)
        except pika.exceptions.ChannelClosedByBroker as e:
            return (e.reply_code, re.sub(r"amq\.gen-[\w-]+", "amq.gen-*", e.reply_text))
    finally:
        if conn.is_open:
            conn.close()


def _admin_setup(params: pika.ConnectionParameters) -> None:
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.exchange_declare("tx", "topic")
        ch.exchange_declare("tx_internal", "topic", internal=True)
        ch.exchange_declare("tdest", "fanout")
    finally:
        conn.close()


class Target:
    def __init__(self, name: str, host: str, port: int, stomp: tuple[str, int]) -> None:
        self.name, self.host, self.port, self.stomp = name, host, port, stomp

    def params(self, user: str, password: str = PW) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(self.host, self.port, VHOST,
                                         pika.PlainCredentials(user, password),
                                         connection_attempts=1)


@pytest.fixture(scope="module")
def ackmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("topic-perm"))
    b.start()
    sock = b.data_dir / "ctl.sock"

    def ok(verb: str, *args: str, vhost: str = "/") -> None:
        r = request(sock, verb, list(args), vhost)
        assert r["ok"], (verb, args, r)

    ok("add_vhost", VHOST)
    ok("set_permissions", "guest", ".*", ".*", ".*", vhost=VHOST)
    for user, (perms, topics) in USERS.items():
        ok("add_user", user, PW)
        ok("set_permissions", user, *perms, vhost=VHOST)
        for x, w, r in topics:
            ok("set_topic_permissions", user, x, w, r, vhost=VHOST)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def ackmq_target(ackmq_broker: BrokerProcess) -> Target:
    t = Target("ackmq", "127.0.0.1", ackmq_broker.port, ("127.0.0.1", ackmq_broker.stomp_port))
    _admin_setup(t.params("guest", "guest"))
    return t


def _rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not on PATH: this comparison runs its verbs")
    return subprocess.run(["rabbitmqctl", *args], check=check, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def rabbit_target() -> Iterator[Target]:
    """RabbitMQ's users, vhost and permissions, imported in one POST to its management API
    and awaited there (rabbitmqctl's import, its polls and deletes were each an Erlang VM
    start: seconds each)."""
    url = rabbitmq_url()
    api = Api("rabbitmq", rabbit_http(), url)
    for user in USERS:
        api.call("DELETE", f"/api/users/{seg(user)}")
    defs = {
        "users": [{"name": u, "password_hash": hash_password(PW), "tags": "",
                   "hashing_algorithm": "rabbit_password_hashing_sha256"} for u in USERS],
        "vhosts": [{"name": VHOST}],
        "permissions": [{"user": "guest", "vhost": VHOST, "configure": ".*", "write": ".*",
                         "read": ".*"}] + [
            {"user": u, "vhost": VHOST, "configure": c, "write": w, "read": r}
            for u, ((c, w, r), _t) in USERS.items()],
        "topic_permissions": [{"user": u, "vhost": VHOST, "exchange": x, "write": w,
                               "read": r} for u, (_p, ts) in USERS.items() for x, w, r in ts],
    }
    r = api.call("POST", "/api/definitions", defs)
    assert r.status in (201, 204), r

    def imported() -> int:
        r = api.call("GET", f"/api/vhosts/{seg(VHOST)}/topic-permissions")
        return len(r.body) if r.status == 200 and isinstance(r.body, list) else 0

    deadline = time.monotonic() + 30
    while imported() < len(defs["topic_permissions"]):
        assert time.monotonic() < deadline, "RabbitMQ did not import the definitions"
        time.sleep(0.2)
    p = pika.URLParameters(url)
    t = Target("rabbitmq", p.host, p.port, RABBITMQ_STOMP)
    _admin_setup(t.params("guest", "guest"))
    yield t
    for user in USERS:
        api.call("DELETE", f"/api/users/{seg(user)}")
    api.call("DELETE", f"/api/vhosts/{seg(VHOST)}")


def _expected(op: str, user: str) -> str:
    _fn, limited, empty = OPS[op]
    if user == LIMITED:
        return limited
    if user == EMPTY:
        return empty
    return limited if limited in ("404", "403 internal") else OK


def _check(got: tuple[Any, ...], expected: str, user: str) -> None:
    if expected == OK:
        assert got == ("ok",), (user, got)
    elif expected == T:
        assert got[0] == 403, (user, got)
        assert re.fullmatch(rf"ACCESS_REFUSED - access to topic '[^']*' in exchange "
                            rf"'[\w.]+' in vhost '{VHOST}' refused for user '{user}'",
                            got[1]), got
    elif expected == "404":
        assert got[0] == 404, (user, got)
    else:
        assert got[0] == 403 and "cannot publish to internal exchange" in got[1], got


@pytest.mark.parametrize("op", list(OPS))
def test_U3_topic_permissions_ackmq(ackmq_target: Target, op: str) -> None:
    """On ackmq alone: refused exactly where the topic permission says so."""
    fn = OPS[op][0]
    for user in AMQP_USERS:
        _check(_answer(ackmq_target.params(user), fn, user), _expected(op, user), user)


@pytest.mark.parametrize("op", list(OPS))
def test_U3_topic_permissions_same_as_rabbitmq(ackmq_target: Target, rabbit_target: Target,
                                               op: str) -> None:
    fn = OPS[op][0]
    for user in AMQP_USERS:
        mine = _answer(ackmq_target.params(user), fn, user)
        theirs = _answer(rabbit_target.params(user), fn, user)
        assert mine == theirs, f"{op} as {user}: ackmq {mine} RabbitMQ {theirs}"


# -- STOMP ------------------------------------------------------------------------------
STOMP_CASES: dict[str, list[tuple[str, dict[str, str]]]] = {
    "SEND /topic allowed": [("SEND", {"destination": "/topic/ok.1", "receipt": "r"})],
    "SEND /topic refused": [("SEND", {"destination": "/topic/no.1", "receipt": "r"})],
    # (no receipt on the /exchange/ SEND: with one, ackmq answers an unroutable SEND
    # with an ERROR where RabbitMQ drops it silently, a documented difference)
    "SEND /exchange/amq.topic refused": [
        ("SEND", {"destination": "/exchange/amq.topic/no.1"}),
        ("SEND", {"destination": "/topic/ok.1", "receipt": "r"})],
    "SEND refused without receipt, then one": [
        ("SEND", {"destination": "/topic/no.1"}),
        ("SEND", {"destination": "/topic/ok.1", "receipt": "r"})],
    "SUBSCRIBE /topic allowed": [
        ("SUBSCRIBE", {"destination": "/topic/ok.1", "id": "s", "receipt": "r"})],
    "SUBSCRIBE /topic refused": [
        ("SUBSCRIBE", {"destination": "/topic/no.1", "id": "s", "receipt": "r"})],
    "SUBSCRIBE /topic refused, bad ack mode": [
        ("SUBSCRIBE", {"destination": "/topic/no.1", "id": "s", "ack": "bogus"})],
    "SUBSCRIBE /topic refused, durable without id": [
        ("SUBSCRIBE", {"destination": "/topic/no.1", "durable": "true"})],
    "SUBSCRIBE /exchange/amq.topic refused": [
        ("SUBSCRIBE", {"destination": "/exchange/amq.topic/no.1", "id": "s", "receipt": "r"})],
    "SUBSCRIBE /exchange/amq.topic allowed": [
        ("SUBSCRIBE", {"destination": "/exchange/amq.topic/ok.1", "id": "s", "receipt": "r"})],
}


# users whose answer to a case does not involve topic permissions and differs for a
# documented reason: a bad ack mode is ERROR "Invalid header" naming it on ackmq,
# "Processing error" on RabbitMQ (docs/stomp.md)
COMPARE_SKIP = {"SUBSCRIBE /topic refused, bad ack mode": {NONE}}


def _stomp(addr: tuple[str, int], user: str, steps: list[tuple[str, dict[str, str]]]
           ) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    with Raw.open(*addr) as r:
        r.send("CONNECT", {"accept-version": "1.2", "host": VHOST, "login": user,
                           "passcode": PW})
        f = r.recv()
        assert f.command == "CONNECTED", (f.command, f.headers, f.body)
        for command, headers in steps:
            r.send(command, headers, b"hello" if command == "SEND" else b"")
        while True:  # every case ends in a RECEIPT or an ERROR
            try:
                f = r.recv(timeout=5.0)
            except Exception as e:  # noqa: BLE001 - closed after an ERROR, or silent
                seen.append(("no frame", type(e).__name__))
                break
            body = re.sub(r"stomp-subscription-[\w-]+", "stomp-subscription-*",
                          f.body.decode())
            seen.append((f.command, f.headers.get("message", ""), body))
            if f.command in ("ERROR", "RECEIPT"):
                break
    return seen


@pytest.fixture(scope="module")
def rabbit_stomp(rabbit_target: Target) -> Target:
    if not listening(RABBITMQ_STOMP):
        pytest.skip("RabbitMQ's STOMP plugin is not there")
    return rabbit_target


@pytest.mark.parametrize("case", list(STOMP_CASES))
def test_U3_topic_permissions_stomp_ackmq(ackmq_target: Target, case: str) -> None:
    """SEND and SUBSCRIBE to topics meet the same checks on ackmq alone: the refused
    ones end in RabbitMQ's access_refused ERROR naming the topic."""
    steps = STOMP_CASES[case]
    for user in STOMP_USERS:
        seen = _stomp(ackmq_target.stomp, user, steps)
        errors = [s for s in seen if s[0] == "ERROR"]
        topic_refusals = [e for e in errors if "access to topic '" in e[2]]
        if "durable without id" in case:  # RabbitMQ checks that header first
            assert errors and errors[0][1] == "Missing Header", (user, seen)
        elif user == NOCONF and case.startswith("SUBSCRIBE /exchange"):
            # its queue is declared (refused: no configure) before the bind's check
            assert errors and "access to queue 'stomp-subscription-" in errors[0][2], seen
        elif user == NONE or ("allowed" in case and user != EMPTY):
            assert not topic_refusals, (user, seen)
        else:
            assert topic_refusals and topic_refusals[0][1] == "access_refused", (user, seen)
            # /topic/ subscriptions: the plugin's own check, without the AMQP prefix
            prefix = "" if case.startswith("SUBSCRIBE /topic") else "ACCESS_REFUSED - "
            assert topic_refusals[0][2] == (
                f"{prefix}access to topic '{'no' if 'refused' in case else 'ok'}.1' in "
                f"exchange 'amq.topic' in vhost '{VHOST}' refused for user '{user}'"), seen


@pytest.mark.parametrize("case", list(STOMP_CASES))
def test_U3_topic_permissions_stomp_same_as_rabbitmq(ackmq_target: Target,
                                                     rabbit_stomp: Target, case: str) -> None:
    steps = STOMP_CASES[case]
    for user in STOMP_USERS:
        if user in COMPARE_SKIP.get(case, ()):
            continue
        mine = _stomp(ackmq_target.stomp, user, steps)
        theirs = _stomp(rabbit_stomp.stomp, user, steps)
        assert mine == theirs, f"{case} as {user}:\nackmq    {mine}\nRabbitMQ {theirs}"


# -- changes, durability, definitions, ctl ---------------------------------------------------
def test_U3_topic_permission_change_applies_to_open_channels(ackmq_broker: BrokerProcess,
                                                            ackmq_target: Target) -> None:
    """As RabbitMQ: a topic permission set while a channel is open refuses its next
    publish (the channel's caches are emptied); clearing it allows again."""
    user = f"ackU_t_live_{uuid.uuid4().hex[:6]}"
    sock = ackmq_broker.data_dir / "ctl.sock"
    assert request(sock, "add_user", [user, PW])["ok"]
    assert request(sock, "set_permissions", [user, ".*", ".*", ".*"], VHOST)["ok"]
    conn = pika.BlockingConnection(ackmq_target.params(user))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "a.1", b"x")  # allowed, and now cached
        assert request(sock, "set_topic_permissions", [user, "amq.topic", "^b", ".*"],
                       VHOST)["ok"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.basic_publish("amq.topic", "a.1", b"x")
        assert e.value.reply_code == 403 and "access to topic 'a.1'" in e.value.reply_text
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "b.1", b"x")
        assert request(sock, "clear_topic_permissions", [user], VHOST)["ok"]
        ch.basic_publish("amq.topic", "a.1", b"x")
    finally:
        if conn.is_open:
            conn.close()
        request(sock, "delete_user", [user])  # its topic permission goes with it


def test_U3_topic_permissions_survive_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        sock = b.data_dir / "ctl.sock"
        assert request(sock, "set_topic_permissions", ["guest", "amq.topic", "^a", "^b"])["ok"]
        b.stop()
        b.start()
        rows = request(sock, "list_topic_permissions", [])["rows"]
        assert rows == [["guest", "amq.topic", "^a", "^b"]]
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                ch.basic_publish("amq.topic", "z", b"x")
            assert e.value.reply_code == 403
        finally:
            conn.close()
    finally:
        b.stop()


def _ctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=60)


def test_U3_topic_permissions_definitions_round_trip(tmp_path: Path,
                                                     ackmq_broker: BrokerProcess) -> None:
    """export_definitions writes "topic_permissions" in RabbitMQ's layout, and
    import_definitions reads it back (here into a second, fresh broker)."""
    out = tmp_path / "defs.json"
    p = _ctl(ackmq_broker.data_dir, "export_definitions", str(out))
    assert p.returncode == 0, p.stderr
    defs = json.loads(out.read_text())
    mine = [t for t in defs["topic_permissions"] if t["user"] == LIMITED]
    assert {"user": LIMITED, "vhost": VHOST, "exchange": "tx", "write": r"^{username}\.",
            "read": r"^{vhost}\.|^{client_id}$"} in mine
    b = BrokerProcess(tmp_path / "fresh")
    b.start()
    try:
        p = _ctl(b.data_dir, "import_definitions", str(out))
        assert p.returncode == 0, p.stderr
        p = _ctl(b.data_dir, "-q", "list_user_topic_permissions", LIMITED)
        assert sorted(p.stdout.splitlines()) == sorted(
            f"{VHOST}\t{x}\t{w}\t{r}" for x, w, r in USERS[LIMITED][1])
    finally:
        b.stop()


def test_U3_topic_permissions_import_rabbitmq_export(tmp_path: Path, rabbit_target: Target
                                                     ) -> None:
    """A `rabbitmqctl export_definitions` file's topic permissions import into ackmq."""
    # written by the RabbitMQ node (its own OS user): not into pytest's private tmp dir
    out = Path("/tmp") / f"ackU_topic_{uuid.uuid4().hex[:8]}.json"
    try:
        _rabbitmqctl("export_definitions", str(out))
        theirs = json.loads(out.read_text())["topic_permissions"]
        (tmp_path / "rabbit.json").write_text(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    out = tmp_path / "rabbit.json"
    b = BrokerProcess(tmp_path / "d")
    b.start()
    try:
        p = _ctl(b.data_dir, "import_definitions", str(out))
        assert p.returncode == 0, p.stderr
        assert not [line for line in p.stdout.splitlines()  # imported, not named as not
                    if line.startswith("not imported") and "topic_permissions" in line]
        rows = request(b.data_dir / "ctl.sock", "list_topic_permissions", [], VHOST)["rows"]
        assert sorted(map(tuple, rows)) == sorted(
            (t["user"], t["exchange"], t["write"], t["read"]) for t in theirs
            if t["vhost"] == VHOST)
    finally:
        b.stop()


CTL_STEPS: list[list[str]] = [
    ["set_topic_permissions", "-p", VHOST, "ackU_t_ctl", "amq.topic", "^a", "^b"],
    ["set_topic_permissions", "-p", VHOST, "ackU_t_ctl", "tx_not_declared", "x", ""],
    ["set_topic_permissions", "-p", "ackU_no_such_vhost", "ackU_t_ctl", "amq.topic", "a", "b"],
    ["set_topic_permissions", "-p", VHOST, "ackU_no_such_user", "amq.topic", "a", "b"],
    ["set_topic_permissions", "-p", VHOST, "ackU_t_ctl", "amq.topic", "(", "b"],
    ["list_topic_permissions", "-p", VHOST],
    ["list_user_topic_permissions", "ackU_t_ctl"],
    ["list_user_topic_permissions", "ackU_no_such_user"],
    ["clear_topic_permissions", "-p", VHOST, "ackU_t_ctl", "tx_not_declared"],
    ["clear_topic_permissions", "-p", VHOST, "ackU_t_ctl"],
    ["list_user_topic_permissions", "ackU_t_ctl"],
    ["clear_topic_permissions", "-p", VHOST, "ackU_no_such_user"],
    ["list_topic_permissions", "-p", "ackU_no_such_vhost"],
]


def _ctl_answer(p: subprocess.CompletedProcess[str], step: list[str]) -> tuple[Any, ...]:
    """Exit code, the info line, the data lines (sorted: the brokers list in their own
    order), and the error text (except for an invalid regex: Erlang's and Python's
    regex errors differ)."""
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    err = p.stderr.split("Error:\n", 1)[-1].strip() if p.returncode else ""
    if "(" in step:
        err = "invalid regex"
    return p.returncode, lines[:1], sorted(lines[1:]), err


def test_U3_topic_permission_verbs_same_as_rabbitmqctl(ackmq_broker: BrokerProcess,
                                                       rabbit_target: Target) -> None:
    user = "ackU_t_ctl"
    assert request(ackmq_broker.data_dir / "ctl.sock", "add_user", [user, PW])["ok"]
    _rabbitmqctl("delete_user", user, check=False)
    _rabbitmqctl("add_user", user, PW)
    try:
        for step in CTL_STEPS:
            mine = _ctl_answer(_ctl(ackmq_broker.data_dir, *step), step)
            theirs = _ctl_answer(_rabbitmqctl(*step, check=False), step)
            assert mine == theirs, f"{step}:\nackmq    {mine}\nRabbitMQ {theirs}"
    finally:
        _rabbitmqctl("delete_user", user, check=False)


def test_U3_access_cost_bench_runs() -> None:
    """`python -m tools.perf.access_cost` (the figures in docs/security.md) measures its
    three configurations; a tiny run here keeps it working."""
    from tools.perf.access_cost import measure
    res = measure(rounds=3, per_round=200)
    assert set(res) == {"no checks", "checks", "checks + topic permission elsewhere"}
    assert all(len(v) == 3 and all(x > 0 for x in v) for v in res.values())
