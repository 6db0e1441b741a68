"""ActiveMQ's scheduled delivery (SPEC L5): `AMQ_SCHEDULED_DELAY`, `AMQ_SCHEDULED_PERIOD`,
`AMQ_SCHEDULED_REPEAT`, `AMQ_SCHEDULED_CRON` on a STOMP SEND, compared case by case with
ActiveMQ Classic 5.17.2 (tests/test_scheduled.py records its answers).

ActiveMQ's rules, as observed:
- a SEND is scheduled when it has a cron entry, a period > 0, or a delay header (0
  included); `AMQ_SCHEDULED_REPEAT` alone is not a schedule (sent at once, header kept);
- first delivery: at the next cron time (when a cron entry is given), plus the delay if
  > 0, else plus the period; then `repeat` more, `period` apart (0 apart without one);
  with a cron entry the whole series starts again at every later matching minute,
  forever (ActiveMQ's JmsCronSchedulerTest: cron + delay + period + repeat 9 = 10
  messages per cron time);
- values are Java longs (`Long.parseLong`: no spaces, no fraction); a negative delay,
  period or repeat, a non-number or a cron entry that is not five fields is refused
  (ActiveMQ drops the connection without an ERROR frame; ackmq sends ERROR and closes);
- the consumer sees the message without the AMQ_SCHEDULED_* headers and with
  `scheduledJobId`, the same id on every repeat.

Bounds (issue 34, docs/delays.md "Bounds"): ActiveMQ has none; ackmq refuses a SEND whose
`AMQ_SCHEDULED_REPEAT` is above `Bounds.max_repeat` (default 1,000) or that repeats with
a `AMQ_SCHEDULED_PERIOD` below `Bounds.min_period_ms` (default 1,000 ms; a repeat with no
period would fire its copies at once). A schedule ends with its destination (the exchange,
or for the default exchange the queue) and with the user who made it; the vhost limit
`max-scheduled-messages` bounds the vhost's pending scheduled and delayed messages. Jobs
are listed and cancelled by `jobs` / `cancel` (ctl, the HTTP API, the UI and ActiveMQ's
`ActiveMQ.Scheduler.Management` over STOMP).

The schedule's store (`ScheduledStore`) is a `TimerStore` of the vhost (one hidden queue
of the segment log): the record's exchange field holds the due time, the repeats left
and the exchange; the schedule itself is in the message's headers, so a repeat survives
kill -9 like a first delivery (its next record is added in the turn the last fires).
"""

from __future__ import annotations

import heapq
import logging
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ackmq.broker.cron import Cron, CronError
from ackmq.broker.delayed import HOLDER_PREFIX, MASK64, TimerStore, now_ms
from ackmq.broker.errors import PRECONDITION_FAILED, SoftError
from ackmq.broker.message import Message
from ackmq.broker.storage import StoreError
from ackmq.protocol.amqp.properties import (
    header_entries,
    header_value,
    properties_edit,
    properties_with_header,
)

if TYPE_CHECKING:
    from ackmq.broker.host import QueueHost

log = logging.getLogger(__name__)

DELAY, PERIOD, REPEAT, CRON = ("AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD",
                               "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON")
HEADERS = (DELAY, PERIOD, REPEAT, CRON)
JOB_ID = "scheduledJobId"
JOB_USER = "x-ackmq-scheduled-by"  # who scheduled it: set by the broker, never delivered
PRIVATE = (*HEADERS, JOB_USER)  # headers a due copy goes without
LIMIT = "max-scheduled-messages"  # the vhost limit on pending scheduled + delayed messages
MAX_REPEAT = 1000
MIN_PERIOD_MS = 1000
STORE_NAME = HOLDER_PREFIX + "s"
_LONG = re.compile(r"[+-]?[0-9]+\Z")
K = TypeVar("K")


