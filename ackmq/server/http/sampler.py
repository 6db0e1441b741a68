"""Message rates for the web UI, sampled off the hot path.

The broker only counts (broker/stats.py, the queues' `stat_*` counters); a timer on the
loop reads those counters every `INTERVAL` seconds and keeps the differences: the
rates of the last interval, and a short history for the overview's chart. The cost is
O(queues) every few seconds, nothing per message. Started with the HTTP app, stopped
with it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ackmq.server.server import Server

INTERVAL = 5.0  # seconds between samples (RabbitMQ's collect_statistics_interval)
HISTORY = 120   # samples kept for the chart: 10 minutes
# the overview's rates: rabbit_global_counters' names (summed over protocols)
GLOBAL = ("received", "confirmed", "routed", "delivered", "acknowledged", "redelivered",
          "unroutable_dropped", "unroutable_returned", "get_empty")
QUEUE = ("stat_published", "stat_delivered", "stat_acked")


@dataclass
class Sample:
    at: float
    totals: dict[str, int]
    queues: dict[int, tuple[int, ...]]  # id(queue) -> QUEUE counters
    rates: dict[str, float] = field(default_factory=dict)


class RateSampler:
    def __init__(self, server: Server, interval: float = INTERVAL) -> None:
        self.server = server
        self.interval = interval
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        self.queue_rates: dict[int, tuple[float, ...]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self.sample()
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def sample(self) -> Sample:
        stats = self.server.broker.stats
        now = time.monotonic()
        s = Sample(now, {name: stats.total(name) for name in GLOBAL},
                   {id(q): (q.stat_published, q.stat_delivered, q.stat_acked)
                    for q in self.server.broker.queues()})
        prev = self.history[-1] if self.history else None
        if prev is not None and now > prev.at:
            dt = now - prev.at
            s.rates = {k: max(0, v - prev.totals[k]) / dt for k, v in s.totals.items()}
            self.queue_rates = {
                qid: tuple(max(0, a - b) / dt for a, b in zip(c, prev.queues[qid], strict=True))
                for qid, c in s.queues.items() if qid in prev.queues}
        self.history.append(s)
        return s

    def rates(self) -> dict[str, float]:
        return self.history[-1].rates if self.history else {}

    def series(self, name: str) -> list[float]:
        return [s.rates.get(name, 0.0) for s in self.history if s.rates]

    def queue(self, qid: int) -> tuple[float, ...]:
        """(incoming, deliver/get, ack) per second of the queue with this id."""
        return self.queue_rates.get(qid, (0.0, 0.0, 0.0))
