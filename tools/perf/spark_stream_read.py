"""What one Spark stream read task costs, per protocol (R4, X2): `read_range` +
`stream_batch` (the task's whole Python work but Spark's own) over AMQP 0-9-1
(spark/streamwire.py) and RabbitMQ's stream protocol (spark/streamproto.py), on the same
stream, against ackmq and RabbitMQ: wall time and this process's CPU per message.

    python -m tools.perf.spark_stream_read [--messages 50000] [--size 1024] [--rounds 3]
        [--ackmq-url URL --ackmq-stream-url URL] [--rabbitmq-url URL | --no-rabbitmq]
        [--ackmq-stream-tls-url rabbitmq-stream+tls://guest:guest@localhost:5551/?cacertfile=ca.pem]

Without --ackmq-url an `ackmq serve` subprocess is started (spark/bench.py's).
--ackmq-stream-tls-url adds rows for the stream protocol over TLS on ackmq (an `ackmq
serve --stream-tls-port` of one's own, with --ackmq-url and --ackmq-stream-url).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from ackmq.spark.bench import STREAM, STREAM_URLS, ackmq_broker, fill
from ackmq.spark.streamproto import read_range as read_stream
from ackmq.spark.streamproto import stream_url_for
from ackmq.spark.streamrows import stream_batch
from ackmq.spark.streamwire import last_offset, read_range


def one(protocol: str, url: str, surl: str, name: str, end: int) -> tuple[float, float, int]:
    """(wall s, CPU s, rows) of reading [0, end) as one read task does."""
    t0, c0 = time.perf_counter(), time.process_time()
    rows = 0
    if protocol != "amqp":
        reads = read_stream(surl, name, 0, end, amqp_url=url)
    else:
        reads = read_range(url, name, 0, end)
    for items in reads:
        rows += stream_batch(items).num_rows
    return time.perf_counter() - t0, time.process_time() - c0, rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.perf.spark_stream_read")
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ackmq-url", default=None)
    ap.add_argument("--ackmq-stream-url", default=None)
    ap.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--ackmq-stream-tls-url", default=None)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as work, ackmq_broker(a.ackmq_url, Path(work)) as aurl:
        if a.ackmq_stream_url:
            STREAM_URLS[aurl] = a.ackmq_stream_url
        brokers = [("ackmq", aurl)] + ([] if a.no_rabbitmq else [("RabbitMQ", a.rabbitmq_url)])
        for broker, url in brokers:
            name = "bench.spark.read"
            fill(url, name, a.messages, a.size, STREAM)
            last = last_offset(url, name, 3.0)
            assert last is not None
            urls = {"stream": STREAM_URLS.get(url) or stream_url_for(url), "amqp": url}
            if broker == "ackmq" and a.ackmq_stream_tls_url:
                urls["tls"] = a.ackmq_stream_tls_url
            for r in range(a.rounds):
                for protocol, surl in urls.items():
                    wall, cpu, rows = one(protocol, url, surl, name, last + 1)
                    print(f"{broker:8} {protocol:6} round {r}: {rows} rows, "
                          f"{rows / wall:9,.0f} msg/s, {cpu / rows * 1e6:5.1f} us CPU/msg "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
