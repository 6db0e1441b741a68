"""C5 on the loop: the broker's one timer service (broker/timers.py) driven by one loop
timer, kept at the service's soonest deadline. Every deadline of the model and of the
front ends (heartbeats, handshake and close timeouts, resource checks) is a `Deadline`
of that service; nothing else calls `loop.call_later` for a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ackmq.broker.timers import Timers


class LoopTimers:
    """Runs `timers` on `loop`; `after()` once after each run that fired anything (the
    server's end-of-turn flush: what a timer did is committed and written out)."""

    __slots__ = ("timers", "loop", "after", "_handle", "_at")

    def __init__(self, timers: Timers, loop: asyncio.AbstractEventLoop,
                 after: Callable[[], None]) -> None:
        self.timers, self.loop, self.after = timers, loop, after
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None
        timers.wake = self._wake
        due = timers.soonest()
        if due is not None:
            self._wake(due)

    def _wake(self, due: float) -> None:
        if self._at is not None and self._at <= due:
            return  # the loop timer already fires no later
        if self._handle is not None:
            self._handle.cancel()
        self._at = due
        self._handle = self.loop.call_later(max(0.0, due - self.timers.now()), self._run)

    def _run(self) -> None:
        self._handle = None
        self._at = None
        if self.timers.run():
            self.after()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = None
        self.timers.wake = _ignore


def _ignore(_due: float) -> None:
    pass