class ScheduleError(ValueError):
    """A SEND's schedule headers ActiveMQ refuses; the text says which and why."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one SEND may ask for (`ackmq serve --scheduled-max-repeat`,
    `--scheduled-min-period-ms`): at most `max_repeat` repeats, `min_period_ms` apart
    at least. Without them one SEND was 50,001 messages, or 1,000 a second for ever."""

    max_repeat: int = MAX_REPEAT
    min_period_ms: int = MIN_PERIOD_MS

    def check(self, s: Schedule) -> None:
        if s.repeat > self.max_repeat:
            raise ScheduleError(f"{REPEAT} {s.repeat} is above this broker's limit of "
                                f"{self.max_repeat} repeats")
        if s.repeat > 0 and s.period < self.min_period_ms:
            raise ScheduleError(f"{PERIOD} {s.period} is below this broker's minimum of "
                                f"{self.min_period_ms} ms for a repeated message")


@dataclass(frozen=True, slots=True)
class Schedule:
    delay: int
    period: int
    repeat: int
    cron: Cron | None

    def first_due(self, now: int) -> int:
        base = self.cron.next_after(now) if self.cron is not None else now
        return base + (self.delay if self.delay > 0 else self.period)


def _long(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ScheduleError(f"{name}: For input string: \"{v}\"")
    if isinstance(v, int):
        n = v
    else:
        s = v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)
        if not _LONG.match(s):
            raise ScheduleError(f"{name}: For input string: \"{s}\"")
        n = int(s)
    if n < 0:
        raise ScheduleError(f"{name} must not be a negative value")
    return n


def parse(headers: Mapping[str, Any], bounds: Bounds | None = None) -> Schedule | None:
    """The schedule a SEND's headers ask for, None when they ask for none (ActiveMQ's
    rule above); ScheduleError for a value ActiveMQ refuses or one beyond `bounds` (every
    front end passes the broker's `schedule_bounds`; stored schedules are read without)."""
    if not any(h in headers for h in HEADERS):
        return None
    delay = _long(DELAY, headers[DELAY]) if DELAY in headers else None
    period = _long(PERIOD, headers[PERIOD]) if PERIOD in headers else 0
    repeat = _long(REPEAT, headers[REPEAT]) if REPEAT in headers else 0
    cron = None
    entry = headers.get(CRON)
    if entry:
        text = entry.decode("utf-8", "replace") if isinstance(entry, bytes) else str(entry)
        n = len(text.split())
        if n != 5:
            raise ScheduleError(f"Not a valid cron entry - wrong number of tokens({n}): "
                                f"{text}")
        try:
            cron = Cron(text)
        except CronError as e:
            raise ScheduleError(f"Not a valid cron entry - {e}") from None
    if cron is None and period <= 0 and delay is None:
        return None
    sched = Schedule(delay or 0, period, repeat, cron)
    if bounds is not None:
        bounds.check(sched)
    return sched


