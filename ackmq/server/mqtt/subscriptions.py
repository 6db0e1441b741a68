"""MQTT sessions, subscriptions and deliveries (N2-N5, N7) for `MQTTConnection` (a part of
it, kept apart).

A session's subscriptions are bindings from amq.topic to its queues, one per granted QoS,
named as RabbitMQ's plugin names them: `mqtt-subscription-<client id>qos<n>`. A clean
session's queues are exclusive to the connection; a persistent one's are durable (with
the MQTT 5 session expiry interval as the queue's x-expires), so the store keeps the
subscriptions and the messages queued for them across restarts and kill -9. A shared
subscription `$share/<group>/<filter>` is one queue per group and filter, `mqtt-shared-
<group>-<filter>`, consumed by every member: each message goes to one of them.

Deliveries go out at min(the subscription's QoS, the publisher's): QoS 0 ones are acked
to the queue at once, QoS 1 ones on PUBACK, QoS 2 ones on PUBREC (the client owns the
message from then on; PUBREL / PUBCOMP finish the exchange)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackmq.broker.errors import ReplyError
from ackmq.broker.exchange import args_key
from ackmq.protocol.mqtt import constants as rc
from ackmq.protocol.mqtt import encode, encode_properties, encode_publish
from ackmq.protocol.mqtt import packets as pk
from ackmq.protocol.mqtt.amqp_map import (
    PUBLISHER,
    RETAIN,
    header_of,
    mqtt5_properties,
    publish_qos,
)
from ackmq.protocol.mqtt.topics import Filter, TopicError, from_amqp, matches, parse_filter, to_amqp

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.queue_type import Queue, QueueEntry
    from ackmq.broker.vhost import VHost
    from ackmq.server.context import FrontEnd
    from ackmq.server.mqtt.state import MQTTState, Retained

EXCHANGE = "amq.topic"
NEVER = 0xFFFFFFFF
MAX_CLIENT_ID = 200  # bytes: the queue names must stay within AMQP's 255
MATCHING_MAX = 1024  # topics a session keeps the matching subscriptions of (then cleared)
# RabbitMQ 3.13's binding argument: an MQTT 5 subscription's options, kept with its binding
# so that a persistent session's subscriptions come back with them after a restart
OPTS = "x-mqtt-subscription-opts"


@dataclass(slots=True)
class Sub:
    flt: Filter
    options: pk.SubOptions
    sub_id: int | None = None
    bound: dict[str, Any] | None = None  # the arguments of its binding, as bound (or restored)

    def binding_args(self, v5: bool) -> dict[str, Any]:
        """As RabbitMQ 3.13: none for 3.1.1, the options as a table for 5.0."""
        if not v5:
            return {}
        o = self.options
        table: dict[str, Any] = {"qos": o.qos, "no-local": o.no_local,
                                 "retain-as-published": o.retain_as_published,
                                 "retain-handling": o.retain_handling}
        if self.sub_id is not None:
            table["id"] = self.sub_id
        return {OPTS: table}


def sub_from_binding(text: str, qos: int, args: dict[str, Any]) -> Sub:
    """A persistent session's subscription as its binding kept it."""
    t = args.get(OPTS)
    if not isinstance(t, dict):
        return Sub(Filter(text, text), pk.SubOptions(qos), None, args)
    sid = t.get("id")
    return Sub(Filter(text, text), pk.SubOptions(
        qos, bool(t.get("no-local")), bool(t.get("retain-as-published")),
        int(t.get("retain-handling") or 0)), sid if isinstance(sid, int) and sid else None,
        args)


