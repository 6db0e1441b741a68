"""A policy applied to many existing queues (issue 28, SPEC M7): how long `PUT
/api/policies` takes to answer (the change is saved and re-applied to every queue on
the broker's loop before the answer), and the delivery gap it causes meanwhile on a
queue the policy does not match. A benchmark, not a timed test: run it on a quiet
machine.

    python -m tools.perf.policy_apply --queues 10000 [--durable] [--rounds 3]

Steps: an `ackmq serve` of our own; `--queues` queues `pol-bench.N` declared (one
message each); a probe publisher (one message every --interval-ms) and consumer on the
queue `probe` record delivery times; after a quiet baseline, each round sets a policy
matching every `pol-bench.` queue (max-length, message-ttl, dead-letter-exchange),
changes it, and clears it. Printed as JSON: per action the seconds until the API
answered and the longest delivery gap on the probe in that window, against the longest
gap of the baseline.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import re
import sys
import threading
import time
from typing import Any

from tools.harness.ownbroker import OwnBroker

HTTP_URL = re.compile(r"http://[^\s/]+:(\d+)")


def _http_port(b: OwnBroker) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = HTTP_URL.search(b.log_path.read_text(errors="replace"))
        if m:
            return int(m.group(1))
        time.sleep(0.2)
    raise RuntimeError(f"no management URL in {b.log_path}")


def _call(port: int, method: str, path: str, body: Any = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    auth = base64.b64encode(b"guest:guest").decode()
    conn.request(method, path, json.dumps(body) if body is not None else None,
                 {"Authorization": f"Basic {auth}", "Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


class Probe:
    """A publisher and a consumer on `probe`: the times deliveries arrive."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.arrivals: list[float] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._consume, daemon=True),
                        threading.Thread(target=self._publish, daemon=True)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _consume(self) -> None:
        import pika
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        ch.queue_declare("probe")
        for _m in ch.consume("probe", auto_ack=True, inactivity_timeout=0.2):
            if _m[0] is not None:
                self.arrivals.append(time.monotonic())
            if self.stop.is_set():
                break
        conn.close()

    def _publish(self) -> None:
        import pika
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        ch.queue_declare("probe")
        while not self.stop.is_set():
            ch.basic_publish("", "probe", b"p")
            time.sleep(self.interval)
        conn.close()

    def max_gap(self, start: float, end: float) -> float:
        ts = [t for t in self.arrivals if start <= t <= end]
        return max((b - a for a, b in zip(ts, ts[1:], strict=False)), default=float("nan"))


def declare(url: str, n: int, durable: bool) -> float:
    import pika
    started = time.monotonic()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare("pol-bench-dlx", durable=durable)
    for i in range(n):
        ch.queue_declare(f"pol-bench.{i}", durable=durable)
        ch.basic_publish("", f"pol-bench.{i}", b"m")
    conn.close()
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--durable", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval-ms", type=float, default=2.0)
    p.add_argument("--baseline-s", type=float, default=3.0)
    a = p.parse_args(argv)
    b = OwnBroker([])
    try:
        url = b.start()
        port = _http_port(b)
        out: dict[str, Any] = {"queues": a.queues, "durable": a.durable,
                               "declare_s": declare(url, a.queues, a.durable)}
        probe = Probe(url, a.interval_ms / 1000)
        probe.start()
        time.sleep(1.0)
        t = time.monotonic()
        time.sleep(a.baseline_s)
        out["baseline_max_gap_s"] = probe.max_gap(t, time.monotonic())
        actions = []
        for r in range(a.rounds):
            for what, method, body in (
                    ("set", "PUT", {"pattern": r"^pol-bench\.", "apply-to": "queues",
                                    "definition": {"max-length": 1000, "message-ttl": 600000,
                                                   "dead-letter-exchange": ""}}),
                    ("change", "PUT", {"pattern": r"^pol-bench\.", "apply-to": "queues",
                                       "definition": {"max-length": 500}}),
                    ("clear", "DELETE", None)):
                t0 = time.monotonic()
                status = _call(port, method, "/api/policies/%2F/bench", body)
                t1 = time.monotonic()
                time.sleep(0.5)
                actions.append({"round": r, "action": what, "status": status,
                                "answered_s": t1 - t0,
                                "max_gap_s": probe.max_gap(t0 - 0.1, t1 + 0.5)})
        out["actions"] = actions
        probe.stop.set()
        for th in probe.threads:
            th.join(10)
        print(json.dumps(out, indent=1))
        return 0
    finally:
        b.stop()


if __name__ == "__main__":
    sys.exit(main())
