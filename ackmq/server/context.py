"""The front-end context: what every connection of every protocol (AMQP, STOMP, the
HTTP API) may reach of the running broker, typed, instead of the whole `Server`.

The server (the composition root) builds one at start and hands it to each listener's
connection factory. `blocking` is the only field that changes while the broker runs
(the resource alarms set it); the rest is fixed once the broker is up. The management
listener gets an `HttpContext`: the same FrontEnd plus what only it shows (the alarms'
monitor, the other listeners' ports), so server/http/ needs nothing of server/server.py
and stays independent of server/amqp and server/stomp (pyproject's import contract).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ackmq.broker import BrokerModel
    from ackmq.broker.access import AccessModel
    from ackmq.server.alarms import ResourceMonitor
    from ackmq.server.config import Config
    from ackmq.server.parameters import Parameters
    from ackmq.server.transport import ClientConnection


class ConnectionSet(set["ClientConnection"]):
    """The open connections, counting those opened and closed since start (RabbitMQ's
    rabbitmq_connections_opened_total / _closed_total)."""

    opened = 0
    closed = 0

    def add(self, c: ClientConnection) -> None:
        if c not in self:
            self.opened += 1
        super().add(c)

    def discard(self, c: object) -> None:
        if c in self:
            self.closed += 1
        super().discard(c)


@dataclass(eq=False, slots=True)
class FrontEnd:
    broker: BrokerModel
    access: AccessModel  # users, vhosts, permissions, limits (U1-U3, U6)
    config: Config
    loop: asyncio.AbstractEventLoop
    # schedule the end-of-turn work once (group commit, confirms, every dirty connection's
    # output); a connection calls it after handling a read or a timer
    request_flush: Callable[[], None]
    # the reason text of the resource alarms set now (connection.blocked's reason)
    alarm_reason: Callable[[], str]
    # every open connection, whatever its protocol (U6 limits, vhost/user deletion)
    # (typed as itself: compiled code calls a `set`'s add and discard directly, past the
    # counting overrides)
    connections: ConnectionSet = field(default_factory=ConnectionSet)
    # connections with output gathered this turn: written by the server's flush
    dirty: list[ClientConnection] = field(default_factory=list)
    # U5: True while a resource alarm is set; read once per read by each connection
    blocking: bool = False
    # what a protocol keeps for the broker's life beside the model, by protocol (MQTT's
    # client ids, retained messages, QoS 2 ids: server/mqtt/state.py); closed at stop
    protocol_state: dict[str, Any] = field(default_factory=dict)
    # the runtime parameters (server/parameters.py): MQTT reads two global ones at CONNECT
    parameters: Parameters | None = None


class HttpPorts(Protocol):
    """The management listener's own bound ports (server/http's HttpListener)."""

    port: int
    https_port: int


@dataclass(eq=False, slots=True)
class HttpContext:
    """What the management API (server/http/) reaches: the FrontEnd's broker, users,
    config and connections, the resource monitor (node stats, alarms), the bound ports
    of the protocol listeners (/api/overview's `listeners`; 0 = not listening) and the
    HTTP listener itself (set by it)."""

    front: FrontEnd
    alarms: ResourceMonitor | None
    port: int = 0
    tls_port: int = 0
    stomp_port: int = 0
    stomp_tls_port: int = 0
    http: HttpPorts | None = None
    stream_port: int = 0  # RabbitMQ's stream protocol (server/stream/)
    stream_tls_port: int = 0
    # runtime parameters of plugged-in components (server/parameters.py: shovels)
    parameters: Parameters | None = None
    mqtt_port: int = 0
    mqtt_tls_port: int = 0
    mqtt_ws_port: int = 0  # MQTT over WebSocket (RabbitMQ's http/web-mqtt)
    mqtt_wss_port: int = 0  # and over TLS (https/web-mqtt)

    @property
    def broker(self) -> BrokerModel:
        return self.front.broker

    @property
    def access(self) -> AccessModel:
        return self.front.access

    @property
    def config(self) -> Config:
        return self.front.config

    @property
    def connections(self) -> set[ClientConnection]:
        return self.front.connections

    def request_flush(self) -> None:
        self.front.request_flush()
