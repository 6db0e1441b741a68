"""Message counters and cheap histograms for /metrics, the UI's rates and the API.

RabbitMQ keeps `rabbit_global_counters` per protocol: plain counters bumped on the
publish, deliver and ack paths. `MessageStats` is the same, one instance per open
channel: a count is one attribute increment on the channel's own instance (no
allocation, no lookup), and the same counts give the management API's per-channel
`message_stats`. A protocol's totals (`ProtocolStats`) are its closed channels' counts,
folded in when each closes, plus its open channels', summed when someone reads them. `Histogram` is observed
once per fdatasync or per group commit, never per message: `observe(value, n)` books `n`
events of the same value (the publishes one commit confirmed).
"""

from __future__ import annotations

from collections import Counter
from typing import Final

PROTOCOLS = ("amqp091", "stomp", "amqp10", "stream", "mqtt")


#: the counters of `MessageStats`, in the order /metrics lists them
COUNTERS: Final = ("received", "received_confirm", "confirmed", "routed",
                    "unroutable_dropped", "unroutable_returned",
                    "delivered_consume_auto_ack", "delivered_consume_manual_ack",
                    "delivered_get_auto_ack", "delivered_get_manual_ack", "get_empty",
                    "redelivered", "acknowledged")


class MessageStats:
    """RabbitMQ's rabbit_global_counters for one protocol (names without the
    `rabbitmq_global_messages_` prefix and `_total` suffix)."""

    __slots__ = COUNTERS
    received: int
    received_confirm: int
    confirmed: int
    routed: int
    unroutable_dropped: int
    unroutable_returned: int
    delivered_consume_auto_ack: int
    delivered_consume_manual_ack: int
    delivered_get_auto_ack: int
    delivered_get_manual_ack: int
    get_empty: int
    redelivered: int
    acknowledged: int

    def __init__(self) -> None:
        for name in COUNTERS:
            setattr(self, name, 0)

    @property
    def delivered(self) -> int:
        """Every delivery, consumed or got (one counter fewer to bump per delivery)."""
        return (self.delivered_consume_auto_ack + self.delivered_consume_manual_ack
                + self.delivered_get_auto_ack + self.delivered_get_manual_ack)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in (*COUNTERS, "delivered")}


# seconds: from 50 µs (an fdatasync on a fast NVMe) to 10 s (a disk in trouble)
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                   0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# records (messages, acks) one fdatasync made durable
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)


class Histogram:
    """Prometheus-style buckets (`le`, cumulative when read). Not thread-safe beyond
    what the GIL gives: a reader may see one observation half-booked, never a crash."""

    __slots__ = ("buckets", "counts", "count", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        # bisect_left, as a loop: compiled, a few compares where values sit (the low
        # buckets) cost less than the call (once per fdatasync, twice)
        i = 0
        for le in self.buckets:
            if value <= le:
                break
            i += 1
        self.counts[i] += n
        self.count += n
        self.sum += value * n

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, count of observations <= le), ..., ("+Inf", count)]."""
        out, acc = [], 0
        for le, c in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            acc += c
            out.append((le, acc))
        return out

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile `q` (None: no data)."""
        if not self.count:
            return None
        rank, acc = q * self.count, 0
        for i, c in enumerate(self.counts):
            acc += c
            if acc >= rank and c:
                return self.buckets[i] if i < len(self.buckets) else float("inf")
        return None


class ProtocolStats:
    """One protocol's counters: its open channels' `MessageStats` and the sum of those
    it closed. Reading a total is O(open channels), done by readers (the sampler every
    5 s, a /metrics scrape), never per message."""

    __slots__ = ("closed", "open")

    def __init__(self) -> None:
        self.closed = MessageStats()
        self.open: set[MessageStats] = set()

    def channel(self) -> MessageStats:
        """A new channel's counters, counted in the totals from now on."""
        m = MessageStats()
        self.open.add(m)
        return m

    def retire(self, m: MessageStats) -> None:
        """A channel closed: its counts go into `closed`, once."""
        if m in self.open:
            self.open.remove(m)
            closed = self.closed
            for name in COUNTERS:
                setattr(closed, name, getattr(closed, name) + getattr(m, name))

    def total(self, counter: str) -> int:
        return getattr(self.closed, counter) + sum(getattr(m, counter) for m in self.open)


class Churn:
    """RabbitMQ's churn counters (rabbit_core_metrics): channels opened and closed,
    queues declared (by a client, redeclares included), created and deleted, since
    start; the server counts connections (server/context.py)."""

    __slots__ = ("channels_opened", "channels_closed", "queues_declared", "queues_created",
                 "queues_deleted")

    def __init__(self) -> None:
        self.channels_opened = self.channels_closed = 0
        self.queues_declared = self.queues_created = self.queues_deleted = 0


class AuthAttempts:
    """Login attempts per protocol ("amqp091", "stomp", "http"): [succeeded, failed]
    (RabbitMQ's rabbitmq_auth_attempts_*); counted by the front ends."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def count(self, protocol: str, ok: bool) -> None:
        c = self.counts.setdefault(protocol, [0, 0])
        c[0 if ok else 1] += 1


class BrokerStats:
    """Everything the broker counts: message counters per protocol, the publish→confirm
    latency of group commits, and channels/connections opened and closed."""

    def __init__(self) -> None:
        self.messages = {p: ProtocolStats() for p in PROTOCOLS}
        # publish→confirm: seconds from the end of the loop turn that read the publishes
        # to the turn that sends their confirms, booked once per commit for all of them
        self.confirm_latency = Histogram(LATENCY_BUCKETS)
        self.churn = Churn()
        self.auth = AuthAttempts()
        # commands a front end refused, per protocol and error name (the stream
        # protocol's rabbitmq_global_stream_error_<name>_total)
        self.errors: dict[str, Counter[str]] = {p: Counter() for p in PROTOCOLS}

    def protocol(self, name: str) -> ProtocolStats:
        return self.messages[name]

    def total(self, counter: str) -> int:
        return sum(m.total(counter) for m in self.messages.values())
