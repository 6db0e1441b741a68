"""Crash tests: a consumer process is killed (SIGKILL) mid-batch in each acknowledge
mode; a second process finishes the queue. Every message is processed at least once,
none is lost, poison messages are in the dead-letter queue with their cause, and a
transacted consume-and-produce lands every message in its output queue exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ackmq.client import connect

if TYPE_CHECKING:
    from support.clienthelp import Witness

pytest_plugins = ["support.clienthelp"]

N = 300
POISON = {37, 150, 263}

CONSUMER = r'''
import sys, time
from ackmq.client import AckMode, RedeliveryPolicy, connect
url, q, out, mode, ledger, dlq = sys.argv[1:7]
policy = RedeliveryPolicy(maximum_redeliveries=1, initial_redelivery_delay=0,
                          redelivery_delay=0)
conn = connect(url, redelivery_policy=policy)
conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": dlq})
log = open(ledger, "a", buffering=1)
transacted = mode == "TRANSACTED"
s = conn.session(transacted=True) if transacted else conn.session(AckMode[mode])
p = s.producer(out) if transacted else None
state = {"n": 0, "last": time.monotonic()}

def listener(m):
    state["last"] = time.monotonic()
    if m.body.startswith(b"poison"):
        raise ValueError("poison " + m.message_id)
    log.write(m.message_id + "\n")           # the side effect, before any ack
    time.sleep(0.002)
    state["n"] += 1
    if transacted:
        p.send(m.body, message_id=m.message_id)
        if state["n"] % 10 == 0:
            s.commit()
    elif mode == "CLIENT" and state["n"] % 10 == 0:
        m.acknowledge()
    elif mode == "INDIVIDUAL":
        m.acknowledge()

c = s.consumer(q + "?consumer.prefetchSize=20", listener=listener)
print("ready", flush=True)
while time.monotonic() - state["last"] < 1.0:
    time.sleep(0.05)
c.close()
if transacted:
    s.commit()
elif mode == "CLIENT":
    s.acknowledge()
conn.close()
'''


def run_consumer(url: str, q: str, out: str, mode: str, ledger: Path, dlq: str,
                 kill_after: int | None) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, url, q, out, mode, str(ledger),
                             dlq], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        if kill_after is None:
            assert proc.wait(60) == 0
            return
        deadline = time.monotonic() + 30
        while _lines(ledger) < kill_after:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)  # mid-batch: unacked work in flight
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _lines(path: Path) -> int:
    try:
        return path.read_text().count("\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["AUTO", "CLIENT", "DUPS_OK", "INDIVIDUAL", "TRANSACTED"])
def test_crash_mid_batch_loses_nothing(url: str, q: str, witness: Witness, mode: str,
                                       tmp_path: Path) -> None:
    dlq, out = q + ".dlq", q + ".out"
    witness.declare(dlq)
    witness.declare(out)
    ids = [f"{q}-{i}" for i in range(N)]
    with connect(url) as conn:
        conn.declare_queue(q, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq})
        p = conn.session().producer(q)
        for i, mid in enumerate(ids):
            p.publish(b"poison" if i in POISON else b"work %d" % i, message_id=mid)
        p.wait_for_confirms(timeout=20)
        assert p.take_failed() == []
    ledger = tmp_path / "ledger"
    run_consumer(url, q, out, mode, ledger, dlq, kill_after=100)
    killed_at = _lines(ledger)
    run_consumer(url, q, out, mode, ledger, dlq, kill_after=None)

    witness.wait_ready(q, 0)
    processed = ledger.read_text().split()
    dead = witness.drain(dlq)
    poisoned = {props.message_id for _, props, _ in dead}
    good = {mid for i, mid in enumerate(ids) if i not in POISON}
    assert set(processed) == good                       # every good one, at least once
    assert poisoned == {ids[i] for i in POISON}         # poison: in the DLQ, not lost
    for _, props, _ in dead:
        assert props.headers["x-ackmq-dlq-cause"] == \
            f"ValueError('poison {props.message_id}')"
    assert 100 <= killed_at < len(good)                 # it really died mid-way
    if mode == "TRANSACTED":
        landed = [props.message_id for _, props, _ in witness.drain(out)]
        assert sorted(landed) == sorted(good)           # exactly once
