"""B1 on every listener: `python -m tools.robustness.fuzz_listeners` in miniature (the long
runs are in docs/robustness.md). STOMP, AMQPS and STOMP over TLS (inside the session
and against the TLS handshake), the admin socket and the management HTTP listener
(plain and over TLS) get
mutated sessions while a durable publisher's confirmed messages must all survive a
SIGKILL and restart; no traceback in the broker log, no connection left hanging, no
bad answer (a 5xx, an admin reply that is not JSON or an internal error, a STOMP ERROR
without a message).

Why: the AMQP fuzzer (test_robustness_fuzz.py) reaches one listener; a traceback or a
hang in any other is as much a denial of service.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tools.harness.ownbroker import OwnBroker
from tools.robustness import fuzz_listeners as fl
from tools.robustness import fuzz_seeds as seeds

pytestmark = [
    pytest.mark.skipif(bool(os.environ.get("ACKMQ_TEST_URL")),
                       reason="needs brokers of its own (their logs)"),
    pytest.mark.skipif(shutil.which("openssl") is None,
                       reason="openssl (the command) makes the TLS listeners' certificate"),
]

# frames per listener: a few thousand where a connection is cheap, fewer where each
# costs a TLS handshake; the bound is time, ACKMQ_FUZZ_SECONDS of fuzzing per listener
# (CI-sized; docs/robustness.md has the long runs)
SMOKE = {"amqp10": 3000, "stomp": 3000, "http": 3000, "admin": 1500, "amqps": 800, "stomps": 1000,
         "amqps-handshake": 200, "stomps-handshake": 200, "https": 1000, "stream": 3000,
         "mqtt": 3000}
SECONDS = os.environ.get("ACKMQ_FUZZ_SECONDS", "20")


@pytest.mark.parametrize("listener", fl.LISTENERS)
def test_B1_every_listener_survives_a_short_live_fuzz(listener: str, tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    rc = fl.main(["--listener", listener, "--frames", str(SMOKE[listener]),
                  "--concurrency", "60", "--seed", "7", "--publish-rate", "200",
                  "--max-seconds", SECONDS, "--progress-every", "60",
                  "--json", str(out), "--work-dir", str(tmp_path / "work")])
    summary = json.loads(out.read_text())
    assert summary["problems"] == [], summary
    assert rc == 0
    (r,) = summary["listeners"]
    assert r["frames_mutated"] >= min(SMOKE[listener], 100) and r["hung"] == 0
    assert r["broker_alive"] and r["tracebacks"] == 0
    check = r["confirmed_check"]
    assert check["confirmed"] > 0 and check["missing"] == 0 and check["corrupt"] == 0
    assert len(r["outcomes"]) > 2  # the mutations reached different answers


async def _replay(own: OwnBroker, name: str, data: bytes) -> bytes:
    t = fl.broker_targets(own)[name]
    loop = asyncio.get_running_loop()
    if t.path:
        _, s = await loop.create_unix_connection(fl.Stream, t.path)
    else:
        _, s = await loop.create_connection(fl.Stream, t.host, t.port)
    s.write(data)
    try:
        await asyncio.wait_for(asyncio.shield(s.closed), 3)
    except TimeoutError:
        s.end()  # the admin socket serves until EOF
        await asyncio.wait_for(s.closed, 10)
    return bytes(s.out)


def test_B1_the_seed_sessions_run_cleanly(tmp_path: Path) -> None:
    """Unmutated, each listener's seed goes through to its end: mutations then reach
    every command rather than dying at the first."""
    own = OwnBroker(["--stomp-port", "0"], tmp_path, stomp=True)
    own.start()
    try:
        stomp = asyncio.run(_replay(own, "stomp", b"".join(seeds.stomp_session("0000abcd"))))
        http = asyncio.run(_replay(own, "http", b"".join(seeds.http_session("0000abcd"))))
        admin = asyncio.run(_replay(own, "admin", b"".join(seeds.admin_session("0000abcd"))))
    finally:
        own.stop()
    assert b"ERROR" not in stomp and stomp.count(b"MESSAGE\n") == 3
    assert stomp.rstrip(b"\n").endswith(b"receipt-id:bye\n\n\x00")
    codes = [int(c) for c in re.findall(rb"HTTP/1\.1 (\d{3}) ", http)]
    assert codes == [200, 201, 201, 200, 200, 200, 200, 401, 401, 400, 204, 204, 200]
    replies = [json.loads(x) for x in admin.splitlines()]
    assert len(replies) == len(seeds.admin_session("0000abcd"))
    assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]]


def test_B1_admin_list_items_without_a_kind_is_a_usage_error(tmp_path: Path) -> None:
    """Found by the admin-socket fuzzer: `{"verb": "list_items", "args": []}` raised
    IndexError in the broker (a traceback in its log, "internal error" code 70 to the
    client) instead of rabbitmqctl's usage error (64) that every other verb gives."""
    own = OwnBroker([], tmp_path)
    own.start()

    async def ask() -> dict[str, object]:
        r, w = await asyncio.open_unix_connection(str(own.data_dir / "ctl.sock"))
        w.write(b'{"verb": "list_items", "args": []}\n')
        reply = json.loads(await asyncio.wait_for(r.readline(), 10))
        w.close()
        return reply

    try:
        reply = asyncio.run(ask())
    finally:
        own.stop()
    trouble = fl.log_trouble(own.log_path)
    assert (reply["ok"], reply["code"]) == (False, 64), reply
    assert "usage" in str(reply["error"]) and not trouble, trouble


def test_B1_stomp_send_with_a_long_routing_key_does_not_stop_other_publishers(
        tmp_path: Path) -> None:
    """Found by the STOMP fuzzer (a long run inserted into a destination): a persistent
    SEND to /queue/<300-byte name> reached the store, whose record holds the routing
    key's length in one byte: struct.error in the write batch ("store write failed"),
    and from then on EVERY persistent publish of every client was nacked (1,604 failed
    commits in 15 s) until the broker was restarted. RabbitMQ 3.10 answers that SEND
    with a RECEIPT. Whatever the answer to the long key, an AMQP publisher next to it
    must keep getting acks and the log must stay free of tracebacks."""
    import pika
    from conftest import BrokerProcess
    b = BrokerProcess(tmp_path, "--stomp-port", "0")
    b.start()
    try:
        import socket
        s = socket.create_connection(("127.0.0.1", b.stomp_port), timeout=10)
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"
                  b"SEND\ndestination:/queue/fzlong." + b"k" * 300
                  + b"\npersistent:true\nreceipt:r1\n\nhello\x00")
        got = b""
        deadline = time.monotonic() + 10
        while b"ERROR" not in got and time.monotonic() < deadline:
            got += s.recv(4096) or b""
        assert b"longer than 255 bytes" in got, got  # the SEND's own answer: 406's text
        s.close()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("t.after.long", durable=True)
        ch.confirm_delivery()
        for i in range(5):  # raises pika.exceptions.NackError on a nack
            ch.basic_publish("", "t.after.long", b"m%d" % i,
                             pika.BasicProperties(delivery_mode=2))
        conn.close()
    finally:
        b.stop()
    assert "Traceback" not in "".join(b.log), "".join(b.log)[-3000:]
