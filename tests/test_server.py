"""The server as users run it: `ackmq serve`, embedded brokers, shutdown, bad start-ups,
and a disk that fills up under confirmed load."""

from __future__ import annotations

import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from conftest import URL_LINE, BrokerProcess
from pika.exceptions import ConnectionClosedByBroker, NackError

import ackmq


def test_sigterm_closes_connections_with_320(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d")
    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    assert b.proc is not None
    b.proc.send_signal(signal.SIGTERM)
    with pytest.raises(ConnectionClosedByBroker) as info:
        ch.queue_declare("", exclusive=True)
        conn.process_data_events(time_limit=5)
        conn.sleep(5)
    assert info.value.reply_code == 320
    assert info.value.reply_text.startswith("CONNECTION_FORCED")
    assert b.proc.wait(15) == 0


async def test_embedded_async_broker_serves_aio_pika() -> None:
    import aio_pika

    async with ackmq.Broker(port=0) as broker:
        assert broker.url.startswith("amqp://") and broker.port > 0
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("embedded", durable=True)
        await ch.default_exchange.publish(aio_pika.Message(b"hi", delivery_mode=2), "embedded")
        msg = await q.get(timeout=5)
        assert msg.body == b"hi"
        await msg.ack()
        await conn.close()


def test_embedded_thread_broker_for_synchronous_code(tmp_path: Path) -> None:
    with ackmq.EmbeddedBroker(data_dir=tmp_path / "emb") as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("kept", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "kept", b"1", pika.BasicProperties(delivery_mode=2))
        conn.close()
    with ackmq.EmbeddedBroker(data_dir=tmp_path / "emb") as broker:  # same data dir
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        m, _p, body = conn.channel().basic_get("kept", auto_ack=True)
        assert body == b"1"
        conn.close()


def _serve(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ackmq", "serve", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = _serve("--port", str(port), "--data-dir", str(tmp_path / "d"))
    finally:
        s.close()
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in r.stdout + r.stderr


def test_damaged_data_dir_stops_the_broker_with_a_clear_message(tmp_path: Path) -> None:
    data = tmp_path / "d"
    b = BrokerProcess(data)
    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    ch.confirm_delivery()
    for i in range(200):
        ch.basic_publish("", "q", b"%d" % i * 50, pika.BasicProperties(delivery_mode=2))
    conn.close()
    b.stop()
    seg = max(data.glob("*.seg"), key=lambda p: p.stat().st_size)
    raw = bytearray(seg.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 16] = bytes(16)        # damage in the middle, not a torn tail
    seg.write_bytes(bytes(raw))
    r = _serve("--port", "0", "--data-dir", str(data))
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "damaged" in out and seg.name in out


def test_no_fsync_says_what_it_gives_up(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d", "--no-fsync")
    b.start()
    b.stop()
    log = "".join(b.log)
    assert "fsync is OFF" in log and "can be lost" in log


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))


def test_P6_disk_full_nacks_publishes_and_keeps_serving(tmp_path: Path) -> None:
    """Files may not grow past 3 MiB: persistent publishes are nacked, never confirmed,
    and the broker keeps serving; everything confirmed is there after a restart."""
    data = tmp_path / "d"
    proc = subprocess.Popen([sys.executable, "-m", "ackmq", "serve", "--port", "0",
                             "--no-stomp", "--data-dir", str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_limit_file_size)
    try:
        assert proc.stdout is not None
        url = ""
        while not url:
            line = proc.stdout.readline()
            assert line, "broker exited"
            m = URL_LINE.search(line)
            url = m.group(1) if m else ""
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare("full", durable=True)
        ch.confirm_delivery()
        confirmed, nacked = [], 0
        body = b"x" * 4096
        for i in range(2000):
            try:
                ch.basic_publish("", "full", b"%06d" % i + body,
                                 pika.BasicProperties(delivery_mode=2))
                confirmed.append(i)
            except NackError:
                nacked += 1
                if nacked >= 5:
                    break
        assert nacked >= 5 and confirmed, (nacked, len(confirmed))
        ch2 = conn.channel()                  # still serving: transient traffic works
        ch2.queue_declare("side", exclusive=True)
        ch2.basic_publish("", "side", b"ok")
        m, _p, b2 = ch2.basic_get("side", auto_ack=True)
        assert b2 == b"ok"
        conn.close()
    finally:
        proc.terminate()
        proc.wait(15)
    b = BrokerProcess(data)                  # no limit now: recover what was confirmed
    b.start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        got = []
        while True:
            m, _p, body2 = ch.basic_get("full", auto_ack=True)
            if m is None:
                break
            got.append(int(body2[:6]))
        assert set(confirmed) <= set(got)
        assert len(got) == len(set(got))
        conn.close()
    finally:
        b.stop()


def test_broker_url_line_names_a_free_port(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d")
    url = b.start()
    try:
        assert URL_LINE.search("".join(b.log)).group(1) == url
        assert b.port != 0
        with socket.create_connection(("127.0.0.1", b.port), timeout=5):
            pass
    finally:
        b.stop()
