"""A virtual host: its exchanges, queues and bindings, and the declare/bind/delete rules.

Texts of errors follow RabbitMQ 3.10 word for word where clients or users see them.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any, Final, Protocol

from ackmq.broker import dedup, delayed, scheduled
from ackmq.broker.arguments import (
    EXCHANGE_EQUIVALENCE_KEYS,
    check_alternate_exchange_type,
    declared_type,
    type_module,
    type_name,
)
from ackmq.broker.dead_letter import dead_letter_properties
from ackmq.broker.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    HardError,
    SoftError,
    check_shortstr,
    not_found,
)
from ackmq.broker.exchange import (
    EXCHANGE_CLASSES,
    Binding,
    DefaultExchange,
    Exchange,
    args_key,
)
from ackmq.broker.host import BrokerHost, Policies
from ackmq.broker.message import Message
from ackmq.broker.queue import ClassicQueue  # noqa: F401 - registers classic
from ackmq.broker.queue_type import Queue, QueueEntry, queue_class
from ackmq.broker.stats import BrokerStats
from ackmq.broker.storage import BindingDef, ExchangeDef, QueueDef, Store
from ackmq.broker.stream import StreamQueue  # noqa: F401 - registers stream
from ackmq.broker.trace import TRACE_EXCHANGE, Tracer
from ackmq.broker.vhost_store import VHostStore
from ackmq.protocol.amqp.erlang import erl_term


class VHostPolicies(Policies, Protocol):
    def apply_exchange(self, vhost: str, x: Exchange) -> None: ...


class VHostBroker(BrokerHost, Protocol):
    """The broker as a vhost sees it (`BrokerModel`, above the vhost in broker's inner
    layers, satisfies it): what its queue types see, its policies, stats and store."""

    @property
    def policies(self) -> VHostPolicies: ...
    @property
    def stats(self) -> BrokerStats: ...
    @property
    def store(self) -> Store | None: ...

DEFAULT_EXCHANGE_REFUSED: Final = "operation not permitted on the default exchange"
DEFAULT_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"),
                     ("amq.topic", "topic"), ("amq.headers", "headers"),
                     ("amq.match", "headers"))


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _norm(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


REPLY_TO: Final = "amq.rabbitmq.reply-to"  # the pseudo-queue of direct reply-to


class VHost:
    def __init__(self, broker: VHostBroker, name: str = "/") -> None:
        self.broker = broker
        self.name = name
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {"": DefaultExchange(self.queues)}
        for xname, xtype in DEFAULT_EXCHANGES:
            self.exchanges[xname] = EXCHANGE_CLASSES[xtype](xname, durable=True)
        self.exchanges[TRACE_EXCHANGE] = EXCHANGE_CLASSES["topic"](  # M9, as RabbitMQ's
            TRACE_EXCHANGE, durable=True, internal=True)
        self.trace: Tracer | None = None  # the firehose, while on (broker/trace.py)
        # destination id -> bindings that point at it (for delete)
        self._inbound: dict[int, dict[tuple, Binding]] = {}
        self._store: VHostStore | None = None
        # queues routing reaches that no listing shows: delaying exchanges' timer stores
        # by their store names (broker/delayed.py; recovery hands them their messages)
        self.hidden: dict[str, Queue] = {}

    @property
    def store(self) -> Any:
        """The broker's store as this vhost sees it: "/" uses it as is, any other vhost
        through `VHostStore` (names qualified by the vhost); None when not persisting."""
        inner = self.broker.store
        if inner is None or self.name == "/":
            return inner
        if self._store is None or self._store.inner is not inner:
            self._store = VHostStore(inner, self.name)
        return self._store

    # -- lookups --------------------------------------------------------------------
    def exchange(self, name: str) -> Exchange:
        x = self.exchanges.get(name)
        if x is None:
            raise not_found("exchange", name, self.name)
        return x

    def queue(self, name: str, owner: Any = None) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise not_found("queue", name, self.name)
        self.check_exclusive(q, owner)
        return q

    def check_exclusive(self, q: Queue, owner: Any) -> None:
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self._locked(q)

    def _locked(self, q: Queue) -> SoftError:
        return SoftError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{q.name}' in vhost "
            f"'{self.name}'. It could be originally declared on another connection or "
            "the exclusive property value does not match that of the original declaration.")

    # -- exchanges --------------------------------------------------------------------
    def declare_exchange(self, name: str, type_: str, passive: bool, durable: bool,
                         auto_delete: bool, internal: bool, arguments: dict[str, Any],
                         check: bool = True,
                         permit: Callable[[Exchange | None], None] | None = None) -> Exchange:
        """`check=False` (recovery): definitions accepted once are not checked again.
        `permit(existing or None)`: the operation layer's checks (U3, broker/
        operations.py), called where rabbit_channel makes them."""
        if name == "":
            raise SoftError(ACCESS_REFUSED, DEFAULT_EXCHANGE_REFUSED)
        if passive:
            return self.exchange(name)
        if check:
            check_shortstr("exchange name", name)
        if permit is not None:
            permit(self.exchanges.get(name))
        if name.startswith("amq.") and name not in self.exchanges:
            raise SoftError(ACCESS_REFUSED,
                               f"exchange name '{name}' contains reserved prefix 'amq.*'")
        cls = EXCHANGE_CLASSES.get(type_)
        if cls is None:
            raise HardError(COMMAND_INVALID, f"unknown exchange type '{type_}'")
        cls = delayed.exchange_class(cls, arguments)  # x-delayed-delivery (L1)
        x = self.exchanges.get(name)
        if x is not None:
            self._equivalent("exchange", name, "type", type_, x.type)
            self._equivalent("exchange", name, "durable", durable, x.durable)
            self._equivalent("exchange", name, "auto_delete", auto_delete, x.auto_delete)
            self._equivalent("exchange", name, "internal", internal, x.internal)
            for k in EXCHANGE_EQUIVALENCE_KEYS:
                self._equivalent_arg("exchange", name, k, arguments.get(k), x.arguments.get(k))
            return x
        if check:
            check_alternate_exchange_type(arguments, name, self.name)
            cls.validate(arguments)
        x = cls(name, durable=durable, auto_delete=auto_delete, internal=internal,
                arguments=arguments)
        self.broker.policies.apply_exchange(self.name, x)  # its policy (M5)
        self.exchanges[name] = x
        if durable and self.store is not None:
            self.store.save_exchange(
                ExchangeDef(name, type_, durable, auto_delete, internal, dict(arguments)))
        x.declared(self)
        return x

    def check_exchange_deletable(self, name: str) -> None:
        """The default and the `amq.*` exchanges are never deleted (403)."""
        if name == "":
            raise SoftError(ACCESS_REFUSED, DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):
            raise SoftError(ACCESS_REFUSED, f"deletion of system exchange '{name}' in "
                                               f"vhost '{self.name}' not allowed")

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        self.check_exchange_deletable(name)
        x = self.exchanges.get(name)
        if x is None:
            return  # idempotent, as RabbitMQ 3.x
        if if_unused and x.bindings:
            raise SoftError(PRECONDITION_FAILED,
                               f"exchange '{name}' in vhost '{self.name}' in use")
        self._remove_exchange(x)

    def _remove_exchange(self, x: Exchange) -> None:
        self.exchanges.pop(x.name, None)
        for b in list(x.bindings.values()):
            self._unbind(b, check_auto_delete=True)
        for b in list(self._inbound.get(id(x), {}).values()):
            self._unbind(b, check_auto_delete=True)
        self._inbound.pop(id(x), None)
        x.removed()
        scheduled.destination_gone(self, x.name)
        if x.durable and self.store is not None:
            self.store.delete_exchange(x.name)

    # -- queues -----------------------------------------------------------------------
    def declare_queue(self, name: str, passive: bool, durable: bool, exclusive: bool,
                      auto_delete: bool, arguments: dict[str, Any], owner: Any,
                      check: bool = True,
                      permit: Callable[[str, Queue | None], None] | None = None) -> Queue:
        """`check=False` (recovery): definitions accepted once are not checked again.
        `permit(name, existing or None)`: the operation layer's checks (U3, U6; broker/
        operations.py), called once the name is known (a server-named one too)."""
        if passive:
            if name == "":
                raise not_found("queue", name, self.name)
            return self.queue(name, owner)
        if check:
            check_shortstr("queue name", name)
        cls = queue_class(arguments)
        if name == "":
            if check and not cls.server_named_ok(arguments):
                raise SoftError(PRECONDITION_FAILED, "Cannot declare a server-named queue "
                                f"for type {type_module(declared_type(arguments))}")
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        elif check and name.startswith("amq."):  # recovery brings back amq.gen-… ones
            raise SoftError(ACCESS_REFUSED,
                               f"queue name '{name}' contains reserved prefix 'amq.*'")
        q = self.queues.get(name)
        if permit is not None:
            permit(name, q)
        if q is not None:
            # as RabbitMQ: the declaring connection must own the queue exactly when it
            # declares it exclusive (405 either way round), checked before anything else
            if q.exclusive_owner is not (owner if exclusive else None):
                raise self._locked(q)
            self._equivalent("queue", name, "durable", durable, q.durable)
            self._equivalent("queue", name, "auto_delete", auto_delete, q.auto_delete)
            for k in q.equivalence_keys:  # other arguments may differ (RabbitMQ)
                self._equivalent_arg("queue", name, k, arguments.get(k), q.arguments.get(k))
            q.touch()
            self.broker.stats.churn.queues_declared += 1
            return q
        if check:
            cls.check_declare(arguments, name, self.name, durable, exclusive, auto_delete)
        q = cls(self, name, durable=durable and not exclusive,
                  exclusive_owner=owner if exclusive else None, auto_delete=auto_delete,
                  arguments=arguments, epoch=self.broker.epoch)
        q.durable = durable  # declared durability (exclusive queues are never stored)
        if exclusive:
            q.persistent_store = None
        q.declared(new=check)
        self.queues[name] = q
        if check:  # not a recovered one (churn counts since start, as RabbitMQ)
            self.broker.stats.churn.queues_declared += 1
            self.broker.stats.churn.queues_created += 1
        if durable and not exclusive and self.store is not None:
            self.store.save_queue(QueueDef(name, True, auto_delete, dict(arguments)))
        delayed.queue_declared(self, q)
        return q

    def set_queue_arguments(self, q: Queue, arguments: dict[str, Any]) -> None:
        """A front end's own queue whose declared arguments change (MQTT 5's session
        expiry interval, changed by a later CONNECT or by DISCONNECT, is its session
        queues' x-expires): in force at once, and stored again when the queue is."""
        q.arguments = dict(arguments)
        apply = getattr(q, "apply_policy", None)  # the settings of the queue's type
        if apply is not None:
            apply()
        if q.durable and not q.exclusive_owner and self.store is not None:
            self.store.save_queue(QueueDef(q.name, True, q.auto_delete, dict(arguments)))

    def reply_queue(self, owner: Any) -> Queue:
        """Direct reply-to (RabbitMQ's `amq.rabbitmq.reply-to`): a consumer's own
        non-durable, auto-delete queue, named `amq.rabbitmq.reply-to.<token>` so a reply
        published to the default exchange with that name as key reaches it."""
        name = f"{REPLY_TO}.{base64.urlsafe_b64encode(os.urandom(18)).decode()}"
        q = queue_class({})(self, name, durable=False, exclusive_owner=owner,
                            auto_delete=True, arguments={}, epoch=self.broker.epoch)
        q.persistent_store = None
        self.queues[name] = q
        return q

    def delete_queue(self, q: Queue, notify: bool = True, if_unused: bool = False,
                     if_empty: bool = False) -> int:
        count = q.deletion(if_unused, if_empty)
        if self.queues.get(q.name) is q:
            del self.queues[q.name]
            self.broker.stats.churn.queues_deleted += 1
        for c in list(q.consumers.values()):
            q.consumers.pop(id(c), None)
            c.channel.consumer_gone(c, notify=notify)
        for b in list(self._inbound.get(id(q), {}).values()):
            self._unbind(b, check_auto_delete=True)
        self._inbound.pop(id(q), None)
        was_stored = q.persistent_store is not None
        delayed.queue_deleted(self, q)
        scheduled.destination_gone(self, "", q.name)
        q.destroy()
        if was_stored and self.store is not None:
            self.store.delete_queue(q.name)
        return count

    def connection_closed(self, owner: Any) -> None:
        """Exclusive queues go with the connection that declared them."""
        for q in [q for q in self.queues.values() if q.exclusive_owner is owner]:
            self.delete_queue(q, notify=False)

    # -- bindings ---------------------------------------------------------------------
    def bind(self, source: str, destination: Any, routing_key: str,
             arguments: dict[str, Any]) -> None:
        if source == "" or (getattr(destination, "name", None) == ""
                            and not isinstance(destination, Queue)):
            raise SoftError(ACCESS_REFUSED, DEFAULT_EXCHANGE_REFUSED)
        x = self.exchange(source)
        if x.type == "headers":
            mode = _norm((arguments or {}).get("x-match", "all"))
            if mode not in ("all", "any", "all-with-x", "any-with-x"):
                raise SoftError(PRECONDITION_FAILED, f"Invalid x-match field value {erl_term(str(mode))}; "
                                   "expected all, any, all-with-x, or any-with-x")
        b = Binding(x, destination, routing_key, arguments)
        if x.bind(b):
            self._inbound.setdefault(id(destination), {})[b.key] = b
            store = self.store
            if store is not None and x.durable and destination.durable and not getattr(
                    destination, "exclusive_owner", None):
                store.save_binding(self._binding_def(b))

    def bindings_to(self, destination: Any) -> list[tuple[str, str, dict[str, Any]]]:
        """(source exchange, routing key, arguments) of each binding to `destination`."""
        return [(b.source.name, b.routing_key, b.arguments)
                for b in self._inbound.get(id(destination), {}).values()]

    def unbind(self, source: str, kind: str, destination: str, routing_key: str,
               arguments: dict[str, Any], owner: Any = None) -> None:
        """As RabbitMQ: unbinding what is not bound succeeds, whether the binding, its
        source or its destination (`kind` "queue" or "exchange") is missing; only the
        default exchange (403) and another connection's exclusive queue (405, when the
        binding exists) refuse."""
        if source == "" or (kind == "exchange" and destination == ""):
            raise SoftError(ACCESS_REFUSED, DEFAULT_EXCHANGE_REFUSED)
        x = self.exchanges.get(source)
        dest = (self.queues if kind == "queue" else self.exchanges).get(destination)
        if x is None or dest is None:
            return
        b = x.bindings.get((id(dest), routing_key, args_key(arguments)))
        if b is None:
            return
        if isinstance(dest, Queue):
            self.check_exclusive(dest, owner)
        self._unbind(b, check_auto_delete=True)

    def _unbind(self, b: Binding, check_auto_delete: bool) -> None:
        x = b.source
        x.unbind(b.key)
        inbound = self._inbound.get(id(b.destination))
        if inbound is not None:
            inbound.pop(b.key, None)
        store = self.store
        if store is not None and x.durable and b.destination.durable:
            store.delete_binding(self._binding_def(b))
        if check_auto_delete and x.auto_delete and not x.bindings and \
                self.exchanges.get(x.name) is x:
            self._remove_exchange(x)

    @staticmethod
    def _binding_def(b: Binding) -> BindingDef:
        kind = "queue" if isinstance(b.destination, Queue) else "exchange"
        return BindingDef(b.source.name, b.destination.name, kind, b.routing_key,
                          dict(b.arguments))

    # -- routing ----------------------------------------------------------------------
    def route(self, x: Exchange, message: Message) -> list[Queue]:
        dests = x.route(message.routing_key, message)
        if message.cc:
            dests = list(dests)
            for key in message.cc:
                dests.extend(x.route(key, message))
        if not dests:
            if x.alternate is None:
                return []
        elif len(dests) == 1 and isinstance(dests[0], Queue):
            return [dests[0]]
        return self._route_graph(x, dests, message)

    def _route_graph(self, x: Exchange, dests: list[Any], message: Message) -> list[Queue]:
        """Through exchange-to-exchange bindings and alternate exchanges, as RabbitMQ's
        route1: every exchange reached that routes the message nowhere hands it to its
        alternate exchange (if that exists); each exchange is visited once (cycles)."""
        out: list[Queue] = []
        seen: set[int] = {id(x)}
        work: list[tuple[Exchange, list[Any]]] = [(x, dests)]
        while work:
            ex, ds = work.pop()
            if not ds and ex.alternate is not None:
                ae = self.exchanges.get(ex.alternate)
                ds = [ae] if ae is not None else []
            for d in ds:
                if id(d) in seen:
                    continue
                seen.add(id(d))
                if isinstance(d, Queue):
                    out.append(d)
                else:
                    nd = list(d.route(message.routing_key, message))
                    for key in message.cc:
                        nd.extend(d.route(key, message))
                    work.append((d, nd))
        return out

    def feeds_dedup(self, q: Queue) -> bool:
        """True when a dedup exchange is bound to `q`: at start `q` reads back all its
        stored messages so the exchange remembers their ids again."""
        return any(isinstance(b.source, dedup.DedupExchange)
                   for b in self._inbound.get(id(q), {}).values())

    # -- dead-lettering (D6) ------------------------------------------------------------
    def dead_letter(self, queue: Queue, entry: QueueEntry, reason: str,
                    exchange: str | None = None, routing_key: str | None = None) -> None:
        """`exchange`/`routing_key`, when given, stand in for the queue's DLX and its key
        (a STOMP subscription in ActiveMQ form dead-letters to ActiveMQ.DLQ)."""
        dlx = queue.dlx if exchange is None else exchange
        x = self.exchanges.get(dlx or "")
        if x is None or dlx is None:
            return
        msg = entry.message
        assert msg is not None  # only a purge's spilled entries come without one
        dlrk = queue.dlrk if exchange is None else routing_key
        rk = dlrk if dlrk is not None else msg.routing_key
        props, deaths = dead_letter_properties(msg, queue.name, reason,
                                               drop_cc=dlrk is not None)
        new = Message(x.name, rk, props, msg.body)
        if self.trace is not None:
            self.trace.dead_lettered(queue, entry, reason, x, new)
        automatic = all(_norm(d.get("reason")) != "rejected" for d in deaths)
        for target in self.route(x, new):
            if automatic and any(_norm(d.get("queue")) == target.name for d in deaths):
                continue  # a cycle with no rejection in it: dropped, as RabbitMQ does
            target.publish(new)

    # -- equivalence ------------------------------------------------------------------
    def _equivalent(self, kind: str, name: str, field: str, received: Any, current: Any) -> None:
        if received != current:
            raise SoftError(
                PRECONDITION_FAILED,
                f"inequivalent arg '{field}' for {kind} '{name}' in vhost '{self.name}': "
                f"received '{_show(received)}' but current is '{_show(current)}'")

    def _equivalent_arg(self, kind: str, name: str, key: str, received: Any,
                        current: Any) -> None:
        if _norm(received) == _norm(current):
            return
        if received is not None and current is not None:
            self._equivalent(kind, name, key, received, current)

        def desc(v: Any) -> str:
            if v is None:
                return "none"
            return f"the value '{_show(v)}' of type '{type_name(v)}'"

        raise SoftError(
            PRECONDITION_FAILED,
            f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{self.name}': "
            f"received {desc(received)} but current is {desc(current)}")
