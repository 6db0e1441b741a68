"""One STOMP 1.0/1.1/1.2 connection (SPEC W1-W9) on the same broker model as AMQP.

A STOMP connection is one model `ChannelModel` (as in RabbitMQ's plugin) and implements its
`ChannelOutput`: a subscription is a `Consumer`, a SEND is a `basic_publish`, ACK and
NACK settle deliveries of one subscription (`ChannelModel.take_for_consumer`). Receipts for
SENDs ride on publisher confirms: the first SEND with a `receipt` puts the channel in
confirm mode, and its RECEIPT goes out when the confirm does, i.e. after the group
commit's fsync for a persistent message to a durable queue (W7, P5c). STOMP
transactions are kept here, named, and replayed at COMMIT (W8); the model's own
(one-per-channel) transaction is not used.

Errors: a problem with a frame is answered with an ERROR frame (`message` names it,
the body explains it, as RabbitMQ words it where RabbitMQ has a text), then the
connection closes (W9): its unacked deliveries go back (D8), its open transactions are
dropped. Output is buffered and written once per event-loop turn, as for AMQP.
"""

from __future__ import annotations

import base64
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ackmq.broker import scheduled
from ackmq.broker.access import ChannelAccess
from ackmq.broker.confirms import take_confirmed
from ackmq.broker.errors import ReplyError
from ackmq.protocol.foreign import STOMP_FRAME, describe, name_bytes
from ackmq.protocol.stomp import (
    VERSIONS,
    Decoder,
    Destination,
    DestinationError,
    Frame,
    StompError,
    encode_frame,
    format_destination,
    message_headers,
    parse_destination,
    properties_from_headers,
)
from ackmq.protocol.stomp.destinations import QUEUE, TEMP_QUEUE, TOPIC
from ackmq.server import admission
from ackmq.server.admission import LOOPBACK_ONLY, VHOST_ACCESS, Refusal
from ackmq.server.delivery import delivery_properties
from ackmq.server.stomp import scheduler
from ackmq.server.stomp.refusal import Refused, quoted
from ackmq.server.stomp.states import TRANSITIONS, StompState
from ackmq.server.stomp.states import StompState as S
from ackmq.server.stomp.subscriptions import Subscription, Subscriptions
from ackmq.server.stomp.transactions import Receipt, Transactions
from ackmq.server.transport import ClientConnection, events_from

# per-frame state reads as module globals (an enum class attribute lookup costs ~75 ns
# on Python 3.11, a global ~15)
_CONNECT, _OPEN = S.CONNECT, S.OPEN
_LIVE = (_CONNECT, _OPEN)

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.message import Message
    from ackmq.broker.queue_type import QueueEntry
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.stomp")

SUPPORTED = ",".join(VERSIONS)
# MESSAGE headers the broker writes itself: application headers of these names are dropped
OWN_HEADERS = frozenset(("subscription", "destination", "message-id", "redelivered", "ack",
                         "content-length"))


def _heartbeat_ms(ms: int) -> int:
    """RabbitMQ rounds heart-beats to whole seconds, at least one."""
    if ms <= 0:
        return 0
    return 1000 if ms < 1000 else ms // 1000 * 1000


