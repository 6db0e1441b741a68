"""One AMQP 1.0 connection (SPEC A1, A9): protocol headers, SASL (PLAIN, ANONYMOUS when
configured, EXTERNAL with a verified client certificate) through server/admission.py,
open (the vhost from `hostname`: `vhost:NAME` as RabbitMQ 4, else a vhost of that name,
else "/"), sessions by channel, heartbeats by idle-time-out, close.

States and transitions: states.py. Frames are decoded by protocol/amqp10 (sans-IO); a
frame the decoder cannot read, or one that breaks the rules of its state, closes the
connection with the specification's error condition after the frames read before it
were handled (nobody else is disturbed; nothing is raised past data_received).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ackmq.broker.errors import ReplyError
from ackmq.protocol.amqp10 import (
    AMQP_HEADER,
    HEARTBEAT,
    SASL_HEADER,
    BadHeader,
    Composite,
    Decoder,
    Frame,
    FramingError,
    Heartbeat,
    ProtocolHeader,
    encode_frame,
    error,
)
from ackmq.protocol.amqp10 import frames as F
from ackmq.protocol.amqp10.types import Symbol, UInt
from ackmq.server import admission
from ackmq.server.admission import Refusal
from ackmq.server.amqp10.errors import AmqpError
from ackmq.server.amqp10.session import Session
from ackmq.server.amqp10.states import TRANSITIONS, AMQP10State
from ackmq.server.amqp10.states import AMQP10State as S
from ackmq.server.amqp10.transfers import TransferConnection
from ackmq.server.transport import events_from

if TYPE_CHECKING:
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.amqp10")

CHANNEL_MAX = 255  # sessions per connection (RabbitMQ 4: 255 by default... its max_sessions)
SASL_OK, SASL_AUTH = 0, 1


class AMQP10Connection(TransferConnection):
    protocol = "AMQP 1-0"
    transitions = TRANSITIONS
    heartbeat_frame = HEARTBEAT  # an empty frame (part 2.4.5)
    log = log

    def __init__(self, ctx: FrontEnd) -> None:
        super().__init__(ctx)
        self.decoder = Decoder(max_frame_size=F.MIN_MAX_FRAME_SIZE)
        self.state: AMQP10State = S.HEADER
        self.sessions: dict[int, Session] = {}
        self.max_frame_size = F.MIN_MAX_FRAME_SIZE  # what the peer takes from us
        self.channel_max = CHANNEL_MAX
        self.idle_ms = 0  # the peer's idle-time-out: we send something within half of it
        self.container_id = ""
        self.client_properties: dict[str, Any] = {}

    # -- what the management plane and the limits see -----------------------------------
    @property
    def channel_count(self) -> int:
        return len(self.sessions)

    def open_channels(self) -> list[tuple[int, Any]]:
        return [(n, s.channel) for n, s in sorted(self.sessions.items()) if s.channel.open]

    # -- input (plain transfers: transfers.py's lane) -----------------------------------
    def _read(self, data: bytes) -> None:
        try:
            events = self.decoder.feed(data)
        except BadHeader:
            # part 2.2: answer with the header we speak, then close
            self.write(SASL_HEADER if self.state == S.HEADER else AMQP_HEADER)
            self._shutdown()
            return
        except FramingError as e:
            self._events(e.events)
            self.close_connection(e.condition, e.description)
            return
        self._events(events)
        self.ctx.request_flush()

    def _events(self, events: list[Any]) -> None:
        blocking = self.ctx.blocking
        for ev in events:
            if self.state == S.CLOSED:
                return
            if self.state == S.CLOSING:
                if type(ev) is Frame and ev.performative.kind == "close":
                    self._shutdown()
                    return
                continue
            try:
                if type(ev) is Frame:
                    if blocking and ev.performative.kind == "transfer" and self.state == S.OPEN:
                        # U5/A10: as a 0-9-1 publish during an alarm: not read until it clears
                        self.block_for_alarm(events_from(events, ev))
                        return
                    self._frame(ev)
                elif type(ev) is ProtocolHeader:
                    self._header(ev)
                elif type(ev) is Heartbeat:
                    pass
            except AmqpError as e:
                self.close_connection(e.condition, e.description)
                return
            except ReplyError as e:  # the model refused something no handler caught
                self.close_connection(F.INTERNAL_ERROR, e.text)
                return

    def _handle_held(self, held: list[Any]) -> None:
        if self.state == S.OPEN:
            self._events(held)

    def alarm_cleared(self) -> None:
        super().alarm_cleared()
        for s in list(self.sessions.values()):
            s.alarm_cleared()

    # -- headers and SASL -------------------------------------------------------------------
    def _header(self, h: ProtocolHeader) -> None:
        if self.state == S.HEADER:
            if h.protocol_id != 3:
                # RabbitMQ 4 requires SASL: our SASL header, then close (part 2.2, 2.13)
                log.info("AMQP 1.0 connection from %s without SASL refused", self.peer)
                self.write(SASL_HEADER)
                self._shutdown()
                return
            self._to(S.SASL)
            self.write(SASL_HEADER + encode_frame(0, Composite(
                "sasl_mechanisms", sasl_server_mechanisms=[Symbol(m) for m in self._mechanisms()]),
                b"", F.SASL_FRAME))
        elif self.state == S.SASL_DONE and h.protocol_id == 0:
            self._to(S.OPEN_WAIT)
            self.write(AMQP_HEADER)
        else:  # a header out of place (before the SASL outcome, or a second SASL one)
            raise AmqpError(F.NOT_ALLOWED, "protocol header out of sequence")

    def _mechanisms(self) -> list[str]:
        out = []
        if self.certificate_user():
            out.append("EXTERNAL")
        out.append("PLAIN")
        if self.ctx.config.amqp10_anonymous_user:
            out.append("ANONYMOUS")
        return out

    def _sasl(self, f: Frame) -> None:
        p = f.performative
        if self.state != S.SASL or p.kind != "sasl_init":
            raise AmqpError(F.NOT_ALLOWED, f"unexpected {p.kind} during SASL")
        mech = str(p.mechanism)
        if mech not in self._mechanisms():
            got: str | Refusal = Refusal(admission.BAD_CREDENTIALS, "")
        elif mech == "ANONYMOUS":
            # ANONYMOUS logs in as the configured user (RabbitMQ 4's anonymous_login_user)
            got = admission.certificate_login(
                self.ctx.access, self.ctx.config.loopback_users,
                self.ctx.config.amqp10_anonymous_user, self.peer)
        else:
            got = admission.sasl_login(self.ctx, mech, p.initial_response or b"", self.peer,
                                       self.certificate_user() if mech == "EXTERNAL" else None)
        if isinstance(got, Refusal):
            log.warning("AMQP 1.0 %s login refused for user %r from %s", mech, got.user,
                        self.peer)
            self.write(encode_frame(0, Composite("sasl_outcome", code=SASL_AUTH), b"",
                                    F.SASL_FRAME))
            self._shutdown()
            return
        self.user = got
        self._to(S.SASL_DONE)
        self.write(encode_frame(0, Composite("sasl_outcome", code=SASL_OK), b"", F.SASL_FRAME))

    # -- frames -------------------------------------------------------------------------------
    def _frame(self, f: Frame) -> None:
        p = f.performative
        if f.type == F.SASL_FRAME:
            self._sasl(f)
            return
        if self.state == S.OPEN_WAIT:
            if p.kind != "open":
                raise AmqpError(F.ILLEGAL_STATE, f"expected open, got {p.kind}")
            self._open(p)
            return
        if self.state != S.OPEN:
            raise AmqpError(F.ILLEGAL_STATE, f"{p.kind} before the SASL outcome")
        kind = p.kind
        if kind == "close":
            self.write(encode_frame(0, Composite("close")))
            self._shutdown()
            return
        if kind == "open":
            raise AmqpError(F.ILLEGAL_STATE, "a second open")
        if kind == "begin":
            self._begin(f.channel, p)
            return
        s = self.sessions.get(f.channel)
        if s is None:
            raise AmqpError(F.NOT_ALLOWED, f"{kind} on channel {f.channel}, which has no "
                                           "session")
        if kind == "end":
            self.sessions.pop(f.channel, None)
            s.close()
            self.write(encode_frame(f.channel, Composite("end")))
            return
        s.frame(f)

    def _open(self, p: Composite) -> None:
        self.container_id = p.container_id
        self.client_properties = p.properties or {}
        host = p.hostname or ""
        broker = self.ctx.broker
        name = host[len("vhost:"):] if host.startswith("vhost:") else host
        vhost = broker.vhosts.get(name) or (broker.vhosts.get("/") if not host.startswith(
            "vhost:") else None)
        peer_max = int(p.max_frame_size) if p.max_frame_size is not None else 4294967295
        if peer_max < F.MIN_MAX_FRAME_SIZE:
            raise AmqpError(F.FRAME_SIZE_TOO_SMALL, f"max-frame-size {peer_max} is below "
                                                     f"{F.MIN_MAX_FRAME_SIZE}")
        self.max_frame_size = min(peer_max, F.DEFAULT_MAX_FRAME_SIZE)
        self.channel_max = min(int(p.channel_max), CHANNEL_MAX)
        self.idle_ms = int(p.idle_time_out or 0)
        self._send_open()
        if vhost is None:
            self._to(S.CLOSING)  # part 2.4.1: open, then close with the error
            self._send_close(self._close_frame(F.NOT_FOUND, f"vhost '{name}' does not exist"))
            return
        refusal = admission.open_vhost(self.ctx, self, self.user, vhost.name)  # U6, U3
        if refusal is not None:
            self._to(S.CLOSING)
            text = (f"connection limit ({refusal.limit}) is reached" if refusal.limit else
                    f"access to vhost '{vhost.name}' refused for user '{self.user}'")
            self._send_close(self._close_frame(F.UNAUTHORIZED_ACCESS if not refusal.limit
                                               else F.RESOURCE_LIMIT_EXCEEDED, text))
            return
        self.vhost = vhost
        self._to(S.OPEN)
        self.decoder.max_frame_size = F.DEFAULT_MAX_FRAME_SIZE
        self._handshake_done()
        # part 2.4.5: something within half the peer's idle-time-out; a peer silent for
        # two of our heartbeat intervals (the idle-time-out we sent) is gone
        self.start_heartbeats(self.idle_ms / 2000.0, 2 * self.ctx.config.heartbeat)

    def _send_open(self) -> None:
        from ackmq.version import VERSION
        hb = self.ctx.config.heartbeat
        self.write(encode_frame(0, Composite(
            "open", container_id="ackmq", max_frame_size=UInt(F.DEFAULT_MAX_FRAME_SIZE),
            channel_max=self.channel_max, idle_time_out=UInt(hb * 1000) if hb else None,
            offered_capabilities=[Symbol("ANONYMOUS-RELAY")],
            properties=self._server_properties(VERSION))))

    def _server_properties(self, version: str) -> dict[Symbol, str]:
        if self.ctx.config.amqp10_rabbitmq_compat:  # --amqp10-rabbitmq-compat
            return {Symbol("product"): "RabbitMQ", Symbol("version"): f"4.0.0+ackmq.{version}",
                    Symbol("platform"): "Python (ackmq)"}
        return {Symbol("product"): "ackmq", Symbol("version"): version,
                Symbol("platform"): "Python"}

    def _begin(self, channel: int, p: Composite) -> None:
        if p.remote_channel is not None:
            raise AmqpError(F.NOT_ALLOWED, "begin with remote-channel: ackmq begins no "
                                           "session itself")
        if channel in self.sessions:
            raise AmqpError(F.NOT_ALLOWED, f"channel {channel} already has a session")
        if channel > self.channel_max:
            raise AmqpError(F.NOT_ALLOWED, f"channel {channel} is above channel-max "
                                           f"{self.channel_max}")
        limit = admission.channel_limit_reached(self.ctx, self.user)  # U6
        if limit is not None:
            raise AmqpError(F.RESOURCE_LIMIT_EXCEEDED, f"number of sessions opened for user "
                            f"'{self.user}' has reached the maximum allowed user limit of "
                            f"({limit})")
        assert self.vhost is not None
        s = Session(self, channel, p)
        self.sessions[channel] = s
        s.begin()

    # -- closing ----------------------------------------------------------------------------
    def _close_frame(self, condition: str, description: str) -> bytes:
        return encode_frame(0, Composite("close", error=error(condition, description)))

    def close_connection(self, condition: str, description: str) -> None:
        """An error: close with it, wait briefly for the peer's close, then drop."""
        if self.state in (S.CLOSING, S.CLOSED):
            return
        log.info("closing AMQP 1.0 connection %s: %s %s", self.peer, condition, description)
        if self.state not in (S.OPEN, S.OPEN_WAIT):
            self._shutdown()  # no open exchanged: nothing to close with
            return
        if self.state == S.OPEN_WAIT:
            self._send_open()
        self._close_with(self._close_frame(condition, description[:1000]))

    def _release_channels(self) -> None:
        """D8: every session's unsettled deliveries go back (exclusive queues: _release)."""
        sessions, self.sessions = self.sessions, {}
        for s in sessions.values():
            s.close()

    def _close_forced(self, text: str) -> None:
        self.close_connection(F.CONNECTION_FORCED, text)

    def _wake(self) -> None:
        for s in list(self.sessions.values()):
            s.channel.wake()

    # -- heartbeats (idle-time-out, part 2.4.5) ---------------------------------------------
    def _heartbeats_missed(self) -> None:
        log.info("AMQP 1.0 peer %s idle past its time-out, closing", self.peer)
        self.close_connection(F.RESOURCE_LIMIT_EXCEEDED, "idle-time-out exceeded")
