"""Outstanding publisher confirms of one channel, after RabbitMQ's `rabbit_confirms`.

A publish on a confirm channel gets a sequence number; it is settled when nothing is
owed for it any more (the store has fsynced it, or it never needed to be written).
Settled numbers are collected and, once per event-loop turn, turned into as few
`basic.ack`s as possible: one `multiple=true` ack up to just below the oldest
still-outstanding number, single acks above it. Nacks are sent as they are.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

V = TypeVar("V")


def take_settled(owed: OrderedDict[int, V], tag: int, multiple: bool
                 ) -> list[tuple[int, V]]:
    """The (sequence number, what was owed) pairs a confirm settles (`basic.ack` /
    `basic.nack` semantics: `multiple` covers every sequence number up to `tag`), removed
    from `owed` (keyed by sequence number, in publish order)."""
    if not multiple:
        return [(tag, owed.pop(tag))] if tag in owed else []
    done: list[tuple[int, V]] = []
    while owed:
        if next(iter(owed)) > tag:
            break
        done.append(owed.popitem(last=False))
    return done


def take_confirmed(owed: OrderedDict[int, V], tag: int, multiple: bool) -> list[V]:
    """What a front end owed for the publishes a confirm settles (take_settled's values)."""
    return [v for _, v in take_settled(owed, tag, multiple)]


class ConfirmTracker:
    __slots__ = ("next_seq", "_outstanding", "_acked", "_nacked", "_last_multiple")

    def __init__(self) -> None:
        self.next_seq = 1
        self._outstanding: OrderedDict[int, None] = OrderedDict()  # seq order == insertion order
        self._acked: list[int] = []
        self._nacked: list[int] = []
        self._last_multiple = 0  # every seq <= this one has been answered

    def publish(self) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        return seq

    def wait(self, seq: int) -> None:
        """`seq` waits for something (a store commit) before it can be confirmed."""
        self._outstanding[seq] = None

    def ack(self, seq: int) -> None:
        self._outstanding.pop(seq, None)
        self._acked.append(seq)

    def nack(self, seq: int) -> None:
        self._outstanding.pop(seq, None)
        self._nacked.append(seq)

    @property
    def dirty(self) -> bool:
        return bool(self._acked or self._nacked)

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def drain(self) -> list[tuple[bool, int, bool]]:
        """(ack?, delivery_tag, multiple) frames to send now, coalesced."""
        out: list[tuple[bool, int, bool]] = []
        if self._nacked:
            for seq in self._nacked:
                out.append((False, seq, False))
            nacked = set(self._nacked)
            self._nacked.clear()
        else:
            nacked = set()
        if not self._acked:
            return out
        acked = self._acked
        self._acked = []
        floor = next(iter(self._outstanding)) if self._outstanding else None
        top = max(acked)
        if not nacked and (floor is None or floor > top):
            # everything up to `top` is answered: one multiple ack covers it
            if top - self._last_multiple > 1 or len(acked) > 1:
                out.append((True, top, True))
            else:
                out.append((True, top, False))
            self._last_multiple = top
            return out
        limit = floor - 1 if floor is not None else top
        below = [s for s in acked if s <= limit and s not in nacked]
        above = [s for s in acked if s > limit]
        if below and not nacked:
            out.append((True, max(below), len(below) > 1))
            self._last_multiple = max(self._last_multiple, max(below))
        else:
            for s in sorted(below):
                out.append((True, s, False))
        for s in sorted(above):
            out.append((True, s, False))
        return out
