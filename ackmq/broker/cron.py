"""Five-field cron entries (minute hour day-of-month month day-of-week), as ActiveMQ's
`AMQ_SCHEDULED_CRON` takes them (SPEC L5): `*`, numbers, ranges `a-b`, lists `a,b`,
steps `*/n` and `a-b/n`; day of week 0-7 (0 and 7 are Sunday). When both day fields are
restricted a day matches either (Vixie cron). Times are the broker's local time, to the
minute. No I/O; `next_after` is a pure function of the entry and a time.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31),
           ("month", 1, 12), ("day of week", 0, 7))


class CronError(ValueError):
    """A cron entry that is not five valid fields."""


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        rng, _, step_s = part.partition("/")
        try:
            step = int(step_s) if step_s else 1
            if rng == "*":
                a, b = low, high
            elif "-" in rng:
                a_s, b_s = rng.split("-", 1)
                a, b = int(a_s), int(b_s)
            else:
                a = b = int(rng)
                if step_s:
                    b = high
        except ValueError:
            raise CronError(f"invalid {name} field {text!r}") from None
        if step <= 0 or not (low <= a <= high and low <= b <= high) or a > b:
            raise CronError(f"invalid {name} field {text!r} (allowed {low}-{high})")
        out.update(range(a, b + 1, step))
    return frozenset(out)


class Cron:
    __slots__ = ("entry", "minutes", "hours", "days", "months", "weekdays",
                 "any_day", "any_weekday")

    def __init__(self, entry: str) -> None:
        parts = entry.split()
        if len(parts) != 5:
            raise CronError(f"cron entry {entry!r} must have 5 fields, has {len(parts)}")
        fields = [_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
        self.entry = entry
        self.minutes, self.hours, self.days, self.months, weekdays = fields
        self.weekdays = frozenset(d % 7 for d in weekdays)  # 7 is Sunday too
        self.any_day = parts[2] == "*"
        self.any_weekday = parts[4] == "*"

    def _day_ok(self, t: datetime) -> bool:
        dom = t.day in self.days
        dow = (t.isoweekday() % 7) in self.weekdays  # Sunday = 0
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def next_after(self, ms: int) -> int:
        """The first matching minute strictly after `ms` (ms since the epoch), in ms."""
        t = datetime.fromtimestamp(ms / 1000.0).replace(second=0, microsecond=0)
        t += timedelta(minutes=1)
        for _ in range(600000):  # years of days/hours; a match comes far sooner
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
                continue
            if not self._day_ok(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t += timedelta(minutes=1)
                continue
            return int(time.mktime(t.timetuple()) * 1000)
        raise CronError(f"cron entry {self.entry!r} never matches")
