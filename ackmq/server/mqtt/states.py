"""The server's MQTT connection states and their transitions (see server/states.py).

    connect  -> open     CONNECT accepted, CONNACK 0 sent
    (any)    -> closing  the shared connection life's close (server/transport.py) waiting
                         for the socket to go
    (any)    -> closed   refused, DISCONNECT, socket closed or lost, keep-alive expired,
                         taken over; closed -> closed repeats the teardown (a no-op)
"""

from __future__ import annotations

from enum import StrEnum

from ackmq.server.states import connection_table


class MQTTState(StrEnum):
    CONNECT = "connect"  # waiting for CONNECT
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_S = MQTTState

TRANSITIONS = connection_table({
    _S.CONNECT: {_S.OPEN, _S.CLOSING},
}, _S.OPEN, _S.CLOSING, _S.CLOSED)
