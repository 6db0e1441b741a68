"""What a pending delayed message costs in memory, in process (issue 27, L3):
`python -m tools.perf.delayed_memory -n 1000000`.

The model with a real segment log (fsync off: memory, not speed, is measured) and one
durable `x-delayed-message` exchange; N persistent 100-byte messages published through
`ChannelModel.basic_publish`, due in an hour, committed every 10,000. Prints RSS growth
per pending message (bytes) and the CPU µs per delayed publish (process clock; the
model only, no socket or codec). Memory figures do not depend on machine load.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from ackmq.broker import BrokerModel, NullScheduler
from ackmq.protocol.amqp.properties import encode_fields
from ackmq.store import open_store


class _Output:
    writable = True
    number = 1

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        store = open_store(d, fsync=False)
        broker = BrokerModel(NullScheduler(), store)
        broker.start()
        vh = broker.vhosts["/"]
        vh.declare_exchange("dx", "x-delayed-message", False, True, False, False,
                            {"x-delayed-type": "direct"})
        q = vh.declare_queue("dq", False, True, False, False, {}, None)
        vh.bind("dx", q, "k", {})
        ch = broker.open_channel(vh, object(), _Output(), "guest")
        props = encode_fields({"delivery_mode": 2, "headers": {"x-delay": 3600000}})
        body = b"x" * 100
        gc.collect()
        r0, t0 = rss(), time.process_time()
        for i in range(n):
            ch.basic_publish("dx", "k", False, False, props, body)
            if i % 10000 == 9999:
                broker.end_of_turn()
        broker.end_of_turn()
        cpu = time.process_time() - t0
        gc.collect()
        r1 = rss()
        x = vh.exchanges["dx"]
        assert x.messages_delayed == n  # type: ignore[attr-defined]
        broker.close()
    return {"pending": n, "rss_bytes_per_pending": round((r1 - r0) / n, 1),
            "cpu_us_per_publish": round(cpu / n * 1e6, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=1000000)
    print(measure(p.parse_args().n))


if __name__ == "__main__":
    main()
