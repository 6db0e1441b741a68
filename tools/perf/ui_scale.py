"""How long the web UI's and /metrics' pages take with many queues (they are built on
the broker's loop, so this is also the longest pause they cause):
`python -m tools.perf.ui_scale --queues 10000`. An embedded broker, N queues declared
over AMQP, then each path fetched a few times; the best time is printed."""

from __future__ import annotations

import argparse
import base64
import time
import urllib.request

import pika

from ackmq.server.embedded import EmbeddedBroker

PATHS = ("/", "/queues", "/metrics", "/metrics/per-object")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queues", type=int, default=10000)
    p.add_argument("--tries", type=int, default=3)
    a = p.parse_args()
    with EmbeddedBroker(persistent=False) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for i in range(a.queues):
            ch.queue_declare(f"scale-{i}")
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        for path in PATHS:
            best, size = float("inf"), 0
            for _ in range(a.tries):
                t0 = time.perf_counter()
                with urllib.request.urlopen(urllib.request.Request(
                        b.http_url + path, headers=auth), timeout=60) as r:
                    size = len(r.read())
                best = min(best, time.perf_counter() - t0)
            print(f"{path:22s} best {best * 1000:7.0f} ms  {size / 1024:8.0f} KiB "
                  f"({a.queues} queues)")
        conn.close()


if __name__ == "__main__":
    main()
