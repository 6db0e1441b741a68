"""The server's STOMP connection states and their transitions (see server/states.py).

    connect       -> open           CONNECT (or STOMP) accepted, CONNECTED sent
    open          -> disconnecting  DISCONNECT with a receipt while receipts are owed
    open          -> closing        an ERROR while the channel is open (settled receipts
                                    go out first)
    closing       -> closing        the same, re-entered: a refusal flushed by that ERROR
    (any)         -> closed         socket closed, lost, or dead (heart-beats); closed ->
                                    closed is a no-op repeat of the teardown
"""

from __future__ import annotations

from enum import StrEnum


class StompState(StrEnum):
    CONNECT = "connect"              # waiting for CONNECT
    OPEN = "open"
    DISCONNECTING = "disconnecting"  # DISCONNECT read, waiting for the receipts owed
    CLOSING = "closing"              # writing an ERROR, then closed
    CLOSED = "closed"


_S = StompState

TRANSITIONS: dict[StompState, frozenset[StompState]] = {
    _S.CONNECT: frozenset({_S.OPEN, _S.CLOSED}),
    _S.OPEN: frozenset({_S.DISCONNECTING, _S.CLOSING, _S.CLOSED}),
    _S.DISCONNECTING: frozenset({_S.CLOSED}),
    _S.CLOSING: frozenset({_S.CLOSING, _S.CLOSED}),
    _S.CLOSED: frozenset({_S.CLOSED}),
}
