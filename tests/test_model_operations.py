"""In-process tests of the operation layer (SPEC C1, C2; broker/operations.py): the verbs
of a `ChannelModel` check permissions (U3, topic permissions too), another connection's
exclusive queue, the reserved names and limits themselves, with RabbitMQ's codes and
texts, and a publish returns its outcome. No sockets: a BrokerModel, an AccessModel and
two channels of two "connections". Each front end's wire behaviour is covered by
tests/test_operation_layer.py."""

from __future__ import annotations

import pytest

from ackmq.broker.access import AccessModel, ChannelAccess
from ackmq.broker.broker import BrokerModel, NullScheduler
from ackmq.broker.errors import AccessRefused, SoftError

PROPS = b"\x00\x00"  # no properties
LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'x' in vhost "
          "'/'. It could be originally declared on another connection or the exclusive "
          "property value does not match that of the original declaration.")


class Output:
    writable = True
    number = 1
    cancel_notify = False

    def __init__(self) -> None:
        self.returned: list[object] = []

    def deliver(self, consumer: object, delivery_tag: int, entry: object) -> None:
        pass

    def unroutable(self, message: object) -> None:
        self.returned.append(message)

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        pass

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        pass

    def close(self, code: int, text: str) -> None:
        raise AssertionError(f"channel closed: {code} {text}")


class World:
    def __init__(self) -> None:
        self.broker = BrokerModel(NullScheduler())
        self.broker.start()
        self.vhost = self.broker.vhost("/")
        self.access = AccessModel()
        self.access.add_vhost("/")
        self.access.add_user("u", "pw")
        self.admin = self.broker.open_channel(self.vhost, "conn-a", Output())

    def channel(self, perms: tuple[str, str, str] | None = None, owner: str = "conn-b",
                ) -> object:
        """A channel of `owner`; with `perms`, user u's checks (configure, write, read)."""
        ch = self.broker.open_channel(self.vhost, owner, Output(), "u")
        if perms is not None:
            self.access.set_permissions("u", "/", *perms)
            ch.access = ChannelAccess(self.access, "u", "/")
        return ch


def refused(fn: object, *args: object, **kw: object) -> SoftError:
    with pytest.raises(SoftError) as e:
        fn(*args, **kw)  # type: ignore[operator]
    return e.value


def denied(perm: str, kind: str, name: str) -> str:
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user 'u'"


def test_C1_verbs_refuse_another_connections_exclusive_queue() -> None:
    w = World()
    w.admin.declare_queue("x", exclusive=True)
    other = w.channel()
    for call in (lambda: other.purge("x"), lambda: other.delete_queue("x"),
                 lambda: other.bind("queue", "x", "amq.direct", "k"),
                 lambda: other.declare_queue("x", passive=True),
                 lambda: other.basic_get("x", True),
                 lambda: other.basic_consume("x", "", True, False, {})):
        e = refused(call)
        assert (e.code, e.text) == (405, LOCKED)
    # its own connection may, and the admin socket's channel (superuser) too
    assert w.admin.purge("x") == 0
    root = w.channel()
    root.superuser = True
    assert root.delete_queue("x") == 0
    assert "x" not in w.vhost.queues


def test_C1_purge_needs_read_and_delete_needs_configure() -> None:
    w = World()
    w.admin.declare_queue("q")
    w.admin.basic_publish("", "q", False, False, PROPS, b"m")
    e = refused(w.channel((".*", ".*", "^$")).purge, "q")
    assert isinstance(e, AccessRefused) and e.permission == "read"
    assert (e.code, e.text) == (403, denied("read", "queue", "q"))
    e = refused(w.channel(("^$", ".*", ".*")).delete_queue, "q")
    assert isinstance(e, AccessRefused) and e.permission == "configure"
    assert (e.code, e.text) == (403, denied("configure", "queue", "q"))
    assert w.channel((".*", ".*", ".*")).purge("q") == 1
    # a missing queue: refused for lack of configure before it is found missing
    e = refused(w.channel(("^$", ".*", ".*")).delete_queue, "nothing")
    assert e.code == 403
    assert w.channel((".*", ".*", ".*")).delete_queue("nothing") == 0


