"""U3 over AMQP 1.0: every source and target address checks at attach what its AMQP
0-9-1 equivalent checks (declare: configure; bind: write on the queue, read on the
exchange, the topic permission on the binding key; consume: read on the queue;
publish: write on the exchange, `amq.default` for a queue), through the model's own
checks. A refusal ends the session with amqp:unauthorized-access and RabbitMQ 4's
description ("<permission> access to ... refused for user '...'"), as RabbitMQ 4's
amqp_auth_SUITE shows; RabbitMQ 3.10's plugin aborts the connection on a refused bind
and accepts a sender it then never settles, so RabbitMQ 4 is the reference here (docs/
amqp10.md, "Permissions"). Client: python-qpid-proton; users and permissions are made
through ackmq's management API as guest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BrokerProcess
from support.amqp10help import WAIT, connect, uniq
from support.mgmthelp import Target, http_url_of, q

proton = pytest.importorskip("proton")
from proton import Endpoint, Message  # noqa: E402
from proton.utils import LinkDetached  # noqa: E402

USER, PASSWORD = "u3-amqp10", "u3-pw"
QUEUE = "u3q"
GEN = r"^amq\.gen"


class Broker:
    def __init__(self, port: int, mgmt: Target, vhost: str) -> None:
        self.port = port
        self.mgmt = mgmt
        self.vhost = vhost

    def permit(self, configure: str, write: str, read: str) -> None:
        r = self.mgmt.call("PUT", f"/api/permissions/{q(self.vhost)}/{USER}",
                           {"configure": configure, "write": write, "read": read})
        assert r.status in (201, 204), r

    def topic_permit(self, write: str, read: str) -> None:
        r = self.mgmt.call("PUT", f"/api/topic-permissions/{q(self.vhost)}/{USER}",
                           {"exchange": "amq.topic", "write": write, "read": read})
        assert r.status in (201, 204), r

    def clear_topic(self) -> None:
        self.mgmt.call("DELETE", f"/api/topic-permissions/{q(self.vhost)}/{USER}")

    def queues(self) -> list[str]:
        r = self.mgmt.call("GET", f"/api/queues/{q(self.vhost)}")
        return [x["name"] for x in r.body]

    def connect(self, user: str = USER, password: str = PASSWORD) -> Any:
        return connect(self.port, user, password, vhost=f"vhost:{self.vhost}")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = BrokerProcess(tmp_path_factory.mktemp("a10u3"))
    b.start()
    http = http_url_of(b)
    mgmt = Target("ackmq", http, "")
    vhost = "u3-amqp10-vh"
    for path, body in ((f"/api/vhosts/{q(vhost)}", None),
                       (f"/api/users/{USER}", {"password": PASSWORD, "tags": ""}),
                       (f"/api/permissions/{q(vhost)}/guest",
                        {"configure": ".*", "write": ".*", "read": ".*"}),
                       (f"/api/queues/{q(vhost)}/{QUEUE}", {"durable": True})):
        r = mgmt.call("PUT", path, body)
        assert r.status in (201, 204), (path, r)
    yield Broker(b.port, mgmt, vhost)
    b.stop()


def attach(conn: Any, role: str, address: str) -> tuple[str, Any, Any]:
    """Attach one link on a new session: ("attached" | "ended" | "detached", the link,
    the remote condition). proton's blocking API has no call for a session the peer
    ends before it answers the attach, so the session is driven by hand."""
    ssn = conn.conn.session()
    ssn.open()
    if role == "receiver":
        link = ssn.receiver(uniq("r"))
        link.source.address = address
    else:
        link = ssn.sender(uniq("s"))
        link.target.address = address
    link.open()
    try:
        conn.wait(lambda: bool(ssn.state & Endpoint.REMOTE_CLOSED)
                  or not link.state & Endpoint.REMOTE_UNINIT, timeout=WAIT)
        if not ssn.state & Endpoint.REMOTE_CLOSED and role == "receiver":
            link.flow(1)
        conn.wait(lambda: bool(ssn.state & Endpoint.REMOTE_CLOSED)
                  or bool(link.state & Endpoint.REMOTE_CLOSED) or link.credit > 0
                  or role == "receiver", timeout=WAIT)
    except LinkDetached:
        pass
    if ssn.state & Endpoint.REMOTE_CLOSED:
        return "ended", link, ssn.remote_condition
    if link.state & Endpoint.REMOTE_CLOSED:
        return "detached", link, link.remote_condition
    return "attached", link, None


def refused(b: Broker, role: str, address: str) -> str:
    """The description of the amqp:unauthorized-access that ends the session."""
    conn = b.connect()
    try:
        state, _link, cond = attach(conn, role, address)
        assert state == "ended", (state, cond)
        assert cond.name == "amqp:unauthorized-access", cond
        return str(cond.description)
    finally:
        conn.close()


def refusal(perm: str, kind: str, name: str, b: Broker) -> str:
    return f"{perm} access to {kind} '{name}' in vhost '{b.vhost}' refused for user '{USER}'"


# -- sources that bind: /exchange/, /topic/, topic://, the firehose -------------------------
BINDING_SOURCES = {
    "v1-exchange-key": ("/exchange/amq.direct/k1", "amq.direct"),
    "v1-exchange": ("/exchange/amq.fanout", "amq.fanout"),
    "v1-exchange-topic": ("/exchange/amq.topic/a.b", "amq.topic"),
    "v1-topic": ("/topic/a.b", "amq.topic"),
    "activemq-topic": ("topic://a.b", "amq.topic"),
    "firehose": ("/exchange/amq.rabbitmq.trace/#", "amq.rabbitmq.trace"),
}


@pytest.mark.parametrize("form", list(BINDING_SOURCES))
def test_U3_amqp10_source_bind_refused(broker: Broker, form: str) -> None:
    """queue.bind's rule for the link's own queue: write on the queue (the issue's
    hole: configure/read on amq.gen and no write received others' messages, the
    firehose too), then read on the exchange; the refused link's queue is gone."""
    address, exchange = BINDING_SOURCES[form]
    before = broker.queues()
    broker.permit(GEN, "^$", ".*")
    text = refused(broker, "receiver", address)
    assert text.startswith("write access to queue 'amq.gen-"), text
    assert text.endswith(f"in vhost '{broker.vhost}' refused for user '{USER}'"), text
    broker.permit(GEN, GEN, GEN)
    assert refused(broker, "receiver", address) == refusal("read", "exchange", exchange,
                                                           broker)
    assert broker.queues() == before  # nothing left behind by the refused attaches


