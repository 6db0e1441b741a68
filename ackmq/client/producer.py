"""BaseProducer: publishes to a queue or a topic, with confirms, batches and idempotent
re-sends across a reconnect. Written once as steps (see steps.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core import Chan
from .errors import (
    ClientError,
    ConfirmTimeout,
    ConnectionLost,
    NackError,
    PublishError,
    ReturnedError,
)
from .message import (
    DEDUP_HEADER,
    OutboundMessage,
    message_id_prefix,
    next_id,
)
from .options import (
    Destination,
)
from .steps import RECONNECT, Step, wait

if TYPE_CHECKING:
    from .session import BaseSession


class BaseProducer:
    """Publishes to a queue (default exchange, mandatory: an unroutable message is an
    error) or a topic (amq.topic; no subscriber is not an error, as in JMS)."""

    def __init__(self, session: BaseSession, dest: Destination) -> None:
        self.session = session
        self.dest = dest
        if dest.kind == "queue":
            self.exchange, self.routing_key, self.mandatory = "", dest.name, True
        else:
            self.exchange, self.routing_key, self.mandatory = "amq.topic", dest.name, False
        self.name = f"{session.id}:{next(session._producer_ids)}"
        self._id_prefix = message_id_prefix(self.name)
        self.failed: list[OutboundMessage] = []
        self._last_seq = 0
        self._chan: Chan | None = None
        self._dedup = session.conn.idempotent  # the id also in x-deduplication-header
        session.producers.append(self)

    def prepare_g(self, deadline: float | None) -> Step:
        if self.dest.kind == "queue":
            yield from self.session.conn._ensure_queue_g(self.dest.name, deadline)

    def build(self, body: bytes | str | OutboundMessage, headers: dict[str, Any] | None,
              persistent: bool, message_id: str | None, props: dict[str, Any]
              ) -> OutboundMessage:
        if isinstance(body, OutboundMessage):
            return body
        if "delivery_delay" in props:
            props = dict(props)
            headers = self._delayed(headers, props.pop("delivery_delay"))
        if message_id is None:
            message_id = self._id_prefix + str(next_id())
            if headers is None and not props and type(body) is bytes:
                return OutboundMessage.plain(body, self.exchange, self.routing_key,
                                             self.mandatory, message_id, persistent,
                                             self._dedup)
        if self._dedup and (headers is None or DEDUP_HEADER not in headers):
            headers = {**(headers or {}), DEDUP_HEADER: message_id}
        return OutboundMessage.build(body, self.exchange, self.routing_key, self.mandatory,
                                     message_id, headers=headers, persistent=persistent,
                                     **props)

    def _delayed(self, headers: dict[str, Any] | None, delay: float | None
                 ) -> dict[str, Any] | None:
        """JMS 2.0 setDeliveryDelay: `delivery_delay` seconds, sent as the `x-delay`
        header (ms), which ackmq honours when the queue (or the exchange) opts in with
        `x-delayed-delivery: true` (docs/delays.md). RabbitMQ would deliver at once, so
        the client refuses rather than deliver early."""
        if not delay:
            return headers
        if delay < 0:
            raise ClientError(f"delivery_delay must be >= 0, got {delay}")
        if self.session.conn.broker_is_ackmq is False:
            raise ClientError("delivery_delay needs ackmq: RabbitMQ without the delayed-"
                              "message exchange would deliver the message at once")
        return {**(headers or {}), "x-delay": round(delay * 1000)}

    def publish_now(self, msg: OutboundMessage, failed: list | None) -> Any:
        s = self.session
        s.check()
        assert s.chan is not None
        fut = s.conn.new_future()
        s.chan.publish(msg, fut, failed)
        if s.transacted:
            s.tx_dirty = True
            fut.set_result(None)
        return fut

    def _publish_g(self, msg: OutboundMessage, deadline: float | None) -> Step:
        """publish_now; an idempotent producer that finds the connection lost first asks
        for the reconnect and publishes then."""
        while True:
            try:
                return self.publish_now(msg, None)
            except ConnectionLost:
                if not self.session.conn.resending or self.session.transacted:
                    raise
            yield (RECONNECT, deadline)

    def send_g(self, msg: OutboundMessage, deadline: float | None) -> Step:
        """J10 one by one: publish and wait for the confirm (or nothing, transacted)."""
        fut = yield from self._publish_g(msg, deadline)
        if self.session.transacted:
            return
        try:
            yield from self._confirmed_g(fut, deadline)
        except TimeoutError:
            raise ConfirmTimeout(f"no confirm for {msg!r} in time") from None

    def _confirmed_g(self, fut: Any, deadline: float | None) -> Step:
        """Wait for one publish's confirm; an idempotent producer's publish lost with the
        connection is re-sent by the reconnect this asks for, and waited for again."""
        while True:
            try:
                return (yield from wait(fut, deadline))
            except ConnectionLost:
                if fut.done() or not self.session.conn.resending:
                    raise
            yield (RECONNECT, deadline)

    def send_batch_g(self, msgs: list[OutboundMessage], deadline: float | None) -> Step:
        """J10 batches: publish all, one wait for all their confirms."""
        futures = []
        for m in msgs:
            futures.append((yield from self._publish_g(m, deadline)))
        if self.session.transacted:
            return
        failed: list[OutboundMessage] = []
        nacked = False
        first: PublishError | None = None
        for i, fut in enumerate(futures):
            try:
                yield from self._confirmed_g(fut, deadline)
            except PublishError as err:
                failed.extend(err.messages)
                nacked = nacked or isinstance(err, NackError)
                first = first or err
            except TimeoutError:
                rest = [m for m, f in zip(msgs[i:], futures[i:], strict=True)
                        if not f.done() or f.exception() is not None]
                raise ConfirmTimeout(f"{len(rest)} of {len(msgs)} messages not confirmed "
                                     f"in time") from None
        if failed:
            cls = NackError if nacked else ReturnedError
            raise cls(f"{len(failed)} of {len(msgs)} messages not taken: {first}", failed)

    def track_seq(self) -> None:
        """Remember the sequence number of this producer's latest publish()."""
        chan = self.session.chan
        if chan is not None and chan.confirm:
            self._last_seq = chan.next_seq - 1
            self._chan = chan

    def wait_for_confirms_g(self, deadline: float | None) -> Step:
        """Until every publish() of this producer is settled (acked, nacked, returned).
        The channel's outstanding map is sorted: wait while its first entry is one of
        ours or older (other producers of the session may make this wait a little
        longer, never shorter)."""
        chan = self._chan
        if chan is None:
            return
        last = self._last_seq
        while True:
            if chan.error is not None:
                if not self.session.resend:
                    return  # the channel is gone; its publishes are in take_failed()
                yield (RECONNECT, deadline)  # idempotent: kept, re-sent by the reconnect
                chan, last = self._chan, self._last_seq
                assert chan is not None
                continue
            outstanding = chan.outstanding
            if not outstanding:
                return
            seq = next(iter(outstanding))
            if seq > last:
                return
            try:
                yield (outstanding[seq].future, deadline)
            except TimeoutError:
                left = sum(1 for s in outstanding if s <= last)
                raise ConfirmTimeout(f"{left} publishes not yet confirmed") from None
            except ClientError:
                pass  # a nack or return (in take_failed()), or the channel gone (above)

    def take_failed(self) -> list[OutboundMessage]:
        """Nacked, returned, or lost-with-the-connection publishes, handed back for the
        caller to publish again (never re-published from the I/O path, J10)."""
        failed, self.failed = self.failed, []
        return failed