class ScheduledStore(TimerStore):
    """The vhost's scheduled STOMP sends: routed by their exchange when due, again and
    again while repeats are left, and again at each cron time."""

    kind = "scheduled"

    def __init__(self, vhost: QueueHost) -> None:
        super().__init__(vhost, None, True, STORE_NAME)
        self._left: dict[int, int] = {}  # seq -> repeats left (only when not 0)
        # pending copies by destination and by user: a queue, exchange or user deletion
        # with none pending reads nothing back (memory per destination, not per message)
        self.by_dest: Counter[tuple[str, str]] = Counter()
        self.by_user: Counter[str] = Counter()

    def admit(self, message: Message, user: str | None) -> Message:
        """A SEND about to be scheduled: refused (406) when the vhost's
        max-scheduled-messages is reached; else the message, marked with its user."""
        limit = self.vhost.broker.vhost_limit(self.vhost.name, LIMIT)
        if limit is not None and pending(self.vhost) >= limit:
            raise SoftError(PRECONDITION_FAILED, limit_text(self.vhost.name, limit))
        props = message.properties
        if user is not None or JOB_USER.encode() in props:
            props = properties_with_header(props, JOB_USER, user or "")
        return Message(message.exchange, message.routing_key, props, message.body,
                       trusted=True)

    def publish(self, message: Message) -> bool:
        sched = _schedule_of(message)
        seq = self.next_seq()
        msg = Message(message.exchange, message.routing_key,
                      properties_with_header(message.properties, JOB_ID,
                                             f"ID:ackmq-{self.vhost.name}-{seq}"),
                      message.body, trusted=True)
        if sched is None:
            self.enqueue(seq, now_ms(), msg)
            return True
        left = sched.repeat
        if left:
            self._left[seq] = left
        self.enqueue(seq, sched.first_due(now_ms()), msg)
        return True

    def _record_exchange(self, due: int, message: Message, seq: int) -> str:
        return f"{due} {self._left.get(seq, 0)} {message.exchange}"

    def _stored(self, sm: Any) -> tuple[int, Message]:
        due, left, exchange = sm.exchange.split(" ", 2)
        if int(left):
            self._left[sm.seq] = int(left)
        return int(due), Message(exchange, sm.routing_key, sm.properties, sm.body,
                                 trusted=True)

    def _hold(self, seq: int, due: int, message: Message, stored: bool) -> int:
        self._count(message, 1)
        return super()._hold(seq, due, message, stored)

    def _count(self, msg: Message, n: int) -> None:
        _bump(self.by_dest, (msg.exchange, msg.routing_key), n)
        _bump(self.by_user, job_user(msg), n)

    def destroy(self) -> None:
        super().destroy()
        self.by_dest.clear()
        self.by_user.clear()

    def _deliver(self, seq: int, due: int, msg: Message) -> None:
        self._count(msg, -1)
        left = self._left.pop(seq, 0)
        entries = [e for k, e in header_entries(msg.properties)
                   if k.decode("utf-8", "replace") not in PRIVATE]
        out = Message(msg.exchange, msg.routing_key, properties_edit(msg.properties, entries),
                      msg.body, trusted=True)
        x = self.vhost.exchanges.get(msg.exchange)
        if x is None or (msg.exchange == "" and msg.routing_key not in self.vhost.queues):
            return  # its destination is gone: so is the schedule (not resumed, not re-made)
        queues = self.vhost.route(x, out)
        x.stat_out += len(queues)
        for q in queues:
            q.stat_published += 1
            q.publish(out)
        sched = _schedule_of(msg) if left or CRON.encode() in msg.properties else None
        if sched is None:
            return
        if left:  # the series goes on: `period` later
            self.schedule_at(due + sched.period, msg, left - 1)
        elif sched.cron is not None:  # the next cron time starts a new series
            self.schedule_at(sched.first_due(due), msg, sched.repeat)

    def schedule_at(self, due: int, msg: Message, left: int) -> None:
        seq = self.next_seq()
        if left:
            self._left[seq] = left
        self.enqueue(seq, due, msg)


    # -- the jobs: listed and cancelled (ctl, HTTP API, UI, STOMP management) ----------
    def _pending(self) -> Iterator[tuple[int, int, Message]]:
        """(seq, due, message) of every pending copy; paged ones are read back."""
        store = self.persistent_store
        far = [(seq, -1) for seqs in self._far.values() for seq in seqs]
        for seq, due in [(k & MASK64, k >> 64) for k in self._heap] + far:
            msg = self._hot.get(seq)
            if msg is None:
                if store is None:
                    continue
                try:
                    d, msg = self._stored(store.read_queued(self.name, seq))
                except Exception:  # a damaged record: _route logs it when due
                    continue
                due = d if due < 0 else due
            yield seq, due, msg

    def jobs(self, where: Callable[[Message], bool] | None = None) -> list[dict[str, Any]]:
        """The pending jobs (one per scheduledJobId), due order."""
        out: list[dict[str, Any]] = []
        for seq, due, msg in self._pending():
            if where is not None and not where(msg):
                continue
            s = _schedule_of(msg)
            out.append({"id": _text(header_value(msg.properties, JOB_ID)),
                        "vhost": self.vhost.name, "exchange": msg.exchange,
                        "routing_key": msg.routing_key, "user": job_user(msg),
                        "next_run": due, "delay": s.delay if s else 0,
                        "period": s.period if s else 0, "repeat": s.repeat if s else 0,
                        "repeats_left": self._left.get(seq, 0),
                        "cron": s.cron.entry if s and s.cron else "",
                        "persistent": msg.persistent, "payload_bytes": len(msg.body),
                        "message": msg})
        out.sort(key=lambda j: (j["next_run"], j["id"]))
        return out

    def cancel(self, where: Callable[[Message], bool]) -> int:
        """Drop every pending copy `where` says; returns how many jobs went."""
        gone = {seq: msg for seq, _due, msg in self._pending() if where(msg)}
        if not gone:
            return 0
        store = self.persistent_store
        stored = False
        for seq, msg in gone.items():
            self._count(msg, -1)
            self._hot.pop(seq, None)
            self._left.pop(seq, None)
            if store is not None and msg.persistent:
                store.remove(self.name, seq)
                stored = True
        if store is not None and stored:
            try:  # durable before the reply: a kill -9 right after it must not resume them
                store.sync_now()
            except StoreError as e:  # the store is failing everything: say so, go on
                log.error("cancelled schedules not made durable: %s", e)
        self._heap = [k for k in self._heap if k & MASK64 not in gone]
        heapq.heapify(self._heap)
        for b in list(self._far):
            kept = array("Q", (s for s in self._far[b] if s not in gone))
            self._far_count -= len(self._far[b]) - len(kept)
            if kept:
                self._far[b] = kept
            else:
                del self._far[b]
        self._far_keys = list(self._far)
        heapq.heapify(self._far_keys)
        self._arm()
        self.vhost.broker.request_flush()
        return len({_text(header_value(m.properties, JOB_ID)) for m in gone.values()})


