"""The stream protocol connection's states and their transitions (see server/states.py).

    peer       -> sasl        peer properties exchanged (or the SASL handshake first)
    sasl       -> tuning      authenticated: our tune sent
    tuning     -> opening     the client's tune read
    opening    -> open        open read, admitted to the vhost
    (before open) -> closing  refused (login, vhost): the answer, then closed
    open       -> closing     our close sent (bad input), waiting for the client's answer
    (any)      -> closed      socket closed, lost, or dead
"""

from __future__ import annotations

from enum import StrEnum

from ackmq.server.states import connection_table


class StreamState(StrEnum):
    PEER = "peer"
    SASL = "sasl"
    TUNING = "tuning"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_S = StreamState

TRANSITIONS = connection_table({
    _S.PEER: {_S.SASL, _S.CLOSING},
    _S.SASL: {_S.SASL, _S.TUNING, _S.CLOSING},
    _S.TUNING: {_S.OPENING, _S.CLOSING},
    _S.OPENING: {_S.OPEN, _S.CLOSING},
}, _S.OPEN, _S.CLOSING, _S.CLOSED)
