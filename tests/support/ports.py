"""Ports for the suite's own brokers, drawn from below the kernel's ephemeral range.

A broker killed and restarted keeps its ports (clients reconnect to the same URL). A port
the kernel had handed out at random (port 0) is drawn from the same range as every
client's ephemeral port, so with many tests at once a client's socket could hold it by the
restart (CI: "cannot listen on 127.0.0.1:42063: address already in use" after a kill -9).
Below that range only another listener can take a port, and we check it is free.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32000  # Linux's ephemeral range starts at 32768 (ip_local_port_range)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick() -> int:
    """A port nothing listens on now, outside the ephemeral range."""
    high = min(HIGH, _ephemeral_low())
    for _ in range(200):
        port = random.randrange(LOW, high)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return 0  # let the kernel choose, as before