@pytest.mark.parametrize("form", list(BINDING_SOURCES))
def test_U3_amqp10_source_bind_permitted(broker: Broker, form: str) -> None:
    """The same attach with configure, write and read on amq.gen and read on the
    exchange: attached, and (not the firehose) what guest publishes arrives."""
    address, exchange = BINDING_SOURCES[form]
    broker.permit(GEN, GEN, GEN + "|^" + re.escape(exchange) + "$")
    conn = broker.connect()
    try:
        state, link, cond = attach(conn, "receiver", address)
        assert state == "attached", (state, cond)
        if form == "firehose":
            return
        g = broker.connect("guest", "guest")
        key = {"v1-exchange-key": "k1", "v1-exchange": "any"}.get(form, "a.b")
        g.create_sender(f"/exchange/{exchange}/{key}").send(Message(body=form))
        g.close()
        conn.wait(lambda: link.current is not None and not link.current.partial,
                  timeout=WAIT)
        assert link.current is not None
    finally:
        conn.close()


@pytest.mark.parametrize("address", ["/topic/a.b", "/exchange/amq.topic/a.b", "topic://a.b"])
def test_U3_amqp10_source_topic_permission_refused(broker: Broker, address: str) -> None:
    """A topic exchange's binding key needs the user's topic read permission
    (RabbitMQ 4's v1_attach_source_topic), {username} and {vhost} filled."""
    broker.permit(".*", ".*", ".*")
    broker.topic_permit(".*", "^$")
    try:
        assert refused(broker, "receiver", address) == (
            f"read access to topic 'a.b' in exchange 'amq.topic' in vhost '{broker.vhost}' "
            f"refused for user '{USER}'")
        broker.topic_permit(".*", r"^a\.b$")
        conn = broker.connect()
        try:
            assert attach(conn, "receiver", address)[0] == "attached"
        finally:
            conn.close()
    finally:
        broker.clear_topic()


# -- sources that are queues: read (and /queue/'s declare: configure) -----------------------
QUEUE_SOURCES = {"v2-queue": f"/queues/{QUEUE}", "v1-amq-queue": f"/amq/queue/{QUEUE}",
                 "v1-queue": f"/queue/{QUEUE}", "bare": QUEUE,
                 "activemq-queue": f"queue://{QUEUE}"}


@pytest.mark.parametrize("form", list(QUEUE_SOURCES))
def test_U3_amqp10_source_read_refused(broker: Broker, form: str) -> None:
    """basic.consume's rule: read on the queue; the session ends, as RabbitMQ 4."""
    broker.permit(".*", ".*", "^$")
    assert refused(broker, "receiver", QUEUE_SOURCES[form]) == refusal(
        "read", "queue", QUEUE, broker)
    broker.permit(f"^{QUEUE}$", "^$", f"^{QUEUE}$")
    conn = broker.connect()
    try:
        assert attach(conn, "receiver", QUEUE_SOURCES[form])[0] == "attached"
    finally:
        conn.close()


@pytest.mark.parametrize("form", ["v1-queue", "bare", "activemq-queue"])
def test_U3_amqp10_declaring_address_needs_configure(broker: Broker, form: str) -> None:
    """/queue/, queue:// and a bare name declare their queue (queue.declare: configure,
    whether it exists or not), as source and as target (RabbitMQ 4's
    v1_attach_target_queue)."""
    address = QUEUE_SOURCES[form]
    broker.permit("^$", ".*", ".*")
    for role in ("receiver", "sender"):
        assert refused(broker, role, address) == refusal("configure", "queue", QUEUE, broker)


