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
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import READ, ChannelAccess
from ackmq.broker.arguments import DELIVERY_COUNT_ARG, SEQ_ARG, as_text
from ackmq.broker.errors import PRECONDITION_FAILED, ReplyError, SoftError
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
from ackmq.protocol.stomp.destinations import (
    AMQQUEUE,
    EXCHANGE,
    QUEUE,
    REPLY_QUEUE,
    TEMP_QUEUE,
    TOPIC,
)
from ackmq.server.channel import delivery_properties
from ackmq.server.connection import CLOSING_TIMEOUT, _is_loopback, connection_limit_reached
from ackmq.server.tls import certificate_user
from ackmq.server.transport import ClientConnection, events_from

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.message import Message, QueueEntry
    from ackmq.broker.queue_type import Queue
    from ackmq.server.server import Server

log = logging.getLogger("ackmq.stomp")

SUPPORTED = ",".join(VERSIONS)
ACK_MODES = ("auto", "client", "client-individual")
ACTIVEMQ_DLQ = "ActiveMQ.DLQ"
STOMP_DELIVERY_LIMIT = 6  # W6: ActiveMQ's maximumRedeliveries, for STOMP subscriptions
# SUBSCRIBE headers that become queue arguments, as RabbitMQ's plugin takes them
QUEUE_ARGUMENTS = {"x-dead-letter-exchange": str, "x-dead-letter-routing-key": str,
                   "x-expires": int, "x-max-length": int, "x-max-length-bytes": int,
                   "x-max-priority": int, "x-message-ttl": int, "x-queue-type": str,
                   "x-delivery-limit": int}
# SUBSCRIBE headers passed on as consume arguments: ackmq's opt-in delivery headers
CONSUMER_ARGUMENTS = (SEQ_ARG, DELIVERY_COUNT_ARG)
# MESSAGE headers the broker writes itself: application headers of these names are dropped
OWN_HEADERS = frozenset(("subscription", "destination", "message-id", "redelivered", "ack",
                         "content-length"))


def _delivery_limit(q: Queue) -> int | None:
    """The queue's own x-delivery-limit (D10), read from its arguments (any queue type)."""
    v = q.arguments.get("x-delivery-limit")
    return v if type(v) is int and v >= 0 else None


class _Refused(Exception):
    """A frame the connection refuses: ERROR with this message and detail, then close."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


def _q(text: str) -> str:
    """A string as Erlang's ~p prints it in RabbitMQ's texts."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _boolean(value: str | None) -> bool | None:
    """RabbitMQ's boolean header: true/false, and Python clients' True/False."""
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    return None


def _heartbeat_ms(ms: int) -> int:
    """RabbitMQ rounds heart-beats to whole seconds, at least one."""
    if ms <= 0:
        return 0
    return 1000 if ms < 1000 else ms // 1000 * 1000


class _Sub:
    """One subscription: its consumer tag on the channel and what its frames need."""

    __slots__ = ("id", "tag", "dest_text", "dest", "ack", "queue", "head", "durable")

    def __init__(self, sub_id: str | None, tag: str, dest_text: str, dest: Destination | None,
                 ack: str, queue: str, durable: bool) -> None:
        self.id = sub_id
        self.tag = tag
        self.dest_text = dest_text
        self.dest = dest
        self.ack = ack
        self.queue = queue
        self.durable = durable
        # the MESSAGE headers before destination: RabbitMQ names the subscription only
        # when it has an id
        self.head = [("subscription", sub_id)] if sub_id is not None else []


class _Receipt:
    """A receipt owed once `remaining` publishes are confirmed (one SEND, or a COMMIT's)."""

    __slots__ = ("id", "remaining", "what")

    def __init__(self, receipt_id: str | None, what: str) -> None:
        self.id = receipt_id
        self.remaining = 0
        self.what = what  # for the ERROR text when a publish is refused


