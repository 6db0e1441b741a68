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

The schedule's store (`ScheduledStore`) is a `TimerStore` of the vhost (one hidden queue
of the segment log): the record's exchange field holds the due time, the repeats left
and the exchange; the schedule itself is in the message's headers, so a repeat survives
kill -9 like a first delivery (its next record is added in the turn the last fires).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackmq.broker.cron import Cron, CronError
from ackmq.broker.delayed import HOLDER_PREFIX, TimerStore, now_ms
from ackmq.broker.message import Message
from ackmq.protocol.amqp.properties import (
    header_entries,
    properties_edit,
    properties_with_header,
)

if TYPE_CHECKING:
    from ackmq.broker.vhost import VHost

DELAY, PERIOD, REPEAT, CRON = ("AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD",
                               "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON")
HEADERS = (DELAY, PERIOD, REPEAT, CRON)
JOB_ID = "scheduledJobId"
STORE_NAME = HOLDER_PREFIX + "s"
_LONG = re.compile(r"[+-]?[0-9]+\Z")


class ScheduleError(ValueError):
    """A SEND's schedule headers ActiveMQ refuses; the text says which and why."""


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


def parse(headers: Mapping[str, Any]) -> Schedule | None:
    """The schedule a SEND's headers ask for, None when they ask for none (ActiveMQ's
    rule above); ScheduleError for a value ActiveMQ refuses."""
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
    return Schedule(delay or 0, period, repeat, cron)


class ScheduledStore(TimerStore):
    """The vhost's scheduled STOMP sends: routed by their exchange when due, again and
    again while repeats are left, and again at each cron time."""

    kind = "scheduled"

    def __init__(self, vhost: VHost) -> None:
        super().__init__(vhost, None, True, STORE_NAME)
        self._left: dict[int, int] = {}  # seq -> repeats left (only when not 0)

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

    def _deliver(self, seq: int, due: int, msg: Message) -> None:
        left = self._left.pop(seq, 0)
        entries = [e for k, e in header_entries(msg.properties)
                   if k.decode("utf-8", "replace") not in HEADERS]
        out = Message(msg.exchange, msg.routing_key, properties_edit(msg.properties, entries),
                      msg.body, trusted=True)
        x = self.vhost.exchanges.get(msg.exchange)
        if x is not None:
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


def _schedule_of(message: Message) -> Schedule | None:
    headers = message.headers or {}
    try:
        return parse(headers)
    except ScheduleError:
        return None


def store_of(vhost: VHost) -> ScheduledStore:
    """The vhost's scheduled store, made on first use (registered as hidden)."""
    t = vhost.hidden.get(STORE_NAME)
    if t is None:
        t = ScheduledStore(vhost)
        t.save()
        vhost.hidden[STORE_NAME] = t
    return t  # type: ignore[return-value]
