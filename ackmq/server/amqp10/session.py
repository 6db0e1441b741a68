"""One AMQP 1.0 session (SPEC A3-A5): one model channel (as RabbitMQ 4's session is one
channel), the session windows (part 2.5.6), the links by handle, and the channel's
`ChannelOutput`: deliveries become transfers on the consumer's link, confirms become
dispositions on the publisher's link.

Sender settlement (A3): every transfer from a client is published in confirm mode;
an unsettled one is answered when the model confirms it -- `accepted` once it is stored
(after fsync for a durable message to a durable queue: P5c), `released` when it reached
no queue (RabbitMQ 4), `rejected` when a queue refused it; a pre-settled one is never
answered (at most once).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, cast

from ackmq.broker.access import ChannelAccess
from ackmq.protocol.amqp10 import Composite, Frame, encode_frame, encode_frames, error
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.types import UInt
from ackmq.server.amqp10.errors import AmqpError, LinkError, SessionError
from ackmq.server.amqp10.links import Incoming, Outgoing
from ackmq.server.amqp10.transfers import INCOMING_WINDOW, SessionTransfers

if TYPE_CHECKING:
    from ackmq.broker.message import Message
    from ackmq.server.amqp10.connection import AMQP10Connection

log = logging.getLogger("ackmq.amqp10")


class Session(SessionTransfers):
    conn: AMQP10Connection

    def __init__(self, conn: AMQP10Connection, channel: int, begin: Composite) -> None:
        self.conn = conn
        self.number = channel  # ChannelOutput: the number the model's texts name
        self.channel_number = channel
        vhost = conn.vhost
        assert vhost is not None
        ctx = conn.ctx
        self.channel = ctx.broker.open_channel(vhost, conn, self, conn.user, "amqp10")
        self.channel.access = ChannelAccess(ctx.access, conn.user, vhost.name)
        self.channel.confirm_select()
        self.links = {}  # by the client's handle
        self.by_tag = {}
        self.delivered_on = {}
        self.management_link = None
        self.detaching = set()
        # outgoing (to the client)
        self.next_outgoing_id = 0
        self.remote_incoming_window = int(begin.incoming_window)
        # incoming (from the client)
        self.next_incoming_id = int(begin.next_outgoing_id)
        self.incoming_window = INCOMING_WINDOW
        self.remote_outgoing_window = int(begin.outgoing_window)
        self.pending = OrderedDict()
        self.released = set()
        self.open = True

    # -- ChannelOutput ------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        return self.conn.writable and self.remote_incoming_window > 0

    def begin(self) -> None:
        self.write(Composite("begin", remote_channel=self.channel_number,
                             next_outgoing_id=UInt(0), incoming_window=UInt(self.incoming_window),
                             outgoing_window=UInt(0xFFFFFFFF), handle_max=UInt(255)))

    def write(self, p: Composite, payload: bytes = b"") -> None:
        self.conn.write(encode_frame(self.channel_number, p, payload))

    def send_transfer(self, link: Outgoing, payload: bytes) -> None:
        """A pre-settled transfer outside the model (the management node's replies)."""
        transfer = Composite("transfer", handle=UInt(link.handle),
                             delivery_id=UInt(self.next_outgoing_id),
                             delivery_tag=self.next_outgoing_id.to_bytes(8, "big"),
                             message_format=UInt(0), settled=True)
        frames = encode_frames(self.channel_number, transfer, payload, self.conn.max_frame_size)
        for fr in frames:
            self.conn.write(fr)
        self.next_outgoing_id = (self.next_outgoing_id + 1) & 0xFFFFFFFF
        self.remote_incoming_window -= len(frames)
        link.delivery_count = (link.delivery_count + 1) & 0xFFFFFFFF

    def unroutable(self, message: Message) -> None:
        """`basic_publish` returns it: the transfer's outcome says `released`."""

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        """The queue went away: detach the link with RabbitMQ 4's resource-deleted (the
        ChannelOutput signature; `reason` is only given for a consumer timeout, which
        1.0 sessions do not get: they have no `cancel_notify`, so the model ends the
        session instead, with the timeout's text)."""
        link = self.by_tag.pop(consumer_tag, None)
        if link is None or not self.open:
            return
        self.links.pop(link.handle, None)
        link.detached()
        self.detaching.add(link.handle)
        self.write(Composite("detach", handle=UInt(link.handle), closed=True,
                             error=error(F.RESOURCE_DELETED, "the queue was deleted")))

    def close(self, code: int = 0, text: str = "") -> None:
        """The model closed the channel (consumer timeout), or the session ends."""
        if text and self.open:  # from the model: end the session with the reason
            self.write(Composite("end", error=error(F.PRECONDITION_FAILED, text)))
            self.conn.sessions.pop(self.channel_number, None)
        self.open = False
        self.by_tag.clear()
        self.links.clear()
        self.pending.clear()
        self.channel.close()

    def alarm_cleared(self) -> None:
        for link in list(self.links.values()):
            if isinstance(link, Incoming):
                link.top_up()

    # -- frames ---------------------------------------------------------------------------------
    def frame(self, f: Frame) -> None:
        p = f.performative
        if p.kind == "transfer":  # the Decoder checked the fields' types
            self.transfer(p.handle, p.delivery_id, p.settled, p.more, p.aborted, f.payload)
            return
        try:
            if p.kind == "flow":
                self._flow(p)
            elif p.kind == "disposition":
                self.disposition(p.role, p.first, p.last, p.settled, p.state)
            elif p.kind == "attach":
                self._attach(p)
            elif p.kind == "detach":
                self._detach(p)
            else:
                raise AmqpError(F.ILLEGAL_STATE, f"unexpected {p.kind} on a session")
        except LinkError as e:
            if p.kind not in ("attach", "detach", "flow"):
                # a disposition names deliveries, not a link: its error ends the session
                self.end(e)
                return
            self.link_error(int(p.handle), e)
        except SessionError as e:
            self.end(e)

    def link_error(self, handle: int, e: LinkError) -> None:
        """Detach the link with the error (closed)."""
        link = self.links.pop(handle, None)
        if link is not None:
            link.detached()
        self.detaching.add(handle)
        self.write(Composite("detach", handle=UInt(handle), closed=True,
                             error=error(e.condition, e.description)))

    def end(self, e: AmqpError) -> None:
        self.conn.sessions.pop(self.channel_number, None)
        self.write(Composite("end", error=error(e.condition, e.description)))
        self.close()

    def _attach(self, p: Composite) -> None:
        self.detaching.discard(int(p.handle))
        if p.handle in self.links:
            raise SessionError(F.HANDLE_IN_USE, f"handle {p.handle} is in use")
        if p.role is False:  # the client sends: our receiving end
            link: Incoming | Outgoing = Incoming(self, p)
        else:
            link = Outgoing(self, p)
        self.links[int(p.handle)] = link
        try:
            link.attach()
        except LinkError:
            self.links.pop(int(p.handle), None)
            link.refuse_attach()
            raise
        except Exception:
            self.links.pop(int(p.handle), None)
            raise

    def _detach(self, p: Composite) -> None:
        if int(p.handle) in self.detaching:  # the answer to ours: the handle is free again
            self.detaching.discard(int(p.handle))
            return
        link = self.links.pop(int(p.handle), None)
        if link is None:
            raise SessionError(F.UNATTACHED_HANDLE, f"detach of handle {p.handle}, which is "
                                                    "not attached")
        link.detached()
        self.write(Composite("detach", handle=UInt(link.handle), closed=p.closed or None))

    def _link(self, handle: Any) -> Incoming | Outgoing:
        link = cast("Incoming | Outgoing | None", self.links.get(handle))
        if link is None:
            raise SessionError(F.UNATTACHED_HANDLE, f"handle {handle} is not attached")
        return link

    def session_flow(self, link: Any = None) -> None:
        fields: dict[str, Any] = dict(
            next_incoming_id=UInt(self.next_incoming_id), incoming_window=UInt(
                max(0, self.incoming_window)),
            next_outgoing_id=UInt(self.next_outgoing_id), outgoing_window=UInt(0xFFFFFFFF))
        if link is not None:
            fields.update(link.flow_fields())
        self.write(Composite("flow", **fields))

    def _flow(self, p: Composite) -> None:
        nid = 0 if p.next_incoming_id is None else int(p.next_incoming_id)
        self.remote_incoming_window = nid + int(p.incoming_window) - self.next_outgoing_id
        was_blocked = self.remote_incoming_window <= 0
        if p.handle is not None:
            if int(p.handle) in self.detaching:
                return  # sent before the client saw our detach
            link = self._link(p.handle)
            link.flow(p)
        elif p.echo:
            self.session_flow()
        if not was_blocked:
            self.channel.wake()
