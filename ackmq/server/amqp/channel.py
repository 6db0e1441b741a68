"""The AMQP side of a channel: turns methods into calls on the model's `Channel` and the
model's output into frames. One per open channel number of a connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from ackmq.broker.access import ChannelAccess
from ackmq.broker.errors import SoftError
from ackmq.broker.vhost import REPLY_TO
from ackmq.protocol.amqp import build_method as M
from ackmq.protocol.amqp import (
    encode_get_ok,
    encode_method,
)
from ackmq.protocol.amqp.constants import (
    CLASS_TX,
    INTERNAL_ERROR,
    fit_shortstr,
)
from ackmq.protocol.amqp.events import DecodedCancel, DecodedFlow, DecodedReject
from ackmq.server.amqp.frames import ChannelFrames
from ackmq.server.delivery import delivery_properties

if TYPE_CHECKING:
    from ackmq.server.amqp.connection import AMQPConnection

def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "")


def _binding_key(m: C.Queue.Bind | C.Queue.Unbind, queue: str) -> str:
    """As RabbitMQ: an empty routing key means the queue's name only when the queue field
    was empty too."""
    return m.routing_key if m.queue or m.routing_key else queue


class AMQPChannel(ChannelFrames):
    """Implements the model's ChannelOutput for one channel number (its per-message half
    compiled in frames.py) and the channel's methods."""

    conn: AMQPConnection

    def __init__(self, conn: AMQPConnection, number: int) -> None:
        super().__init__(conn, number)
        vhost = conn.vhost
        assert vhost is not None  # channel.open is refused before connection.open
        self.model = conn.ctx.broker.open_channel(vhost, conn, self, conn.user)
        access = conn.ctx.access
        if access is not None:
            self.model.access = ChannelAccess(access, conn.user, vhost.name)

    @property
    def cancel_notify(self) -> bool:
        """The client takes basic.cancel from the broker (L7: a consumer timeout cancels
        its consumer instead of closing the channel, RabbitMQ 4.3)."""
        return bool(self.conn.client_capabilities.get("consumer_cancel_notify"))

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        if not self.conn.client_capabilities.get("consumer_cancel_notify"):
            return
        held = self.conn.held_cancels
        if held is not None:  # the connection's own queue.delete: its reply goes first
            held.append((self, consumer_tag))
            return
        self.send(M(C.Basic.Cancel, consumer_tag=consumer_tag, nowait=True))

    def close(self, code: int, text: str) -> None:
        """The model closes the channel on its own (consumer timeout, H2)."""
        self.fail(SoftError(code, ""), text=text)

    # -- helpers ----------------------------------------------------------------------
    def send(self, method: Any) -> None:
        self.conn.write(encode_method(self.number, method))

    def fail(self, err: SoftError, class_id: int = 0, method_id: int = 0,
             text: str | None = None) -> None:
        """Soft error: close this channel only (requeueing its deliveries, D8)."""
        if self.closing:
            return
        self.closing = True
        self.model.flush_confirms()  # settled ones first, as RabbitMQ (P4)
        self.model.close()
        self.send(M(C.Channel.Close, reply_code=err.code, reply_text=fit_shortstr(text or err.text),
                                  class_id=class_id, method_id=method_id))
        self.conn.ctx.request_flush()

    # -- methods ------------------------------------------------------------------
    def handle(self, m: Any) -> None:
        """`m` is one of HANDLERS' methods (the connection answers any other with 503)."""
        HANDLERS[type(m)](self, m)

    def publish(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool,
                properties: bytes, body: bytes) -> None:
        self.model.basic_publish(exchange, routing_key, mandatory, immediate, properties, body)

    def _channel_close(self, m: C.Channel.Close) -> None:
        # publishes read before the close and already settled are answered first: RabbitMQ
        # does, and a client closing right after publishing still gets its confirms (P4)
        self.model.flush_confirms()
        self.model.close()
        self.send(M(C.Channel.CloseOk))
        self.conn.channel_gone(self.number, by_client=True)

    def _channel_flow(self, m: DecodedFlow) -> None:
        self.model.channel_flow(m.active)
        self.send(M(C.Channel.FlowOk, active=m.active))

    def _exchange_declare(self, m: C.Exchange.Declare) -> None:
        self.model.declare_exchange(m.exchange, _s(m.exchange_type), m.passive, m.durable,
                                    m.auto_delete, m.internal, m.arguments or {})
        if not m.nowait:
            self.send(M(C.Exchange.DeclareOk))

    def _exchange_delete(self, m: C.Exchange.Delete) -> None:
        self.model.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self.send(M(C.Exchange.DeleteOk))

    def _exchange_bind(self, m: C.Exchange.Bind) -> None:
        self.model.bind("exchange", m.destination, m.source, m.routing_key, m.arguments or {})
        if not m.nowait:
            self.send(M(C.Exchange.BindOk))

    def _exchange_unbind(self, m: C.Exchange.Unbind) -> None:
        self.model.unbind("exchange", m.destination, m.source, m.routing_key,
                          m.arguments or {})
        if not m.nowait:
            self.send(M(C.Exchange.UnbindOk))

    def _queue_declare(self, m: C.Queue.Declare) -> None:
        if m.passive and m.queue == REPLY_TO:  # clients probe direct reply-to so (RabbitMQ)
            self.send(M(C.Queue.DeclareOk, queue=REPLY_TO, message_count=0, consumer_count=1))
            return
        q = self.model.declare_queue(m.queue, m.passive, m.durable, m.exclusive,
                                     m.auto_delete, m.arguments or {})
        if not m.nowait:
            self.send(M(C.Queue.DeclareOk, queue=q.name, message_count=q.message_count,
                                        consumer_count=q.consumer_count))

    def _queue_bind(self, m: C.Queue.Bind) -> None:
        name = self.model.queue_name(m.queue)
        self.model.bind("queue", name, m.exchange, _binding_key(m, name), m.arguments or {})
        if not m.nowait:
            self.send(M(C.Queue.BindOk))

    def _queue_unbind(self, m: C.Queue.Unbind) -> None:
        name = self.model.queue_name(m.queue)
        self.model.unbind("queue", name, m.exchange, _binding_key(m, name), m.arguments or {})
        self.send(M(C.Queue.UnbindOk))

    def _queue_purge(self, m: C.Queue.Purge) -> None:
        n = self.model.purge(self.model.queue_name(m.queue))
        if not m.nowait:
            self.send(M(C.Queue.PurgeOk, message_count=n))

    def _queue_delete(self, m: C.Queue.Delete) -> None:
        # as RabbitMQ: delete-ok before the basic.cancel of this connection's consumers
        # (py-amqp, so kombu and Celery, wait for the delete-ok and fail on a cancel)
        held: list[tuple[AMQPChannel, str]] = []
        self.conn.held_cancels = held
        try:
            n = self.model.delete_queue(self.model.queue_name(m.queue), m.if_unused,
                                         m.if_empty)
        finally:
            self.conn.held_cancels = None
        if not m.nowait:
            self.send(M(C.Queue.DeleteOk, message_count=n))
        for ch, tag in held:
            ch.send(M(C.Basic.Cancel, consumer_tag=tag, nowait=True))

    def _basic_qos(self, m: C.Basic.Qos) -> None:
        self.model.basic_qos(m.prefetch_size, m.prefetch_count, m.global_)
        self.send(M(C.Basic.QosOk))

    def _basic_consume(self, m: C.Basic.Consume) -> None:
        tag = self.model.basic_consume(m.queue, m.consumer_tag, m.no_ack, m.exclusive,
                                       m.arguments or {})
        if not m.nowait:
            self.send(M(C.Basic.ConsumeOk, consumer_tag=tag))
        self.model.start_consumer(tag)

    def _basic_cancel(self, m: DecodedCancel) -> None:
        self.model.basic_cancel(m.consumer_tag)
        if not m.nowait:
            self.send(M(C.Basic.CancelOk, consumer_tag=m.consumer_tag))

    def _basic_get(self, m: C.Basic.Get) -> None:
        got = self.model.basic_get(m.queue, m.no_ack)
        if got is None:
            self.send(M(C.Basic.GetEmpty))
            return
        tag, entry, count = got
        msg, q = entry.message, entry.queue
        assert msg is not None  # only a purge's spilled entries come without one
        self.conn.write(encode_get_ok(self.number, tag, entry.redelivered, msg.exchange,
                                      msg.routing_key, count,
                                      delivery_properties(entry, q.seq_header, q.count_header),
                                      msg.body, self.conn.frame_max))

    def _basic_ack(self, m: C.Basic.Ack) -> None:
        self.model.basic_ack(m.delivery_tag, m.multiple)

    def _basic_nack(self, m: C.Basic.Nack) -> None:
        self.model.basic_nack(m.delivery_tag, m.multiple, m.requeue)

    def _basic_reject(self, m: DecodedReject) -> None:
        self.model.basic_reject(m.delivery_tag, m.requeue)

    def _basic_recover(self, m: C.Basic.Recover) -> None:
        self.model.basic_recover(m.requeue)
        self.send(M(C.Basic.RecoverOk))

    def _basic_recover_async(self, m: C.Basic.RecoverAsync) -> None:
        self.model.basic_recover(m.requeue)

    def _confirm_select(self, m: C.Confirm.Select) -> None:
        self.model.confirm_select()
        if not m.nowait:
            self.send(M(C.Confirm.SelectOk))

    def _tx_select(self, m: C.Tx.Select) -> None:
        self.model.tx_select()
        self.send(M(C.Tx.SelectOk))

    def _tx_commit(self, m: C.Tx.Commit) -> None:
        def done(exc: BaseException | None) -> None:
            if self.closing or not self.model.open:
                return
            if exc is None:
                self.send(M(C.Tx.CommitOk))
            else:
                self.fail(SoftError(INTERNAL_ERROR, f"commit failed: {exc}"), CLASS_TX, 20)
            self.conn.ctx.request_flush()
        self.model.tx_commit(done)

    def _tx_rollback(self, m: C.Tx.Rollback) -> None:
        self.model.tx_rollback()
        self.send(M(C.Tx.RollbackOk))


