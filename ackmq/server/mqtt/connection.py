"""One MQTT 3.1 / 3.1.1 / 5.0 connection (SPEC N1-N8) on the same broker model as AMQP.

As RabbitMQ's plugin: a connection is one model `ChannelModel` (it implements the
channel's `ChannelOutput`), topics are routing keys on `amq.topic` (`/` <-> `.`), a
session's subscriptions are bindings to its queues `mqtt-subscription-<client id>qos<n>`
(durable for a persistent session), and a PUBLISH is a `basic_publish`. QoS 1 and 2
publishes ride on publisher confirms: PUBACK / PUBREC go out when the confirm does, i.e.
after the group commit's fsync when the message reached a durable queue (N3, P5c).
Subscriptions and deliveries are in subscriptions.py; what MQTT keeps beside the queues
(client ids, retained messages, QoS 2 packet ids, delayed wills) in state.py.

A refusal is MQTT's answer: a CONNACK return / reason code, a reason code in the PUBACK,
PUBREC or SUBACK (5.0), or DISCONNECT with a reason code (5.0) and the socket closed (N8);
3.1.1 has no way to refuse a packet but closing the connection, and does so.
"""

from __future__ import annotations

import base64
import logging
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import ChannelAccess
from ackmq.broker.confirms import take_confirmed
from ackmq.broker.errors import ReplyError
from ackmq.protocol.mqtt import Decoder, MQTTError, encode
from ackmq.protocol.mqtt import constants as rc
from ackmq.protocol.mqtt import packets as pk
from ackmq.protocol.mqtt.amqp_map import properties_for
from ackmq.protocol.mqtt.topics import TopicError, check_name, to_amqp
from ackmq.server import admission
from ackmq.server.admission import BAD_CREDENTIALS, VHOST_ACCESS, Refusal
from ackmq.server.mqtt.state import MQTTState, state_of
from ackmq.server.mqtt.states import TRANSITIONS
from ackmq.server.mqtt.states import MQTTState as S
from ackmq.server.mqtt.subscriptions import MAX_CLIENT_ID, Subscriptions
from ackmq.server.mqtt.vhosts import choose_vhost
from ackmq.server.tls import certificate_subject, certificate_user
from ackmq.server.transport import ClientConnection, events_from

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.message import Message
    from ackmq.protocol.mqtt import Packet
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.mqtt")

EXCHANGE = "amq.topic"  # RabbitMQ's mqtt.exchange
TOPIC_ALIAS_MAXIMUM = 1024  # per connection, client to server (5.0)
# 5.0: QoS 1 and 2 PUBLISHes a client may have unanswered (no PUBACK / PUBCOMP yet), told
# in CONNACK; one more is DISCONNECT 0x93 ([MQTT-3.3.4-7]). Room for group commits.
RECEIVE_MAXIMUM = 1024
NEVER = 0xFFFFFFFF  # a session expiry interval that never ends
_GONE = (S.CLOSING, S.CLOSED)  # input is dropped: our close is on its way
PROTOCOL_NAMES = {rc.MQTT31: "MQTT 3.1", rc.MQTT311: "MQTT 3.1.1", rc.MQTT5: "MQTT 5-0"}


class Refused(Exception):
    """A packet refused: DISCONNECT `reason_code` (5.0) or close (3.x)."""

    def __init__(self, reason_code: int, text: str) -> None:
        super().__init__(text)
        self.reason_code = reason_code
        self.text = text