# -- targets: write on the exchange the messages go to --------------------------------------
TARGETS = {
    "v2-queue": (f"/queues/{QUEUE}", "amq.default"),
    "v1-amq-queue": (f"/amq/queue/{QUEUE}", "amq.default"),
    "v1-queue": (f"/queue/{QUEUE}", "amq.default"),
    "bare": (QUEUE, "amq.default"),
    "activemq-queue": (f"queue://{QUEUE}", "amq.default"),
    "v2-exchange-key": ("/exchanges/amq.direct/k1", "amq.direct"),
    "v2-exchange": ("/exchanges/amq.direct", "amq.direct"),
    "v1-exchange-key": ("/exchange/amq.direct/k1", "amq.direct"),
    "v1-exchange": ("/exchange/amq.direct", "amq.direct"),
    "v1-topic": ("/topic/a.b", "amq.topic"),
    "activemq-topic": ("topic://a.b", "amq.topic"),
    "firehose": ("/exchange/amq.rabbitmq.trace/x", "amq.rabbitmq.trace"),
    "v2-firehose": ("/exchanges/amq.rabbitmq.trace/x", "amq.rabbitmq.trace"),
}


@pytest.mark.parametrize("form", list(TARGETS))
def test_U3_amqp10_target_write_refused_at_attach(broker: Broker, form: str) -> None:
    """basic.publish's rule, checked when the sender attaches (RabbitMQ 4 ends the
    session there), not transfer by transfer."""
    address, exchange = TARGETS[form]
    broker.permit(".*", "^$", ".*")
    assert refused(broker, "sender", address) == refusal("write", "exchange", exchange,
                                                         broker)


@pytest.mark.parametrize("form", [f for f in TARGETS if "firehose" not in f])
def test_U3_amqp10_target_write_permitted(broker: Broker, form: str) -> None:
    """The same attach with write on that exchange only: attached, and a message sent
    is settled (accepted, or released when nothing is bound)."""
    address, exchange = TARGETS[form]
    broker.permit(f"^{QUEUE}$", "^" + re.escape(exchange) + "$", "^$")
    conn = broker.connect()
    try:
        state, _link, cond = attach(conn, "sender", address)
        assert state == "attached", (state, cond)
        snd = conn.create_sender(address)
        snd.send(Message(body=form, subject="k1"))  # raises unless accepted
    except proton.utils.SendException as e:
        assert e.state == proton.Delivery.RELEASED, e
    finally:
        conn.close()


def test_U3_amqp10_topic_write_refused_per_transfer(broker: Broker) -> None:
    """A topic permission is on each message's routing key: the attach succeeds, the
    transfer ends the session (RabbitMQ 4's v1_send_to_topic)."""
    broker.permit(".*", ".*", ".*")
    broker.topic_permit("^$", ".*")
    conn = broker.connect()
    try:
        state, link, _ = attach(conn, "sender", "/topic/a.b")
        assert state == "attached"
        d = link.delivery(b"1")
        link.stream(Message(body="x").encode())
        link.advance()
        ssn = link.session
        conn.wait(lambda: bool(ssn.state & Endpoint.REMOTE_CLOSED), timeout=WAIT)
        assert ssn.remote_condition.name == "amqp:unauthorized-access"
        assert ssn.remote_condition.description == (
            f"write access to topic 'a.b' in exchange 'amq.topic' in vhost "
            f"'{broker.vhost}' refused for user '{USER}'")
        assert d is not None
    finally:
        conn.close()
        broker.clear_topic()


def test_U3_amqp10_anonymous_terminus_checks_each_to(broker: Broker) -> None:
    """The null target (each message's `to` names its node): nothing to check at attach;
    a message to a node the user may not write ends the session, as RabbitMQ 4's
    target_per_message_exchange; one it may write is settled as usual."""
    broker.permit(".*", r"^amq\.fanout$", ".*")
    conn = broker.connect()
    try:
        state, link, _ = attach(conn, "sender", None)  # type: ignore[arg-type]
        assert state == "attached"
        ssn = link.session
        for n, to in enumerate(("/exchanges/amq.fanout", f"/queues/{QUEUE}")):
            d = link.delivery(str(n).encode())
            link.stream(Message(body="x", address=to).encode())
            link.advance()
            conn.wait(lambda d=d: bool(ssn.state & Endpoint.REMOTE_CLOSED)
                      or d.remote_state != 0, timeout=WAIT)
            if n == 0:
                assert d.remote_state == proton.Delivery.RELEASED  # nothing bound
        assert ssn.state & Endpoint.REMOTE_CLOSED
        assert ssn.remote_condition.name == "amqp:unauthorized-access"
        assert ssn.remote_condition.description == refusal(
            "write", "exchange", "amq.default", broker)
    finally:
        conn.close()
