"""What holding QoS 2 messages until their commit costs a subscriber (docs/mqtt.md, "QoS 2
across a power cut"): `python -m tools.perf.qos2_hold [--messages 1000] [--rounds 3]`.

An embedded broker with a data dir; a paho QoS 2 publisher sends one message at a time
to a topic a paho QoS 1 subscriber on a persistent session (a durable queue) holds, and
the time from `publish` to the subscriber's `on_message` is taken per message. Rounds
alternate without the hold (`ClassicQueue.hold` made a no-op: the path before) and with
it; each prints the median, p90 and p99 in ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

import ackmq
from ackmq.broker.queue import ClassicQueue


def _client(port: int, clean: bool) -> Any:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"hold-{uuid.uuid4().hex[:8]}",
                    clean_session=clean)
    c.username_pw_set("guest", "guest")
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    if not connected.wait(10):
        raise TimeoutError("no CONNACK")
    return c


def measure(hold: bool, n: int) -> list[float]:
    """Publish → delivery latencies (s) of `n` QoS 2 messages, one at a time."""
    real = ClassicQueue.hold
    if not hold:
        ClassicQueue.hold = lambda self: None  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as d, ackmq.EmbeddedBroker(data_dir=Path(d)) as b:
            arrived = threading.Event()
            at = [0.0]

            def on_message(client: Any, userdata: Any, msg: Any) -> None:
                at[0] = time.perf_counter()
                arrived.set()

            sub = _client(b.mqtt_port, clean=False)
            sub.on_message = on_message
            subscribed = threading.Event()
            sub.on_subscribe = lambda *a: subscribed.set()
            sub.subscribe("hold/x", 1)
            subscribed.wait(10)
            pub = _client(b.mqtt_port, clean=True)
            out = []
            for _ in range(n):
                arrived.clear()
                t0 = time.perf_counter()
                info = pub.publish("hold/x", b"x" * 64, qos=2)
                if not arrived.wait(10):
                    raise TimeoutError("not delivered")
                out.append(at[0] - t0)
                info.wait_for_publish(10)
            for c in (sub, pub):
                c.disconnect()
                c.loop_stop()
            return out
    finally:
        ClassicQueue.hold = real  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    for _ in range(a.rounds):
        for hold in (False, True):
            lat = sorted(measure(hold, a.messages))
            n = len(lat)
            print(f"{'hold   ' if hold else 'no hold'}: median {statistics.median(lat) * 1e3:.2f} ms, "
                  f"p90 {lat[int(0.9 * n)] * 1e3:.2f} ms, p99 {lat[int(0.99 * n)] * 1e3:.2f} ms",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
