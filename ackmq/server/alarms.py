"""Resource alarms (U5), as RabbitMQ 3.10's vm_memory_monitor, rabbit_disk_monitor and
rabbit_alarm: a timer samples the process's memory (RSS) and the data dir's free disk
space, never a message; crossing a limit sets an alarm, and while any alarm is set every
connection that publishes is blocked (server/transport.py) until all clear.

`Limits` holds the rule-keeping (parse, compare, which alarms changed): plain Python,
testable without sockets. `ResourceMonitor` puts it on the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ackmq.broker.timers import Deadline, Timers

if TYPE_CHECKING:
    pass

log = logging.getLogger("ackmq.alarms")

PAGING_RATIO = 0.5  # RabbitMQ's vm_memory_high_watermark_paging_ratio
MEMORY = "memory"
DISK = "disk"

# rabbit_resource_monitor_misc:parse_information_unit: k/K/kiB = 1024, kB/KB = 1000, ...
_UNITS = {
    "": 1,
    "k": 1024, "kiB": 1024, "K": 1024, "KIB": 1024, "KiB": 1024, "kB": 1000, "KB": 1000,
    "m": 1024 ** 2, "M": 1024 ** 2, "MiB": 1024 ** 2, "MIB": 1024 ** 2, "mb": 1000 ** 2,
    "MB": 1000 ** 2,
    "g": 1024 ** 3, "G": 1024 ** 3, "GiB": 1024 ** 3, "GIB": 1024 ** 3, "gb": 1000 ** 3,
    "GB": 1000 ** 3,
    "t": 1024 ** 4, "T": 1024 ** 4, "TiB": 1024 ** 4, "TIB": 1024 ** 4, "tb": 1000 ** 4,
    "TB": 1000 ** 4,
}
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """`2GiB`, `512MB`, `50000000`: RabbitMQ's information units (KB/MB/GB are powers
    of 1000, k/M/G and KiB/MiB/GiB powers of 1024)."""
    m = _AMOUNT.match(str(text))
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"{text!r} is not an amount of memory: a number of bytes or "
                         "one with a unit, KB/MB/GB/TB (x1000) or KiB/MiB/GiB/TiB (x1024)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class Limit:
    """A fraction of RAM (`relative`) or a number of bytes (`absolute`)."""

    relative: float | None = None
    absolute: int | None = None

    def bytes(self, total_ram: int) -> int:
        if self.absolute is not None:
            return self.absolute
        return int((self.relative or 0.0) * total_ram)

    def __str__(self) -> str:
        return str(self.absolute) if self.absolute is not None else f"{self.relative}"


def parse_watermark(text: str | float) -> Limit:
    """`--memory-high-watermark`: a fraction of RAM (0.4, RabbitMQ's
    vm_memory_high_watermark) or an amount with units (2GiB, its `.absolute`). A plain
    number above 1 is bytes."""
    s = str(text).strip()
    if s.startswith(("absolute:", "absolute ")):  # rabbitmqctl's `absolute <value>`
        return Limit(absolute=parse_bytes(s[9:]))
    try:
        f = float(s)
    except ValueError:
        return Limit(absolute=parse_bytes(s))
    if f < 0 or f != f:
        raise ValueError(f"the memory high watermark must be a fraction of RAM (0.0 to "
                         f"1.0) or an amount (2GiB), got {s!r}")
    if f <= 1.0:
        return Limit(relative=f)
    if s.isdigit():
        return Limit(absolute=int(s))
    raise ValueError(f"the memory high watermark must be a fraction of RAM (0.0 to 1.0) "
                     f"or an amount (2GiB), got {s!r}")


def parse_disk_limit(text: str | float) -> Limit:
    """`--disk-free-limit`: an amount (50MB, RabbitMQ's default; 1GiB), or
    `mem_relative:1.5` (RabbitMQ's disk_free_limit.relative: a multiple of RAM)."""
    s = str(text).strip()
    for prefix in ("mem_relative:", "mem_relative "):
        if s.startswith(prefix):
            try:
                f = float(s[len(prefix):])
            except ValueError:
                raise ValueError(f"{s!r}: mem_relative takes a number, e.g. "
                                 "mem_relative:1.5") from None
            if f < 0:
                raise ValueError(f"{s!r}: mem_relative must not be negative")
            return Limit(relative=f)
    return Limit(absolute=parse_bytes(s))


def total_memory() -> int:
    """MemTotal of /proc/meminfo (what RabbitMQ's relative watermark is a fraction of)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_PAGE = os.sysconf("SC_PAGE_SIZE")


_statm: list[int] = []  # an fd of /proc/self/statm, opened once


def process_rss() -> int:
    """Resident set size of this process: one pread of /proc/self/statm (~3 µs)."""
    try:
        if not _statm:
            _statm.append(os.open("/proc/self/statm", os.O_RDONLY))
        return int(os.pread(_statm[0], 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _mib(n: int) -> int:
    return n // (1024 * 1024)


class Limits:
    """The alarm rules: memory used above the high watermark, or free disk space below
    the limit, sets that resource's alarm; back on the right side clears it. No I/O:
    the readings come in as numbers, the changes go out as a return value."""

    def __init__(self, watermark: Limit, disk_limit: Limit, total_ram: int) -> None:
        self.watermark = watermark
        self.disk_limit = disk_limit
        self.total_ram = total_ram
        self.active: set[str] = set()

    @property
    def memory_limit(self) -> int:
        return self.watermark.bytes(self.total_ram)

    @property
    def disk_free_limit(self) -> int:
        return self.disk_limit.bytes(self.total_ram)

    def check_memory(self, used: int) -> bool | None:
        """True: the alarm is set now, False: cleared now, None: no change."""
        return self._change(MEMORY, used > self.memory_limit)

    def check_disk(self, free: int) -> bool | None:
        return self._change(DISK, free < self.disk_free_limit)

    def _change(self, resource: str, over: bool) -> bool | None:
        if over == (resource in self.active):
            return None
        (self.active.add if over else self.active.discard)(resource)
        return over

    def reason(self) -> str:
        """connection.blocked's reason, as RabbitMQ 3.10 words it: "low on memory",
        "low on disk", "low on disk & memory"."""
        return "low on " + " & ".join(sorted(self.active))


_libc: ctypes.CDLL | None = None


def _trim() -> None:
    """Give freed heap back to the OS (glibc keeps it otherwise), so RSS can fall below
    the watermark once the queues drain or page out."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class ResourceMonitor:
    """Samples memory every `memory_interval` s and disk every `disk_interval` s on the
    loop; tells `on_change(active)` when the set of alarms changes."""

    def __init__(self, timers: Timers, limits: Limits, data_dir: Path | None,
                 on_change: Callable[[set[str]], None], node: str,
                 memory_interval: float = 0.1, disk_interval: float = 1.0,
                 set_paging: Callable[[bool], None] | None = None,
                 page_out: Callable[[], int] | None = None) -> None:
        self.limits = limits
        self.data_dir = data_dir
        self.on_change = on_change
        self.node = node
        self.memory_interval = memory_interval
        self.disk_interval = disk_interval
        self.set_paging = set_paging
        self.page_out = page_out
        self.paging = False
        self.rss = 0
        self.disk_free: int | None = None
        self._memory_timer = Deadline(timers, self._memory_tick)  # C5: the broker's timers
        self._disk_timer = Deadline(timers, self._disk_tick)
        self._last_trim = 0.0
        self._stopped = False

    def start(self) -> None:
        lim = self.limits
        log.info("Memory high watermark set to %d MiB (%d bytes) of %d MiB (%d bytes) total",
                 _mib(lim.memory_limit), lim.memory_limit, _mib(lim.total_ram), lim.total_ram)
        if self.data_dir is not None:
            log.info("Enabling free disk space monitoring")
            log.info("Disk free limit set to %dMB", lim.disk_free_limit // 1000000)
        self._memory_tick()
        if self.data_dir is not None:
            self._disk_tick()

    def stop(self) -> None:
        self._stopped = True
        self._memory_timer.cancel()
        self._disk_timer.cancel()

    # -- changes at run time (ackmq ctl) ------------------------------------------------
    def set_watermark(self, watermark: Limit) -> None:
        lim = self.limits
        lim.watermark = watermark
        log.info("Memory high watermark set to %d MiB (%d bytes) of %d MiB (%d bytes) total",
                 _mib(lim.memory_limit), lim.memory_limit, _mib(lim.total_ram), lim.total_ram)
        self.check_memory()

    def set_disk_limit(self, disk_limit: Limit) -> None:
        self.limits.disk_limit = disk_limit
        log.info("Disk free limit set to %dMB", self.limits.disk_free_limit // 1000000)
        self.check_disk()

    # -- sampling -----------------------------------------------------------------------
    def _paging(self) -> None:
        """As RabbitMQ pages queue contents to disk above half the watermark
        (vm_memory_high_watermark_paging_ratio), queues send new messages to the spill
        while RSS is above that, instead of holding them (--queue-memory-mb)."""
        over = self.rss >= PAGING_RATIO * self.limits.memory_limit
        if over != self.paging and self.set_paging is not None:
            self.paging = over
            self.set_paging(over)
            log.debug("memory %d MiB: queues %s", _mib(self.rss),
                      "page new messages to disk" if over else "keep messages in memory")

    def _memory_tick(self) -> None:
        if self._stopped:
            return
        self.check_memory()
        self._memory_timer.arm_in(self.memory_interval)

    def _disk_tick(self) -> None:
        if self._stopped:
            return
        self.check_disk()
        self._disk_timer.arm_in(self.disk_interval)

    def check_memory(self) -> None:
        lim = self.limits
        self.rss = process_rss()
        if MEMORY in lim.active:
            now = time.monotonic()
            if now - self._last_trim >= 1.0:  # at most once a second, only in alarm
                self._last_trim = now
                if self.page_out is not None:  # as RabbitMQ: queues to disk, to clear it
                    moved = self.page_out()
                    if moved:
                        log.info("memory alarm: paged %d ready messages out to disk", moved)
                _trim()
                self.rss = process_rss()
        self._paging()
        change = lim.check_memory(self.rss)
        if change is None:
            return
        log.info("vm_memory_high_watermark %s. Memory used:%d allowed:%d",
                 "set" if change else "clear", self.rss, lim.memory_limit)
        self._announce(MEMORY, change)

    def check_disk(self) -> None:
        if self.data_dir is None:
            return
        lim = self.limits
        try:
            self.disk_free = shutil.disk_usage(self.data_dir).free
        except OSError as e:
            log.warning("cannot read free disk space of %s: %s", self.data_dir, e)
            return
        change = lim.check_disk(self.disk_free)
        if change is None:
            return
        log.info("Free disk space is %s. Free bytes: %d. Limit: %d",
                 "insufficient" if change else "sufficient", self.disk_free,
                 lim.disk_free_limit)
        self._announce(DISK, change)

    def _announce(self, resource: str, set_: bool) -> None:
        if set_:
            log.warning("%s resource limit alarm set on node %s.\n\n"
                        "**********************************************************\n"
                        "*** Publishers will be blocked until this alarm clears ***\n"
                        "**********************************************************\n",
                        resource, self.node)
        else:
            log.warning("%s resource limit alarm cleared on node %s", resource, self.node)
        self.on_change(set(self.limits.active))
