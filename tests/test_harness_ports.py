"""The suite's own brokers listen below the kernel's ephemeral port range, so a broker
killed and restarted on its ports never finds a client's socket holding one (CI failed a
kill -9 restart on 'address already in use' when the kernel had chosen the port)."""

from __future__ import annotations

from pathlib import Path

import pika
from conftest import BrokerProcess
from support import ports


def test_picked_ports_are_free_and_below_the_ephemeral_range() -> None:
    low = ports._ephemeral_low()
    for _ in range(20):
        p = ports.pick()
        assert ports.LOW <= p < low


def test_a_killed_broker_restarts_on_the_same_ports(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        first = (b.port, b.stomp_port, b.mqtt_port)
        assert all(0 < p < ports._ephemeral_low() for p in first), first
        b.kill()
        b.start()
        assert (b.port, b.stomp_port, b.mqtt_port) == first
        pika.BlockingConnection(pika.URLParameters(b.url)).close()
    finally:
        b.stop()
