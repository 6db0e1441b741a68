"""Message rates for the web UI, sampled off the hot path.

The broker only counts (broker/stats.py, the queues' `stat_*` counters). A timer on the
loop reads the global counters every `INTERVAL` seconds and keeps the differences: the
rates of the last interval and a short history for the overview's chart; O(1) a tick.
A queue's, exchange's, channel's or connection's rates are measured when a page shows
it: against the snapshot of its counters the previous showing took (at least `INTERVAL`
before), so they cost O(objects shown) per page and nothing while nobody looks.
Nothing is done per message. Started with the HTTP app, stopped with it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ackmq.broker.timers import Deadline

if TYPE_CHECKING:
    from ackmq.server.context import HttpContext

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
# a channel's message_stats (rabbit_mgmt's two channel stats tables): (API name, the
# channel's MessageStats counter); a group is shown, zeros included, once any of its
# counters moved, as RabbitMQ 3.10 shows them
CHANNEL_PUBLISH = (("confirm", "confirmed"), ("drop_unroutable", "unroutable_dropped"),
                   ("publish", "received"), ("return_unroutable", "unroutable_returned"))
CHANNEL_DELIVER = (("ack", "acknowledged"), ("deliver", "delivered_consume_manual_ack"),
                   ("deliver_get", "delivered"),
                   ("deliver_no_ack", "delivered_consume_auto_ack"),
                   ("get", "delivered_get_manual_ack"), ("get_empty", "get_empty"),
                   ("get_no_ack", "delivered_get_auto_ack"), ("redeliver", "redelivered"))
CHANNEL_COUNTERS = tuple(c for _, c in CHANNEL_PUBLISH + CHANNEL_DELIVER)


def stats_json(counts: dict[str, int], rates: dict[str, float], zeros: bool = False
               ) -> dict[str, Any]:
    """RabbitMQ's `message_stats`: each count with its `<name>_details` rate; a counter
    that never moved is left out, as RabbitMQ does (`zeros`: kept)."""
    out: dict[str, Any] = {}
    for name, n in counts.items():
        if n or zeros:
            out[name] = n
            out[name + "_details"] = {"rate": round(rates.get(name, 0.0), 1)}
    return out


def channel_message_stats(sampler: RateSampler | None, ch: Any) -> dict[str, Any]:
    """A channel's `message_stats`: its publish group and its deliver group, each once
    it moved ({} for a channel that did neither: RabbitMQ leaves the key out)."""
    m = ch.stats
    cur = tuple(getattr(m, c) for c in CHANNEL_COUNTERS)
    rates = sampler.rates_of(ch, cur) if sampler is not None else (0.0,) * len(cur)
    out: dict[str, Any] = {}
    i = 0
    for group in (CHANNEL_PUBLISH, CHANNEL_DELIVER):
        j = i + len(group)
        if any(cur[i:j]):
            names = [api for api, _ in group]
            out.update(stats_json(dict(zip(names, cur[i:j], strict=True)),
                                  dict(zip(names, rates[i:j], strict=True)), zeros=True))
        i = j
    return dict(sorted(out.items()))  # RabbitMQ's order


def exchange_message_stats(sampler: RateSampler | None, x: Any) -> dict[str, Any]:
    """An exchange's `message_stats`: publish_in, publish_out (each once it moved)."""
    cur = (x.stat_in, x.stat_out)
    rates = sampler.rates_of(x, cur) if sampler is not None else (0.0, 0.0)
    return stats_json({"publish_in": cur[0], "publish_out": cur[1]},
                      {"publish_in": rates[0], "publish_out": rates[1]})


def connection_rates(sampler: RateSampler | None, conn: Any) -> tuple[float, ...]:
    """(recv_oct, send_oct) per second of a connection."""
    cur = (conn.recv_oct, conn.send_oct)
    return sampler.rates_of(conn, cur) if sampler is not None else (0.0, 0.0)


@dataclass
class Sample:
    at: float
    totals: dict[str, int]
    rates: dict[str, float] = field(default_factory=dict)


class RateSampler:
    def __init__(self, server: HttpContext, interval: float = INTERVAL) -> None:
        self.server = server
        self.interval = interval
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        # id(obj) -> (obj, when, its counters then, rates up to then)
        self._snaps: dict[int, tuple[Any, float, tuple[int, ...], tuple[float, ...]]] = {}
        self._timer = Deadline(server.broker.timers, self._tick)  # C5: the broker's timers

    def start(self) -> None:
        self._tick()

    def stop(self) -> None:
        self._timer.cancel()

    def _tick(self) -> None:
        self.sample()
        self._timer.arm_in(self.interval)

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
        return self.rates_of(q, (q.stat_published, q.stat_delivered, q.stat_acked))

    def rates_of(self, obj: Any, cur: tuple[int, ...]) -> tuple[float, ...]:
        """Per second, each of the counters `cur` of `obj` (a queue, exchange, channel,
        connection), over the time since an earlier page showed it (0.0 the first time;
        the snapshot is renewed at most every `interval`)."""
        now = time.monotonic()
        snap = self._snaps.get(id(obj))
        if snap is None or snap[0] is not obj or len(snap[2]) != len(cur):
            rates: tuple[float, ...] = (0.0,) * len(cur)
            self._snaps[id(obj)] = (obj, now, cur, rates)
            return rates
        _, then, old, rates = snap
        if now - then >= self.interval:
            rates = tuple(max(0, c - o) / (now - then) for c, o in zip(cur, old, strict=True))
            self._snaps[id(obj)] = (obj, now, cur, rates)
        return rates


SAMPLER_KEY: web.AppKey[RateSampler] = web.AppKey("ackmq_sampler", RateSampler)