def _bump(counter: Counter[K], key: K, n: int) -> None:
    counter[key] += n
    if counter[key] <= 0:
        del counter[key]


def _text(v: Any) -> str:
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    return "" if v is None else str(v)


def job_user(msg: Message) -> str:
    return _text(header_value(msg.properties, JOB_USER))


def made_by(user: str) -> Callable[[Message], bool]:
    return lambda m: job_user(m) == user


def job_is(job_id: str) -> Callable[[Message], bool]:
    return lambda m: _text(header_value(m.properties, JOB_ID)) == job_id


def limit_text(vhost: str, limit: int) -> str:
    """RabbitMQ's words for a reached vhost limit (as its max-queues refusal)."""
    return (f"cannot schedule message: scheduled message limit in vhost '{vhost}' "
            f"({limit}) is reached")


def pending(vhost: QueueHost) -> int:
    """The vhost's pending scheduled and delayed messages (what max-scheduled-messages
    bounds)."""
    return sum(t.message_count for t in vhost.hidden.values())


def existing(vhost: QueueHost) -> ScheduledStore | None:
    return vhost.hidden.get(STORE_NAME)  # type: ignore[return-value]


def destination_gone(vhost: QueueHost, exchange: str, queue: str | None = None) -> None:
    """An exchange (or, `queue` given, a queue) was deleted: its schedules end."""
    t = existing(vhost)
    if t is None:
        return
    if queue is None:
        if any(x == exchange for x, _ in t.by_dest):
            t.cancel(lambda m: m.exchange == exchange)
    elif ("", queue) in t.by_dest:
        t.cancel(lambda m: m.exchange == "" and m.routing_key == queue)


def user_gone(vhost: QueueHost, user: str) -> None:
    """A user was deleted: the schedules they made end."""
    t = existing(vhost)
    if t is not None and user in t.by_user:
        t.cancel(made_by(user))


def _schedule_of(message: Message) -> Schedule | None:
    headers = message.headers or {}
    try:
        return parse(headers)
    except ScheduleError:
        return None


def store_of(vhost: QueueHost) -> ScheduledStore:
    """The vhost's scheduled store, made on first use (registered as hidden)."""
    t = vhost.hidden.get(STORE_NAME)
    if t is None:
        t = ScheduledStore(vhost)
        t.save()
        vhost.hidden[STORE_NAME] = t
    return t  # type: ignore[return-value]
