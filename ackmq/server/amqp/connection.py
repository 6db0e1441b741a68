"""One AMQP 0-9-1 connection: the handshake state machine, channel table, heartbeats,
and the output buffer written once per event-loop turn.

States: header -> start (start sent, waiting start-ok) -> tune (waiting tune-ok) ->
open-wait (waiting connection.open) -> open -> closing (we sent connection.close) -> closed;
the transition table is in states.py, checked at every change (`_to`).
Errors: a SoftError closes one channel; a HardError or a FrameError closes the
connection with connection.close (reply code, text, class and method of the culprit).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from pamqp import commands as C

from ackmq.broker.errors import HardError, SoftError
from ackmq.protocol.amqp import (
    HEARTBEAT,
    Decoder,
    encode_method,
)
from ackmq.protocol.amqp import build_method as M
from ackmq.protocol.amqp.constants import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    FRAME_MAX_DEFAULT,
    FRAME_MIN_SIZE,
    NOT_ALLOWED,
    fit_shortstr,
)
from ackmq.server import admission
from ackmq.server.admission import LOOPBACK_ONLY, VHOST_LIMIT, Refusal
from ackmq.server.amqp.channel import HANDLERS, AMQPChannel
from ackmq.server.amqp.frames import FrameConnection, class_method
from ackmq.server.amqp.states import TRANSITIONS, AMQPState
from ackmq.server.amqp.states import AMQPState as S
from ackmq.server.transport import CLOSING_TIMEOUT

if TYPE_CHECKING:
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.connection")

_OPEN = S.OPEN  # read per method

CHANNEL_MAX = 2047
# A client that fails the handshake (tune-ok outside the limits) is not trusted: as
# RabbitMQ, say nothing, wait this long, then drop the socket.
SILENT_CLOSE_DELAY = 3.0

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


def _negotiation_error(field: str, client: int, minimum: int, maximum: int) -> str | None:
    """RabbitMQ's check of one tune-ok value (0 = "no limit", so above any maximum)."""
    if client != 0 and client < minimum:
        return (f"negotiated {field} = {client} is lower than the minimum allowed value "
                f"({minimum})")
    if client == 0 or client > maximum:
        detail = " (no limit)" if client == 0 and field == "channel_max" else ""
        return (f"negotiated {field} = {client}{detail} is higher than the maximum allowed "
                f"value ({maximum})")
    return None