class StompConnection(Subscriptions, Transactions, ClientConnection):
    """Implements the model's ChannelOutput for the connection's one channel."""

    number = 1  # the channel's number in texts the model writes (consumer timeout)
    transitions = TRANSITIONS
    heartbeat_frame = b"\n"  # an EOL (W2)
    forced_close_states = frozenset({S.OPEN, S.DISCONNECTING})
    log = log
    cancel_notify = True  # L7: a timed-out subscription gets its ERROR; the others stay

    def __init__(self, ctx: FrontEnd) -> None:
        super().__init__(ctx)
        self.decoder = Decoder(max_body=ctx.config.max_message_size)
        self.state: StompState = S.CONNECT  # transitions: states.py
        self.version: str | None = None
        self.session = ""
        self.channel: ChannelModel | None = None
        self.subs: dict[str, Subscription] = {}          # by consumer tag
        self.timed_out: set[str] = set()  # L7: subscriptions a consumer timeout ended
        self.reply_queues: dict[str, str] = {}   # temp-queue id -> queue name
        self.txs: dict[str, list[tuple[Any, ...]]] = {}
        self.receipts: OrderedDict[int, list[Receipt]] = OrderedDict()  # confirm seq ->
        self.disconnect_receipt: str | None = None
        self.send_ms = self.recv_ms = 0
        self._resume = False  # the decoder waited for the version after CONNECT

    def _input(self, data: bytes) -> None:
        if self.state not in _LIVE:
            return
        if self.state == S.CONNECT and self.recv_oct == len(data) and self._foreign(data):
            return
        while True:
            error = None
            try:
                events = self.decoder.feed(data)
            except StompError as e:  # the frames before the bad one count (W9)
                events, error = e.frames, e
            if self._frames(events, error):
                break  # a SEND during a resource alarm: the rest waits in `held` (U5)
            if not (self._resume and self.state == S.OPEN):
                break
            self._resume = False  # CONNECTED is out: parse what waited, as `version`
            data = b""
        self.ctx.request_flush()

    def _foreign(self, head: bytes) -> bool:
        """A client of another protocol (MQTT, TLS, HTTP, AMQP, the stream protocol) on
        the STOMP port: an ERROR naming what came, and close, instead of waiting for a
        NUL that never comes until the handshake timeout (RabbitMQ 3.10's STOMP waits
        10 s in silence, logging only the timeout)."""
        what = describe(head)
        if what is None or what == STOMP_FRAME:
            return False
        self._error("Not STOMP", f"expected a STOMP CONNECT frame, got {name_bytes(head)}")
        return True

    def _frames(self, events: list[Any], error: StompError | None) -> bool:
        """Handle decoded frames, then the decoder's error if any. True: a SEND during a
        resource alarm blocked the connection (U5, as RabbitMQ's STOMP reader); the
        frames after it and the error are held until the alarm clears."""
        blocking = self.ctx.blocking
        for ev in events:
            if self.state not in _LIVE:
                break
            if type(ev) is Frame:
                self._frame(ev)
                if blocking and ev.command == "SEND" and self.state == _OPEN:
                    self.block_for_alarm(events_from(events + [error], ev)[1:])
                    return True
        if error is not None and self.state in (S.CONNECT, S.OPEN):
            self._error(error.message, error.detail)
        return False

    def _handle_held(self, held: list[Any]) -> None:
        *frames, error = held
        if self.state in (S.CONNECT, S.OPEN):
            self._frames(frames, error)

    @property
    def vhost_name(self) -> str | None:
        return None if self.channel is None else self.channel.vhost.name

    @property
    def protocol(self) -> str:  # type: ignore[override]
        return f"STOMP {self.version or '1.2'}"  # the negotiated version

    def open_channels(self) -> list[tuple[int, Any]]:
        ch = self.channel
        return [(1, ch)] if ch is not None and ch.open else []

    # -- frames -------------------------------------------------------------------------
    def _frame(self, f: Frame) -> None:
        cmd = f.command
        try:
            if self.state == _CONNECT:
                if cmd not in ("CONNECT", "STOMP"):
                    raise Refused("Illegal command", "You must log in using CONNECT first\n")
                self._connect(f)
                return
            if self.version == "1.0":  # RabbitMQ trims 1.0 header values
                f.headers = {k: v.lstrip() for k, v in f.headers.items()}
            handler = _HANDLERS.get(cmd)
            if handler is None:
                raise Refused("Bad command", f"Could not interpret command {quoted(cmd)}\n")
            after = handler(self, f)
            receipt = f.headers.get("receipt")
            if receipt is not None and cmd not in ("SEND", "COMMIT", "DISCONNECT"):
                self._write_receipt(receipt)
            if after is not None:
                after()
        except Refused as e:
            self._error(e.message, e.detail, f)
        except StompError as e:
            self._error(e.message, e.detail, f)
        except DestinationError as e:
            self._error(e.message, e.detail, f)
        except ReplyError as e:  # the model refused: RabbitMQ's amqp_death texts
            name = e.text.split(" - ", 1)[0].lower() if " - " in e.text else "error"
            self._error(name, e.text, f)

    def _connect(self, f: Frame) -> None:
        h = f.headers
        offered = [v.strip() for v in h.get("accept-version", "1.0").split(",")]
        common = [v for v in VERSIONS if v in offered]
        if not common:
            raise Refused("Version mismatch", f"Supported versions are {SUPPORTED}\n")
        version = common[-1]
        self.version = version
        self.decoder.negotiated(version)
        self._resume = True
        if version == "1.0":
            h = {k: v.lstrip() for k, v in h.items()}
        try:
            cx, cy = (int(x.strip()) for x in h.get("heart-beat", "0,0").split(","))
        except ValueError:
            raise Refused("Bad CONNECT", f"heart-beat must be two integers 'cx,cy', got "
                                          f"{h.get('heart-beat', '')[:40]!r}\n") from None
        login = h.get("login")
        ctx = self.ctx
        cert_user = self._cert_user() if login is None else None
        if cert_user is not None:  # U4, stomp.ssl_cert_login: the certificate names the user
            got = admission.counted(ctx.broker.stats, "stomp", admission.certificate_login(
                ctx.access, ctx.config.loopback_users, cert_user, self.peer))
            if isinstance(got, Refusal):
                log.warning("STOMP certificate login refused for user %r from %s", got.user,
                            self.peer)
                raise Refused("Bad CONNECT", f"Access refused for user '{got.user}'\n")
        else:
            # no login at all: RabbitMQ's default user (guest), still loopback-only
            user, password = ("guest", "guest") if login is None \
                else (login, h.get("passcode", ""))
            got = admission.counted(ctx.broker.stats, "stomp", admission.password_login(
                ctx.access, ctx.config.loopback_users, user, password, self.peer))
            if isinstance(got, Refusal):
                log.warning("STOMP login refused for user %r from %s", user, self.peer)
                if got.kind == LOOPBACK_ONLY:
                    raise Refused("Bad CONNECT", "non-loopback access denied")
                raise Refused("Bad CONNECT", f"Access refused for user '{user}'\n")
        user = got
        broker = ctx.broker
        # host names a vhost when one has that name; otherwise it is the server's host
        # name (STOMP 1.1+'s meaning, and what stomp.py sends), and the vhost is "/"
        vhost = broker.vhosts.get(h.get("host") or "/") or broker.vhost("/")
        refusal = admission.open_vhost(ctx, self, user, vhost.name)  # U6, U3
        if refusal is not None:
            if refusal.kind != VHOST_ACCESS:
                log.warning("STOMP connection of user %r to vhost %r refused: connection "
                            "limit reached", user, vhost.name)
            # RabbitMQ's STOMP text, the same for access and both limits
            raise Refused("Bad CONNECT", f"Virtual host '{vhost.name}' access denied")
        access = ctx.access
        self.user = user
        self.channel = broker.open_channel(vhost, self, self, user, "stomp")
        # U3: SEND and SUBSCRIBE are checked as the AMQP operations they perform
        self.channel.access = ChannelAccess(access, user, vhost.name)
        self.session = "session-" + base64.urlsafe_b64encode(os.urandom(16)).decode()[:22]
        self.send_ms, self.recv_ms = _heartbeat_ms(cy), _heartbeat_ms(cx)
        from ackmq.version import VERSION
        self.write(encode_frame("CONNECTED", [
            ("server", f"ackmq/{VERSION}"), ("session", self.session),
            ("heart-beat", f"{self.send_ms},{self.recv_ms}"), ("version", version)]))
        self._to(S.OPEN)
        self._handshake_done()
        # W2: an EOL when quiet for half our interval; dead when silent for two of its
        self.start_heartbeats(self.send_ms / 2000.0, 2 * self.recv_ms / 1000.0)

    def _cert_user(self) -> str | None:
        """With --stomp-ssl-cert-login, the CN of a verified client certificate on a TLS
        connection (RabbitMQ's stomp.ssl_cert_login; its ssl_cert_login_from common_name)."""
        if not self.ctx.config.stomp_ssl_cert_login or self.transport is None:
            return None
        return self.certificate_user()

    def _destination(self, command: str, f: Frame) -> tuple[str, Destination]:
        text = f.headers.get("destination")
        if text is None:
            raise Refused("Missing destination",
                           f"{quoted(command)} must include a 'destination' header\n")
        return text, parse_destination(text)

    # -- SEND (W3, W7) --------------------------------------------------------------------
    def _on_send(self, f: Frame) -> None:
        if "message-id" in f.headers:
            raise Refused("Invalid header", "'message-id' is not allowed on 'SEND'.\n")
        text, dest = self._destination("SEND", f)
        if dest.kind == TEMP_QUEUE:
            raise Refused("Invalid destination",
                           f"'{text}' is not a valid destination for 'SEND'\n")
        tx = f.headers.get("transaction")
        if tx is not None:
            self._tx(tx).append(("send", f, text, dest))
            return
        self._send(f, text, dest, f.headers.get("receipt"), None)

    def _send(self, f: Frame, text: str, dest: Destination, receipt: str | None,
              group: Receipt | None) -> None:
        ch = self.channel
        assert ch is not None
        headers = f.headers
        reply_to = headers.get("reply-to")
        if reply_to is not None and reply_to.startswith("/temp-queue/"):
            headers = dict(headers)
            headers["reply-to"] = self._reply_queue(reply_to)
        if scheduler.is_management(dest, headers):  # ActiveMQ's BROWSE / REMOVE(ALL)
            scheduler.manage(ch, self.user, headers)
            if receipt is not None:
                self._write_receipt(receipt)
            return
        if dest.kind == QUEUE and dest.name not in ch.vhost.queues:
            self._declare_queue(dest.name, headers, durable=True)
        exchange, routing_key = dest.routing()
        props = properties_from_headers(headers)
        try:  # ActiveMQ's AMQ_SCHEDULED_* (L5): held by the vhost's scheduled store
            later = scheduled.parse(headers, ch.broker.schedule_bounds) is not None
        except scheduled.ScheduleError as e:
            raise Refused("Bad header", f"{e}\n") from None
        own = Receipt(receipt, f"SEND to '{text}'") if receipt is not None else None
        if own is None and group is None:
            ch.basic_publish(exchange, routing_key, False, False, props, f.body, later)
            return
        if ch.confirms is None:
            ch.confirm_select()
        # a topic with no subscriber is normal pub/sub; anything else unroutable is an error
        mandatory = dest.kind != TOPIC
        seq, routed = ch.basic_publish(exchange, routing_key, mandatory, False, props, f.body,
                                       later)
        if mandatory and not routed:
            raise Refused("Unroutable message",
                           f"SEND to '{text}' reached no queue: the message was dropped\n")
        waiting = [r for r in (own, group) if r is not None]
        for r in waiting:
            r.remaining += 1
        self.receipts[seq] = waiting

    # -- DISCONNECT ---------------------------------------------------------------------
    def _on_disconnect(self, f: Frame) -> None:
        receipt = f.headers.get("receipt")
        if receipt is None:
            self._shutdown()
            return
        # the RECEIPT says everything before it is done: wait for the receipts owed
        if self.channel is not None:
            self.channel.flush_confirms()
        if self.receipts:
            self.disconnect_receipt = receipt
            self._to(S.DISCONNECTING)
            return
        self._write_receipt(receipt)
        self._shutdown()

    def _on_connect_again(self, f: Frame) -> None:
        raise Refused("Illegal command", "already connected\n")

    # -- ChannelOutput ----------------------------------------------------------------
    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        sub = self.subs.get(consumer.tag)
        if sub is None:
            return
        msg = entry.message
        assert msg is not None  # only a purge's spilled entries come without one
        msg_id = f"{consumer.tag}@@{self.session}@@{delivery_tag}"
        headers = [*sub.head, ("destination", format_destination(msg.exchange, msg.routing_key)),
                   ("message-id", msg_id),
                   ("redelivered", "true" if entry.redelivered else "false")]
        if sub.ack != "auto" and self.version == "1.2":
            headers.append(("ack", msg_id))
        props = delivery_properties(entry, consumer.seq_header, consumer.count_header)
        headers += message_headers(props, OWN_HEADERS)
        self.write(encode_frame("MESSAGE", headers, msg.body, self.version or "1.2"))

    def unroutable(self, message: Message) -> None:
        """`basic_publish` returns it: _send turns it into an ERROR naming the
        destination."""

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        if self.state == S.CLOSED:
            return
        owed = [r for rs in take_confirmed(self.receipts, delivery_tag, multiple) for r in rs]
        for r in owed:
            if not ack:
                self._error("Message refused",
                            f"{r.what} was refused by a queue (full with x-overflow="
                            "reject-publish) or by the storage: it is not stored\n",
                            receipt=r.id)
                return
            r.remaining -= 1
            if r.remaining == 0 and r.id is not None:
                self._write_receipt(r.id)
        if self.state == S.DISCONNECTING and not self.receipts:
            assert self.disconnect_receipt is not None
            self._write_receipt(self.disconnect_receipt)
            self._shutdown()

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        """The queue went away under a subscription, or (`reason`) it overran its consumer
        timeout (L7): RabbitMQ's ERROR, and, as RabbitMQ, the connection stays open for
        the other subscriptions."""
        sub = self.subs.pop(consumer_tag, None)
        if sub is None or self.state != S.OPEN:
            return
        if reason:  # its late ACKs/NACKs are ignored, as the channel ignores them
            self.timed_out.add(consumer_tag)
        self.write(encode_frame("ERROR", [
            ("message", "Server cancelled subscription"), ("content-type", "text/plain"),
            ("version", SUPPORTED), ("subscription", sub.id or sub.dest_text)],
            (f"The server has canceled a subscription.\nNo more messages will be delivered "
             f"for {sub.dest_text!r}.\n" + (f"Reason: {reason}.\n" if reason else "")
             ).encode(), self.version or "1.2"))

    def close(self, code: int, text: str) -> None:
        """The model closes the channel on its own (consumer timeout, H2)."""
        self._error(text.split(" - ", 1)[0].lower(), text)

    # -- output -------------------------------------------------------------------------
    def _write_receipt(self, receipt: str) -> None:
        self.write(encode_frame("RECEIPT", [("receipt-id", receipt)], b"", self.version or "1.2"))

    def _wake(self) -> None:
        if self.channel is not None:
            self.channel.wake()

    # -- errors and closing ---------------------------------------------------------------
    def _error(self, message: str, detail: str, frame: Frame | None = None,
               receipt: str | None = None) -> None:
        """ERROR, then close (W9). Receipts already settled go out first."""
        if self.state == S.CLOSED:
            return
        log.info("STOMP error to %s: %s: %r", self.peer, message, detail.strip()[:300])
        if self.channel is not None and self.channel.open and self.state != S.DISCONNECTING:
            self._to(S.CLOSING)
            self.channel.flush_confirms()
        headers = [("message", message), ("content-type", "text/plain"), ("version", SUPPORTED)]
        if receipt is None and frame is not None:
            receipt = frame.headers.get("receipt")
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        self.write(encode_frame("ERROR", headers, detail.encode("utf-8"), self.version or "1.2"))
        self._shutdown()

    def _release_channels(self) -> None:
        """D8: unacked deliveries go back; open transactions are dropped; exclusive
        (temp and subscription) queues go with the connection."""
        self.txs.clear()
        ch, self.channel = self.channel, None
        if ch is not None:
            ch.close()
            ch.vhost.connection_closed(self)

    def _close_forced(self, text: str) -> None:
        """Broker shutdown, the vhost or user deleted."""
        self._error("connection_forced", f"CONNECTION_FORCED - {text}")


_HANDLERS: dict[str, Callable[[StompConnection, Frame], Any]] = {
    "SEND": StompConnection._on_send,
    "SUBSCRIBE": StompConnection._on_subscribe,
    "UNSUBSCRIBE": StompConnection._on_unsubscribe,
    "ACK": StompConnection._on_ack,
    "NACK": StompConnection._on_nack,
    "BEGIN": StompConnection._on_begin,
    "COMMIT": StompConnection._on_commit,
    "ABORT": StompConnection._on_abort,
    "DISCONNECT": StompConnection._on_disconnect,
    "CONNECT": StompConnection._on_connect_again,
    "STOMP": StompConnection._on_connect_again,
}