class MQTTConnection(Subscriptions, ClientConnection):
    transitions = TRANSITIONS
    number = 1  # the channel's number in texts the model writes
    cancel_notify = True

    def __init__(self, ctx: FrontEnd) -> None:
        super().__init__(ctx)
        self.decoder = Decoder(max_packet_size=ctx.config.mqtt_packet_limit())
        self.state: S = S.CONNECT
        self.level = rc.MQTT311
        self.client_id = ""
        self.channel: ChannelModel | None = None
        self.mqtt: MQTTState | None = None
        self.keep_alive = 0
        self.will: pk.Will | None = None
        self.clean = True
        self.session_expiry = 0
        self.aliases: dict[int, str] = {}
        self.client_max_packet = rc.MAX_VARINT + 5  # 5.0: the client's maximum packet size
        # confirms owed: publish sequence number -> (PubAck or PubRec, packet id, routed)
        self.owed: OrderedDict[int, tuple[type, int, bool]] = OrderedDict()
        self.qos2_pending: set[int] = set()  # QoS 2 ids published, PUBREC not sent yet
        self._init_subscriptions()

    @property
    def protocol(self) -> str:  # type: ignore[override]
        return PROTOCOL_NAMES.get(self.level, "MQTT 3.1.1")

    @property
    def channel_count(self) -> int:
        return 1 if self.channel is not None else 0

    def open_channels(self) -> list[tuple[int, Any]]:
        ch = self.channel
        return [(1, ch)] if ch is not None and ch.open else []

    # -- input ------------------------------------------------------------------------
    def _input(self, data: bytes) -> None:
        if self.state in _GONE:
            return
        error = None
        try:
            packets = self.decoder.feed(data)
        except MQTTError as e:
            packets, error = e.packets, e
        self._packets(packets, error)
        self.ctx.request_flush()

    def _packets(self, packets: list[Any], error: MQTTError | None) -> None:
        blocking = self.ctx.blocking
        for p in packets:
            if self.state in _GONE:
                return
            self._packet(p)
            if blocking and type(p) is pk.Publish and self.state == S.OPEN:
                self.block_for_alarm(events_from(packets + [error], p)[1:])
                return
        if error is not None and self.state not in _GONE:
            self._decode_error(error)

    def _handle_held(self, held: list[Any]) -> None:
        *packets, error = held
        if self.state not in _GONE:
            self._packets(packets, error)

    def _decode_error(self, e: MQTTError) -> None:
        if self.state == S.CONNECT:
            log.info("MQTT CONNECT from %s refused: %s", self.peer, e.text)
            if e.reason_code == rc.UNSUPPORTED_PROTOCOL_VERSION:
                # answered in the version the client can read: 3.1.1's return code 1
                self.write(encode(pk.ConnAck(rc.REFUSED_PROTOCOL_VERSION), rc.MQTT311))
            self._shutdown()
            return
        self._disconnect(e.reason_code, e.text)

    def _packet(self, p: Packet) -> None:
        try:
            if self.state == S.CONNECT:
                if type(p) is not pk.Connect:
                    raise Refused(rc.PROTOCOL_ERROR, "the first packet must be CONNECT")
                self._connect(p)
                return
            handler = _HANDLERS.get(type(p))
            if handler is None:
                raise Refused(rc.PROTOCOL_ERROR, f"a client may not send {type(p).__name__}")
            handler(self, p)
        except Refused as e:
            self._disconnect(e.reason_code, e.text)
        except ReplyError as e:  # the model refused what the packet asked for
            self._disconnect(rc.NOT_AUTHORIZED if e.code == 403 else rc.UNSPECIFIED_ERROR,
                             e.text)

    # -- CONNECT (N1, N4) ----------------------------------------------------------------
    def _connect(self, p: pk.Connect) -> None:
        self.level = p.level
        v5 = p.level == rc.MQTT5
        ctx = self.ctx
        client_id = p.client_id
        assigned = None
        if not client_id:
            if not p.clean_start and not v5:  # [MQTT-3.1.3-8]
                return self._connack_refused(rc.CLIENT_IDENTIFIER_NOT_VALID,
                                             "an empty client id needs a clean session")
            client_id = assigned = "ackmq-" + base64.urlsafe_b64encode(
                os.urandom(12)).decode()
        if len(client_id.encode()) > MAX_CLIENT_ID:  # its queues' names must fit AMQP's
            return self._connack_refused(rc.CLIENT_IDENTIFIER_NOT_VALID,
                                         f"client id longer than {MAX_CLIENT_ID} bytes")
        vhost_name, user = choose_vhost(ctx.parameters, p.username, self._local_port(),
                                        self._certificate_names())
        cert_user = self.certificate_user() if ctx.config.mqtt_ssl_cert_login and \
            p.username is None and p.password is None else None
        if cert_user is not None:  # U4, mqtt.ssl_cert_login: the certificate names the user
            got = admission.certificate_login(ctx.access, ctx.config.loopback_users,
                                              cert_user, self.peer)
        elif p.username is None:
            anonymous = ctx.config.mqtt_anonymous_user
            if anonymous is None:
                return self._connack_refused(rc.NOT_AUTHORIZED, "no user name, and "
                                             "anonymous connections are not enabled")
            got = admission.certificate_login(ctx.access, ctx.config.loopback_users,
                                              anonymous, self.peer)
        else:
            password = (p.password or b"").decode("utf-8", "replace")
            got = admission.password_login(ctx.access, ctx.config.loopback_users, user,
                                           password, self.peer)
        got = admission.counted(ctx.broker.stats, "mqtt", got)
        if isinstance(got, Refusal):
            log.warning("MQTT login refused for user %r from %s", got.user, self.peer)
            return self._connack_refused(
                rc.BAD_USER_NAME_OR_PASSWORD if got.kind == BAD_CREDENTIALS
                else rc.NOT_AUTHORIZED, f"access refused for user '{got.user}'")
        user = got
        vhost = ctx.broker.vhosts.get(vhost_name)
        if vhost is None:  # RabbitMQ's plugin: 3.1.1 CONNACK 4, 5.0 0x86
            return self._connack_refused(rc.BAD_USER_NAME_OR_PASSWORD,
                                         f"virtual host '{vhost_name}' does not exist")
        refusal = admission.open_vhost(ctx, self, user, vhost_name)  # U6, U3
        if refusal is not None:
            return self._connack_refused(
                rc.NOT_AUTHORIZED if refusal.kind == VHOST_ACCESS else rc.QUOTA_EXCEEDED,
                f"access to virtual host '{vhost_name}' refused for user '{user}'")
        self.user = user
        self.client_id = client_id
        self.keep_alive = p.keep_alive
        most = ctx.config.mqtt_max_keep_alive
        server_keep_alive = None
        if v5 and most and not 0 < p.keep_alive <= most:  # [MQTT-3.2.2-21]
            self.keep_alive = server_keep_alive = most
        self.will = p.will
        self.clean = p.clean_start
        props = p.properties
        if v5:
            self.session_expiry = props.get("session_expiry_interval", 0)
            self.client_max_packet = props.get("maximum_packet_size", self.client_max_packet)
            self.alias_max = props.get("topic_alias_maximum", 0)
        else:
            self.session_expiry = 0 if p.clean_start else NEVER
        self.mqtt = st = state_of(ctx)
        key = (vhost_name, client_id)
        old = st.sessions.get(key)
        if old is not None and old is not self:  # N4: session takeover
            old.taken_over()
        timer = st.wills.pop(key, None)
        if timer is not None:  # reconnected within the will delay: no will (N6)
            timer.cancel()
        st.sessions[key] = self
        self.vhost = vhost
        ch = self.channel = ctx.broker.open_channel(vhost, self, self, user, "mqtt")
        ch.access = ChannelAccess(ctx.access, user, vhost_name, {"client_id": client_id})
        ch.confirm_select()
        receive_max = props.get("receive_maximum", 65535) if v5 else PREFETCH
        ch.basic_qos(0, receive_max, True)
        try:
            present = self._open_session(self.clean)
            self._apply_session_expiry()
        except ReplyError as e:  # e.g. an AMQP client's exclusive queue of that name
            self.will = None
            return self._connack_refused(
                rc.NOT_AUTHORIZED if e.code == 403 else rc.SERVER_UNAVAILABLE, e.text)
        ack_props: dict[str, Any] = {}
        if v5:
            if assigned is not None:
                ack_props["assigned_client_identifier"] = assigned
            ack_props["topic_alias_maximum"] = TOPIC_ALIAS_MAXIMUM
            ack_props["receive_maximum"] = RECEIVE_MAXIMUM
            ack_props["maximum_packet_size"] = ctx.config.mqtt_packet_limit()
            if server_keep_alive is not None:
                ack_props["server_keep_alive"] = server_keep_alive
        self.write(encode(pk.ConnAck(rc.SUCCESS, present, ack_props), self.level))
        self._to(S.OPEN)
        self._handshake_done()
        if self.keep_alive:  # a client silent for 1.5 keep-alives is gone [MQTT-3.1.2-24]
            self.start_heartbeats(0.0, 1.5 * self.keep_alive)
        for pid in sorted(self.released):  # [MQTT-4.4.0-1]: PUBRELs owed go again
            self.write(encode(pk.PubRel(pid), self.level))
        self._start_consumers()

    def _local_port(self) -> int | None:
        """The port the client connected to: its listener's (mqtt_port_to_vhost_mapping)."""
        t = self.transport
        name = t.get_extra_info("sockname") if t is not None else None
        return name[1] if isinstance(name, tuple) and len(name) > 1 else None

    def _certificate_names(self) -> tuple[str, ...]:
        """The verified client certificate's subject DN and CN (mqtt_default_vhosts' keys);
        () without one."""
        t = self.transport
        cert = t.get_extra_info("peercert") if t is not None else None
        return tuple(n for n in (certificate_subject(cert), certificate_user(cert)) if n)

    def _connack_refused(self, reason: int, text: str) -> None:
        log.info("MQTT CONNECT from %s refused: %s", self.peer, text)
        if self.level == rc.MQTT5:
            props = {"reason_string": text}
            self.write(encode(pk.ConnAck(reason, False, props), self.level))
        else:
            self.write(encode(pk.ConnAck(rc.V311_CONNACK.get(reason, rc.REFUSED_NOT_AUTHORIZED)),
                              self.level))
        self._shutdown()

    # -- PUBLISH (N3, N5) ------------------------------------------------------------------
    def _on_publish(self, p: pk.Publish) -> None:
        topic = p.topic
        props = p.properties
        if props:
            alias = props.pop("topic_alias", None)
            if alias is not None:
                if not 0 < alias <= TOPIC_ALIAS_MAXIMUM:
                    raise Refused(rc.TOPIC_ALIAS_INVALID, f"topic alias {alias} is not "
                                  f"between 1 and {TOPIC_ALIAS_MAXIMUM}")
                if topic:
                    self.aliases[alias] = topic
                else:
                    got = self.aliases.get(alias)
                    if got is None:
                        raise Refused(rc.PROTOCOL_ERROR, f"topic alias {alias} is not set")
                    topic = got
            if "subscription_identifier" in props:
                raise Refused(rc.PROTOCOL_ERROR, "a PUBLISH from a client may not carry "
                              "a subscription identifier")
        try:
            check_name(topic)
        except TopicError as e:  # a MUST broken: protocol error, as Mosquitto (0x90 is
            raise Refused(rc.PROTOCOL_ERROR, str(e)) from None  # for names well formed)
        qos, pid = p.qos, p.packet_id
        if qos == 2:
            if pid in self.qos2_pending:  # its PUBREC is on its way
                return
            if pid in self._qos2_ids():  # received before: PUBREC again, no second copy
                # DUP or not: until its PUBREL the id is this message's (MQTT 4.3.3), and
                # paho-mqtt was seen resending one the broker had, after a power cut,
                # without DUP. A released id is never stale: the PUBCOMP waits for the
                # release to be durable (_on_pubrel)
                self.write(encode(pk.PubRec(pid), self.level))
                return
        if qos and self.level == rc.MQTT5 and \
                len(self.owed) + len(self._qos2_ids()) >= RECEIVE_MAXIMUM:
            raise Refused(rc.RECEIVE_MAXIMUM_EXCEEDED, f"more than {RECEIVE_MAXIMUM} QoS 1 "
                          "and 2 PUBLISH packets not answered with PUBACK or PUBCOMP")
        ch = self.channel
        assert ch is not None and ch.confirms is not None
        raw = properties_for(qos, p.dup, props, p.retain,
                             self.client_id if self.no_local else None)
        key = to_amqp(topic)
        try:
            # QoS 2: no consumer has it before its commit (and its id's note) is durable
            seq, routed = ch.basic_publish(EXCHANGE, key, qos > 0 and self.level == rc.MQTT5,
                                           False, raw, p.payload, hold=qos == 2)
        except ReplyError as e:
            if qos and self.level == rc.MQTT5:  # 5.0 refuses the one message
                code = rc.NOT_AUTHORIZED if e.code == 403 else rc.UNSPECIFIED_ERROR
                ack = pk.PubAck if qos == 1 else pk.PubRec
                self.write(encode(ack(pid, code, {"reason_string": e.text}), self.level))
                return
            raise
        if p.retain and self.mqtt is not None and self.vhost is not None:
            self.mqtt.retain(self.vhost.name, topic, qos, raw, p.payload,
                             props.get("message_expiry_interval") if props else None)
        if qos:
            if qos == 2:
                self.qos2_pending.add(pid)
                if self.mqtt is not None and self.vhost is not None:  # in the message's frame
                    self.mqtt.qos2_note(self.vhost.name, self.client_id, pid)
            self.owed[seq] = (pk.PubAck if qos == 1 else pk.PubRec, pid, routed)

    def _qos2_ids(self) -> set[int]:
        assert self.mqtt is not None and self.vhost is not None
        return self.mqtt.qos2_ids(self.vhost.name, self.client_id)

    def _on_pubrel(self, p: pk.PubRel) -> None:
        """The client releases a QoS 2 message it sent: forget its id, and once that is
        durable, PUBCOMP. Not before: the client may reuse the id at once, and a new
        message resent with DUP after a crash must not meet the old id."""
        pid = p.packet_id
        known = self._release_qos2(pid)
        code = rc.SUCCESS if known or self.level != rc.MQTT5 else rc.PACKET_IDENTIFIER_NOT_FOUND
        data = encode(pk.PubComp(pid, code), self.level)
        st = self.mqtt
        if known and st is not None and st.qos2_noted():
            def durable(exc: BaseException | None) -> None:
                if exc is None and self.state == S.OPEN:  # else the client sends PUBREL again
                    self.write(data)
                    self.ctx.request_flush()
            self.ctx.broker.await_commit_callback(durable)
            self.ctx.request_flush()
        else:
            self.write(data)

    def _release_qos2(self, pid: int) -> bool:
        st = self.mqtt
        return st is not None and self.vhost is not None and \
            st.qos2_remove(self.vhost.name, self.client_id, pid)

    def _write_answers(self, answers: list[bytes]) -> None:
        if self.state == S.OPEN:
            for data in answers:
                self.write(data)

    # -- ChannelOutput: confirms --------------------------------------------------------
    def unroutable(self, message: Message) -> None:
        pass  # the publish's outcome says it (C2): PUBACK 0x10 "no matching subscribers"

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        if self.state == S.CLOSED:
            return
        done = take_confirmed(self.owed, delivery_tag, multiple)
        if not done:
            return
        st = self.mqtt
        v5 = self.level == rc.MQTT5
        for kind, pid, _routed in done:
            if kind is pk.PubRec:
                self.qos2_pending.discard(pid)
                if st is not None and self.vhost is not None:
                    if ack:
                        st.qos2_add(self.vhost.name, self.client_id, pid)
                    else:
                        st.qos2_unnote(self.vhost.name, self.client_id, pid)
        answers = []
        for kind, pid, routed in done:
            if not ack:
                if not v5:  # 3.1.1 cannot refuse one message: the client will resend it
                    self._disconnect(rc.QUOTA_EXCEEDED, "a queue refused a message")
                    return
                answers.append(encode(kind(pid, rc.QUOTA_EXCEEDED, {
                    "reason_string": "a queue refused the message (full with "
                                     "x-overflow=reject-publish) or the storage failed"}),
                    self.level))
            elif v5 and not routed:
                answers.append(encode(kind(pid, rc.NO_MATCHING_SUBSCRIBERS), self.level))
            else:
                answers.append(encode(kind(pid), self.level))
        if st is not None and st.waiting:  # retained messages, QoS 2 ids: on disk first
            st.after_sync(lambda: self._write_answers(answers))
        else:
            for data in answers:
                self.write(data)

    # -- PINGREQ, DISCONNECT, keep alive ------------------------------------------------
    def _on_pingreq(self, p: pk.PingReq) -> None:
        self.write(b"\xd0\x00")

    def _on_disconnect(self, p: pk.Disconnect) -> None:
        if p.reason_code != rc.DISCONNECT_WITH_WILL:
            self.will = None  # N6: a normal DISCONNECT discards the will
        expiry = p.properties.get("session_expiry_interval")
        if expiry is not None:
            if self.session_expiry == 0 and expiry:
                raise Refused(rc.PROTOCOL_ERROR, "the session expiry interval was 0 at "
                                                 "CONNECT and cannot be set at DISCONNECT")
            self.session_expiry = expiry
            self._apply_session_expiry()
        self._shutdown()

    def _heartbeats_missed(self) -> None:
        """Keep alive expired: 5.0's DISCONNECT 0x8D, and the will goes (N6)."""
        log.info("MQTT keep alive expired for %s (client %r)", self.peer, self.client_id)
        self._disconnect(rc.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
        self.ctx.request_flush()

    # -- closing --------------------------------------------------------------------------
    def _disconnect(self, reason: int, text: str) -> None:
        """5.0: DISCONNECT with the reason (once CONNACKed), then close; 3.x: close.
        The DISCONNECT is every protocol's close (C3, `_close_with`): what is confirmed
        is answered first, and what the client still sends is read and dropped until it
        closes (or CLOSE_OK_WAIT), so it meets no reset before it has read why."""
        if self.state in _GONE:
            return
        log.info("MQTT connection from %s closed: %s", self.peer, text[:300])
        if self.level == rc.MQTT5 and self.state == S.OPEN:
            self._close_with(encode(pk.Disconnect(reason, {"reason_string": text[:200]}),
                                    self.level))
            return
        self._shutdown()

    def taken_over(self) -> None:
        """Another connection CONNECTed with this client id (N4)."""
        self._disconnect(rc.SESSION_TAKEN_OVER, "another connection took the session over")

    def _release_channels(self) -> None:
        """The will (N6) if the connection ended without DISCONNECT; unacked deliveries go
        back to the session's queues (D8); a clean session's queues go."""
        ch, self.channel = self.channel, None
        if ch is None:
            return
        will, self.will = self.will, None
        st = self.mqtt
        if st is not None:
            key = (ch.vhost.name, self.client_id)
            if st.sessions.get(key) is self:
                del st.sessions[key]
            if will is not None:
                from ackmq.server.mqtt.will import send_will
                send_will(self.ctx, st, ch.vhost.name, self.user, self.client_id, will,
                          self.session_expiry)
        ch.close()
        self._end_session(ch)

    def _close_forced(self, text: str) -> None:
        """Broker shutdown, vhost or user deleted."""
        self._disconnect(rc.SERVER_SHUTTING_DOWN if "shutdown" in text
                         else rc.ADMINISTRATIVE_ACTION, text)

    def close(self, code: int, text: str) -> None:
        """The model closes the channel on its own (consumer timeout)."""
        self._disconnect(rc.UNSPECIFIED_ERROR, text)

    def _wake(self) -> None:
        if self.channel is not None:
            self.channel.wake()


PREFETCH = 10  # 3.1.1's deliveries in flight per connection (RabbitMQ's mqtt.prefetch)

_HANDLERS: dict[type, Any] = {
    pk.Publish: MQTTConnection._on_publish,
    pk.PubAck: MQTTConnection._on_puback,
    pk.PubRec: MQTTConnection._on_pubrec,
    pk.PubRel: MQTTConnection._on_pubrel,
    pk.PubComp: MQTTConnection._on_pubcomp,
    pk.Subscribe: MQTTConnection._on_subscribe,
    pk.Unsubscribe: MQTTConnection._on_unsubscribe,
    pk.PingReq: MQTTConnection._on_pingreq,
    pk.Disconnect: MQTTConnection._on_disconnect,
}
# a server never receives PINGRESP (or anything else not above): a protocol error
