"""C1 through every front end: the same refusal — another connection's exclusive queue,
no read permission (purge, consume), no configure permission (delete, declare), a bad
argument (declare), deleting a system exchange — comes from the one check in the operation layer (broker/
operations.py) with RabbitMQ's code and text, whichever grammar asked: AMQP 0-9-1
(pika), AMQP 1.0's `/management` node (rabbitmq-amqp-python-client's request), STOMP,
the HTTP API, the UI's forms and `ackmq ctl`. Where RabbitMQ 3.10 speaks the same
protocol (0-9-1, STOMP, the HTTP API) the test runs against it too and the texts must
be equal; RabbitMQ 3.10 has no `/management` node (a RabbitMQ 4 feature: its codes are
docs/amqp10.md's) and its UI has no such forms."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pika
import pytest
from conftest import BrokerProcess
from support.mgmthelp import Target, http_url_of, q, rabbit_http
from support.stomphelp import Raw
from support.uihelp import ui_call

RABBIT_STOMP = ("127.0.0.1", 61623)
RABBIT_AMQP = os.environ.get("ACKMQ_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


def locked(name: str) -> str:
    return (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in "
            "vhost '/'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.")


def denied(kind: str, name: str, user: str) -> str:
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user '{user}'"


def bad_ttl(name: str) -> str:
    return (f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{name}' in vhost "
            "'/': {value_negative,-1}")


SYSTEM_EXCHANGE = "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"


def without_code(text: str) -> str:
    """The HTTP API's reason: the channel's text without the code's name."""
    return text.split(" - ", 1)[1]


@dataclass
class World:
    """One broker (ackmq or the reference) with a queue of 2 messages, another
    connection's exclusive queue, and two users: no read, no configure."""

    kind: str
    mgmt: Target
    amqp_url: str
    stomp: tuple[str, int]
    proc: BrokerProcess | None = None
    queue: str = ""
    exclusive: str = ""
    users: dict[str, tuple[str, str]] = field(default_factory=dict)
    holder: Any = None

    def params(self, user: tuple[str, str] | None = None) -> pika.URLParameters:
        p = pika.URLParameters(self.amqp_url)
        if user is not None:
            p.credentials = pika.PlainCredentials(*user)
        return p

    def amqp_refusal(self, user: tuple[str, str] | None, call: Any) -> tuple[int, str]:
        conn = pika.BlockingConnection(self.params(user))
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                call(conn.channel())
            return e.value.reply_code, e.value.reply_text
        finally:
            conn.close()

    def stomp_refusal(self, user: tuple[str, str] | None, headers: dict[str, str]
                      ) -> tuple[str, str]:
        with Raw.open(*self.stomp) as r:
            creds = {} if user is None else {"login": user[0], "passcode": user[1]}
            r.connect(**creds)
            r.send("SUBSCRIBE", {"id": "s1", "receipt": "r1", **headers})
            f = r.recv()
            assert f.command == "ERROR", f
            return f.headers["message"], f.body.decode()


def _make(kind: str, mgmt: Target, amqp_url: str, stomp: tuple[str, int],
          proc: BrokerProcess | None = None) -> World:
    w = World(kind, mgmt, amqp_url, stomp, proc)
    tag = uuid.uuid4().hex[:6]
    w.queue, w.exclusive = f"c1-q-{tag}", f"c1-excl-{tag}"
    for name, perms in (("noread", (".*", ".*", "^$")), ("noconf", ("^$", ".*", ".*"))):
        user = mgmt.user("management")
        r = mgmt.call("PUT", f"/api/permissions/%2F/{q(user[0])}",
                      dict(zip(("configure", "write", "read"), perms, strict=True)))
        assert r.status in (201, 204), r
        w.users[name] = user
    conn = pika.BlockingConnection(w.params())
    ch = conn.channel()
    ch.queue_declare(w.queue)
    mgmt.cleanup.append(("queue", w.queue))
    for _ in range(2):
        ch.basic_publish("", w.queue, b"m")
    ch.queue_declare(w.exclusive, exclusive=True)
    w.holder = conn  # keeps the exclusive queue its own
    return w


@pytest.fixture(scope="module")
def ackmq_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    b = BrokerProcess(tmp_path_factory.mktemp("c1"), "--amqp10-rabbitmq-compat")
    b.start()
    http = http_url_of(b)
    w = _make("ackmq", Target("ackmq", http, b.url), b.url, ("127.0.0.1", b.stomp_port), b)
    yield w
    w.holder.close()
    b.stop()


@pytest.fixture(scope="module")
def rabbitmq_world() -> Iterator[World]:
    w = _make("rabbitmq", Target("rabbitmq", rabbit_http(), RABBIT_AMQP), RABBIT_AMQP,
              RABBIT_STOMP)
    yield w
    w.holder.close()
    w.mgmt.forget()


