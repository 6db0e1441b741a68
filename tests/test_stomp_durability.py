"""W7 + P9 over STOMP: persistent SENDs (and COMMITs) that got their RECEIPT survive
`kill -9` of the broker; none is duplicated; each publisher's order is kept. The STOMP
twin of test_durability.py's P9 test (ackmq only: it kills its own broker)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import BrokerProcess
from support.stomphelp import Closed, Raw

pytestmark = pytest.mark.slow

QUEUE = "/queue/crash"


def _publisher(port: int, name: str, confirmed: list[str], stop: threading.Event,
               transactional: bool) -> None:
    """SEND persistent messages, each with a receipt (or in 3-message transactions with a
    receipted COMMIT); what a RECEIPT answered goes into `confirmed`."""
    n = 0
    try:
        r = Raw.open("127.0.0.1", port)
        r.connect(host="/")
        while not stop.is_set():
            if transactional:
                tx = f"{name}-tx{n}"
                r.send("BEGIN", {"transaction": tx})
                bodies = [f"{name}-{n + i}" for i in range(3)]
                for b in bodies:
                    r.send("SEND", {"destination": QUEUE, "persistent": "true",
                                    "transaction": tx}, b.encode())
                r.send("COMMIT", {"transaction": tx, "receipt": tx})
                f = r.recv(10)
                assert f.command == "RECEIPT" and f.headers["receipt-id"] == tx, f
                confirmed.extend(bodies)
                n += 3
            else:
                body = f"{name}-{n}"
                r.send("SEND", {"destination": QUEUE, "persistent": "true",
                                "receipt": body}, body.encode())
                f = r.recv(10)
                assert f.command == "RECEIPT" and f.headers["receipt-id"] == body, f
                confirmed.append(body)
                n += 1
    except (Closed, OSError, TimeoutError):  # the kill: that SEND has no receipt
        return


def _drain(port: int) -> list[str]:
    r = Raw.open("127.0.0.1", port)
    r.connect(host="/")
    r.subscribe(QUEUE, "d", ack="client", **{"prefetch-count": "0"})
    bodies = []
    last = None
    while True:
        got = r.frames(0.7)
        if not got:
            break
        bodies += [m.body.decode() for m in got]
        last = got[-1]
    if last is not None:
        r.ack(last)
    r.receipt("DISCONNECT")
    r.close()
    return bodies


def test_W7_P9_receipted_persistent_sends_survive_kill_9(tmp_path: Path) -> None:
    rnd = random.Random(7)
    b = BrokerProcess(tmp_path / "data")
    confirmed: list[str] = []
    try:
        for cycle in range(4):
            b.start()
            stop = threading.Event()
            threads = [threading.Thread(target=_publisher,
                                        args=(b.stomp_port, f"c{cycle}p{i}", confirmed, stop,
                                              i % 2 == 1))
                       for i in range(4)]
            for t in threads:
                t.start()
            time.sleep(rnd.uniform(0.5, 1.5))
            b.kill()
            stop.set()
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads)
        b.start()
        bodies = _drain(b.stomp_port)
    finally:
        b.stop()
    counts = Counter(bodies)
    assert len(confirmed) > 100
    missing = set(confirmed) - counts.keys()
    assert not missing, f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:5]}"
    dups = [x for x, c in counts.items() if c > 1]
    assert not dups, f"duplicated: {dups[:5]}"
    for name in {x.rsplit("-", 1)[0] for x in bodies}:  # per publisher, order is kept
        ns = [int(x.rsplit("-", 1)[1]) for x in bodies if x.rsplit("-", 1)[0] == name]
        assert ns == sorted(ns)
