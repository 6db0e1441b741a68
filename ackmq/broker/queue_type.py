"""The queue-type seam, after RabbitMQ's `rabbit_queue_type`: what the channel, the
vhost and recovery may call on a queue, whatever its type. A type is chosen by the
`x-queue-type` argument at declare (`queue_class`); `classic` is ackmq's queue
(broker/queue.py), which also serves `quorum` declarations (same guarantees on one node:
fsynced before confirm, delivery limit). A second type (streams) subclasses `Queue`
and registers itself in `QUEUE_TYPES`; nothing outside a type touches its counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

from mypy_extensions import mypyc_attr

from ackmq.broker.arguments import (
    QUEUE_EQUIVALENCE_KEYS,
    check_consume_arguments,
    check_queue_arguments,
    declared_type,
)
from ackmq.broker.errors import ACCESS_REFUSED, PRECONDITION_FAILED, SoftError

if TYPE_CHECKING:
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.message import Message
    from ackmq.broker.retry import Backoff
    from ackmq.broker.storage import QueuedMessages, Store

# what a channel asks a queue to do with a settled delivery
ACK, REQUEUE, REJECT = "ack", "requeue", "reject"
RECOVER: Final = "recover"  # basic.recover: asked of `check_settle` only (settled as RETURN)
# a requeue the client did not ask for (channel or connection closed, basic.recover,
# consumer timeout): as REQUEUE, except for a back-off of type "failed"/"returned" (L6)
RETURN: Final = "return"


class QueueEntry:
    """One message in one queue: `seq` orders the queue and survives requeue and restart.

    `message` is None only for spilled entries handed back by `ReadyList.clear` (seq and
    flags are all a purge needs).
    """

    __slots__ = ("message", "seq", "delivery_count", "redelivered", "expires_at", "persisted",
                 "queue", "size", "priority")

    def __init__(self, message: Message | None, seq: int, queue: Queue, size: int = 0,
                 priority: int = 0) -> None:
        self.message = message
        if message is not None:
            size, priority = len(message.body), message.priority
        self.size = size
        self.priority = priority
        self.seq = seq
        self.queue = queue
        self.delivery_count = 0   # times returned to the queue after a delivery (D10)
        self.redelivered = False  # D9
        self.expires_at: float | None = None
        self.persisted = False    # written to the store: an ack must remove it there

    def __lt__(self, other: QueueEntry) -> bool:  # heap order for requeued entries
        return self.seq < other.seq


class Host(Protocol):
    """What the queue-type seam knows of a queue's vhost: its name (for the texts). A
    type's own module, above the seam, annotates `vhost` with host.QueueHost; the
    seam stays below the vhost (docs/DESIGN.md, "broker's inner layers")."""

    @property
    def name(self) -> str: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class Queue:
    """A queue of any type. Attributes every type has: `vhost`, `name`, `durable`,
    `exclusive_owner`, `auto_delete`, `arguments`, `deleted`, `consumers` (by id),
    `persistent_store` (the Store when its persistent messages are stored),
    `consumer_timeout` (H2, ms or None), `seq_header` / `count_header` (the opt-in
    delivery headers its deliveries carry).

    A plain base class, not an ABC: `isinstance(x, Queue)` runs on every publish's route,
    and ABCMeta's check costs ~100 ns more; `missing_methods` checks a type instead."""

    kind: ClassVar[str] = ""
    # compared on redeclare, in this order (RabbitMQ: the type's queue_arguments)
    equivalence_keys: ClassVar[tuple[str, ...]] = QUEUE_EQUIVALENCE_KEYS
    server_named: ClassVar[bool] = True  # may be declared with an empty name (amq.gen-…)
    vhost: Host
    name: str
    durable: bool
    exclusive_owner: Any
    auto_delete: bool
    arguments: dict[str, Any]
    deleted: bool
    consumers: dict[int, Consumer]
    persistent_store: Store | None
    consumer_timeout: int | None
    seq_header: bool
    count_header: bool
    # message counters for the UI's per-queue rates (bumped by the channel; class
    # defaults, so a type gets them without doing anything)
    stat_published = 0
    stat_delivered = 0
    stat_acked = 0
    # D6: the queue's dead-letter exchange and routing key (None: none); a type without
    # dead-lettering keeps these defaults
    dlx: str | None = None
    dlrk: str | None = None
    # a queue with x-delayed-delivery: its timer store (broker/delayed.py), else None
    timers: Any = None
    hidden: ClassVar[bool] = False  # a timer store (broker/delayed.py): in no listing, no trace

    def __init__(self, vhost: Host, name: str, durable: bool = False,
                 exclusive_owner: Any = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None, epoch: int = 0) -> None:
        """Every type is made so (VHost.declare_queue, reply_queue); a type's own
        `__init__` calls this for the identity every type has, then sets up its state."""
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})

    # -- counters -----------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Ready messages (queue.declare-ok, basic.get-ok)."""
        raise NotImplementedError

    @property
    def unacked_count(self) -> int:
        """Delivered and not yet settled."""
        raise NotImplementedError

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def browse(self, offset: int, count: int) -> list[QueueEntry]:
        """Ready messages `offset` .. `offset + count` as they would be delivered, the
        queue left as it was (V3 peek; broker/browse.py)."""
        raise NotImplementedError

    # -- declare / recover ----------------------------------------------------------
    @classmethod
    def check_declare(cls, arguments: dict[str, Any], name: str, vhost: str, durable: bool,
                      exclusive: bool, auto_delete: bool) -> None:
        """A new queue's arguments and properties, as RabbitMQ checks them for the type
        (not on redeclare, not on recovery): SoftError on the first bad one."""
        check_queue_arguments(arguments, name, vhost)
        if declared_type(arguments) != "quorum":
            return
        for bad, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                          (not durable, "non-durable")):
            if bad:  # rabbit_quorum_queue:declare's checks, in its order
                raise SoftError(PRECONDITION_FAILED,
                                f"invalid property '{prop}' for queue '{name}' in vhost "
                                f"'{vhost}'")

    @classmethod
    def server_named_ok(cls, arguments: dict[str, Any]) -> bool:
        """May be declared with an empty name (amq.gen-…): not a quorum queue (RabbitMQ's
        server_named capability), even though ackmq serves it with the classic type."""
        return cls.server_named and declared_type(arguments) != "quorum"

    def declared(self, new: bool) -> None:
        """Created: by a client's declare (`new`) or by recovery at start."""

    def recover(self, messages: QueuedMessages, hot: int | None) -> int:
        """Take back the messages the store found at start (seq order); read the first
        `hot` now (None: all) and keep the rest as references. Returns how many."""
        raise NotImplementedError

    # -- publish / consume / deliver --------------------------------------------------
    def publish(self, message: Message) -> bool:
        """Take a message; False when the queue refuses it (a nack, P6)."""
        raise NotImplementedError

    def hold(self) -> None:
        """Keep the next publish, and those after it, from consumers until this turn's
        store commit is durable (an MQTT QoS 2 publish: broker/hold.py). A type whose
        messages are not in the store's commit holds nothing."""

    def check_consume(self, arguments: dict[str, Any], no_ack: bool, exclusive: bool,
                      prefetch: int) -> None:
        """basic.consume's arguments and flags before consume-ok (the consumer's own
        prefetch given): ReplyError when the type refuses them."""
        if arguments:
            check_consume_arguments(arguments, self.name, self.vhost.name,
                                    declared_type(self.arguments))
        if any(c.exclusive for c in self.consumers.values()) or (exclusive and self.consumers):
            raise SoftError(ACCESS_REFUSED, f"queue '{self.name}' in vhost "
                                            f"'{self.vhost.name}' in exclusive use")

    def add_consumer(self, c: Consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, c: Consumer) -> None:
        raise NotImplementedError

    def activate(self, c: Consumer) -> None:
        """`c` has room again: serve it (it calls `c.channel.deliver`)."""
        raise NotImplementedError

    def get(self) -> QueueEntry | None:
        """basic.get: the next ready message, or None."""
        raise NotImplementedError

    def delivered(self, entry: QueueEntry, ack_required: bool) -> None:
        """`entry` went to a consumer or a get; without acks it is settled at once (D3)."""
        raise NotImplementedError

    # -- settle ---------------------------------------------------------------------
    def check_settle(self, action: str) -> None:
        """A client's basic.ack/nack/reject/recover (`action`) on this queue's delivery,
        before anything is settled: ReplyError when the type does not support it."""

    def settle(self, entry: QueueEntry, action: str, backoff: Backoff | None = None) -> bool:
        """An unacked delivery settled by ACK, REQUEUE or RETURN (D6/D8: back in place,
        maybe dead-lettered past a delivery limit, maybe after a back-off: `backoff`, the
        consumer's, else the queue's, L6) or REJECT (dead-letter or drop). True when the
        queue should `dispatch()` once the caller's batch is done."""
        raise NotImplementedError

    def dispatch(self) -> None:
        """Deliver what can be delivered now."""
        raise NotImplementedError

    # -- admin ------------------------------------------------------------------------
    def purge(self) -> int:
        raise NotImplementedError

    def deletion(self, if_unused: bool, if_empty: bool) -> int:
        """queue.delete's checks; the message count delete-ok reports."""
        if if_unused and self.consumers:
            raise SoftError(PRECONDITION_FAILED,
                            f"queue '{self.name}' in vhost '{self.vhost.name}' in use")
        if if_empty and self.message_count:
            raise SoftError(PRECONDITION_FAILED,
                            f"queue '{self.name}' in vhost '{self.vhost.name}' not empty")
        return self.message_count

    def touch(self) -> None:
        """Used now (x-expires countdown)."""
        raise NotImplementedError

    def destroy(self) -> None:
        """Deleted: stop timers, forget everything (the vhost removes its bindings)."""
        raise NotImplementedError

    # -- memory (U5) ------------------------------------------------------------------
    def page_out(self) -> int:
        """Memory alarm: move the ready messages held in memory to disk; how many moved.
        A type that keeps none in memory keeps this default."""
        return 0


INTERFACE = ("message_count", "unacked_count", "recover", "publish", "add_consumer",
             "remove_consumer", "activate", "get", "delivered", "settle", "dispatch",
             "purge", "touch", "destroy", "browse")


def missing_methods(cls: type[Queue]) -> list[str]:
    """The interface methods a queue type does not implement (empty for a complete one)."""
    return [n for n in INTERFACE if getattr(cls, n) is getattr(Queue, n)]


QUEUE_TYPES: dict[str, type[Queue]] = {}


def queue_class(arguments: dict[str, Any]) -> type[Queue]:
    """The type named by `x-queue-type` (checked at declare), `classic` by default."""
    name = arguments.get("x-queue-type") or "classic"
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    return QUEUE_TYPES.get(name, QUEUE_TYPES["classic"])
