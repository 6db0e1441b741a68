"""The physical floor under one-at-a-time confirms: a loopback round trip plus an fdatasync.

A publisher that waits for each confirm cannot go faster than one network round trip
and, for a broker that really syncs before confirming, one disk flush per message.
Printing this beside confirms-individual shows how close a broker is to the limit.
(RabbitMQ 3.10 classic queues fsync before confirming a persistent message too:
strace on beam.smp counts one fsync per confirm when the publisher waits for each.)
"""

from __future__ import annotations

import os
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


def fdatasync_time(directory: str | None = None, samples: int = 30) -> float:
    """Median seconds to append 128 bytes and fdatasync, in `directory`'s filesystem."""
    fd, path = tempfile.mkstemp(prefix="ackmq-bench-floor-", dir=directory)
    sync = getattr(os, "fdatasync", os.fsync)
    times = []
    try:
        for _ in range(samples):
            os.write(fd, b"x" * 128)
            t0 = time.perf_counter()
            sync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return median(times)


def physical_floor(n: int, directory: str | None = None) -> dict[str, float]:
    """The floor for n one-at-a-time confirms, in ms, with its two components in µs."""
    rtt = loopback_rtt()
    sync = fdatasync_time(directory)
    return {"rtt_us": rtt * 1e6, "fdatasync_us": sync * 1e6,
            "floor_ms": n * (rtt + sync) * 1e3, "floor_no_fsync_ms": n * rtt * 1e3}