# What a client may send on an open channel, besides channel.open and basic.publish (the
# connection handles those and answers anything else with 503, as RabbitMQ does).
HANDLERS: dict[type, Callable[[AMQPChannel, Any], None]] = {
    C.Channel.Close: AMQPChannel._channel_close,
    C.Channel.Flow: AMQPChannel._channel_flow,
    C.Exchange.Declare: AMQPChannel._exchange_declare,
    C.Exchange.Delete: AMQPChannel._exchange_delete,
    C.Exchange.Bind: AMQPChannel._exchange_bind,
    C.Exchange.Unbind: AMQPChannel._exchange_unbind,
    C.Queue.Declare: AMQPChannel._queue_declare,
    C.Queue.Bind: AMQPChannel._queue_bind,
    C.Queue.Unbind: AMQPChannel._queue_unbind,
    C.Queue.Purge: AMQPChannel._queue_purge,
    C.Queue.Delete: AMQPChannel._queue_delete,
    C.Basic.Qos: AMQPChannel._basic_qos,
    C.Basic.Consume: AMQPChannel._basic_consume,
    C.Basic.Cancel: AMQPChannel._basic_cancel,
    C.Basic.Get: AMQPChannel._basic_get,
    C.Basic.Ack: AMQPChannel._basic_ack,
    C.Basic.Nack: AMQPChannel._basic_nack,
    C.Basic.Reject: AMQPChannel._basic_reject,
    C.Basic.Recover: AMQPChannel._basic_recover,
    C.Basic.RecoverAsync: AMQPChannel._basic_recover_async,
    C.Confirm.Select: AMQPChannel._confirm_select,
    C.Tx.Select: AMQPChannel._tx_select,
    C.Tx.Commit: AMQPChannel._tx_commit,
    C.Tx.Rollback: AMQPChannel._tx_rollback,
}
