"""Instructions per message of AMQP 1.0 in the broker, counted by callgrind
(deterministic on a busy machine, where wall-clock figures are not):

    python -m tools.perf.callgrind_amqp10 [--messages 2000] [--size 1024] [--window 100]

Runs `python -m ackmq serve --no-stomp --no-mqtt --no-stream --no-http` (this
checkout) under valgrind --tool=callgrind and drives it with python-qpid-proton's
blocking API, three phases into one durable queue:

    send-outcome   N durable messages (the body one data section), each outcome
                   awaited before the next
    send-stream    N durable messages, at most --window unsettled at once
    receive        the 2N messages, a receiver with credit --window accepting each

Per message = (the phase's instructions at N - the same phase's at 0) / N: each phase
runs once with 0 messages (connect, attach, detach, close) and once with N, the
counters zeroed before and dumped after each run (callgrind_control).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from proton import Message
from proton.utils import BlockingConnection

from tools.perf.callgrind import dump, free_port, start, stop, zero

QUEUE = "cg10"


def _connect(port: int) -> BlockingConnection:
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=600,
                              allowed_mechs="PLAIN")


def _message(body: bytes) -> Message:
    """A durable message whose body is one data section, as AMQP 1.0 publishers send
    bytes (proton's default for bytes is an amqp-value)."""
    m = Message(body=body, durable=True)
    m.inferred = True
    return m


def send_outcome(port: int, n: int, size: int, window: int) -> None:
    conn = _connect(port)
    snd = conn.create_sender(f"/queues/{QUEUE}")
    body = b"x" * size
    for _ in range(n):
        snd.send(_message(body))
    snd.close()
    conn.close()


def send_stream(port: int, n: int, size: int, window: int) -> None:
    conn = _connect(port)
    snd = conn.create_sender(f"/queues/{QUEUE}")
    link = snd.link
    body = b"x" * size
    out: list = []  # unsettled deliveries, oldest first

    def room() -> bool:
        while out and out[0].settled:  # settled by the broker
            out.pop(0).settle()
        return len(out) < window and link.credit > 0

    for _ in range(n):
        conn.wait(room, msg="window")
        out.append(link.send(_message(body)))
    conn.wait(lambda: (room(), not out)[1], msg="outcomes")
    snd.close()
    conn.close()


def receive(port: int, n: int, size: int, window: int) -> None:
    conn = _connect(port)
    rcv = conn.create_receiver(f"/queues/{QUEUE}", credit=window)
    for _ in range(n):
        rcv.receive(timeout=600)
        rcv.accept()
    rcv.close()
    conn.close()


Phase = Callable[[int, int, int, int], None]
PHASES: list[tuple[str, Phase, int]] = [
    ("send-outcome", send_outcome, 1), ("send-stream", send_stream, 1),
    ("receive", receive, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="ackmq-cg10-", dir="/var/tmp"))
    out = args.out or str(work / "cg")
    port = free_port()
    proc, log = start(work, out, ["--port", str(port), "--no-stomp", "--no-mqtt",
                                  "--no-stream", "--no-http"])
    try:
        for _ in range(20):  # the first connection under valgrind may be slow
            try:
                conn = _connect(port)
                conn.create_sender(f"/queue/{QUEUE}").send(Message(body=b"warm"))
                conn.create_receiver(f"/queues/{QUEUE}", credit=1).receive(timeout=600)
                conn.close()  # the warm-up message goes back to the queue: drained below
                break
            except Exception:  # noqa: BLE001 - retried
                time.sleep(2)
        c = _connect(port)
        r = c.create_receiver(f"/queues/{QUEUE}", credit=1)
        r.receive(timeout=600)
        r.accept()
        c.close()
        figures = []
        for name, fn, mult in PHASES:
            totals = []
            for count in (0, n):
                zero(proc.pid)
                fn(port, count * mult, args.size, args.window)
                totals.append(dump(proc.pid, out, f"{name}-{count}"))
            figures.append(f"{name} {(totals[1] - totals[0]) / (n * mult):,.0f}")
        print(f"{n} x {args.size} B, window {args.window}: instructions per message  "
              + "  ".join(figures) + f"   (dumps: {out}.*)", flush=True)
    finally:
        stop(proc, log, work / "data")


if __name__ == "__main__":
    main()
