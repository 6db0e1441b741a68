"""U3: the permission matrix. Every AMQP operation that RabbitMQ checks, run by four users
(all permissions; all but configure; all but write; all but read) on ackmq and on the
reference RabbitMQ 3.10 (users made with its management API), and the answers compared
code for code and text for text. Each cell is also checked against the rule in SPEC U3 (which
permission the operation needs), so the test fails on ackmq alone if the rule is broken.
"""

from __future__ import annotations

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

from ackmq.ctl.socket_client import request

VHOST = "ackU_matrix"
# user -> (configure, write, read): each lacks one permission ("" = nothing, as RabbitMQ)
USERS = {
    "ackU_all": (".*", ".*", ".*"),
    "ackU_noconf": ("", ".*", ".*"),
    "ackU_nowrite": (".*", "", ".*"),
    "ackU_noread": (".*", ".*", ""),
}
PASSWORD = "matrix-pw"
LACKS = {"ackU_all": None, "ackU_noconf": "configure", "ackU_nowrite": "write",
         "ackU_noread": "read"}


def _reset(ch: Any) -> None:
    """The admin's fixtures for every cell: queues pq (one message), pq_del; exchanges
    px, px2, px_del, pae, pdlx; pq bound to px, px2 bound to px."""
    for q in ("pq", "pq_new", "pq_dlx", "pq_dlx0", "pq_del"):
        ch.queue_delete(q)
    for x in ("px", "px2", "px_new", "px_ae", "px_del", "pae", "pdlx"):
        ch.exchange_delete(x)
    for x in ("px", "px2", "px_del", "pae", "pdlx"):
        ch.exchange_declare(x, "direct")
    ch.queue_declare("pq")
    ch.queue_declare("pq_del")
    ch.queue_bind("pq", "px", "k")
    ch.exchange_bind("px2", "px", "k")
    ch.basic_publish("", "pq", b"m")


def _publish(ch: Any, exchange: str) -> None:
    ch.confirm_delivery()
    ch.basic_publish(exchange, "pq" if exchange == "" else "k", b"x")


OPS: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    # name: (permission SPEC U3 says it needs, lacking which it is refused; the call)
    "queue.declare new": ("configure", lambda ch: ch.queue_declare("pq_new")),
    "queue.declare existing": ("configure", lambda ch: ch.queue_declare("pq")),
    "queue.declare passive": (None, lambda ch: ch.queue_declare("pq", passive=True)),
    "queue.declare server-named": ("configure", lambda ch: ch.queue_declare("")),
    "queue.declare x-dead-letter-exchange": ("configure+read+write", lambda ch: ch.queue_declare(
        "pq_dlx", arguments={"x-dead-letter-exchange": "pdlx"})),
    "queue.declare dlx default exchange": ("configure+read+write", lambda ch: ch.queue_declare(
        "pq_dlx0", arguments={"x-dead-letter-exchange": ""})),
    "exchange.declare new": ("configure", lambda ch: ch.exchange_declare("px_new", "direct")),
    "exchange.declare existing": ("configure", lambda ch: ch.exchange_declare("px", "direct")),
    "exchange.declare passive": (None, lambda ch: ch.exchange_declare("px", passive=True)),
    "exchange.declare alternate-exchange": ("configure+read+write", lambda ch:
        ch.exchange_declare("px_ae", "direct", arguments={"alternate-exchange": "pae"})),
    "exchange.declare default": (None, lambda ch: ch.exchange_declare("", "direct")),
    "queue.bind": ("write+read", lambda ch: ch.queue_bind("pq", "px", "k2")),
    "queue.bind default exchange": ("write", lambda ch: ch.queue_bind("pq", "", "k2")),
    "queue.unbind": ("write+read", lambda ch: ch.queue_unbind("pq", "px", "k")),
    "exchange.bind": ("write+read", lambda ch: ch.exchange_bind("px2", "px", "k2")),
    "exchange.unbind": ("write+read", lambda ch: ch.exchange_unbind("px2", "px", "k")),
    "queue.delete": ("configure", lambda ch: ch.queue_delete("pq_del")),
    "queue.delete missing": ("configure", lambda ch: ch.queue_delete("pq_missing")),
    "exchange.delete": ("configure", lambda ch: ch.exchange_delete("px_del")),
    "queue.purge": ("read", lambda ch: ch.queue_purge("pq")),
    "basic.publish": ("write", lambda ch: _publish(ch, "px")),
    "basic.publish default exchange": ("write", lambda ch: _publish(ch, "")),
    "basic.publish missing exchange": ("write", lambda ch: _publish(ch, "px_missing")),
    "basic.consume": ("read", lambda ch: ch.basic_consume("pq", lambda *a: None)),
    "basic.get": ("read", lambda ch: ch.basic_get("pq")),
    "basic.get missing queue": ("read", lambda ch: ch.basic_get("pq_missing")),
}


