"""The server's MQTT connection states and their transitions (see server/states.py).

    connect  -> open     CONNECT accepted, CONNACK 0 sent
    (any)    -> closed   refused, DISCONNECT, socket closed or lost, keep-alive expired,
                         taken over; closed -> closed repeats the teardown (a no-op)
"""

from __future__ import annotations

from enum import StrEnum


class MQTTState(StrEnum):
    CONNECT = "connect"  # waiting for CONNECT
    OPEN = "open"
    CLOSED = "closed"


_S = MQTTState

TRANSITIONS: dict[MQTTState, frozenset[MQTTState]] = {
    _S.CONNECT: frozenset({_S.OPEN, _S.CLOSED}),
    _S.OPEN: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset({_S.CLOSED}),
}