class StompConnection(ClientConnection):
    """Implements the model's ChannelOutput for the connection's one channel."""

    number = 1  # the channel's number in texts the model writes (consumer timeout)

    def __init__(self, server: Server) -> None:
        super().__init__(server)
        self.decoder = Decoder(max_body=server.config.max_message_size)
        self.state = "connect"  # connect -> open -> (disconnecting) -> closed
        self.version: str | None = None
        self.session = ""
        self.channel: ChannelModel | None = None
        self.subs: dict[str, _Sub] = {}          # by consumer tag
        self.reply_queues: dict[str, str] = {}   # temp-queue id -> queue name
        self.txs: dict[str, list[tuple[Any, ...]]] = {}
        self.receipts: OrderedDict[int, list[_Receipt]] = OrderedDict()  # confirm seq ->
        self.disconnect_receipt: str | None = None
        self.send_ms = self.recv_ms = 0
        self._returned = False
        self._resume = False  # the decoder waited for the version after CONNECT

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        if self.reading_paused and self.transport is not None:
            self.transport.pause_reading()  # the one read a heart-beat tick let through
        if self.state not in ("connect", "open"):
            return
        while True:
            error = None
            try:
                events = self.decoder.feed(data)
            except StompError as e:  # the frames before the bad one count (W9)
                events, error = e.frames, e
            if self._frames(events, error):
                break  # a SEND during a resource alarm: the rest waits in `held` (U5)
            if not (self._resume and self.state == "open"):
                break
            self._resume = False  # CONNECTED is out: parse what waited, as `version`
            data = b""
        self.server.request_flush()

    def _frames(self, events: list[Any], error: StompError | None) -> bool:
        """Handle decoded frames, then the decoder's error if any. True: a SEND during a
        resource alarm blocked the connection (U5, as RabbitMQ's STOMP reader); the
        frames after it and the error are held until the alarm clears."""
        blocking = self.server.blocking
        for ev in events:
            if self.state not in ("connect", "open"):
                break
            if type(ev) is Frame:
                self._frame(ev)
                if blocking and ev.command == "SEND" and self.state == "open":
                    self.block_for_alarm(events_from(events + [error], ev)[1:])
                    return True
        if error is not None and self.state in ("connect", "open"):
            self._error(error.message, error.detail)
        return False

    def _handle_held(self, held: list[Any]) -> None:
        *frames, error = held
        if self.state in ("connect", "open"):
            self._frames(frames, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self.state = "closed"
        self.out.clear()
        self.server.connections.discard(self)

    # -- frames -------------------------------------------------------------------------
    def _frame(self, f: Frame) -> None:
        cmd = f.command
        try:
            if self.state == "connect":
                if cmd not in ("CONNECT", "STOMP"):
                    raise _Refused("Illegal command", "You must log in using CONNECT first\n")
                self._connect(f)
                return
            if self.version == "1.0":  # RabbitMQ trims 1.0 header values
                f.headers = {k: v.lstrip() for k, v in f.headers.items()}
            handler = _HANDLERS.get(cmd)
            if handler is None:
                raise _Refused("Bad command", f"Could not interpret command {_q(cmd)}\n")
            after = handler(self, f)
            receipt = f.headers.get("receipt")
            if receipt is not None and cmd not in ("SEND", "COMMIT", "DISCONNECT"):
                self._write_receipt(receipt)
            if after is not None:
                after()
        except _Refused as e:
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
            raise _Refused("Version mismatch", f"Supported versions are {SUPPORTED}\n")
        version = common[-1]
        self.version = version
        self.decoder.negotiated(version)
        self._resume = True
        if version == "1.0":
            h = {k: v.lstrip() for k, v in h.items()}
        try:
            cx, cy = (int(x.strip()) for x in h.get("heart-beat", "0,0").split(","))
        except ValueError:
            raise _Refused("Bad CONNECT", f"heart-beat must be two integers 'cx,cy', got "
                                          f"{h.get('heart-beat', '')[:40]!r}\n") from None
        login = h.get("login")
        # no login at all: RabbitMQ's default user (guest), still loopback-only
        user, password = ("guest", "guest") if login is None else (login, h.get("passcode", ""))
        config, loopback = self.server.config, _is_loopback(self.peer)
        cert_user = self._cert_user() if login is None else None
        if cert_user is not None:  # U4, stomp.ssl_cert_login: the certificate names the user
            user = cert_user
            if not config.user_exists(user, loopback):
                log.warning("STOMP certificate login refused for user %r from %s", user,
                            self.peer)
                raise _Refused("Bad CONNECT", f"Access refused for user '{user}'\n")
        elif not config.authenticate(user, password, loopback):
            log.warning("STOMP login refused for user %r from %s", user, self.peer)
            if not loopback and config.authenticate(user, password, True):
                raise _Refused("Bad CONNECT", "non-loopback access denied")
            raise _Refused("Bad CONNECT", f"Access refused for user '{user}'\n")
        broker = self.server.broker
        # host names a vhost when one has that name; otherwise it is the server's host
        # name (STOMP 1.1+'s meaning, and what stomp.py sends), and the vhost is "/"
        vhost = broker.vhosts.get(h.get("host") or "/") or broker.vhost("/")
        access = self.server.access
        if not access.vhost_access(user, vhost.name):  # U3, RabbitMQ's STOMP text
            raise _Refused("Bad CONNECT", f"Virtual host '{vhost.name}' access denied")
        if connection_limit_reached(self.server, self, user, vhost.name) is not None:
            # U6: RabbitMQ's STOMP plugin says the same for the vhost's and the user's limit
            log.warning("STOMP connection of user %r to vhost %r refused: connection limit "
                        "reached", user, vhost.name)
            raise _Refused("Bad CONNECT", f"Virtual host '{vhost.name}' access denied")
        self.user = user
        self.channel = broker.open_channel(vhost, self, self, user, "stomp")
        # U3: SEND and SUBSCRIBE are checked as the AMQP operations they perform
        self.channel.access = ChannelAccess(access, user, vhost.name)
        self.session = "session-" + base64.urlsafe_b64encode(os.urandom(16)).decode()[:22]
        self.send_ms, self.recv_ms = _heartbeat_ms(cy), _heartbeat_ms(cx)
        from ackmq import __version__
        self.write(encode_frame("CONNECTED", [
            ("server", f"ackmq/{__version__}"), ("session", self.session),
            ("heart-beat", f"{self.send_ms},{self.recv_ms}"), ("version", version)]))
        self.state = "open"
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        if self.send_ms or self.recv_ms:
            self._hb_timer = self.server.loop.call_later(self._tick_s(), self._heartbeat_tick)

    def _cert_user(self) -> str | None:
        """With --stomp-ssl-cert-login, the CN of a verified client certificate on a TLS
        connection (RabbitMQ's stomp.ssl_cert_login; its ssl_cert_login_from common_name)."""
        if not self.server.config.stomp_ssl_cert_login or self.transport is None:
            return None
        return certificate_user(self.transport.get_extra_info("peercert"))

    def _destination(self, command: str, f: Frame) -> tuple[str, Destination]:
        text = f.headers.get("destination")
        if text is None:
            raise _Refused("Missing destination",
                           f"{_q(command)} must include a 'destination' header\n")
        return text, parse_destination(text)

    # -- SEND (W3, W7) --------------------------------------------------------------------
    def _on_send(self, f: Frame) -> None:
        if "message-id" in f.headers:
            raise _Refused("Invalid header", "'message-id' is not allowed on 'SEND'.\n")
        text, dest = self._destination("SEND", f)
        if dest.kind == TEMP_QUEUE:
            raise _Refused("Invalid destination",
                           f"'{text}' is not a valid destination for 'SEND'\n")
        tx = f.headers.get("transaction")
        if tx is not None:
            self._tx(tx).append(("send", f, text, dest))
            return
        self._send(f, text, dest, f.headers.get("receipt"), None)

    def _send(self, f: Frame, text: str, dest: Destination, receipt: str | None,
              group: _Receipt | None) -> None:
        ch = self.channel
        assert ch is not None
        headers = f.headers
        reply_to = headers.get("reply-to")
        if reply_to is not None and reply_to.startswith("/temp-queue/"):
            headers = dict(headers)
            headers["reply-to"] = self._reply_queue(reply_to)
        if dest.kind == QUEUE and dest.name not in ch.vhost.queues:
            self._declare_queue(dest.name, headers, durable=True)
        exchange, routing_key = dest.routing()
        props = properties_from_headers(headers)
        own = _Receipt(receipt, f"SEND to '{text}'") if receipt is not None else None
        if own is None and group is None:
            ch.basic_publish(exchange, routing_key, False, False, props, f.body)
            return
        if ch.confirms is None:
            ch.confirm_select()
        assert ch.confirms is not None
        seq = ch.confirms.next_seq
        # a topic with no subscriber is normal pub/sub; anything else unroutable is an error
        mandatory = dest.kind != TOPIC
        self._returned = False
        ch.basic_publish(exchange, routing_key, mandatory, False, props, f.body)
        if self._returned:
            raise _Refused("Unroutable message",
                           f"SEND to '{text}' reached no queue: the message was dropped\n")
        waiting = [r for r in (own, group) if r is not None]
        for r in waiting:
            r.remaining += 1
        self.receipts[seq] = waiting

    def _reply_queue(self, reply_to: str) -> str:
        """RabbitMQ's temp-queue: a server-named exclusive queue per /temp-queue/ id,
        consumed by this connection (subscription `/temp-queue/ID`); the message's
        reply-to becomes the queue's name, so AMQP repliers can use it as it is."""
        ch = self.channel
        assert ch is not None
        name = self.reply_queues.get(reply_to)
        if name is not None and name in ch.vhost.queues:
            return name
        q = ch.vhost.declare_queue("", False, False, True, True, {}, self, access=ch.access)
        tag = "T_" + reply_to
        ch.basic_consume(q.name, tag, True, False, {})
        self.subs[tag] = _Sub(reply_to, tag, reply_to, None, "auto", q.name, False)
        self.reply_queues[reply_to] = q.name
        ch.start_consumer(tag)
        return q.name

    # -- SUBSCRIBE / UNSUBSCRIBE (W3, W4, W5) --------------------------------------------
    def _on_subscribe(self, f: Frame) -> Callable[[], None]:
        h = f.headers
        sub_id = h.get("id")
        durable = h.get("durable") == "true" or h.get("persistent") == "true"
        if durable and sub_id is None:
            raise _Refused("Missing Header", "Header 'id' is required for durable subscriptions")
        text, dest = self._destination("SUBSCRIBE", f)
        if dest.kind == TOPIC:
            self._check_topic_subscription(dest)
        if dest.kind == TEMP_QUEUE:
            raise _Refused("Invalid destination",
                           f"'{text}' is not a valid destination for 'SUBSCRIBE'\n")
        if sub_id is not None and sub_id.startswith("/temp-queue/"):
            raise _Refused("Invalid id", "SUBSCRIBE 'id' may not start with /temp-queue/\n")
        ack = h.get("ack", "auto")
        if ack not in ACK_MODES:
            raise _Refused("Invalid header", f"'ack' must be auto, client or "
                                             f"client-individual, not {ack[:40]!r}\n")
        prefetch = self._prefetch(h)
        tag = "T_" + sub_id if sub_id is not None else "Q_" + text
        if tag in self.subs:
            raise _Refused("Duplicated subscription identifier",
                           f"A subscription identified by '{tag}' already exists.")
        ch = self.channel
        assert ch is not None
        queue = self._source_queue(dest, h, sub_id, durable)
        args = {k: h[k] for k in CONSUMER_ARGUMENTS if k in h}
        try:
            ch.basic_consume(queue.name, tag, ack == "auto", False, args, prefetch=prefetch)
        except ReplyError:
            self._drop_unused(queue, dest)
            raise
        self.subs[tag] = _Sub(sub_id, tag, text, dest, ack, queue.name, durable)
        return lambda: ch.start_consumer(tag)  # deliveries after the RECEIPT

    def _check_topic_subscription(self, dest: Destination) -> None:
        """U3: RabbitMQ's plugin checks a /topic/ subscription against the user's topic
        permission (read on amq.topic) before anything else, with its own text (no
        ACCESS_REFUSED prefix); /exchange/ subscriptions meet it at their queue.bind."""
        ch = self.channel
        assert ch is not None
        access = ch.access
        if access is not None and access.topics:
            refusal = access.topic_refusal(READ, "amq.topic", dest.name)
            if refusal is not None:
                raise _Refused("access_refused", refusal)

    @staticmethod
    def _prefetch(h: dict[str, str]) -> int | None:
        for name in ("prefetch-count", "activemq.prefetchSize"):
            v = h.get(name)
            if v is not None:
                v = v.strip()
                if not (v.isascii() and v.isdigit()):
                    raise _Refused("Invalid header", f"'{name}' must be a whole number, "
                                                     f"not {v[:40]!r}\n")
                return int(v)
        return None  # the channel's (unlimited), as RabbitMQ

    def _source_queue(self, dest: Destination, h: dict[str, str], sub_id: str | None,
                      durable: bool) -> Queue:
        ch = self.channel
        assert ch is not None
        vh = ch.vhost
        if dest.kind == QUEUE:
            return self._declare_queue(dest.name, h, durable=True)
        if dest.kind in (AMQQUEUE, REPLY_QUEUE):
            return vh.queue(dest.name, self)
        # /topic/ and /exchange/: a queue per subscription, bound to the exchange
        exchange, key = ("amq.topic", dest.name) if dest.kind == TOPIC \
            else (dest.name, dest.key or "")
        vh.exchange(exchange)  # 404 before anything is declared
        name = h.get("x-queue-name")
        if name is None:
            seed = sub_id if durable and sub_id is not None else os.urandom(16).hex()
            digest = hashlib.md5(f"{dest.name}\x00{seed}".encode()).digest()
            name = "stomp-subscription-" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
        fresh = name not in vh.queues
        q = self._declare_queue(name, h, durable=durable, auto_delete=True)
        try:
            if ch.access is not None:  # U3: as queue.bind
                ch.access.write("queue", q.name)
                ch.access.read("exchange", exchange)
                ch.access.check_topic(READ, vh.exchange(exchange), key)
            vh.bind(exchange, q, key, {})
        except ReplyError:
            if fresh:
                self._drop_unused(q, dest)
            raise
        return q

    def _declare_queue(self, name: str, h: dict[str, str], durable: bool,
                       auto_delete: bool = False) -> Queue:
        """Declare as RabbitMQ's plugin does: the durable / persistent, auto-delete and
        exclusive headers override the destination's defaults; x-* headers are
        queue arguments."""
        ch = self.channel
        assert ch is not None
        for header in ("durable", "persistent"):
            b = _boolean(h.get(header))
            if b is not None:
                durable = b
        b = _boolean(h.get("auto-delete"))
        if b is not None:
            auto_delete = b
        exclusive = _boolean(h.get("exclusive")) or False
        args: dict[str, Any] = {}
        for k, kind in QUEUE_ARGUMENTS.items():
            v = h.get(k)
            if v is None:
                continue
            if kind is int:
                try:
                    args[k] = int(v.strip())
                except ValueError:
                    raise _Refused("Invalid header",
                                   f"'{k}' must be an integer, not {v[:40]!r}\n") from None
            else:
                args[k] = v.strip()
        return ch.vhost.declare_queue(name, False, durable, exclusive, auto_delete, args, self,
                                      access=ch.access)

    def _drop_unused(self, q: Queue, dest: Destination) -> None:
        """A subscription queue we declared and could not use goes again."""
        if dest.kind in (TOPIC, EXCHANGE) and q.auto_delete and not q.consumers \
                and not q.deleted:
            q.vhost.delete_queue(q, notify=False)

    def _on_unsubscribe(self, f: Frame) -> None:
        h = f.headers
        sub_id = h.get("id")
        if sub_id is not None:
            if sub_id.startswith("/temp-queue/"):
                raise _Refused("Invalid id", "UNSUBSCRIBE 'id' may not start with "
                                             "/temp-queue/\n")
            tag, desc = "T_" + sub_id, f"id='{sub_id}'"
        elif "destination" in h:
            tag, desc = "Q_" + h["destination"], f"destination='{h['destination']}'"
        else:
            raise _Refused("Missing destination or id",
                           "UNSUBSCRIBE must include a 'destination' or 'id' header")
        sub = self.subs.pop(tag, None)
        if sub is None:
            raise _Refused("No subscription found",
                           f"UNSUBSCRIBE must refer to an existing subscription.\n"
                           f"Subscription to {desc} not found.\n")
        ch = self.channel
        assert ch is not None
        consumer = ch.consumers.get(tag)
        ch.basic_cancel(tag)
        if consumer is not None:  # its unacked deliveries go back now, not at disconnect
            mine = [t for t, d in ch.unacked.items() if d[1] is consumer]
            if mine:
                ch.settle("requeue", ch.take_for_consumer(tag, mine[-1], True))
        if sub.dest is not None and sub.dest.kind == TOPIC and \
                (h.get("durable") == "true" or h.get("persistent") == "true"):
            q = ch.vhost.queues.get(sub.queue)
            if q is not None:  # ends a durable subscription, as RabbitMQ
                ch.vhost.delete_queue(q, notify=False)

    # -- ACK / NACK (W4, W6) ----------------------------------------------------------
    def _on_ack(self, f: Frame) -> None:
        self._ack(f, nack=False)

    def _on_nack(self, f: Frame) -> None:
        self._ack(f, nack=True)

    def _ack(self, f: Frame, nack: bool) -> None:
        cmd = f.command
        header = "id" if self.version == "1.2" else "message-id"
        ack_id = f.headers.get(header)
        if ack_id is None:
            raise _Refused("Missing header", f"{_q(cmd)} must include the {_q(header)} header\n")
        parts = ack_id.rsplit("@@", 2)
        if len(parts) != 3 or not (parts[2].isascii() and parts[2].isdigit()):
            raise _Refused("Invalid header",
                           f"{_q(cmd)} must include a valid {_q(header)} header\n")
        ctag, session, tag = parts[0], parts[1], int(parts[2])
        sub = self.subs.get(ctag)
        if sub is None or session != self.session:
            raise _Refused("Subscription not found",
                           f"Message with id {_q(ack_id)} has no subscription\n")
        requeue = _boolean(f.headers.get("requeue"))
        action = ("nack" if nack else "ack", sub, tag, requeue is not False)
        tx = f.headers.get("transaction")
        if tx is not None:
            actions = self._tx(tx)
            ch = self.channel
            assert ch is not None
            d = ch.unacked.get(tag)
            if d is None or d[1] is None or d[1].tag != ctag:  # as take_for_consumer
                raise SoftError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            actions.append(action)
            return
        self._settle(*action)

    def _settle(self, kind: str, sub: _Sub, tag: int, requeue: bool) -> None:
        ch = self.channel
        assert ch is not None
        taken = ch.take_for_consumer(sub.tag, tag, sub.ack == "client")
        if kind == "ack":
            ch.settle("ack", taken)
            return
        q = taken[0][1][0].queue
        target = self._dead_letter_target(sub, q)
        if not requeue:
            if target is None or target == (None, None):
                ch.settle("reject", taken)  # the queue's DLX, or dropped (as RabbitMQ)
            else:
                self._dead_letter(taken, "rejected", target)
            return
        limit = _delivery_limit(q)
        if target is None or (limit is not None and target == (None, None)):
            ch.settle("requeue", taken)  # RabbitMQ's form: back to the queue (D10 applies)
            return
        if limit is None:
            limit = STOMP_DELIVERY_LIMIT
        over = [td for td in taken if td[1][0].delivery_count + 1 > limit]
        if over:
            taken = [td for td in taken if td[1][0].delivery_count + 1 <= limit]
            self._dead_letter(over, "delivery_limit", target)
        if taken:
            ch.settle("requeue", taken)

    def _dead_letter_target(self, sub: _Sub, q: Queue) -> tuple[str | None, str | None] | None:
        """Where a NACKed message past the delivery limit goes (W6): the queue's DLX
        ((None, None)); for a destination in ActiveMQ form without one, ActiveMQ.DLQ;
        otherwise nowhere, and the limit does not apply (RabbitMQ requeues for ever)."""
        if as_text(q.arguments.get("x-dead-letter-exchange")) is not None:
            return None, None
        if sub.dest is not None and sub.dest.activemq:
            ch = self.channel
            assert ch is not None
            if ACTIVEMQ_DLQ not in ch.vhost.queues:
                ch.vhost.declare_queue(ACTIVEMQ_DLQ, False, True, False, False, {}, self)
            return "", ACTIVEMQ_DLQ
        return None

    def _dead_letter(self, taken: list[tuple[int, Any]], reason: str,
                     target: tuple[str | None, str | None]) -> None:
        ch = self.channel
        assert ch is not None
        for _tag, (entry, _c, _d) in taken:
            q = entry.queue
            if not q.deleted:
                q.vhost.dead_letter(q, entry, reason, target[0], target[1])
        ch.settle("ack", taken)  # the copy is dead-lettered: the original is settled

    # -- transactions (W8) --------------------------------------------------------------
    def _tx_name(self, f: Frame) -> str:
        tx = f.headers.get("transaction")
        if tx is None:
            raise _Refused("Missing transaction",
                           f"{_q(f.command)} must include a 'transaction' header\n")
        return tx

    def _tx(self, name: str) -> list[tuple[Any, ...]]:
        actions = self.txs.get(name)
        if actions is None:
            raise _Refused("Bad transaction", f"Invalid transaction identifier: {_q(name)}\n")
        return actions

    def _on_begin(self, f: Frame) -> None:
        name = self._tx_name(f)
        if name in self.txs:
            raise _Refused("Bad transaction", f"Transaction {_q(name)} is already open\n")
        self.txs[name] = []

    def _on_commit(self, f: Frame) -> None:
        name = self._tx_name(f)
        actions = self._tx(name)
        del self.txs[name]
        receipt = f.headers.get("receipt")
        group = _Receipt(receipt, f"COMMIT of {_q(name)}") if receipt is not None else None
        for action in actions:
            if action[0] == "send":
                _kind, frame, text, dest = action
                self._send(frame, text, dest, frame.headers.get("receipt"), group)
            else:
                self._settle(*action)
        if group is not None and group.remaining == 0:
            self._write_receipt(receipt)  # type: ignore[arg-type]

    def _on_abort(self, f: Frame) -> None:
        name = self._tx_name(f)
        self._tx(name)
        del self.txs[name]  # sends dropped, acks never made: those deliveries stay unacked

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
            self.state = "disconnecting"
            return
        self._write_receipt(receipt)
        self._shutdown()

    def _on_connect_again(self, f: Frame) -> None:
        raise _Refused("Illegal command", "already connected\n")

    # -- ChannelOutput ----------------------------------------------------------------
    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        sub = self.subs.get(consumer.tag)
        if sub is None:
            return
        msg = entry.message
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
        self._returned = True  # _send turns it into an ERROR naming the destination

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        if self.state == "closed":
            return
        receipts = self.receipts
        owed: list[_Receipt] = []
        if multiple:
            while receipts:
                seq = next(iter(receipts))
                if seq > delivery_tag:
                    break
                owed += receipts.popitem(last=False)[1]
        else:
            owed = receipts.pop(delivery_tag, [])
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
        if self.state == "disconnecting" and not receipts:
            assert self.disconnect_receipt is not None
            self._write_receipt(self.disconnect_receipt)
            self._shutdown()

    def consumer_cancelled(self, consumer_tag: str) -> None:
        """The queue went away under a subscription: RabbitMQ's ERROR, and, as RabbitMQ,
        the connection stays open for the other subscriptions."""
        sub = self.subs.pop(consumer_tag, None)
        if sub is None or self.state != "open":
            return
        self.write(encode_frame("ERROR", [
            ("message", "Server cancelled subscription"), ("content-type", "text/plain"),
            ("version", SUPPORTED), ("subscription", sub.id or sub.dest_text)],
            (f"The server has canceled a subscription.\nNo more messages will be delivered "
             f"for {sub.dest_text!r}.\n").encode(), self.version or "1.2"))

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
        if self.state == "closed":
            return
        log.info("STOMP error to %s: %s: %r", self.peer, message, detail.strip()[:300])
        if self.channel is not None and self.channel.open and self.state != "disconnecting":
            self.state = "closing"
            self.channel.flush_confirms()
        headers = [("message", message), ("content-type", "text/plain"), ("version", SUPPORTED)]
        if receipt is None and frame is not None:
            receipt = frame.headers.get("receipt")
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        self.write(encode_frame("ERROR", headers, detail.encode("utf-8"), self.version or "1.2"))
        self._shutdown()

    def _shutdown(self) -> None:
        """Write what is queued and close the socket; a peer that reads none of it is
        cut off after the closing timeout."""
        self._release()
        self.state = "closed"
        self.flush()
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()
            if t.get_write_buffer_size():
                self._close_timer = self.server.loop.call_later(CLOSING_TIMEOUT, t.abort)

    def _release(self) -> None:
        """D8: unacked deliveries go back; open transactions are dropped; exclusive
        (temp and subscription) queues go with the connection."""
        for t in (self._hb_timer, self._close_timer):
            if t is not None:
                t.cancel()
        self._hb_timer = self._close_timer = None
        self.txs.clear()
        ch, self.channel = self.channel, None
        if ch is not None:
            ch.close()
            ch.vhost.connection_closed(self)
        self.server.request_flush()

    def force_close(self, text: str) -> None:
        """Broker shutdown."""
        if self.state in ("open", "disconnecting"):
            self._error("connection_forced", f"CONNECTION_FORCED - {text}")
        else:
            self._shutdown()

    def _handshake_timeout(self) -> None:
        self._close_timer = None
        if self.state == "connect":
            log.info("STOMP handshake timeout from %s", self.peer)
            self._shutdown()

    # -- heart-beats (W2) ---------------------------------------------------------------
    def _tick_s(self) -> float:
        return min(ms for ms in (self.send_ms, self.recv_ms) if ms) / 2000.0

    def _heartbeat_tick(self) -> None:
        """Send an EOL when quiet for half our interval; a peer silent for two of its
        intervals is dead (W2, as H1) and its deliveries go back (D8)."""
        self._hb_timer = None
        if self.state not in ("open", "disconnecting") or self.transport is None:
            return
        now = time.monotonic()
        if self.reading_paused and not self.alarm_blocked:
            self.transport.resume_reading()  # let one read through (see AMQPConnection)
        if self.recv_ms and now - self.last_recv > 2 * self.recv_ms / 1000.0 \
                and not self.alarm_blocked:  # blocked (U5): the silence is ours
            log.info("missed STOMP heart-beats from %s, closing", self.peer)
            self._release()
            self.state = "closed"
            self.transport.abort()
            return
        if self.send_ms and now - self.last_sent >= self.send_ms / 2000.0:
            self.write(b"\n")
            self.server.request_flush()
        self._hb_timer = self.server.loop.call_later(self._tick_s(), self._heartbeat_tick)


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
