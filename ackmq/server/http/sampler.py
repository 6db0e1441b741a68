"""Message rates for the web UI, sampled off the hot path.

The broker only counts (broker/stats.py, the queues' `stat_*` counters). A timer on the
loop reads the global counters every `INTERVAL` seconds and keeps the differences: the
rates of the last interval and a short history for the overview's chart; O(1) a tick.
A queue's rates are measured when a page shows the queue: against the snapshot of its
counters the previous showing took (at least `INTERVAL` before), so they cost O(queues
shown) per page and nothing while nobody looks. Nothing is done per message. Started
with the HTTP app, stopped with it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext as Server

INTERVAL = 5.0  # seconds between samples (RabbitMQ's collect_statistics_interval)
HISTORY = 120   # samples kept for the chart: 10 minutes
# a queue's snapshot is forgotten when no page has shown it for this long
QUEUE_INTEREST = 120.0
# the overview's rates: rabbit_global_counters' names (summed over protocols)
GLOBAL = ("received", "confirmed", "routed", "delivered", "acknowledged", "redelivered",
          "unroutable_dropped", "unroutable_returned", "get_empty")


# the management API's message_stats keys (RabbitMQ's) for the global counters
API_NAMES = {"received": "publish", "confirmed": "confirm", "routed": None,
             "delivered": "deliver_get", "acknowledged": "ack", "redelivered": "redeliver",
             "unroutable_dropped": "drop_unroutable",
             "unroutable_returned": "return_unroutable", "get_empty": "get_empty"}
QUEUE_API_NAMES = ("publish", "deliver_get", "ack")  # a queue's stat_* counters, in order


def stats_json(counts: dict[str, int], rates: dict[str, float]) -> dict[str, Any]:
    """RabbitMQ's `message_stats`: each count with its `<name>_details` rate; a counter
    that never moved is left out, as RabbitMQ does."""
    out: dict[str, Any] = {}
    for name, n in counts.items():
        if n:
            out[name] = n
            out[name + "_details"] = {"rate": round(rates.get(name, 0.0), 1)}
    return out


@dataclass
class Sample:
    at: float
    totals: dict[str, int]
    rates: dict[str, float] = field(default_factory=dict)


class RateSampler:
    def __init__(self, server: Server, interval: float = INTERVAL) -> None:
        self.server = server
        self.interval = interval
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        # id(queue) -> (queue, when, its stat_* counters then, rates up to then)
        self._snaps: dict[int, tuple[Any, float, tuple[int, ...], tuple[float, ...]]] = {}
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
        s = Sample(now, {name: stats.total(name) for name in GLOBAL})
        prev = self.history[-1] if self.history else None
        if prev is not None and now > prev.at:
            dt = now - prev.at
            s.rates = {k: max(0, v - prev.totals[k]) / dt for k, v in s.totals.items()}
        self.history.append(s)
        stale = [k for k, snap in self._snaps.items() if now - snap[1] > QUEUE_INTEREST]
        for k in stale:
            del self._snaps[k]
        return s

    def rates(self) -> dict[str, float]:
        return self.history[-1].rates if self.history else {}

    def series(self, name: str) -> list[float]:
        return [s.rates.get(name, 0.0) for s in self.history if s.rates]

    def message_stats(self) -> dict[str, Any]:
        """The overview's `message_stats`: the totals now, the rates of the last sample."""
        stats = self.server.broker.stats
        rates = self.rates()
        counts = {api: stats.total(name) for name, api in API_NAMES.items() if api}
        return stats_json(counts, {api: rates.get(name, 0.0)
                                   for name, api in API_NAMES.items() if api})

    def queue_message_stats(self, q: Any) -> dict[str, Any]:
        """A queue's `message_stats` (publish, deliver_get, ack) with their rates."""
        counts = (q.stat_published, q.stat_delivered, q.stat_acked)
        rates = self.queue(q)
        return stats_json(dict(zip(QUEUE_API_NAMES, counts, strict=True)),
                          dict(zip(QUEUE_API_NAMES, rates, strict=True)))

    def queue(self, q: Any) -> tuple[float, ...]:
        """(incoming, deliver/get, ack) per second of `q`, over the time since an
        earlier page showed it (0.0 the first time)."""
        now = time.monotonic()
        cur = (q.stat_published, q.stat_delivered, q.stat_acked)
        snap = self._snaps.get(id(q))
        if snap is None or snap[0] is not q:
            self._snaps[id(q)] = (q, now, cur, (0.0, 0.0, 0.0))
            return (0.0, 0.0, 0.0)
        _, then, old, rates = snap
        if now - then >= self.interval:
            rates = tuple(max(0, c - o) / (now - then) for c, o in zip(cur, old, strict=True))
            self._snaps[id(q)] = (q, now, cur, rates)
        return rates


SAMPLER_KEY: web.AppKey[RateSampler] = web.AppKey("ackmq_sampler", RateSampler)
