"""MQTT publish rates with paho-mqtt, the same steps against each broker given:

    python -m tools.perf.mqtt_rate --broker ackmq=127.0.0.1:1883 \
        --broker mosquitto=127.0.0.1:1884 --broker rabbitmq=127.0.0.1:1883

Per broker: QoS 0 publishes to a QoS 0 subscriber (messages/s from the first publish to
the last arrival), QoS 1 publishes one at a time (each waits for its PUBACK: the
round trip, fsync included where the broker does one) and pipelined (up to 20 in
flight), QoS 2 pipelined. A persistent-session QoS 1 subscriber exists during the QoS
1/2 runs, so the messages reach a durable queue (on ackmq: the PUBACK waits for the
fsync). Figures from a loaded machine are rough; docs/mqtt.md keeps the quiet ones.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def _client(host: str, port: int, user: str | None, cid: str, clean: bool = True) -> Any:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, clean_session=clean)
    if user:
        c.username_pw_set(user, user)
    c.max_inflight_messages_set(20)  # Mosquitto's default inflight limit
    c.max_queued_messages_set(0)
    c.connect(host, port)
    c.loop_start()
    time.sleep(0.3)
    return c


def qos0_fanin(host: str, port: int, user: str | None, n: int) -> float:
    topic = f"rate/{uuid.uuid4().hex[:8]}"
    done = threading.Event()
    count = [0]

    def on_message(c: Any, u: Any, m: Any) -> None:
        count[0] += 1
        if count[0] == n:
            done.set()
    sub = _client(host, port, user, "rate-sub0")
    sub.on_message = on_message
    sub.subscribe(topic, 0)
    time.sleep(0.3)
    pub = _client(host, port, user, "rate-pub0")
    t0 = time.monotonic()
    for _ in range(n):
        pub.publish(topic, b"x" * 64, qos=0)
    done.wait(120)
    rate = count[0] / (time.monotonic() - t0)
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
    return rate


def qos_publish(host: str, port: int, user: str | None, n: int, qos: int,
                pipelined: bool) -> float:
    topic = f"rate/q/{uuid.uuid4().hex[:8]}"
    sub = _client(host, port, user, "rate-durable", clean=False)
    sub.subscribe(topic, 1)
    time.sleep(0.3)
    sub.disconnect()
    sub.loop_stop()
    pub = _client(host, port, user, "rate-pub")
    t0 = time.monotonic()
    infos = []
    for _ in range(n):
        info = pub.publish(topic, b"x" * 64, qos=qos)
        if pipelined:
            infos.append(info)
        else:
            info.wait_for_publish(30)
    deadline = time.monotonic() + 60  # one deadline for all (a stuck broker: fewer counted)
    while infos and not all(i.is_published() for i in infos) and time.monotonic() < deadline:
        time.sleep(0.005)
    done = sum(1 for i in infos if i.is_published()) if infos else n
    rate = done / (time.monotonic() - t0)
    pub.disconnect()
    pub.loop_stop()
    clean = _client(host, port, user, "rate-durable", clean=True)  # drop the session
    clean.disconnect()
    clean.loop_stop()
    return rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broker", action="append", required=True,
                   help="name=host:port (name rabbitmq or ackmq: user guest; else anonymous)")
    p.add_argument("-n", type=int, default=2000)
    args = p.parse_args()
    print(f"{'broker':<10} {'qos0 in→out':>12} {'qos1 each':>10} {'qos1 pipe':>10} "
          f"{'qos2 pipe':>10}   (messages/s, {args.n} of 64 bytes)")
    for spec in args.broker:
        name, addr = spec.split("=", 1)
        host, port_s = addr.rsplit(":", 1)
        port = int(port_s)
        user = "guest" if name in ("ackmq", "rabbitmq") else None
        r0 = qos0_fanin(host, port, user, args.n * 5)
        r1 = qos_publish(host, port, user, min(args.n, 500), 1, False)
        r1p = qos_publish(host, port, user, args.n, 1, True)
        r2p = qos_publish(host, port, user, args.n, 2, True)
        print(f"{name:<10} {r0:>12,.0f} {r1:>10,.0f} {r1p:>10,.0f} {r2p:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()
