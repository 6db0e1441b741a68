"""Connection state machines as data: each protocol front end names its states in a
StrEnum and lists its allowed transitions in one table at the top of its states module
(h11's manner). A transition not in the table is a bug in the server, never the
client's doing: every change of state on client input is guarded by the code that
handles it (a bad frame gets its protocol error, not a forbidden transition).

The states are StrEnums so `conn.state == "open"`, JSON and formatting see the same
strings as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TypeVar

S = TypeVar("S", bound=StrEnum)


class IllegalTransition(AssertionError):
    """A state change the protocol's transition table does not allow (a server bug)."""


def check_transition(table: Mapping[S, frozenset[S]], old: S, new: S) -> S:
    """`new` if the table allows old -> new; IllegalTransition otherwise."""
    if new not in table[old]:
        raise IllegalTransition(f"{type(old).__name__}: {old} -> {new} is not allowed")
    return new


def connection_table(handshake: Mapping[S, Iterable[S]], open_: S, closing: S,
                     closed: S) -> dict[S, frozenset[S]]:
    """A connection's table in the shape every protocol shares: its handshake's states,
    each to the next ones it names or to `closed` (the socket lost), then one end for
    all: open -> closing (our close sent, waiting) -> closed, closed repeating (the
    teardown is idempotent)."""
    table = {state: frozenset({*nxt, closed}) for state, nxt in handshake.items()}
    table[open_] = frozenset({closing, closed})
    table[closing] = frozenset({closed})
    table[closed] = frozenset({closed})
    return table
