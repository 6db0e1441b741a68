"""AMQP 1.0 under resource alarms (SPEC A10) and under kill -9 (A3): ackmq's own broker
processes (the alarms are set with `ackmq ctl`, the crash is a SIGKILL)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest
from conftest import BrokerProcess
from support.amqp10help import WAIT, RawPeer, connect

from ackmq.protocol.amqp10 import Composite, encode_frame
from ackmq.protocol.amqp10.message import DATA, Message10
from ackmq.protocol.amqp10.types import UInt

proton = pytest.importorskip("proton")
from proton import Delivery, Message  # noqa: E402


def _ctl(data_dir: Path, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "ackmq", "ctl", "--data-dir", str(data_dir),
                        *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _declare(url: str, q: str) -> None:
    c = pika.BlockingConnection(pika.URLParameters(url))
    c.channel().queue_declare(q, durable=True)
    c.close()


def _attach_sender(p: RawPeer, address: str) -> None:
    p.send(encode_frame(1, Composite("begin", next_outgoing_id=UInt(0),
                                     incoming_window=UInt(10000), outgoing_window=UInt(10000))))
    p.send(encode_frame(1, Composite(
        "attach", name="s", handle=UInt(0), role=False, snd_settle_mode=2,
        source=Composite("source"), target=Composite("target", address=address),
        initial_delivery_count=UInt(0))))


def _transfer(p: RawPeer, did: int, body: bytes) -> None:
    m = Message10(header=Composite("header", durable=True), body=[(DATA, body)])
    p.send(encode_frame(1, Composite("transfer", handle=UInt(0), delivery_id=UInt(did),
                                     delivery_tag=bytes([did]), message_format=UInt(0)),
                        m.encode()))


def _kinds(p: RawPeer, kind: str) -> list[Composite]:
    return [e.performative for e in p.got
            if getattr(getattr(e, "performative", None), "kind", "") == kind]


def test_A10_alarm_stops_credit_and_transfers_wait(tmp_path: Path) -> None:
    """As 0-9-1 publishers are blocked (U5): a transfer during a memory alarm is not
    read on (no outcome) until the alarm clears; a sender attached during the alarm gets
    no credit until then (RabbitMQ 4's rule: alarms stop granting credit)."""
    data = tmp_path / "data"
    b = BrokerProcess(data, "--no-stomp")
    b.start()
    q = "a10-alarm"
    _declare(b.url, q)
    busy, late = RawPeer(b.port), None
    try:
        busy.login()
        _attach_sender(busy, f"/queues/{q}")
        busy.read(until=lambda g: any(f.link_credit for f in _kinds(busy, "flow")))
        _ctl(data, "set_vm_memory_high_watermark", "0.0000001")
        # the monitor samples every 0.1 s; it logs the alarm and blocks in one step
        deadline = time.monotonic() + 10
        while not any("memory resource limit alarm set" in x for x in b.log):
            assert time.monotonic() < deadline, "no memory alarm within 10 s"
            time.sleep(0.02)
        _transfer(busy, 0, b"during the alarm")
        late = RawPeer(b.port)
        late.login()
        _attach_sender(late, f"/queues/{q}")
        late.read(until=lambda g: bool(_kinds(late, "attach")))
        busy.read(timeout=1.5)
        late.read(timeout=0.5)
        assert not _kinds(busy, "disposition")  # not read on while the alarm is set
        assert not any(f.link_credit for f in _kinds(late, "flow"))  # no credit
        _ctl(data, "set_vm_memory_high_watermark", "0.4")
        busy.read(until=lambda g: bool(_kinds(busy, "disposition")))
        assert _kinds(busy, "disposition")[0].state.descriptor == 0x24  # accepted
        late.read(until=lambda g: any(f.link_credit for f in _kinds(late, "flow")))
        assert any(f.link_credit for f in _kinds(late, "flow"))
    finally:
        busy.close()
        if late is not None:
            late.close()
        b.stop()


@pytest.mark.slow
def test_A3_kill_9_loses_nothing_accepted(tmp_path: Path) -> None:
    """Unsettled durable transfers to a durable queue: each `accepted` comes after the
    fsync (P5c), so after kill -9 and a restart every accepted message is there."""
    data = tmp_path / "data"
    b = BrokerProcess(data, "--no-stomp")
    b.start()
    q = "a3-crash"
    _declare(b.url, q)
    accepted: list[int] = []
    stop = threading.Event()

    def send() -> None:
        try:
            conn = connect(b.port)
            s = conn.create_sender(f"/queues/{q}")
            i = 0
            while not stop.is_set():
                d = s.send(Message(body=str(i).encode(), durable=True, inferred=True))
                if d.remote_state == Delivery.ACCEPTED:
                    accepted.append(i)
                i += 1
        except Exception:  # noqa: BLE001 - the broker is killed under it
            return

    t = threading.Thread(target=send, daemon=True)
    t.start()
    deadline = time.monotonic() + WAIT
    while len(accepted) < 150 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.kill()
    stop.set()
    t.join(WAIT)
    assert len(accepted) >= 150
    b.start()
    try:
        c = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = c.channel()
        got = set()
        while True:
            method, _p, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            got.add(int(body))
        c.close()
        assert set(accepted) <= got
    finally:
        b.stop()
