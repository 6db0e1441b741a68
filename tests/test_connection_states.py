"""The server's connection state machines (server/amqp/states.py, server/stomp/states.py):
every transition in a table is allowed, every other one raises IllegalTransition, and the
states are the strings the server has always shown (`conn.state == "open"`, JSON). In
process, no sockets."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ackmq.broker.broker import BrokerModel, NullScheduler
from ackmq.server.amqp import states as amqp_states
from ackmq.server.amqp.connection import AMQPConnection
from ackmq.server.amqp.states import AMQPState
from ackmq.server.config import Config
from ackmq.server.states import IllegalTransition, check_transition
from ackmq.server.stomp import states as stomp_states
from ackmq.server.stomp.connection import StompConnection
from ackmq.server.stomp.states import StompState

MACHINES = [(AMQPState, amqp_states.TRANSITIONS, AMQPConnection),
            (StompState, stomp_states.TRANSITIONS, StompConnection)]


def _pairs(allowed: bool) -> list:
    out = []
    for enum, table, conn_cls in MACHINES:
        for old in enum:
            for new in enum:
                if (new in table[old]) == allowed:
                    out.append(pytest.param(table, conn_cls, old, new,
                                            id=f"{enum.__name__}:{old}->{new}"))
    return out


def _conn(conn_cls: type, state: object) -> object:
    """A connection object in `state`, without a front end or a socket: only its state
    machine is exercised."""
    # made with the parts its __init__ reads (object.__new__ refuses a compiled class)
    ctx = SimpleNamespace(broker=BrokerModel(NullScheduler()), config=Config())
    conn = conn_cls(ctx)
    conn.state = state
    return conn


@pytest.mark.parametrize("enum,table", [(e, t) for e, t, _ in MACHINES])
def test_every_state_has_a_row(enum, table):
    assert set(table) == set(enum)
    for targets in table.values():
        assert targets <= set(enum)


@pytest.mark.parametrize("table,conn_cls,old,new", _pairs(True))
def test_allowed_transition(table, conn_cls, old, new):
    assert check_transition(table, old, new) is new
    conn = _conn(conn_cls, old)
    conn._to(new)
    assert conn.state is new


@pytest.mark.parametrize("table,conn_cls,old,new", _pairs(False))
def test_forbidden_transition_raises(table, conn_cls, old, new):
    with pytest.raises(IllegalTransition):
        check_transition(table, old, new)
    conn = _conn(conn_cls, old)
    with pytest.raises(IllegalTransition):
        conn._to(new)
    assert conn.state is old  # unchanged


def test_forbidden_examples():
    """The obvious bugs: skipping the handshake, reopening a closed connection."""
    with pytest.raises(IllegalTransition, match="header -> open"):
        check_transition(amqp_states.TRANSITIONS, AMQPState.HEADER, AMQPState.OPEN)
    with pytest.raises(IllegalTransition):
        check_transition(amqp_states.TRANSITIONS, AMQPState.CLOSED, AMQPState.OPEN)
    with pytest.raises(IllegalTransition):
        check_transition(stomp_states.TRANSITIONS, StompState.CLOSED, StompState.CONNECT)
    with pytest.raises(IllegalTransition):
        check_transition(stomp_states.TRANSITIONS, StompState.DISCONNECTING, StompState.OPEN)


def test_initial_states():
    assert list(AMQPState)[0] == "header"
    assert list(StompState)[0] == "connect"


@pytest.mark.parametrize("state,text", [
    (AMQPState.HEADER, "header"), (AMQPState.START, "start"), (AMQPState.TUNE, "tune"),
    (AMQPState.OPEN_WAIT, "open-wait"), (AMQPState.OPEN, "open"),
    (AMQPState.CLOSING, "closing"), (AMQPState.CLOSED, "closed"),
    (StompState.CONNECT, "connect"), (StompState.OPEN, "open"),
    (StompState.DISCONNECTING, "disconnecting"), (StompState.CLOSING, "closing"),
    (StompState.CLOSED, "closed"),
])
def test_states_are_the_old_strings(state, text):
    assert state == text and text == state
    assert state in (text,) and state in {text} and {state: 1}[text] == 1
    assert str(state) == text and f"{state}" == text and "%s" % state == text  # noqa: UP031 - as logging formats it
    assert json.dumps({"state": state}) == json.dumps({"state": text})
