"""W9 / B1 fuzz: valid STOMP sessions, mutated (bytes flipped, cut, repeated, special
bytes inserted, split at random), sent to a real `ackmq serve` by many connections at
once. The broker never crashes or logs a traceback, answers every ERROR with a
`message` and closes after it, keeps serving a well-behaved publisher and subscriber
meanwhile, and loses none of that publisher's receipted messages."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import BrokerProcess
from support.stomphelp import Closed, Raw

# STOMP_FUZZ_SESSIONS=20000 for the longer run of docs/robustness.md
SESSIONS = int(os.environ.get("STOMP_FUZZ_SESSIONS", "240"))
SPECIAL = [b"\x00", b"\n", b"\r", b"\r\n", b"\\", b":", b"\\c", b"\xff", b"\n\n",
           b"content-length:99999999\n", b"content-length:-1\n", b"transaction:t1\n",
           b"ACK\nid:x@@y@@1\n\n\x00", b"NACK\nid:T_s1@@y@@2\nrequeue:false\n\n\x00",
           b"SEND\n\n\x00", b"STOMP\n\n\x00"]


def session(i: int) -> bytes:
    """A valid session (ACK/NACK come in as mutations: their ids are the broker's),
    on queues of its own (fz.*)."""
    q = f"/queue/fz.{i % 7}"
    frames = [
        b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nlogin:guest\npasscode:guest\n"
        b"heart-beat:0,0\n\n\x00",
        f"SUBSCRIBE\ndestination:{q}\nid:s{i}\nack:client\nprefetch-count:5\n"
        f"receipt:sub\n\n\x00".encode(),
        f"SEND\ndestination:{q}\npersistent:true\nreceipt:r{i}\nk\\cey:v\\nal\n"
        f"content-length:5\n\nhello\x00".encode(),
        f"SEND\ndestination:/topic/fz.{i}\ncontent-type:text/plain\n\nno length\x00".encode(),
        b"BEGIN\ntransaction:t1\n\n\x00",
        f"SEND\ndestination:{q}\ntransaction:t1\n\ntx body\x00".encode(),
        b"COMMIT\ntransaction:t1\nreceipt:c\n\n\x00",
        f"UNSUBSCRIBE\nid:s{i}\n\n\x00".encode(),
        b"\n\n",
        b"DISCONNECT\nreceipt:bye\n\n\x00",
    ]
    return b"".join(frames)


def mutate(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(6)
        pos = rnd.randrange(len(b) + 1)
        if op == 0 and b:      # flip a byte
            b[min(pos, len(b) - 1)] = rnd.randrange(256)
        elif op == 1:          # cut a range out
            del b[pos:pos + rnd.randint(1, 40)]
        elif op == 2:          # repeat a range
            b[pos:pos] = b[pos:pos + rnd.randint(1, 60)] * rnd.randint(1, 3)
        elif op == 3:          # insert a byte that means something to STOMP
            b[pos:pos] = rnd.choice(SPECIAL)
        elif op == 4:          # truncate
            del b[pos:]
        else:                  # a long run (limits)
            b[pos:pos] = bytes([rnd.choice(b"a:\\\n")]) * rnd.choice([100, 11000])
    return bytes(b)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("stomp-fuzz"), "--max-message-size", "8192")
    b.start()
    yield b
    b.stop()


def run_session(port: int, data: bytes, rnd: random.Random) -> list[str]:
    """Write `data` in random pieces; the problems seen (empty when all is well)."""
    problems = []
    r = Raw(socket.create_connection(("127.0.0.1", port), timeout=5))
    try:
        pos = 0
        while pos < len(data):
            n = rnd.randint(1, 400)
            try:
                r.write(data[pos:pos + n])
            except OSError:
                return problems  # the broker closed on us: allowed at any point
            pos += n
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                f = r.recv(max(0.01, deadline - time.monotonic()))
            except (Closed, OSError):
                return problems
            except TimeoutError:
                return problems  # waiting for the rest of a frame: allowed
            except (AssertionError, ValueError, UnicodeDecodeError, KeyError) as e:
                return problems + [f"unparsable output: {e!r}"]
            if f.command == "ERROR":
                if not f.headers.get("message"):
                    problems.append(f"ERROR without message: {f}")
                if f.headers.get("message") != "Server cancelled subscription" \
                        and not r.closed(2.0):
                    problems.append(f"still open after ERROR {f.headers.get('message')}")
                return problems
            if f.command not in ("CONNECTED", "RECEIPT", "MESSAGE"):
                problems.append(f"unexpected frame {f.command}")
        return problems
    finally:
        r.close()


def test_W9_fuzzed_sessions_never_hurt_the_broker_or_others(broker: BrokerProcess) -> None:
    rnd = random.Random(2024)
    port = broker.stomp_port
    receipted: list[bytes] = []
    received: list[bytes] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def good_publisher() -> None:
        try:
            with Raw.open("127.0.0.1", port) as r:
                r.connect(host="/")
                n = 0
                while not stop.is_set():
                    body = b"safe-%d" % n
                    r.receipt("SEND", {"destination": "/queue/safe", "persistent": "true"},
                              body, receipt=body.decode())
                    receipted.append(body)
                    n += 1
                    time.sleep(0.005)
        except BaseException as e:  # reported below
            errors.append(e)

    def good_subscriber() -> None:
        try:
            with Raw.open("127.0.0.1", port) as r:
                r.connect(host="/")
                r.subscribe("/topic/heartbeat.#", "hb")
                while not stop.is_set():
                    try:
                        received.append(r.recv(0.3).body)
                    except TimeoutError:
                        pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=good_publisher), threading.Thread(target=good_subscriber)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    cases = [(mutate(session(i), rnd), random.Random(i)) for i in range(SESSIONS)]
    with Raw.open("127.0.0.1", port) as ticker:
        ticker.connect(host="/")
        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(run_session, port, data, r) for data, r in cases]
            for i in range(10):  # the subscriber keeps getting messages during the fuzz
                ticker.send("SEND", {"destination": f"/topic/heartbeat.{i}"}, b"tick-%d" % i)
                time.sleep(0.2)
            problems = [p for f in futures for p in f.result()]
    stop.set()
    for t in threads:
        t.join(10)
    assert not errors, errors
    assert not problems, problems[:10]
    assert broker.proc is not None and broker.proc.poll() is None, "the broker died"
    assert received == [b"tick-%d" % i for i in range(10)]
    assert len(receipted) > 20
    with Raw.open("127.0.0.1", port) as r:
        r.connect(host="/")
        r.subscribe("/queue/safe", "s")
        got = []
        while True:
            batch = r.frames(0.5)
            if not batch:
                break
            got += [m.body for m in batch]
    assert set(receipted) <= set(got), "a receipted message is missing"
    assert "Traceback" not in "".join(broker.log), "".join(broker.log)[-3000:]
