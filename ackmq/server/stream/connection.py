"""One connection of RabbitMQ's stream protocol (SPEC X1-X6): peer properties, SASL
through server/admission.py, tune, open (the vhost), heartbeats, close; then the
commands, translated onto the model by publishing.py (publishers, confirms,
deduplication), subscriptions.py (chunks straight from the log, credit) and streams.py
(create/delete, metadata, stats, super streams, offsets).

Frames are decoded by protocol/stream (sans-IO). A frame that cannot be read, or one
that is not allowed in the connection's state, gets the protocol's Close with its code
(UNKNOWN_FRAME, FRAME_TOO_LARGE) after the commands read before it were handled; nothing
reaches the log as a traceback and nobody else is disturbed. The connection is the
model channel's `ChannelOutput` (one channel per connection, in confirm mode).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ackmq.broker.access import ChannelAccess
from ackmq.broker.errors import ReplyError
from ackmq.protocol.stream import constants as K
from ackmq.protocol.stream import frames as F
from ackmq.protocol.stream.frames import Command
from ackmq.server import admission
from ackmq.server.admission import LOOPBACK_ONLY, Refusal
from ackmq.server.stream import publishing, streams, subscriptions
from ackmq.server.stream.states import TRANSITIONS, StreamState
from ackmq.server.stream.states import StreamState as S
from ackmq.server.transport import ClientConnection, events_from

if TYPE_CHECKING:
    from ackmq.broker.channel import ChannelModel
    from ackmq.broker.consumer import Consumer
    from ackmq.broker.message import Message
    from ackmq.broker.queue_type import QueueEntry
    from ackmq.broker.vhost import VHost
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.stream")

INITIAL_FRAME_MAX = 8192  # until open, as RabbitMQ's stream.initial_frame_max
FRAME_MAX = 1048576  # proposed in tune, as RabbitMQ 3.10
MECHANISMS = ["AMQPLAIN", "PLAIN"]  # RabbitMQ 3.10's answer to the SASL handshake
# (key, min version, max version) of each command, in key order (rstream reads the list
# by key - 1): what ExchangeCommandVersions answers (RabbitMQ 3.13+: Publish 2 carries
# filter values, Deliver 2 the committed chunk id)
_V2 = (K.PUBLISH, K.DELIVER)
COMMAND_VERSIONS = [(k, 1, 2 if k in _V2 else 1)
                    for k in range(K.DECLARE_PUBLISHER, K.DELETE_SUPER_STREAM + 1)]
_BEFORE_OPEN = {K.PEER_PROPERTIES, K.SASL_HANDSHAKE, K.SASL_AUTHENTICATE, K.TUNE,
                K.RESPONSE | K.TUNE, K.OPEN, K.CLOSE, K.RESPONSE | K.CLOSE, K.HEARTBEAT}


class StreamConnection(ClientConnection):
    protocol = "stream"
    transitions = TRANSITIONS
    heartbeat_frame = F.heartbeat()  # the Heartbeat command
    log = log
    number = 0  # ChannelOutput: the one channel's number in the model's texts
    cancel_notify = False

    def __init__(self, ctx: FrontEnd) -> None:
        super().__init__(ctx)
        self.decoder = F.Decoder(INITIAL_FRAME_MAX)
        self.state: StreamState = S.PEER
        self.vhost: VHost | None = None
        self.channel: ChannelModel | None = None
        self.frame_max = FRAME_MAX
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self.publishers = publishing.Publishers(self)
        self.subscriptions = subscriptions.Subscriptions(self)
        self._close_correlation = 1
        self.deliver_version = 1  # 2 once the client's ExchangeCommandVersions offers it
        self._delivering = False  # subscriptions wait for this turn's flush
        self._handlers: dict[int, Callable[[Command], None]] = {
            K.DECLARE_PUBLISHER: self.publishers.declare,
            K.PUBLISH: self.publishers.publish,
            K.QUERY_PUBLISHER_SEQUENCE: self.publishers.query_sequence,
            K.DELETE_PUBLISHER: self.publishers.delete,
            K.SUBSCRIBE: self.subscriptions.subscribe,
            K.CREDIT: self.subscriptions.credit,
            K.UNSUBSCRIBE: self.subscriptions.unsubscribe,
            K.STORE_OFFSET: lambda c: streams.store_offset(self, c),
            K.QUERY_OFFSET: lambda c: streams.query_offset(self, c),
            K.CREATE: lambda c: streams.create(self, c),
            K.DELETE: lambda c: streams.delete(self, c),
            K.METADATA: lambda c: streams.metadata(self, c),
            K.ROUTE: lambda c: streams.route(self, c),
            K.PARTITIONS: lambda c: streams.partitions(self, c),
            K.STREAM_STATS: lambda c: streams.stats(self, c),
            K.CREATE_SUPER_STREAM: lambda c: streams.create_super_stream(self, c),
            K.DELETE_SUPER_STREAM: lambda c: streams.delete_super_stream(self, c),
            K.RESOLVE_OFFSET_SPEC: lambda c: streams.resolve_offset_spec(self, c),
            K.EXCHANGE_COMMAND_VERSIONS: self._command_versions,
            K.RESPONSE | K.CONSUMER_UPDATE: self.subscriptions.consumer_update_answer,
        }

    # -- ChannelOutput (the model's answers to publishes) ---------------------------------
    def deliver(self, consumer: Consumer, delivery_tag: int, entry: QueueEntry) -> None:
        pass  # subscriptions read the log themselves: no model consumer on this channel

    def unroutable(self, message: Message) -> None:
        pass

    def confirm(self, ack: bool, delivery_tag: int, multiple: bool) -> None:
        self.publishers.confirmed(ack, delivery_tag, multiple)

    def consumer_cancelled(self, consumer_tag: str, reason: str = "") -> None:
        pass

    def close(self, code: int, text: str) -> None:
        self.close_connection(K.INTERNAL_ERROR, text)

    # -- input ----------------------------------------------------------------------------
    def _input(self, data: bytes) -> None:
        if self.state == S.CLOSED:
            return
        try:
            commands = self.decoder.feed(data)
        except F.StreamFrameError as e:
            self._commands(getattr(e, "commands", []))
            if isinstance(e, F.FrameTooLarge):
                self.close_connection(K.FRAME_TOO_LARGE, str(e))
            elif isinstance(e, F.UnknownFrame):
                self.close_connection(K.UNKNOWN_FRAME, "unknown frame")
            else:
                self.close_connection(K.UNKNOWN_FRAME, f"malformed frame: {e}")
            self.ctx.request_flush()
            return
        self._commands(commands)
        self.ctx.request_flush()

    def _commands(self, commands: list[Command]) -> None:
        blocking = self.ctx.blocking
        for c in commands:
            if self.state == S.CLOSED:
                return
            if self.state == S.CLOSING:
                if c.key in (K.RESPONSE | K.CLOSE, K.CLOSE):
                    if c.key == K.CLOSE:
                        self.write(F.response(K.CLOSE, c.correlation_id, K.OK))
                    self._shutdown()
                    return
                continue
            if blocking and c.key == K.PUBLISH and self.state == S.OPEN:
                self.block_for_alarm(events_from(commands, c))  # U5: not read until clear
                return
            try:
                self._command(c)
            except F.BadFrame as e:
                self.close_connection(K.UNKNOWN_FRAME, f"malformed frame: {e}")
                return
            except ReplyError as e:  # the model refused something no handler caught
                self.close_connection(K.INTERNAL_ERROR, e.text)
                return

    def _handle_held(self, held: list[Any]) -> None:
        if self.state == S.OPEN:
            self._commands(held)

    def _command(self, c: Command) -> None:
        key = c.key
        if key == K.HEARTBEAT:
            return
        if self.state != S.OPEN:
            if key not in _BEFORE_OPEN:
                self.close_connection(K.UNKNOWN_FRAME, "unknown frame")
                return
            self._handshake(c)
            return
        if key == K.CLOSE:
            self.write(F.response(K.CLOSE, c.correlation_id, K.OK))
            self._shutdown()
            return
        handler = self._handlers.get(key)
        if handler is None:
            self.close_connection(K.UNKNOWN_FRAME, "unknown frame")
            return
        out = self.out
        n = len(out)
        handler(c)
        if len(out) != n and key != K.PUBLISH:  # (a Publish counts its PublishError)
            self._count_answers(out, n)

    def _count_answers(self, out: list[bytes], start: int) -> None:
        """RabbitMQ's stream error counters, from the answers a command got: one place
        for every handler's refusals (after Open only: RabbitMQ 3.10 counts none of the
        opening's)."""
        for data in out[start:]:
            code = F.answer_code(data)
            if code is not None and code != K.OK:
                self.count_error(code)

    def count_error(self, code: int) -> None:
        name = K.ERROR_NAMES.get(code)
        if name is not None:
            self.ctx.broker.stats.errors["stream"][name] += 1

    # -- opening ----------------------------------------------------------------------------
    def _handshake(self, c: Command) -> None:
        key = c.key
        if key == K.PEER_PROPERTIES and self.state == S.PEER:
            self.client_properties = dict(c.properties)
            self._to(S.SASL)
            self.write(F.peer_properties_response(c.correlation_id, self._server_properties()))
        elif key == K.SASL_HANDSHAKE and self.state in (S.PEER, S.SASL):
            if self.state == S.PEER:
                self._to(S.SASL)
            self.write(F.sasl_handshake_response(c.correlation_id, self._mechanisms()))
        elif key == K.SASL_AUTHENTICATE and self.state == S.SASL:
            self._authenticate(c)
        elif key in (K.TUNE, K.RESPONSE | K.TUNE) and self.state == S.TUNING:
            fm = c.frame_max
            self.frame_max = min(fm, FRAME_MAX) if fm else FRAME_MAX
            self.heartbeat = c.heartbeat
            self._to(S.OPENING)
        elif key == K.OPEN and self.state == S.OPENING:
            self._open(c)
        elif key == K.CLOSE:
            self.write(F.response(K.CLOSE, c.correlation_id, K.OK))
            self._shutdown()
        elif key == K.RESPONSE | K.CLOSE:
            self._shutdown()
        else:
            self.close_connection(K.UNKNOWN_FRAME, "frame out of sequence")

    def _server_properties(self) -> dict[str, str]:
        from ackmq.version import VERSION
        return {"product": "ackmq", "version": VERSION, "platform": "Python",
                "information": "ackmq: RabbitMQ's stream protocol, docs/stream-protocol.md"}

    def _mechanisms(self) -> list[str]:
        """RabbitMQ 3.10's two, and EXTERNAL on a TLS connection with a verified client
        certificate (as with RabbitMQ's rabbitmq_auth_mechanism_ssl, whose mechanism is
        offered where a peer certificate is)."""
        return MECHANISMS + ["EXTERNAL"] if self.certificate_user() else MECHANISMS

    def _authenticate(self, c: Command) -> None:
        mech = c.mechanism or ""
        if mech not in self._mechanisms():
            self.write(F.sasl_authenticate_response(c.correlation_id,
                                                    K.SASL_MECHANISM_NOT_SUPPORTED))
            return
        got = admission.counted(self.ctx.broker.stats, "stream", admission.sasl_login(
            self.ctx, mech, c.data or b"", self.peer,
            self.certificate_user() if mech == "EXTERNAL" else None))
        if isinstance(got, Refusal):
            log.warning("stream protocol %s login refused for user %r from %s", mech,
                        got.user, self.peer)
            code = K.SASL_AUTHENTICATION_FAILURE_LOOPBACK if got.kind == LOOPBACK_ONLY \
                else K.AUTHENTICATION_FAILURE
            self._close_with(F.sasl_authenticate_response(c.correlation_id, code))
            return
        self.user = got
        self.auth_mechanism = mech  # (the API's connection listings show it)
        self._to(S.TUNING)
        self.write(F.sasl_authenticate_response(c.correlation_id, K.OK))
        self.write(F.tune(FRAME_MAX, self.ctx.config.heartbeat))

    def _open(self, c: Command) -> None:
        name = c.vhost or ""
        broker = self.ctx.broker
        vhost = broker.vhosts.get(name)
        refusal = None if vhost is None else admission.open_vhost(self.ctx, self, self.user,
                                                                  name)
        if vhost is None or refusal is not None:
            log.warning("stream protocol connection from %s (user %r) refused vhost %r%s",
                        self.peer, self.user, name,
                        f": limit {refusal.limit}" if refusal is not None and refusal.limit
                        else "")
            self._close_with(F.open_response(c.correlation_id, K.VIRTUAL_HOST_ACCESS_FAILURE,
                                             None))
            return
        self.vhost = vhost
        ch = broker.open_channel(vhost, self, self, self.user, "stream")
        ch.access = ChannelAccess(self.ctx.access, self.user, vhost.name)
        ch.confirm_select()
        self.channel = ch
        self.decoder.max_frame = self.frame_max
        self._to(S.OPEN)
        host, port = self.advertised()
        self.write(F.open_response(c.correlation_id, K.OK, {
            "advertised_host": host, "advertised_port": str(port)}))
        self._handshake_done()
        # RabbitMQ's stream reader: a Heartbeat after half the negotiated interval of
        # quiet; a peer silent for two intervals is dropped (0: none)
        self.start_heartbeats(self.heartbeat / 2, 2 * self.heartbeat)

    def advertised(self) -> tuple[str, int]:
        """The host and port this broker is reached at, as metadata and open name it
        (RabbitMQ: stream.advertised_host/port, by default the node's host and port):
        the address the client connected to."""
        t = self.transport
        sock = t.get_extra_info("sockname") if t is not None else None
        if sock:
            return str(sock[0]), int(sock[1])
        return self.ctx.config.host or "localhost", 5552

    def _command_versions(self, c: Command) -> None:
        """Ours, and Deliver v2 from now on if the client's list says it reads it
        (RabbitMQ 3.13's rabbit_stream_reader: Deliver offered up to 2; a client that
        never asks, rstream 1.1 among them, keeps v1)."""
        self.write(F.command_versions_response(c.correlation_id, COMMAND_VERSIONS))
        for key, low, high in c.commands:
            if key == K.DELIVER and low <= 2 <= high:
                self.deliver_version = 2

    # -- output -------------------------------------------------------------------------------
    def want_delivery(self) -> None:
        """A subscription has credit and records to send: deliver at this turn's flush."""
        if not self._delivering:
            self._delivering = True
            if not self.queued:
                self.queued = True
                self.ctx.dirty.append(self)
            self.ctx.request_flush()

    def flush(self) -> None:
        if self._delivering and self.state == S.OPEN:
            self._delivering = False
            self.subscriptions.deliver()
        super().flush()

    def _wake(self) -> None:
        if self.subscriptions.waiting:
            self.want_delivery()

    # -- closing ------------------------------------------------------------------------------
    def close_connection(self, code: int, reason: str) -> None:
        """Bad input: the protocol's Close with its code (counted, as RabbitMQ counts its
        stream errors: all but a frame too large, which rabbit_stream_reader closes
        without counting), then wait briefly for the answer."""
        if self.state not in (S.CLOSING, S.CLOSED):
            if code != K.FRAME_TOO_LARGE:
                self.count_error(code)
            self._close_frame(code, reason)

    def _close_frame(self, code: int, reason: str) -> None:
        if self.state in (S.CLOSING, S.CLOSED):
            return
        log.info("closing stream protocol connection %s: %d %s", self.peer, code, reason)
        self._close_with(F.close_request(self._close_correlation, code, reason[:1000]))

    def _close_forced(self, text: str) -> None:
        """RabbitMQ's connection_forced: no client's error, not counted."""
        self._close_frame(K.INTERNAL_ERROR, text)

    def _release_channels(self) -> None:
        self.subscriptions.close()
        self.publishers.close()
        ch, self.channel = self.channel, None
        if ch is not None:
            ch.close()