class Subscriptions:
    ctx: FrontEnd
    channel: ChannelModel | None
    vhost: VHost | None
    mqtt: MQTTState | None
    level: int
    client_id: str
    session_expiry: int
    client_max_packet: int
    write: Any

    def _init_subscriptions(self) -> None:
        self.subs: dict[str, Sub] = {}  # by the filter as the client wrote it
        # (topic, QoS) -> the own subscriptions of that QoS matching it (`_own_matching`)
        self._matching: dict[tuple[str, int], tuple[Sub, ...]] = {}
        self.consumer_qos: dict[str, int] = {}  # consumer tag -> its subscription's QoS
        self.inflight: dict[int, tuple[int | None, int]] = {}  # packet id -> (tag, qos)
        self.released: set[int] = set()  # QoS 2 out: PUBREL sent, PUBCOMP awaited
        self.next_pid = 1
        self.ack_later: list[int] = []  # delivery tags of QoS 0 deliveries from QoS 1+ queues
        self.with_ids = 0  # subscriptions with a subscription identifier (5.0)
        self.no_local = 0  # ... with No Local: this client's publishes are marked
        self.as_published = 0  # ... with Retain As Published
        # 5.0 topic aliases towards the client: at most the Topic Alias Maximum it sent
        self.alias_max = 0
        self.out_aliases: dict[str, int] = {}

    def _recount(self) -> None:
        """The counts that let deliveries skip what no subscription asks for."""
        self._matching.clear()
        own = [s for s in self.subs.values() if s.flt.share is None]
        self.with_ids = sum(1 for s in own if s.sub_id is not None)
        self.no_local = sum(1 for s in own if s.options.no_local)
        self.as_published = sum(1 for s in own if s.options.retain_as_published)

    # -- the session's queues ---------------------------------------------------------------
    def _queue_name(self, qos: int) -> str:
        return f"mqtt-subscription-{self.client_id}qos{qos}"

    def _open_session(self, clean: bool) -> bool:
        """Clean: the old session's queues (and QoS 2 state) go. Otherwise the session's
        subscriptions come back from its queues' bindings. Returns session present."""
        ch = self.channel
        assert ch is not None and self.mqtt is not None
        vh = ch.vhost
        present = False
        for qos in (0, 1, 2):
            name = self._queue_name(qos)
            if name not in vh.queues:
                continue
            q = vh.queue(name, self)  # another connection's exclusive queue: 405
            if clean:
                vh.delete_queue(q, notify=False)
                continue
            present = True
            for source, key, args in vh.bindings_to(q):
                if source == EXCHANGE:
                    text = from_amqp(key)
                    self.subs[text] = sub_from_binding(text, qos, args)
        self._recount()
        if clean:
            self.mqtt.forget_session(vh.name, self.client_id)
        else:  # QoS 2 deliveries PUBRECed before: their PUBREL goes again
            self.released = set(self.mqtt.qos2_ids(vh.name, self.client_id, out=True))
            present = present or bool(self.released)
        return present

    def _session_queue(self, qos: int) -> Queue:
        ch = self.channel
        assert ch is not None
        vh = ch.vhost
        name = self._queue_name(qos)
        if name in vh.queues:
            return vh.queue(name, self)
        persistent = self.session_expiry > 0
        args: dict[str, Any] = {}
        if persistent and self.session_expiry != NEVER:
            args["x-expires"] = self.session_expiry * 1000
        return ch.declare_queue(name, False, persistent, not persistent, False, args)

    def _apply_session_expiry(self) -> None:
        """The session expiry interval as it is now (a later CONNECT, or DISCONNECT, may
        change it) on the session's durable queues: their x-expires, stored."""
        ch = self.channel
        if ch is None or not self.session_expiry:
            return  # 0: the queues go with the connection (`_end_session`)
        vh = ch.vhost
        for qos in (0, 1, 2):
            q = vh.queues.get(self._queue_name(qos))
            if q is None or q.exclusive_owner is not None:
                continue
            args = dict(q.arguments)
            if self.session_expiry == NEVER:
                args.pop("x-expires", None)
            else:
                args["x-expires"] = self.session_expiry * 1000
            if args != q.arguments:
                vh.set_queue_arguments(q, args)

    def _start_consumers(self) -> None:
        """Consume the session's queues (after CONNACK is written)."""
        ch = self.channel
        assert ch is not None
        for qos in (0, 1, 2):
            if self._queue_name(qos) in ch.vhost.queues:
                self._consume(self._queue_name(qos), f"qos{qos}", qos)

    def _consume(self, queue: str, tag: str, qos: int) -> None:
        ch = self.channel
        assert ch is not None
        if tag in ch.consumers:
            return
        ch.basic_consume(queue, tag, qos == 0, False, {})
        self.consumer_qos[tag] = qos
        ch.start_consumer(tag)

    def _end_session(self, ch: ChannelModel) -> None:
        """A session that ends with its connection (expiry 0) leaves nothing behind."""
        if self.session_expiry:
            return
        vh = ch.vhost
        for qos in (0, 1, 2):
            q = vh.queues.get(self._queue_name(qos))
            if q is not None and q.exclusive_owner in (None, self):
                vh.delete_queue(q, notify=False)
        if self.mqtt is not None:
            self.mqtt.forget_session(vh.name, self.client_id)

    def _bind(self, q: Queue, key: str, args: dict[str, Any] | None = None) -> None:
        """queue.bind as the model checks it (U3: write on the queue, read on amq.topic
        and the topic permission)."""
        ch = self.channel
        assert ch is not None
        ch.bind("queue", q.name, EXCHANGE, key, args)

    # -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------
    def _on_subscribe(self, p: pk.Subscribe) -> None:
        v5 = self.level == rc.MQTT5
        sub_ids = p.properties.get("subscription_identifier", [])
        if len(sub_ids) > 1 or (sub_ids and sub_ids[0] == 0):
            from ackmq.server.mqtt.connection import Refused
            raise Refused(rc.PROTOCOL_ERROR, "one subscription identifier, not 0, at most")
        sub_id = sub_ids[0] if sub_ids else None
        codes: list[int] = []
        start: list[tuple[str, str, int]] = []
        retained: list[tuple[Sub, int]] = []
        for text, opts in p.topics:
            try:
                flt = parse_filter(text)
            except TopicError as e:
                if v5:  # 0x8F is for filters "correctly formed": this one is not (as Mosquitto)
                    from ackmq.server.mqtt.connection import Refused
                    raise Refused(rc.MALFORMED_PACKET, str(e)) from None
                codes.append(0x80)
                continue
            if flt.share is not None and opts.no_local:  # [MQTT-3.8.3-4]
                from ackmq.server.mqtt.connection import Refused
                raise Refused(rc.PROTOCOL_ERROR, "no local on a shared subscription")
            qos = opts.qos
            sub = Sub(flt, opts, sub_id)
            try:
                new = self._subscribe(sub, start)
            except ReplyError as e:
                codes.append((rc.NOT_AUTHORIZED if e.code == 403 else rc.UNSPECIFIED_ERROR)
                             if v5 else 0x80)
                continue
            self.subs[text] = sub
            codes.append(qos)
            if flt.share is None and (opts.retain_handling == 0
                                      or (opts.retain_handling == 1 and new)):
                retained.append((sub, qos))
        self._recount()
        self.write(encode(pk.SubAck(p.packet_id, codes), self.level))
        for queue, tag, qos in start:
            self._consume(queue, tag, qos)
        for sub, qos in retained:
            self._send_retained(sub, qos)

    def _subscribe(self, sub: Sub, start: list[tuple[str, str, int]]) -> bool:
        """Bind the filter; True when the client had no such subscription."""
        flt, qos = sub.flt, sub.options.qos
        ch = self.channel
        assert ch is not None
        vh = ch.vhost
        key = to_amqp(flt.topic)
        if flt.share is not None:
            name = f"mqtt-shared-{flt.share}-{key}"
            if len(name.encode()) > 255:
                name = "mqtt-shared-" + hashlib.sha256(name.encode()).hexdigest()
            q = ch.declare_queue(name, False, False, False, True, {})
            self._bind(q, key)
            tag = "share:" + flt.text
            start.append((q.name, tag, qos))
            return flt.text not in self.subs
        old = self.subs.get(flt.text)
        q = self._session_queue(qos)
        args = sub.bound = sub.binding_args(self.level == rc.MQTT5)
        self._bind(q, key, args)
        start.append((q.name, f"qos{qos}", qos))
        if old is not None:  # moved to another QoS's queue, or other options: unbind the old
            old_args = old.bound or {}
            if old.options.qos != qos or args_key(old_args) != args_key(args):
                vh.unbind(EXCHANGE, "queue", self._queue_name(old.options.qos), key,
                          old_args, self)
        return old is None

    def _on_unsubscribe(self, p: pk.Unsubscribe) -> None:
        ch = self.channel
        assert ch is not None
        codes = []
        for text in p.topics:
            sub = self.subs.pop(text, None)
            if sub is None:
                codes.append(rc.NO_SUBSCRIPTION_EXISTED)
                continue
            if sub.flt.share is not None:
                tag = "share:" + text
                mine = ch.unacked_of(tag)
                ch.basic_cancel(tag)
                if mine:  # its unacked deliveries go to the other members now
                    from ackmq.broker.queue_type import RETURN
                    ch.settle(RETURN, ch.take_for_consumer(tag, mine[-1], True))
            else:
                ch.vhost.unbind(EXCHANGE, "queue", self._queue_name(sub.options.qos),
                                to_amqp(sub.flt.topic), sub.bound or {}, self)
            codes.append(rc.SUCCESS)
        self._recount()
        self.write(encode(pk.UnsubAck(p.packet_id, codes), self.level))

    # -- deliveries --------------------------------------------------------------------
    def _next_pid(self) -> int:
        pid = self.next_pid
        inflight, released = self.inflight, self.released
        while pid in inflight or pid in released:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        msg = entry.message
        assert msg is not None
        sub_qos = self.consumer_qos.get(consumer.tag, 0)
        raw = msg.properties
        pq = publish_qos(raw)
        qos = sub_qos if pq is None or pq > sub_qos else pq
        topic = from_amqp(msg.routing_key)
        if topic[:1] == "$" and not self._dollar_matched(consumer.tag, topic):
            if not consumer.no_ack:  # amq.topic's `*`/`#` matched it; MQTT's do not
                self._ack_later(delivery_tag)
            return
        own_queue = consumer.tag.startswith("qos")
        if self.no_local and own_queue and self._local_only(raw, sub_qos, topic):
            if not consumer.no_ack:  # [MQTT-3.8.3-3]: not to the client that published it
                self._ack_later(delivery_tag)
            return
        retain = bool(self.as_published and own_queue and header_of(raw, RETAIN)
                      and self._as_published(sub_qos, topic))
        props = b""
        name, alias = topic, None
        if self.level == rc.MQTT5:
            left = msg.expiration_ms
            if left is not None and entry.expires_at is not None:  # what is left of it
                left = min(left, max(0, int((entry.expires_at - time.monotonic()) * 1000)))
            if self.alias_max:
                name, alias = self._alias(topic)
            props = self._v5_properties(raw, left, topic, own_queue, sub_qos, alias)
        pid = 0
        if qos:
            pid = self._next_pid()
            self.inflight[pid] = (delivery_tag, qos)
        elif not consumer.no_ack:
            self._ack_later(delivery_tag)
        data = encode_publish(name, msg.body, qos, retain, bool(qos and entry.redelivered),
                              pid, self.level, props)
        if len(data) > self.client_max_packet:  # 5.0: dropped as if delivered ([MQTT-3.1.2-25])
            if qos:
                del self.inflight[pid]
                self._ack_later(delivery_tag)
            return
        if alias is not None and name:  # the client learns the alias with this packet
            self.out_aliases[topic] = alias
        self.write(data)

    def _alias(self, topic: str) -> tuple[str, int | None]:
        """The topic name to send and its alias (5.0, [MQTT-3.3.2-9]): a known one with
        an empty name; a new one, while there is room, with the name (recorded once the
        packet is written); none when the client's Topic Alias Maximum is used up."""
        alias = self.out_aliases.get(topic)
        if alias is not None:
            return "", alias
        if len(self.out_aliases) < self.alias_max:
            return topic, len(self.out_aliases) + 1
        return topic, None

    def _dollar_matched(self, tag: str, topic: str) -> bool:
        """Does one of the consumer's subscriptions match this `$` topic by MQTT's rule
        (no wildcard first level, [MQTT-4.7.2-1]), and not only by amq.topic's?"""
        if tag.startswith("share:"):
            sub = self.subs.get(tag[len("share:"):])
            return sub is not None and matches(sub.flt.topic, topic)
        return bool(self._own_matching(topic, self.consumer_qos.get(tag, 0)))

    def _local_only(self, raw: bytes, sub_qos: int, topic: str) -> bool:
        """Did this client publish it, and is every subscription of the queue that
        matches it a No Local one?"""
        who = header_of(raw, PUBLISHER)
        if isinstance(who, bytes):
            who = who.decode("utf-8", "surrogateescape")
        if who != self.client_id:
            return False
        return not any(not s.options.no_local for s in self._own_matching(topic, sub_qos))

    def _as_published(self, sub_qos: int, topic: str) -> bool:
        return any(s.options.retain_as_published for s in self._own_matching(topic, sub_qos))

    def _own_matching(self, topic: str, qos: int) -> tuple[Sub, ...]:
        """The session's own (not shared) subscriptions of QoS `qos` whose filter matches
        `topic`, kept per (topic, QoS) until the subscriptions change (`_recount`, which
        every change of `subs` ends with, before any delivery): a
        delivery asks up to four times, and a session may hold many filters (a profile of
        the MQTT fuzz had 16% of the broker in this scan, once per delivery)."""
        key = (topic, qos)
        hit = self._matching.get(key)
        if hit is None:
            if len(self._matching) >= MATCHING_MAX:
                self._matching.clear()
            hit = self._matching[key] = tuple(
                s for s in self.subs.values()
                if s.flt.share is None and s.options.qos == qos and matches(s.flt.topic, topic))
        return hit

    def _v5_properties(self, raw: bytes, expiration_ms: int | None, topic: str,
                       own_queue: bool, sub_qos: int, alias: int | None = None) -> bytes:
        props = mqtt5_properties(raw, expiration_ms)
        if alias is not None:
            props["topic_alias"] = alias
        if self.with_ids and own_queue:
            ids = [s.sub_id for s in self._own_matching(topic, sub_qos) if s.sub_id is not None]
            if ids:
                props["subscription_identifier"] = ids
        return encode_properties(props) if props else b""

    def _ack_later(self, tag: int) -> None:
        """QoS 0 deliveries of a queue that needs acks are acked after the delivery loop
        that made them (never from inside it); one callback per batch."""
        if not self.ack_later:
            self.ctx.loop.call_soon(self._ack_now)
        self.ack_later.append(tag)

    def _ack_now(self) -> None:
        tags, self.ack_later = self.ack_later, []
        ch = self.channel
        if ch is None:
            return
        for tag in tags:
            if tag in ch.unacked:
                ch.basic_ack(tag, False)
        self.ctx.request_flush()

    def _on_puback(self, p: pk.PubAck) -> None:
        got = self.inflight.pop(p.packet_id, None)
        if got is not None and got[0] is not None and self.channel is not None:
            self.channel.basic_ack(got[0], False)

    def _on_pubrec(self, p: pk.PubRec) -> None:
        """The client has the QoS 2 message: once that is on disk (`mqtt-qos2.log`: the
        PUBREL goes again after a crash or a reconnect, [MQTT-4.4.0-1]) the queue lets
        it go and PUBREL goes out."""
        pid = p.packet_id
        got = self.inflight.pop(pid, None)
        if got is None:
            code = rc.PACKET_IDENTIFIER_NOT_FOUND if self.level == rc.MQTT5 else 0
            if p.reason_code < 0x80:
                self.write(encode(pk.PubRel(pid, code), self.level))
            return
        tag = got[0]
        if p.reason_code >= 0x80:  # the client refused it: no PUBREL ([MQTT-4.3.3])
            if tag is not None and self.channel is not None:
                self.channel.basic_ack(tag, False)
            return
        self.released.add(pid)
        st = self.mqtt
        if st is None or self.vhost is None:
            self._released(tag, pid)
            return
        st.qos2_add(self.vhost.name, self.client_id, pid, out=True)
        st.after_sync(lambda: self._released(tag, pid))

    def _released(self, tag: int | None, pid: int) -> None:
        ch = self.channel
        if ch is None:
            return  # gone meanwhile: the PUBREL goes when the session comes back
        if tag is not None and tag in ch.unacked:
            ch.basic_ack(tag, False)
        self.write(encode(pk.PubRel(pid), self.level))

    def _on_pubcomp(self, p: pk.PubComp) -> None:
        self.released.discard(p.packet_id)
        if self.mqtt is not None and self.vhost is not None:
            self.mqtt.qos2_remove(self.vhost.name, self.client_id, p.packet_id, out=True)

    # -- retained messages (N5) -----------------------------------------------------------
    def _send_retained(self, sub: Sub, granted: int) -> None:
        assert self.mqtt is not None and self.vhost is not None
        now = time.time()
        for r in self.mqtt.retained_for(self.vhost.name, sub.flt.topic, now):
            self._publish_retained(r, min(r.qos, granted), sub.sub_id, r.left_ms(now))

    def _publish_retained(self, r: Retained, qos: int, sub_id: int | None,
                          left_ms: int | None) -> None:
        props = b""
        if self.level == rc.MQTT5:
            d = mqtt5_properties(r.properties, left_ms)
            if sub_id is not None:
                d["subscription_identifier"] = [sub_id]
            props = encode_properties(d) if d else b""
        pid = 0
        if qos:
            pid = self._next_pid()
            self.inflight[pid] = (None, qos)
        data = encode_publish(r.topic, r.payload, qos, True, False, pid, self.level, props)
        if len(data) > self.client_max_packet:
            self.inflight.pop(pid, None)
            return
        self.write(data)

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        """A session queue was deleted under the connection (purge is fine, delete ends
        the subscriptions on it) or a consumer timed out: the subscription ends."""
        self.consumer_qos.pop(consumer_tag, None)

