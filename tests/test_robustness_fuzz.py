"""B1 against a live broker: the mutation fuzzer of tools.robustness.fuzz in a short run (the
10^6-frame run is in docs/robustness.md), the seed session it mutates, and a confirm
defect the fuzzer's seed showed.

Why: the decoder's own property test (test_decoder_hostile.py) cannot see what the
broker does with what the decoder accepted; here whole mutated sessions reach a real
`ackmq serve` over sockets while a durable publisher's confirmed messages must survive.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess, rabbitmq_url
from pamqp import commands

from ackmq.protocol.amqp import encode_method, encode_publish
from tools.harness.rawpeer import Peer, connect, handshake_bytes
from tools.robustness import fuzz

pytestmark = pytest.mark.skipif(bool(os.environ.get("ACKMQ_TEST_URL")),
                                reason="needs brokers of its own (their logs)")


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("fuzz-seed"), "--no-stomp")
    broker.start()
    yield broker
    broker.stop()
    assert "Traceback" not in "".join(broker.log)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def _replay(port: int, data: bytes, timeout: float = 10.0) -> Peer:
    peer = await connect("127.0.0.1", port)
    peer.keep_methods = True
    peer.write(data)
    await asyncio.wait_for(asyncio.shield(peer.closed), timeout)
    peer.abort()
    return peer


def test_B1_the_seed_session_runs_cleanly(own: BrokerProcess) -> None:
    """Unmutated, the fuzzer's session goes through without a channel or connection
    error and ends with our connection.close answered: mutations then reach every
    state (handshake, confirms, returns, gets, tx, consumer) instead of dying early."""
    data = b"".join(f.replace(fuzz.TAG, b"0badcafe") for f in fuzz.live_session())
    peer = asyncio.run(_replay(own.port, data))
    assert (peer.close_code, peer.channel_closes, peer.bad_output) == (None, [], "")
    assert peer.close_ok
    seen = set(peer.methods)
    for reply in [(1, 60, 50), (1, 60, 80), (1, 60, 71), (2, 90, 21), (2, 90, 31),
                  (3, 60, 60), (3, 60, 111), (3, 60, 31)]:  # return, ack, get-ok, tx, consumer
        assert reply in seen, reply


@pytest.fixture(params=["ackmq", "rabbitmq"])
def any_port(request: pytest.FixtureRequest, own: BrokerProcess) -> int:
    return own.port if request.param == "ackmq" else _port(rabbitmq_url())


def test_P4_P5_confirms_of_unroutable_publishes_come_before_channel_close_ok(
        any_port: int) -> None:
    """Unroutable publishes on a confirm channel followed at once by channel.close (one
    write): RabbitMQ 3.10 acks each (P5a: as soon as the exchange finds no queue)
    before close-ok. ackmq sent no ack at all: its confirms waited for the end of the
    loop turn and the close came first, so a client closing right after publishing
    never learnt the fate of its publishes. (Found by the fuzzer's seed session.)"""
    data = (handshake_bytes() + encode_method(1, commands.Confirm.Select())
            + b"".join(encode_publish(1, "", "t.p4close.nowhere", False, False, b"\x00\x00",
                                      b"x", 131072) for _ in range(3))
            + encode_method(1, commands.Channel.Close(200, "bye", 0, 0)))
    acked: list[int] = []

    async def go() -> Peer:
        peer = await connect("127.0.0.1", any_port)
        peer.keep_methods = True
        peer.on_confirm = lambda tag, multiple, ack: acked.extend(
            range(len(acked) + 1, tag + 1) if multiple and ack else [tag] if ack else [])
        close_ok = peer.expect(1, 20, 41)
        peer.write(data)
        try:
            await asyncio.wait_for(close_ok, 10)
        finally:
            peer.abort()
        return peer

    peer = asyncio.run(go())
    assert not peer.channel_closes and peer.close_code is None
    assert acked == [1, 2, 3]


def test_B1_U3_user_id_not_utf8_is_a_406_quoting_its_octets(any_port: int) -> None:
    """A publish whose user_id is not UTF-8 ('g\\xffest'): channel.close 406 whose text
    quotes the octets as they came, byte for byte as RabbitMQ 3.10, and the connection
    goes on. ackmq raised UnicodeEncodeError while writing that text ("Fatal error on
    transport" and a traceback in its log, the connection dropped without a close):
    found by the live fuzzer, 17 times in 10^6 mutated frames."""
    props = struct.pack(">H", 0x0010) + b"\x05g\xffest"  # user_id only
    data = handshake_bytes(channels=(1, 2)) + encode_publish(
        1, "", "t.uid.nowhere", False, False, props, b"x", 131072)

    async def go() -> Peer:
        peer = await connect("127.0.0.1", any_port)
        closed = peer.expect(1, 20, 40)
        peer.write(data)
        try:
            await asyncio.wait_for(closed, 10)
            peer.write(encode_method(1, commands.Channel.CloseOk()))
            await peer.call(2, commands.Basic.Qos(0, 1), (60, 11), timeout=10)
        finally:
            peer.abort()
        return peer

    peer = asyncio.run(go())
    assert peer.channel_closes == [(1, 406, "PRECONDITION_FAILED - user_id property set to "
                                    "'g\udcffest' but authenticated user was 'guest'")]


def test_B1_short_live_fuzz(tmp_path: Path) -> None:
    """`python -m tools.robustness.fuzz` in miniature (3,000 mutated frames, ~700
    connections, 50 at once): the broker stays up with a clean log, every mutated
    connection ends (close, header reply or dropped socket) within the bound, the
    broker's output stays well framed, and every confirmed message of the parallel
    durable publisher is there, intact, after a SIGKILL and restart."""
    out = tmp_path / "fuzz.json"
    rc = fuzz.main(["--frames", "3000", "--concurrency", "50", "--seed", "7",
                    "--publish-rate", "300", "--progress-every", "60",
                    "--json", str(out), "--work-dir", str(tmp_path)])
    summary = json.loads(out.read_text())
    assert summary["problems"] == [], summary
    assert rc == 0
    assert summary["frames_mutated"] >= 3000 and summary["hung"] == 0
    assert summary["broker_alive"] and not summary["log_trouble"]
    check = summary["confirmed_check"]
    assert check["after_sigkill_restart"]
    assert check["confirmed"] > 0 and check["missing"] == 0 and check["corrupt"] == 0
    assert len(summary["outcomes"]) > 3  # the mutations reached different answers
