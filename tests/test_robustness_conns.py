"""B2 and B3 over real sockets, short versions of `python -m tools.robustness.conns` (the
report's figures, ackmq beside RabbitMQ, are in docs/robustness.md).

Why: a broker on a small machine must serve a thousand mostly idle consumers and must
not let half-open handshakes pile up; both are cheap to get wrong (a task or a buffer
per connection, a timer never started before the protocol header).

Stalled readers (B3, a client that never reads its socket) are covered in
test_connection_edges.py: test_client_not_reading_is_held_back_not_buffered,
test_H1_client_held_back_is_not_taken_for_dead,
test_H1_D8_hung_consumer_behind_a_full_socket_is_dead_and_its_deliveries_come_back,
test_closed_connection_whose_peer_reads_nothing_is_cut_off.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess

from tools.robustness.conns import consumers, halfopen, raise_fd_limit

pytestmark = pytest.mark.skipif(bool(os.environ.get("ACKMQ_TEST_URL")),
                                reason="needs brokers of its own (their options and logs)")

TIMEOUT = 1.0  # --handshake-timeout of the B3 broker


@pytest.fixture(scope="module")
def quick_timeout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("b3"), "--no-stomp",
                           "--handshake-timeout", str(TIMEOUT))
    broker.start()
    yield broker
    broker.stop()
    log = "".join(broker.log)
    assert "Traceback" not in log, log[-3000:]


def test_B2_1000_connections_with_consumers_are_all_served(tmp_path: Path) -> None:
    """1,000 connections, each with one channel, an exclusive queue bound to one fanout
    exchange and a consumer: every one gets all 10 messages of a publisher."""
    raise_fd_limit(4096)
    broker = BrokerProcess(tmp_path, "--no-stomp")
    broker.start()
    try:
        assert broker.proc is not None
        out = asyncio.run(consumers(broker.url, 1000, broker.proc.pid, messages=10,
                                    timeout=60, settle=0.2))
        assert out["dropped_connections"] == 0, out
        assert out["served_all_messages"] == 1000, out
        assert out["extra_bodies"] == 0
        assert broker.proc.poll() is None
    finally:
        broker.stop()
    assert "Traceback" not in "".join(broker.log)


def test_B3_U6_half_open_handshakes_are_dropped_after_the_timeout(
        quick_timeout: BrokerProcess) -> None:
    """200 connections that stop mid-handshake (TCP only, the protocol header only, the
    header and start-ok but no tune-ok) are all dropped once the handshake timeout has
    passed, never before it, while a normal client's publish/get round trips go on."""
    out = asyncio.run(halfopen(quick_timeout.url, 67, None, TIMEOUT))
    assert out["normal_client"]["failures"] == [], out
    assert out["normal_client"]["round_trips"] >= 5
    for kind, k in out["kinds"].items():
        assert k["dropped"] == k["connections"] == 67, (kind, k)
        assert k["drop_s"]["min"] >= TIMEOUT * 0.95, (kind, k)  # not before the timeout
        assert k["drop_s"]["max"] < TIMEOUT + 5, (kind, k)  # nor long after (busy machine)
        assert k["connection_close_codes"] == [], (kind, k)  # RabbitMQ: a bare TCP close


def test_U6_handshake_timeout_option_is_checked() -> None:
    """A timeout of 0 or less would drop every client at once: refused with what to fix."""
    run = subprocess.run([sys.executable, "-m", "ackmq", "serve", "--port", "0", "--no-stomp",
                          "--no-persistence", "--handshake-timeout", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--handshake-timeout must be between 0 and 3600 seconds" in run.stderr


def test_B3_no_ack_consumer_on_a_deep_paged_queue_is_fed_a_turn_at_a_time(
        tmp_path: Path) -> None:
    """A no-ack consumer without prefetch on a queue of 60 MB paged to disk: the broker
    used to pull the whole queue into its output in one loop turn (RSS up by the queue's
    size, every other client waiting meanwhile: consume-ok came after 3.7 s for 280 MB).
    Now a connection gathers at most TURN_OUTPUT_MAX (4 MiB) per turn and goes on at the
    next one, after TCP has taken it: broker memory stays near the paging bound."""
    from pamqp import commands

    from ackmq.protocol.amqp import encode_method, encode_publish
    from tools.harness.rawpeer import open_peer, rss_of

    broker = BrokerProcess(tmp_path, "--no-stomp", "--queue-memory-mb", "4")
    broker.start()
    n, body = 60_000, b"m" * 1000

    async def go() -> tuple[int, int, int]:
        assert broker.proc is not None
        pid = broker.proc.pid
        pub = await open_peer("127.0.0.1", broker.port)
        await pub.call(1, commands.Queue.Declare(queue="deep"), (50, 11))
        chunk = b"".join(encode_publish(1, "", "deep", False, False, b"\x00\x00", body,
                                        131072) for _ in range(1000))
        for _ in range(n // 1000):
            pub.write(chunk)
            await pub.call(1, commands.Basic.Qos(0, 0), (60, 11), timeout=60)
        filled = rss_of(pid)
        got = [0]
        con = await open_peer("127.0.0.1", broker.port)
        con.on_body = lambda _ch, _b: got.__setitem__(0, got[0] + 1)
        peak = filled
        con.write(encode_method(1, commands.Basic.Consume(queue="deep", no_ack=True)))
        for _ in range(1200):  # up to 60 s
            peak = max(peak, rss_of(pid))
            if got[0] >= n:
                break
            await asyncio.sleep(0.05)
        pub.abort()
        con.abort()
        return filled, peak, got[0]

    try:
        filled, peak, got = asyncio.run(go())
    finally:
        broker.stop()
    assert got == n
    assert peak - filled < 25 * 2**20, f"RSS grew {(peak - filled) >> 20} MiB while draining"
    assert "Traceback" not in "".join(broker.log)
