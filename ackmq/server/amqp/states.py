"""The server's AMQP 0-9-1 connection states and their transitions (see server/states.py).

    header    -> start      protocol header received, connection.start sent
    start     -> tune       start-ok: login accepted, connection.tune sent
    tune      -> open-wait  tune-ok within the limits
    tune      -> closed     tune-ok outside them: RabbitMQ's silent close
    open-wait -> open       connection.open: vhost admitted, open-ok sent
    (any but closing, closed) -> closing   we sent connection.close (hard error, shutdown)
    (any)     -> closed     socket closed, lost, or dead (heartbeats); closed -> closed is
                            a no-op repeat of the teardown (timer after a silent close,
                            broker shutdown of a closed connection)
"""

from __future__ import annotations

from enum import StrEnum

from ackmq.server.states import connection_table


class AMQPState(StrEnum):
    HEADER = "header"        # waiting for the protocol header
    START = "start"          # start sent, waiting for start-ok
    TUNE = "tune"            # tune sent, waiting for tune-ok
    OPEN_WAIT = "open-wait"  # waiting for connection.open
    OPEN = "open"
    CLOSING = "closing"      # we sent connection.close, waiting for close-ok
    CLOSED = "closed"


_S = AMQPState

TRANSITIONS = connection_table({
    _S.HEADER: {_S.START, _S.CLOSING},
    _S.START: {_S.TUNE, _S.CLOSING},
    _S.TUNE: {_S.OPEN_WAIT, _S.CLOSING},
    _S.OPEN_WAIT: {_S.OPEN, _S.CLOSING},
}, _S.OPEN, _S.CLOSING, _S.CLOSED)
