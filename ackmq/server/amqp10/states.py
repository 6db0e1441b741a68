"""The server's AMQP 1.0 connection states and their transitions (see server/states.py).

    header     -> sasl        SASL header read; ours and sasl-mechanisms sent
    header     -> closed      no SASL (RabbitMQ 4 requires it): our SASL header, closed
    sasl       -> sasl-done   sasl-init accepted, sasl-outcome ok sent
    sasl       -> closed      login refused (sasl-outcome auth), or the peer went
    sasl-done  -> open-wait   AMQP header read, ours sent
    open-wait  -> open        open read, admitted to the vhost, our open sent
    open-wait  -> closing     open refused: our open, then close with the error
    open       -> closing     an error: close sent, waiting for the peer's close
    (any)      -> closed      socket closed, lost, or dead
"""

from __future__ import annotations

from enum import StrEnum

from ackmq.server.states import connection_table


class AMQP10State(StrEnum):
    HEADER = "header"
    SASL = "sasl"
    SASL_DONE = "sasl-done"
    OPEN_WAIT = "open-wait"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_S = AMQP10State

TRANSITIONS = connection_table({
    _S.HEADER: {_S.SASL},
    _S.SASL: {_S.SASL_DONE},
    _S.SASL_DONE: {_S.OPEN_WAIT},
    _S.OPEN_WAIT: {_S.OPEN, _S.CLOSING},
}, _S.OPEN, _S.CLOSING, _S.CLOSED)
