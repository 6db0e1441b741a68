"""How the management API's big listings treat the broker's deliveries (SPEC M1, issue
20): with N queues declared, GET /api/queues is timed while a publisher/consumer pair
moves one message per millisecond through another queue; the largest gap between two
deliveries during the listings is reported next to the gap with no listing running.

    python -m tools.perf.mgmt_listing [--queues 10000] [--rounds 5] [--rabbitmq]

`--rabbitmq` runs the same against the RabbitMQ on 127.0.0.1 (5672, 15672, guest) in
a vhost of its own, removed afterwards. Figures only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any

import pika


def _ackmq() -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                             "--no-stomp", "--http-port", "0", "--no-stream", "--no-mqtt", "--no-persistence"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on (amqp://\S+) .*?(http://\S+?:\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, m.group(1), m.group(2)
    raise RuntimeError("ackmq did not start")


def _get(url: str, timeout: float = 120.0) -> tuple[float, int]:
    """The listing fetched by curl, another process: parsing 5 MB of JSON here would
    hold this process's GIL and show up as a delivery gap of the ticker's threads."""
    r = subprocess.run(["curl", "-s", "-u", "guest:guest", "-o", "/dev/null", "-w",
                        "%{time_total} %{size_download} %{http_code}", url],
                       capture_output=True, text=True, timeout=timeout)
    took, size, code = r.stdout.split()
    assert code == "200", r.stdout
    return float(took), int(size)


class _Ticker:
    """One message a millisecond through `queue`; arrival times of each."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.arrivals: list[float] = []
        self.stop = threading.Event()

    def run_consumer(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        ch.basic_consume(self.queue, lambda c, m, p, b: self.arrivals.append(time.perf_counter()),
                         auto_ack=True)
        while not self.stop.is_set():
            conn.process_data_events(0.01)
        conn.close()

    def run_publisher(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        nxt = time.perf_counter()
        while not self.stop.is_set():
            ch.basic_publish("", self.queue, b"t")
            nxt += 0.001
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        conn.close()

    def max_gap(self, t0: float, t1: float) -> float:
        a = [t for t in self.arrivals if t0 <= t <= t1]
        return max((b - x for x, b in zip(a, a[1:], strict=False)), default=float("nan"))


def measure(amqp: str, http: str, vhost: str, n: int, rounds: int) -> dict[str, Any]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp))
    ch = conn.channel()
    for i in range(n):
        ch.queue_declare(f"list-{i}", auto_delete=False)
    ch.queue_declare("ticker")
    conn.close()
    tick = _Ticker(amqp, "ticker")
    threads = [threading.Thread(target=tick.run_consumer, daemon=True),
               threading.Thread(target=tick.run_publisher, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    b0 = time.perf_counter()
    time.sleep(2.0)
    baseline = tick.max_gap(b0, time.perf_counter())
    times, gaps = [], []
    path = http + "/api/queues/" + urllib.request.quote(vhost, safe="")
    for _ in range(rounds):
        t0 = time.perf_counter()
        took, size = _get(path)
        time.sleep(0.3)  # deliveries held up by the listing arrive after it
        gaps.append(tick.max_gap(t0, time.perf_counter()))
        times.append(took)
        assert size > n * 100, size
        time.sleep(0.5)
    tick.stop.set()
    for t in threads:
        t.join(5)
    return {"queues": n, "listing_s": times, "max_gap_ms_during": [g * 1000 for g in gaps],
            "max_gap_ms_idle": baseline * 1000}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queues", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rabbitmq", action="store_true")
    p.add_argument("--queues-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    results = {}
    proc, amqp, http = _ackmq()
    try:
        results["ackmq"] = measure(amqp, http, "/", args.queues, args.rounds)
    finally:
        proc.terminate()
        proc.wait(30)
    if args.rabbitmq:
        vh = "bench-list-" + uuid.uuid4().hex[:6]
        base = "http://127.0.0.1:15672"
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        q = urllib.request.quote(vh, safe="")
        urllib.request.urlopen(urllib.request.Request(
            f"{base}/api/vhosts/{q}", method="PUT", headers=auth), timeout=30)
        try:
            results["rabbitmq"] = measure(f"amqp://guest:guest@127.0.0.1:5672/{q}", base, vh,
                                          args.queues, args.rounds)
        finally:
            urllib.request.urlopen(urllib.request.Request(
                f"{base}/api/vhosts/{q}", method="DELETE", headers=auth), timeout=120)
    for name, r in results.items():
        print(f"{name}: {r['queues']} queues: GET /api/queues took "
              + ", ".join(f"{t:.3f}" for t in r["listing_s"]) + " s; largest delivery gap "
              "during the listings " + ", ".join(f"{g:.0f}" for g in r["max_gap_ms_during"])
              + f" ms (idle: {r['max_gap_ms_idle']:.0f} ms)")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False,
                                     prefix="mgmt-listing-") as f:
        json.dump(results, f)
        print("raw:", f.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
