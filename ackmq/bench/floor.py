"""The physical floor under one-at-a-time confirms: a loopback round trip plus an fdatasync.

A publisher that waits for each confirm cannot go faster than one network round trip
and, for a broker that really syncs before confirming, one disk flush per message.
Printing this beside confirms-individual shows how close a broker is to the limit.
(RabbitMQ 3.10 classic queues fsync before confirming a persistent message too:
strace on beam.smp counts one fsync per confirm when the publisher waits for each.)
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import threading
import time

from ackmq.bench.stats import median


def loopback_rtt(samples: int = 300) -> float:
    """Median seconds for one tiny TCP round trip on 127.0.0.1 (echo in a thread)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def echo() -> None:
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            while data := c.recv(64):
                c.sendall(data)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    cli = socket.create_connection(srv.getsockname())
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            cli.sendall(b"x")
            cli.recv(64)
            times.append(time.perf_counter() - t0)
    finally:
        cli.close()
        t.join(5)
        srv.close()
    return median(times)


RECORD = 128
PREALLOC = 64 * 1024


def fdatasync_time(directory: str | None = None, samples: int = 30,
                   append: bool = False) -> float:
    """Median seconds for one durable 128-byte write in `directory`'s filesystem.

    Default: overwrite a record in place in a file whose blocks were written and flushed
    first, then fdatasync. That is the cheapest durable write the filesystem offers (no
    size or extent change to journal), so no broker that syncs each message can beat it,
    whatever its log layout. `append=True` measures append + fdatasync instead (the file
    grows, so the flush also commits its new size): what an unpreallocated log pays."""
    fd, path = tempfile.mkstemp(prefix="ackmq-bench-floor-", dir=directory)
    sync = getattr(os, "fdatasync", os.fsync)
    record = b"x" * RECORD
    times = []
    try:
        if not append:
            os.write(fd, b"\0" * PREALLOC)
            os.fsync(fd)
        for i in range(samples):
            if append:
                os.write(fd, record)
            else:
                os.pwrite(fd, record, (i * RECORD) % PREALLOC)
            t0 = time.perf_counter()
            sync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return median(times)


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_of(path: str, mounts: str | None = None) -> tuple[str, str]:
    """(mount point, filesystem type) holding `path`: the longest mount-point prefix in
    /proc/mounts (the last such line wins, as later mounts hide earlier ones);
    ("?", "unknown") where /proc/mounts is not readable."""
    if mounts is None:
        try:
            with open("/proc/mounts") as f:
                mounts = f.read()
        except OSError:
            return ("?", "unknown")
    real = os.path.realpath(path)
    best, best_len = ("?", "unknown"), -1
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mnt, fstype = _unescape(fields[1]), fields[2]
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= best_len:
            best, best_len = (mnt, fstype), len(mnt)
    return best


MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


def floor_dir(directory: str | None) -> str:
    """Where to measure fdatasync when no data directory is known: /var/tmp, not /tmp
    (often tmpfs, where fsync is free), as for --ackmq's data directory."""
    if directory:
        return directory
    return "/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir()


def physical_floor(n: int, directory: str | None = None) -> dict[str, float | str]:
    """The floor for n one-at-a-time confirms, in ms, with its two components in µs,
    and the filesystem the fdatasync was measured on."""
    directory = floor_dir(directory)
    rtt = loopback_rtt()
    sync = fdatasync_time(directory)
    append = fdatasync_time(directory, append=True)
    mnt, fstype = filesystem_of(directory)
    return {"rtt_us": rtt * 1e6, "fdatasync_us": sync * 1e6, "fdatasync_append_us": append * 1e6,
            "floor_ms": n * (rtt + sync) * 1e3, "floor_no_fsync_ms": n * rtt * 1e3,
            "floor_dir": directory, "floor_mount": mnt, "floor_fstype": fstype}
