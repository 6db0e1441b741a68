"""How long a definitions import of N users and N permissions takes, and how long an
AMQP round trip made meanwhile waits (issue 34: every imported user rewrote and fsynced
access.json on the event loop). A broker of its own in a data dir under /var/tmp (so
fsync costs what it costs); a thread opens a pika connection, declares a queue and
closes, over and over, while POST /api/definitions runs; the slowest of those round
trips is reported next to the import's time.

    python -m tools.perf.import_speed [--users 500,1000,2000]

Figures only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
import urllib.request
from base64 import b64encode
from typing import Any

import pika

from ackmq.broker.access import hash_password
from tools.harness.ownbroker import OwnBroker


def definitions(n: int, prefix: str = "imp") -> dict[str, Any]:
    """N users (one hash shared: hashing is not what is measured) with a permission on
    vhost "/" each."""
    h = hash_password("secret")
    return {"users": [{"name": f"{prefix}-{i}", "password_hash": h,
                       "hashing_algorithm": "rabbit_password_hashing_sha256",
                       "tags": ""} for i in range(n)],
            "permissions": [{"user": f"{prefix}-{i}", "vhost": "/", "configure": ".*",
                             "write": ".*", "read": ".*"} for i in range(n)]}


def post_definitions(http_url: str, defs: dict[str, Any], timeout: float = 600.0
                     ) -> int:
    req = urllib.request.Request(
        http_url + "/api/definitions", data=json.dumps(defs).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return int(r.status)


class RoundTrips:
    """pika connect + channel + queue_declare + close, in a loop, each one timed."""

    def __init__(self, amqp_url: str) -> None:
        self.url = amqp_url
        self.times: list[float] = []
        self.failed = 0  # round trips pika gave up on (its handshake timeout)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.url))
                conn.channel().queue_declare("", exclusive=True)
                conn.close()
            except Exception:  # noqa: BLE001 - pika's handshake timeout (a class of its own)
                self.failed += 1
            self.times.append(time.perf_counter() - t0)

    def __enter__(self) -> RoundTrips:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)


def http_url_of(broker: OwnBroker) -> str:
    text = broker.log_path.read_text(errors="replace")
    m = re.findall(r"(http://\S+?:\d+)", text)
    if not m:
        raise RuntimeError(f"no management URL in {broker.log_path}")
    return str(m[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", default="500,1000,2000",
                    help="comma-separated sizes, one fresh broker each")
    args = ap.parse_args()
    print("users+permissions  import_s  amqp_round_trips (failed)  slowest_round_trip_s")
    for n in (int(x) for x in args.users.split(",")):
        b = OwnBroker([])
        b.start()
        try:
            http = http_url_of(b)
            with RoundTrips(b.url) as rt:
                time.sleep(0.5)
                t0 = time.perf_counter()
                status = post_definitions(http, definitions(n))
                took = time.perf_counter() - t0
                time.sleep(0.5)
            assert status == 204, status
            print(f"{n:>17}  {took:8.2f}  {len(rt.times):16} ({rt.failed:>3})  {max(rt.times):20.3f}",
                  flush=True)
        finally:
            b.stop()


if __name__ == "__main__":
    main()