class AMQPConnection(FrameConnection):
    protocol = "AMQP 0-9-1"
    transitions = TRANSITIONS
    heartbeat_frame = HEARTBEAT

    def open_channels(self) -> list[tuple[int, Any]]:
        return [(n, c.model) for n, c in sorted(self.channels.items())]

    def __init__(self, ctx: FrontEnd) -> None:
        super().__init__(ctx)
        self.decoder = Decoder(frame_max=FRAME_MAX_DEFAULT,
                               max_message_size=ctx.config.max_message_size)
        self.state: AMQPState = S.HEADER
        self.frame_max = FRAME_MAX_DEFAULT
        self.channel_max = CHANNEL_MAX
        self.heartbeat = 0
        self.channels = {}  # number -> AMQPChannel
        # channels the client closed: frames it pipelined after its channel.close are
        # dropped, as RabbitMQ does, instead of closing the connection with 504
        self.closed_by_client: set[int] = set()
        self.client_properties: dict[str, Any] = {}
        self.client_capabilities: dict[str, Any] = {}
        # cancels of this connection's consumers held back while its own queue.delete runs
        self.held_cancels: list[tuple[Any, str]] | None = None
        self.sent_blocked = False  # connection.blocked sent, connection.unblocked owed

    # -- method dispatch ------------------------------------------------------------
    def _method(self, number: int, m: Any) -> None:
        if self.state != _OPEN:
            self._handshake(number, m)
            return
        if number == 0:
            if isinstance(m, C.Connection.Close):
                self.write(encode_method(0, M(C.Connection.CloseOk)))
                self._shutdown()
            elif isinstance(m, C.Connection.CloseOk):
                self._shutdown()
            elif isinstance(m, C.Connection.UpdateSecret):
                # OAuth token refresh (RabbitMQ 3.8+). With guest as the only user there is
                # no secret to check: RabbitMQ's internal backend accepts any, and so do we
                self.write(encode_method(0, M(C.Connection.UpdateSecretOk)))
            elif isinstance(m, (C.Connection.Blocked, C.Connection.Unblocked)):
                pass
            else:
                raise HardError(CHANNEL_ERROR,
                                       "unexpected method in connection state running")
            return
        ch = self.channels.get(number)
        if isinstance(m, C.Channel.Open):
            if ch is not None:
                raise HardError(CHANNEL_ERROR, "second 'channel.open' seen")
            # channel_max limits how many channels are open, not their numbers (RabbitMQ)
            if len(self.channels) >= self.channel_max:
                raise HardError(NOT_ALLOWED, f"number of channels opened "
                                       f"({len(self.channels)}) has reached the negotiated "
                                       f"channel_max ({self.channel_max})")
            limit = admission.channel_limit_reached(self.ctx, self.user)  # U6
            if limit is not None:
                raise HardError(NOT_ALLOWED, f"number of channels opened for user "
                                f"'{self.user}' has reached the maximum allowed user "
                                f"limit of ({limit})")
            self.closed_by_client.discard(number)
            self.channels[number] = AMQPChannel(self, number)
            self.write(encode_method(number, M(C.Channel.OpenOk)))
            return
        if ch is None:
            self._no_channel(number)
            return
        if ch.closing:
            if isinstance(m, (C.Channel.CloseOk, C.Channel.Close)):
                if isinstance(m, C.Channel.Close):
                    self.write(encode_method(number, M(C.Channel.CloseOk)))
                self.channel_gone(number)
            return
        if type(m) not in HANDLERS:  # a server's reply (declare-ok, get-empty, flow-ok, ...),
            # a connection method off channel 0, deliver/return/get-ok with content: RabbitMQ's
            # 503 "COMMAND_INVALID - unimplemented method" (a connection error, with its ids)
            raise HardError(COMMAND_INVALID, "unimplemented method")
        try:
            cast(AMQPChannel, ch).handle(m)
        except SoftError as err:
            cid, mid = class_method(m)
            ch.fail(err, cid, mid)

    def channel_gone(self, number: int, by_client: bool = False) -> None:
        self.channels.pop(number, None)
        if by_client:
            self.closed_by_client.add(number)

    # -- handshake ----------------------------------------------------------------------
    def _start(self) -> None:
        from ackmq.version import VERSION
        self._to(S.START)
        props = {
            "product": "ackmq", "version": VERSION, "platform": "Python",
            "information": "https://pypi.org/project/ackmq/",
            "copyright": "ackmq authors", "cluster_name": "ackmq@localhost",
            "capabilities": SERVER_CAPABILITIES,
        }
        self.write(encode_method(0, M(C.Connection.Start,
            server_properties=props, mechanisms=self._mechanisms(), locales="en_US")))

    def _mechanisms(self) -> str:
        """RabbitMQ's two, and EXTERNAL on a TLS connection with a verified client
        certificate (as RabbitMQ's rabbitmq_auth_mechanism_ssl)."""
        return "AMQPLAIN PLAIN EXTERNAL" if self.certificate_user() else "AMQPLAIN PLAIN"

    def _handshake(self, number: int, m: Any) -> None:
        if number != 0:
            raise HardError(CHANNEL_ERROR, "expected 'channel.open'" if self.state
                                   == S.OPEN else "unexpected method before connection.open")
        if self.state == S.START and isinstance(m, C.Connection.StartOk):
            self.client_properties = m.client_properties or {}
            caps = self.client_properties.get("capabilities")
            self.client_capabilities = caps if isinstance(caps, dict) else {}
            user = self._login(m)
            self.user = user
            self._to(S.TUNE)
            self.write(encode_method(0, M(C.Connection.Tune,
                channel_max=CHANNEL_MAX, frame_max=FRAME_MAX_DEFAULT,
                heartbeat=self.ctx.config.heartbeat)))
        elif self.state == S.TUNE and isinstance(m, C.Connection.TuneOk):
            # the client may lower what connection.tune proposed, never raise it or ask
            # for "no limit" (RabbitMQ checks frame_max first, then channel_max)
            problem = (_negotiation_error("frame_max", m.frame_max, FRAME_MIN_SIZE, FRAME_MAX_DEFAULT)
                       or _negotiation_error("channel_max", m.channel_max, 0, CHANNEL_MAX))
            if problem is not None:
                self._silent_close(f"failed to negotiate connection parameters: {problem}")
                return
            self.channel_max = m.channel_max
            self.frame_max = m.frame_max
            self.decoder.frame_max = self.frame_max
            self.heartbeat = m.heartbeat
            self._to(S.OPEN_WAIT)
            if self.heartbeat:  # H1: send when quiet for half, dead when silent for two
                self.start_heartbeats(self.heartbeat / 2, 2 * self.heartbeat)
        elif self.state == S.OPEN_WAIT and isinstance(m, C.Connection.Open):
            vhost = self.ctx.broker.vhost(m.virtual_host or "/")  # 530 vhost not found
            refusal = admission.open_vhost(self.ctx, self, self.user, vhost.name)  # U6, U3
            if refusal is not None:
                raise self._vhost_refused(refusal, vhost.name)
            self.vhost = vhost
            self._to(S.OPEN)
            self._handshake_done()
            self.write(encode_method(0, M(C.Connection.OpenOk)))
        elif isinstance(m, C.Connection.Close):
            self.write(encode_method(0, M(C.Connection.CloseOk)))
            self._shutdown()
        else:
            raise HardError(COMMAND_INVALID, f"unexpected method {m.name} in state {self.state}")

    def _vhost_refused(self, refusal: Refusal, vhost: str) -> HardError:
        """U6 and U3 refusals in RabbitMQ's words (530 NOT_ALLOWED)."""
        if refusal.kind == VHOST_LIMIT:
            return HardError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user "
                             f"'{self.user}': connection limit ({refusal.limit}) is reached")
        if refusal.kind == admission.USER_LIMIT:
            return HardError(NOT_ALLOWED, f"connection refused for user '{self.user}': "
                             f"user connection limit ({refusal.limit}) is reached")
        return HardError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user "
                         f"'{self.user}'")

    def _login(self, m: C.Connection.StartOk) -> str:
        """The user start-ok names, checked (403 with RabbitMQ's texts otherwise)."""
        got = admission.counted(self.ctx.broker.stats, "amqp091", admission.sasl_login(
            self.ctx, m.mechanism, m.response, self.peer,
            self.certificate_user() if m.mechanism == "EXTERNAL" else None))
        if not isinstance(got, Refusal):
            return got
        if m.mechanism == "EXTERNAL":  # U4: the verified client certificate names the user
            log.warning("EXTERNAL login refused for certificate user %r from %s",
                        got.user, self.peer)
        elif got.kind == LOOPBACK_ONLY:
            # the right password, for a user allowed on loopback only (guest)
            text = (f"{m.mechanism} login refused: user '{got.user}' can only connect "
                    "via localhost")
            log.warning("%s (from %s)", text, self.peer)
            raise HardError(ACCESS_REFUSED, text)
        else:
            log.warning("login refused for user %r from %s", got.user, self.peer)
        raise HardError(ACCESS_REFUSED, f"Login was refused using authentication mechanism "
                        f"{m.mechanism}. For details see the broker logfile.")

    # -- resource alarms (U5) ------------------------------------------------------------
    def _notify_blocked(self, reason: str) -> None:
        if self.client_capabilities.get("connection.blocked") is True and \
                self.state == S.OPEN:
            self.sent_blocked = True
            self.write(encode_method(0, M(C.Connection.Blocked, reason=reason)))

    def _notify_unblocked(self) -> None:
        if self.sent_blocked and self.state == S.OPEN:
            self.write(encode_method(0, M(C.Connection.Unblocked)))
        self.sent_blocked = False

    def _handle_held(self, held: list[Any]) -> None:
        if self.state not in (S.CLOSING, S.CLOSED):
            self._events(held)

    def _wake(self) -> None:
        for ch in list(self.channels.values()):
            ch.model.wake()

    # -- closing ----------------------------------------------------------------------
    def close_connection(self, code: int, text: str, class_id: int = 0,
                         method_id: int = 0) -> None:
        """Hard error or shutdown: send connection.close, wait briefly for close-ok."""
        if self.state in (S.CLOSING, S.CLOSED):
            return
        log.info("closing connection %s: %s %s", self.peer, code, text)
        # (deliveries are written as they happen, so they are ahead of the close already)
        self._close_with(encode_method(0, M(C.Connection.Close, reply_code=code,
            reply_text=fit_shortstr(text), class_id=class_id, method_id=method_id)))

    def _silent_close(self, reason: str) -> None:
        """A handshake failure RabbitMQ answers with no connection.close: log the reason,
        read nothing more, and close the socket after SILENT_CLOSE_DELAY."""
        log.error("closing connection %s: %s", self.peer, reason)
        self._release()
        self._to(S.CLOSED)
        self._close.arm_in(SILENT_CLOSE_DELAY, self._shutdown)

    def _closing_method(self, m: Any) -> None:
        if isinstance(m, C.Connection.Close):
            self.write(encode_method(0, M(C.Connection.CloseOk)))
            self._shutdown()
        elif isinstance(m, C.Connection.CloseOk):
            self._shutdown()

    def _closing_grace(self) -> float:
        """A peer that reads none of our last output for two heartbeat intervals (30 s
        without heartbeats, RabbitMQ's closing timeout) is cut off."""
        return 2 * self.heartbeat if self.heartbeat else CLOSING_TIMEOUT

    def _release_channels(self) -> None:
        """D8: every channel's unacked deliveries go back (exclusive queues: _release)."""
        channels, self.channels = self.channels, {}
        for ch in channels.values():
            ch.model.close()

    @property
    def channel_count(self) -> int:
        return len(self.channels)

    def _close_forced(self, text: str) -> None:
        """Broker shutdown, the vhost or user deleted: 320 CONNECTION_FORCED."""
        self.close_connection(CONNECTION_FORCED, f"CONNECTION_FORCED - {text}")