def _answer(params: pika.ConnectionParameters, fn: Callable[[Any], Any]) -> tuple[Any, ...]:
    """("ok",) or (code, text) of the broker's refusal."""
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        try:
            fn(ch)
            conn.process_data_events(0)
            ch.basic_qos(prefetch_count=0)  # a round trip: an async refusal shows up here
            return ("ok",)
        except pika.exceptions.ChannelClosedByBroker as e:
            return (e.reply_code, e.reply_text)
        except pika.exceptions.ConnectionClosedByBroker as e:
            return ("connection", e.reply_code, e.reply_text)
    finally:
        if conn.is_open:
            conn.close()


class Target:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.admin_conn: pika.BlockingConnection | None = None

    def params(self, user: str, password: str = PASSWORD) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(self.host, self.port, VHOST,
                                         pika.PlainCredentials(user, password),
                                         connection_attempts=1)

    def reset(self) -> None:
        if self.admin_conn is None or not self.admin_conn.is_open:
            self.admin_conn = pika.BlockingConnection(self.params("guest", "guest"))
        _reset(self.admin_conn.channel())


@pytest.fixture(scope="module")
def ackmq_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    data = tmp_path_factory.mktemp("perm")
    broker = BrokerProcess(data)
    broker.start()
    sock = Path(data) / "ctl.sock"

    def ok(verb: str, *args: str, vhost: str = "/") -> None:
        r = request(sock, verb, list(args), vhost)
        assert r["ok"], r

    ok("add_vhost", VHOST)
    ok("set_permissions", "guest", ".*", ".*", ".*", vhost=VHOST)
    for user, perms in USERS.items():
        ok("add_user", user, PASSWORD)
        ok("set_permissions", user, *perms, vhost=VHOST)
    yield Target("127.0.0.1", broker.port)
    broker.stop()


@pytest.fixture(scope="module")
def rabbit_target() -> Iterator[Target]:
    """RabbitMQ's vhost and users, made through its management API (a rabbitmqctl call
    is an Erlang VM start: seconds each, ~20 of them)."""
    url = rabbitmq_url()
    api = Api("rabbitmq", rabbit_http(), url)

    def put(path: str, body: dict[str, str] | None = None) -> None:
        r = api.call("PUT", path, body)
        assert r.status in (201, 204), (path, r)

    put(f"/api/vhosts/{seg(VHOST)}")
    put(f"/api/permissions/{seg(VHOST)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    for user, (configure, write, read) in USERS.items():
        api.call("DELETE", f"/api/users/{seg(user)}")
        put(f"/api/users/{seg(user)}", {"password": PASSWORD, "tags": ""})
        put(f"/api/permissions/{seg(VHOST)}/{seg(user)}",
            {"configure": configure, "write": write, "read": read})
    p = pika.URLParameters(url)
    yield Target(p.host, p.port)
    for user in USERS:
        api.call("DELETE", f"/api/users/{seg(user)}")
    api.call("DELETE", f"/api/vhosts/{seg(VHOST)}")


def _expected_refused(needs: str | None, lacks: str | None) -> bool:
    return needs is not None and lacks is not None and lacks in needs.split("+")


@pytest.mark.parametrize("op", list(OPS))
def test_U3_permission_matrix_ackmq(ackmq_target: Target, op: str) -> None:
    """SPEC U3 on ackmq alone: refused with 403 exactly when the needed permission is
    missing, with RabbitMQ's text shape."""
    needs, fn = OPS[op]
    for user, lacks in LACKS.items():
        ackmq_target.reset()
        got = _answer(ackmq_target.params(user), fn)
        if op == "exchange.declare default":
            assert got == (403, "ACCESS_REFUSED - operation not permitted on the default "
                                "exchange"), (user, got)
        elif op == "queue.bind default exchange" and lacks != "write":
            assert got[0] == 403 and "default exchange" in got[1], (user, got)
        elif _expected_refused(needs, lacks):
            assert got[0] == 403, (user, got)
            assert got[1].startswith("ACCESS_REFUSED - access to ") and \
                got[1].endswith(f" in vhost '{VHOST}' refused for user '{user}'"), got
        else:
            assert got[0] != 403, (user, got)


@pytest.mark.parametrize("op", list(OPS))
def test_U3_permission_matrix_same_as_rabbitmq(ackmq_target: Target, rabbit_target: Target,
                                               op: str) -> None:
    """Each operation x each missing permission: ackmq answers as RabbitMQ does, code
    for code and text for text (server-generated names masked)."""
    _, fn = OPS[op]
    for user in USERS:
        answers = []
        for target in (ackmq_target, rabbit_target):
            target.reset()
            answers.append(_mask(_answer(target.params(user), fn)))
        assert answers[0] == answers[1], f"{op} as {user}: ackmq {answers[0]} RabbitMQ {answers[1]}"


def _mask(answer: tuple[Any, ...]) -> tuple[Any, ...]:
    import re
    return tuple(re.sub(r"amq\.gen-[\w-]+", "amq.gen-*", a) if isinstance(a, str) else a
                 for a in answer)
