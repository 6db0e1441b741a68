"""Instructions per message of RabbitMQ's stream protocol in the broker, counted by
callgrind (deterministic on a busy machine, where wall-clock figures are not):

    python -m tools.perf.callgrind_stream [--messages 5000] [--size 1024] [--out PREFIX]
                                          [--publisher-name NAME]

Runs `python -m ackmq serve` (this checkout) under valgrind --tool=callgrind, then with
rstream, as tools/perf/stream_protocol.py does: publish N messages with confirms
(Producer.send, batched by rstream), then consume them from `first` (credit 10). The
counters are zeroed before and dumped after each phase (callgrind_control), so each
figure is that phase's instructions over N; an idle phase of the same wall time as the
consume is counted too (timers, the memory tick), to show what is not per message.
`--publisher-name`: the publishes as a named publisher's (deduplicated, its sequence
kept with its records: X3).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from tools.perf.callgrind import dump, free_port, start, stop, zero
from tools.perf.stream_protocol import consume, publish

# (the stream gets one warm-up message first: the consume phase reads n + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--out", default="")
    ap.add_argument("--publisher-name", default=None)
    args = ap.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="ackmq-cg-", dir="/var/tmp"))
    out = args.out or str(work / "cg")
    port = free_port()
    proc, log = start(work, out, ["--port", "0", "--no-stomp", "--http-port", "0",
                                  "--no-mqtt", "--stream-port", str(port)])
    try:
        stream = "cg"
        for _ in range(20):  # the first connection under valgrind may time out
            try:
                asyncio.run(publish(port, stream, 1, args.size, args.publisher_name))
                break
            except (TimeoutError, OSError):
                time.sleep(2)
        zero(proc.pid)
        t0 = time.monotonic()
        asyncio.run(publish(port, stream, n, args.size, args.publisher_name))
        pub = dump(proc.pid, out, "publish")
        took_pub = time.monotonic() - t0
        zero(proc.pid)
        t0 = time.monotonic()
        asyncio.run(consume(port, stream, n))
        con = dump(proc.pid, out, "consume")
        took = time.monotonic() - t0
        zero(proc.pid)
        time.sleep(took)
        idle = dump(proc.pid, out, "idle")
        print(f"{n} x {args.size} B  publish {pub / n:,.0f} instr/msg ({took_pub:.0f} s)  "
              f"consume {con / n:,.0f} instr/msg ({took:.0f} s)  idle for {took:.0f} s "
              f"{idle / n:,.0f} per msg-equivalent   (dumps: {out}.*)", flush=True)
    finally:
        stop(proc, log, work / "data")


if __name__ == "__main__":
    main()
