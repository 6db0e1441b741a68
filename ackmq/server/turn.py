"""The end of a loop turn, the model's Scheduler on asyncio: `request_flush()` schedules
one callback per loop turn in which anything happened; it runs the broker's end-of-turn
work (group commit, coalesced confirms) and then writes every connection's gathered
frames with one `writelines` each. Its own small module so that it is compiled with the
hot path (native_modules.py): every message's turn runs it."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ackmq.broker.broker import BrokerModel
    from ackmq.server.context import FrontEnd

log = logging.getLogger("ackmq.server")


class Turn:
    """One per server: `broker` and `ctx` are set once the server has built them (the
    broker takes its scheduler when it is made)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.broker: BrokerModel | None = None
        self.ctx: FrontEnd | None = None
        self.scheduled = False

    def request_flush(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def send_output(self) -> None:
        """Every connection's gathered frames, one `writelines` each (the turn's end;
        and before an inline fdatasync, through the broker's store)."""
        ctx = self.ctx
        if ctx is not None and ctx.dirty:
            dirty, ctx.dirty = ctx.dirty, []
            for conn in dirty:
                conn.flush()

    def flush(self) -> None:
        self.scheduled = False
        broker = self.broker
        if broker is not None:
            try:
                broker.end_of_turn()
            except Exception:  # never let one bad turn stop every connection's output
                log.exception("end of turn failed")
        self.send_output()
