"""The front-end context: what every connection of every protocol (AMQP, STOMP, the
coming HTTP API) may reach of the running broker, typed, instead of the whole `Server`.

The server (the composition root) builds one at start and hands it to each listener's
connection factory. `blocking` is the only field that changes while the broker runs
(the resource alarms set it); the rest is fixed once the broker is up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ackmq.broker import BrokerModel
    from ackmq.broker.access import AccessModel
    from ackmq.server.config import Config
    from ackmq.server.transport import ClientConnection


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
    connections: set[ClientConnection] = field(default_factory=set)
    # connections with output gathered this turn: written by the server's flush
    dirty: list[ClientConnection] = field(default_factory=list)
    # U5: True while a resource alarm is set; read once per read by each connection
    blocking: bool = False
