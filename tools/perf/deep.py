"""A durable queue far deeper than memory: publish, crash, recover, drain.

    python -m tools.perf.deep --messages 5000000 --body-size 1024 --memory-limit 2G

Starts `ackmq serve` with its address space capped (RLIMIT_AS), publishes persistent
messages with confirms (each body starts with its index), kills the broker with SIGKILL,
restarts it, times the recovery, then drains the queue checking that every message comes
back once and in order. Prints the broker's resident memory throughout (progress on
stderr) and a summary: peak RSS, bytes per queued message, recovery time, rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ackmq.bench.pipeline import OutstandingConfirms
from ackmq.client.lowlevel import open_connection

QUEUE = "ackmq-bench.deep"
_IDX = struct.Struct(">Q")


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"a size like 2G or 512M, not {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


class DeepBroker:
    def __init__(self, data_dir: Path, limit: int | None) -> None:
        self.data_dir, self.limit = data_dir, limit
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.peak = 0

    def _cap(self) -> None:
        if self.limit:
            resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ackmq", "serve", "--port", "0", "--no-stomp", "--http-port", "0", "--no-stream", "--no-mqtt",
             "--data-dir",
             str(self.data_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=self._cap)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.search(r"listening on (amqp://\S+)", line)
            if m:
                self.url = m.group(1)
                os.set_blocking(self.proc.stdout.fileno(), False)
                return time.monotonic() - t0
        raise RuntimeError("broker exited before listening")

    def rss(self) -> int:
        assert self.proc is not None
        r = psutil.Process(self.proc.pid).memory_info().rss
        self.peak = max(self.peak, r)
        return r

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def _progress(what: str, done: int, n: int, t0: float, broker: DeepBroker) -> None:
    rate = done / max(1e-9, time.monotonic() - t0)
    print(f"\r{what}: {done:,}/{n:,} ({rate:,.0f} msg/s), broker RSS "
          f"{broker.rss() / 2**20:,.0f} MiB   ", end="", file=sys.stderr, flush=True)


async def _publish(broker: DeepBroker, n: int, body_size: int) -> float:
    conn = await open_connection(broker.url, "ackmq-bench-deep")
    ch = await conn.channel()
    await ch.declare_queue(QUEUE, durable=True)
    await ch.confirm_select()
    oc = OutstandingConfirms()
    ch.on_confirm = oc.settle
    pad = b"x" * (body_size - _IDX.size)
    t0 = time.monotonic()
    i = 0
    while i < n:
        k = min(2000, n - i)
        frames = [ch.publish_bytes("", QUEUE, _IDX.pack(j) + pad, 2)
                  for j in range(i, i + k)]
        for _ in range(k):
            oc.add(None)
        conn.write(b"".join(frames))
        i += k
        await (conn.drain() if conn.paused else asyncio.sleep(0))
        while len(oc.pending) > 50_000:
            await asyncio.sleep(0.005)
        if i % 100_000 < k:
            _progress("publish", i, n, t0, broker)
    await oc.wait_all()
    if oc.nacked:
        raise RuntimeError(f"{len(oc.nacked)} publishes were nacked")
    elapsed = time.monotonic() - t0
    count = await ch.queue_count(QUEUE)
    await conn.close()
    if count != n:
        raise RuntimeError(f"queue holds {count}, published {n}")
    print(file=sys.stderr)
    return elapsed


async def _drain(broker: DeepBroker, n: int) -> float:
    conn = await open_connection(broker.url, "ackmq-bench-deep")
    ch = await conn.channel()
    await ch.qos(1000)
    expect = [0]
    done = asyncio.get_running_loop().create_future()
    t0 = time.monotonic()

    def on_deliver(tag: int, redelivered: bool, body: bytes) -> None:
        (idx,) = _IDX.unpack_from(body)
        if idx != expect[0]:
            if not done.done():
                done.set_exception(RuntimeError(f"got message {idx}, expected {expect[0]}"))
            return
        expect[0] += 1
        if expect[0] % 500 == 0 or expect[0] == n:
            conn.queue(ch.ack_bytes(tag, True))
        if expect[0] % 100_000 == 0:
            _progress("drain", expect[0], n, t0, broker)
        if expect[0] == n and not done.done():
            done.set_result(None)

    ch.on_deliver = on_deliver
    await ch.consume(QUEUE)
    await done
    elapsed = time.monotonic() - t0
    await asyncio.sleep(0.2)
    left = await ch.queue_count(QUEUE)
    await conn.close()
    print(file=sys.stderr)
    if left:
        raise RuntimeError(f"{left} messages left after the drain")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.perf.deep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=5_000_000)
    p.add_argument("--body-size", type=int, default=1024)
    p.add_argument("--memory-limit", type=_size, default=_size("2G"),
                   help="the broker's address-space cap (RLIMIT_AS); 0: none")
    p.add_argument("--data-dir", type=Path, default=Path("/var/tmp/ackmq-deep"))
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    if args.body_size < _IDX.size:
        p.error(f"--body-size must be at least {_IDX.size}")
    shutil.rmtree(args.data_dir, ignore_errors=True)
    broker = DeepBroker(args.data_dir, args.memory_limit or None)
    out: dict[str, float] = {"messages": args.messages, "body_size": args.body_size,
                             "memory_limit": args.memory_limit}
    try:
        broker.start()
        base = broker.rss()
        out["publish_s"] = asyncio.run(_publish(broker, args.messages, args.body_size))
        full = broker.rss()
        out["rss_full_mib"] = full / 2**20
        out["bytes_per_queued_msg"] = (full - base) / args.messages
        broker.kill()
        out["recovery_s"] = broker.start()
        out["rss_after_recovery_mib"] = broker.rss() / 2**20
        out["drain_s"] = asyncio.run(_drain(broker, args.messages))
        out["peak_rss_mib"] = broker.peak / 2**20
        broker.stop()
    finally:
        broker.kill() if broker.proc and broker.proc.poll() is None else None
        shutil.rmtree(args.data_dir, ignore_errors=True)
    n = args.messages
    print(f"{n:,} persistent messages of {args.body_size} bytes "
          f"({n * args.body_size / 2**30:.2f} GiB of bodies), broker capped at "
          f"{args.memory_limit / 2**30:.1f} GiB address space:")
    print(f"  publish with confirms: {out['publish_s']:.1f} s ({n / out['publish_s']:,.0f} msg/s)")
    print(f"  broker RSS with all queued: {out['rss_full_mib']:,.0f} MiB "
          f"({out['bytes_per_queued_msg']:.0f} bytes per queued message)")
    print(f"  kill -9, restart: listening again after {out['recovery_s']:.1f} s, "
          f"RSS {out['rss_after_recovery_mib']:,.0f} MiB")
    print(f"  drain in order, every message once: {out['drain_s']:.1f} s "
          f"({n / out['drain_s']:,.0f} msg/s); peak RSS {out['peak_rss_mib']:,.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