def test_C1_declare_checks_configure_limits_and_arguments() -> None:
    w = World()
    e = refused(w.channel(("^$", ".*", ".*")).declare_queue, "d")
    assert (e.code, e.text) == (403, denied("configure", "queue", "d"))
    # a server-named queue is checked under the name it gets
    e = refused(w.channel(("^nope$", ".*", ".*")).declare_queue, "")
    assert e.code == 403 and "access to queue 'amq.gen-" in e.text
    e = refused(w.channel((".*", ".*", ".*")).declare_queue, "bad",
                arguments={"x-message-ttl": -1})
    assert e.code == 406 and e.text.startswith(
        "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'bad' in vhost '/'")
    # a new queue with a dead-letter exchange: read on itself and write on the DLX
    e = refused(w.channel(("^dl$", "^$", ".*")).declare_queue, "dl",
                arguments={"x-dead-letter-exchange": "dlx"})
    assert e.text == denied("write", "exchange", "dlx")
    w.access.set_vhost_limits("/", {"max-queues": 1})
    ch = w.channel((".*", ".*", ".*"))
    ch.declare_queue("one")
    e = refused(ch.declare_queue, "two")
    assert e.text == ("PRECONDITION_FAILED - cannot declare queue 'two': queue limit in "
                      "vhost '/' (1) is reached")
    assert ch.declare_queue("one").name == "one"  # a redeclare is no new queue
    assert ch.last_queue == "one"


def test_C1_exchange_verbs_guard_reserved_names_then_check_configure() -> None:
    w = World()
    ch = w.channel(("^$", ".*", ".*"))
    e = refused(ch.delete_exchange, "amq.direct")  # the guard before the permission
    assert e.text == ("ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost "
                      "'/' not allowed")
    e = refused(ch.delete_exchange, "")
    assert e.text == "ACCESS_REFUSED - operation not permitted on the default exchange"
    e = refused(ch.delete_exchange, "mine")
    assert e.text == denied("configure", "exchange", "mine")
    e = refused(ch.declare_exchange, "mine", "direct")
    assert e.text == denied("configure", "exchange", "mine")
    ok = w.channel((".*", ".*", ".*"))
    ok.declare_exchange("mine", "direct")
    e = refused(ok.declare_exchange, "mine", "fanout")
    assert e.code == 406 and "inequivalent arg 'type'" in e.text
    ok.delete_exchange("mine")
    assert "mine" not in w.vhost.exchanges


def test_C1_bind_checks_in_rabbit_channels_order() -> None:
    """write on the destination, the default exchange, read on the source, then the
    topic permission on the binding key; then 404 / 405."""
    w = World()
    w.admin.declare_queue("b")
    e = refused(w.channel((".*", "^$", ".*")).bind, "queue", "b", "amq.topic", "k")
    assert e.text == denied("write", "queue", "b")
    e = refused(w.channel((".*", ".*", ".*")).bind, "queue", "b", "", "k")
    assert e.text == "ACCESS_REFUSED - operation not permitted on the default exchange"
    e = refused(w.channel((".*", ".*", "^b$")).bind, "queue", "b", "amq.topic", "k")
    assert e.text == denied("read", "exchange", "amq.topic")
    w.access.set_topic_permissions("u", "/", "amq.topic", ".*", "^allowed$")
    ch = w.channel((".*", ".*", ".*"))
    e = refused(ch.bind, "queue", "b", "amq.topic", "other")
    assert e.text == ("ACCESS_REFUSED - access to topic 'other' in exchange 'amq.topic' in "
                      "vhost '/' refused for user 'u'")
    ch.bind("queue", "b", "amq.topic", "allowed")
    e = refused(ch.bind, "queue", "missing", "amq.topic", "allowed")
    assert e.code == 404
    ch.unbind("queue", "b", "amq.topic", "allowed")
    ch.unbind("queue", "b", "amq.topic", "allowed")  # not bound: succeeds
    assert not w.vhost.exchanges["amq.topic"].bindings


def test_C2_publish_returns_its_outcome() -> None:
    w = World()
    w.admin.declare_queue("p")
    ch = w.channel()
    assert ch.basic_publish("", "p", True, False, PROPS, b"m") == (0, True)
    assert ch.basic_publish("", "nowhere", True, False, PROPS, b"m") == (0, False)
    assert len(ch.output.returned) == 1  # the mandatory return still reaches the output
    ch.confirm_select()
    assert ch.basic_publish("", "p", False, False, PROPS, b"m") == (1, True)
    assert ch.basic_publish("", "nowhere", False, False, PROPS, b"m") == (2, False)
    tx = w.channel()
    tx.tx_select()
    assert tx.basic_publish("", "nowhere", True, False, PROPS, b"m") == (0, True)