@pytest.fixture(params=["ackmq", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def world(request: pytest.FixtureRequest) -> World:
    return request.getfixturevalue(f"{request.param}_world")  # type: ignore[no-any-return]


# -- AMQP 0-9-1 ------------------------------------------------------------------------------
def test_C1_amqp091_refusals_come_from_the_verbs(world: World) -> None:
    w = world
    assert w.amqp_refusal(None, lambda ch: ch.queue_purge(w.exclusive)) == (
        405, locked(w.exclusive))
    assert w.amqp_refusal(None, lambda ch: ch.queue_delete(w.exclusive)) == (
        405, locked(w.exclusive))
    u = w.users["noread"]
    assert w.amqp_refusal(u, lambda ch: ch.queue_purge(w.queue)) == (
        403, denied("queue", w.queue, u[0]))
    u = w.users["noconf"]
    assert w.amqp_refusal(u, lambda ch: ch.queue_delete(w.queue)) == (
        403, denied("queue", w.queue, u[0]))
    bad = f"{w.queue}-bad"
    assert w.amqp_refusal(None, lambda ch: ch.queue_declare(
        bad, arguments={"x-message-ttl": -1})) == (406, bad_ttl(bad))
    assert w.amqp_refusal(None, lambda ch: ch.exchange_delete("amq.direct")) == (
        403, SYSTEM_EXCHANGE)


# -- AMQP 1.0 /management ----------------------------------------------------------------------
def test_C1_amqp10_management_refusals_come_from_the_verbs(ackmq_world: World) -> None:
    """rabbitmq-amqp-python-client's own request call: codes as RabbitMQ 4's management
    node (403; 409 for a precondition and a locked queue), the body the model's text.
    The client raises on every 409 without showing the answer; the test reads it."""
    rc = pytest.importorskip("rabbitmq_amqp_python_client")
    w = ackmq_world
    assert w.proc is not None

    def answer(user: tuple[str, str] | None, path: str, method: str, body: Any,
               code: int) -> str:
        creds = "guest:guest" if user is None else f"{user[0]}:{user[1]}"
        env = rc.Environment(uri=f"amqp://{creds}@127.0.0.1:{w.proc.port}/")
        conn = env.connection()
        conn.dial()
        m = conn.management()
        # the client raises on any 409 before its caller sees the answer: read it here
        m._validate_reponse_code = lambda *_: None  # type: ignore[method-assign]
        try:
            reply = m.request(body, path, method, [code])
            assert reply.subject == str(code), (reply.subject, reply.body)
            return str(reply.body)
        finally:
            m.close()
            conn.close()
            env.close()

    qpath = rc.AddressHelper.queue_address
    assert answer(None, qpath(w.exclusive) + "/messages", "DELETE", None, 409) == \
        locked(w.exclusive)
    assert answer(None, qpath(w.exclusive), "DELETE", None, 409) == locked(w.exclusive)
    u = w.users["noread"]
    assert answer(u, qpath(w.queue) + "/messages", "DELETE", None, 403) == \
        denied("queue", w.queue, u[0])
    u = w.users["noconf"]
    assert answer(u, qpath(w.queue), "DELETE", None, 403) == denied("queue", w.queue, u[0])
    bad = f"{w.queue}-bad10"
    assert answer(None, qpath(bad), "PUT", {"durable": True, "exclusive": False,
                                            "auto_delete": False,
                                            "arguments": {"x-message-ttl": -1}},
                  409) == bad_ttl(bad)
    assert answer(None, rc.AddressHelper.exchange_address("amq.direct"), "DELETE", None,
                  403) == SYSTEM_EXCHANGE


# -- STOMP --------------------------------------------------------------------------------------
def test_C1_stomp_refusals_come_from_the_verbs(world: World) -> None:
    """STOMP has no purge or delete: the same checks reached by consume (read), a
    declaring destination (configure) and its x- headers (a bad argument)."""
    w = world
    assert w.stomp_refusal(None, {"destination": f"/amq/queue/{w.exclusive}"}) == (
        "resource_locked", locked(w.exclusive))
    u = w.users["noread"]
    assert w.stomp_refusal(u, {"destination": f"/amq/queue/{w.queue}"}) == (
        "access_refused", denied("queue", w.queue, u[0]))
    u = w.users["noconf"]
    new = f"{w.queue}-new"
    assert w.stomp_refusal(u, {"destination": f"/queue/{new}"}) == (
        "access_refused", denied("queue", new, u[0]))
    bad = f"{w.queue}-badstomp"
    assert w.stomp_refusal(None, {"destination": f"/queue/{bad}", "x-message-ttl": "-1"}) == (
        "precondition_failed", bad_ttl(bad))


# -- HTTP API ---------------------------------------------------------------------------------
def test_C1_http_api_refusals_come_from_the_verbs(world: World) -> None:
    """RabbitMQ's management mapping of the channel's close: 400 with the text without
    its code's name; a refused permission is 401 "Access refused."."""
    w, m = world, world.mgmt
    for path in (f"/api/queues/%2F/{w.exclusive}/contents", f"/api/queues/%2F/{w.exclusive}"):
        r = m.call("DELETE", path)
        assert (r.status, r.body) == (400, {"error": "bad_request",
                                            "reason": without_code(locked(w.exclusive))})
    for user, path in ((w.users["noread"], f"/api/queues/%2F/{w.queue}/contents"),
                       (w.users["noconf"], f"/api/queues/%2F/{w.queue}")):
        r = m.call("DELETE", path, auth=user)
        assert (r.status, r.body) == (401, {"error": "not_authorised",
                                            "reason": "Access refused."})
    bad = f"{w.queue}-badhttp"
    r = m.call("PUT", f"/api/queues/%2F/{bad}", {"arguments": {"x-message-ttl": -1}})
    assert (r.status, r.body) == (400, {"error": "bad_request",
                                        "reason": without_code(bad_ttl(bad))})
    r = m.call("DELETE", "/api/exchanges/%2F/amq.direct")
    assert (r.status, r.body) == (401, {"error": "not_authorised", "reason": "Access refused."})
    if w.kind == "ackmq":  # (RabbitMQ's figures lag by its stats interval)
        r = m.call("GET", f"/api/queues/%2F/{w.queue}")
        assert r.body["messages"] == 2  # nothing above changed it


# -- the UI's forms -----------------------------------------------------------------------------
def test_C1_ui_form_refusals_come_from_the_verbs(ackmq_world: World) -> None:
    """The queue page's purge and delete forms show the model's text (RabbitMQ 3.10's
    UI is a JavaScript client of the API: no such forms to compare with)."""
    w = ackmq_world
    site = SimpleNamespace(http_url=w.mgmt.base)

    def shown(user: tuple[str, str], action: str, name: str) -> str:
        import html
        status, headers, body = ui_call(site, "POST", f"/queue/{action}",  # type: ignore[arg-type]
                                        user, {"vhost": "/", "name": name})
        assert status == 303, (status, body)
        page = ui_call(site, "GET", headers["location"], user)[2]  # type: ignore[arg-type]
        return html.unescape(page)

    guest = ("guest", "guest")
    assert locked(w.exclusive) in shown(guest, "purge", w.exclusive)
    assert locked(w.exclusive) in shown(guest, "delete", w.exclusive)
    u = w.users["noread"]
    assert denied("queue", w.queue, u[0]) in shown(u, "purge", w.queue)
    u = w.users["noconf"]
    assert denied("queue", w.queue, u[0]) in shown(u, "delete", w.queue)


# -- ctl ----------------------------------------------------------------------------------------
def test_C1_ctl_refusals_come_from_the_verbs(ackmq_world: World) -> None:
    """The admin socket owns the broker (rabbitmqctl's verbs check no permission); its
    delete goes through the same verb, so a refused delete has the same text as
    queue.delete's over AMQP 0-9-1."""
    import contextlib
    import io

    from ackmq.cli import main
    w = ackmq_world
    assert w.proc is not None
    text = w.amqp_refusal(None, lambda ch: ch.queue_delete(w.queue, if_empty=True))
    assert text == (406, f"PRECONDITION_FAILED - queue '{w.queue}' in vhost '/' not empty")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ctl", "--data-dir", str(w.proc.data_dir), "delete_queue", w.queue,
                     "--if-empty"])
    assert code != 0 and text[1] in err.getvalue(), (code, out.getvalue(), err.getvalue())
    r = w.mgmt.call("GET", f"/api/queues/%2F/{w.queue}")
    assert r.body["messages"] == 2


def test_C1_stomp_durable_unsubscribe_is_the_delete_verb(world: World) -> None:
    """UNSUBSCRIBE with durable:true ends a durable /topic/ subscription by deleting its
    queue, a queue.delete as RabbitMQ's plugin sends it (configure applies)."""
    w = world

    def subscription_queues() -> set[str]:
        r = w.mgmt.call("GET", "/api/queues/%2F?columns=name")
        return {x["name"] for x in r.body if x["name"].startswith("stomp-subscription-")}

    before = subscription_queues()
    sub = f"c1-durable-{uuid.uuid4().hex[:6]}"
    with Raw.open(*w.stomp) as r:
        r.connect()
        r.subscribe(f"/topic/{sub}", sub, durable="true", **{"auto-delete": "false"})
        made = subscription_queues() - before
        assert len(made) == 1, made
        r.receipt("UNSUBSCRIBE", {"id": sub, "durable": "true"})
    deadline = time.monotonic() + 10
    while made & subscription_queues() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not made & subscription_queues()
