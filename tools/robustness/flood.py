"""B3: an unconfirmed publish flood against a broker with a memory watermark, and the
broker's RSS over time. Bounded means: the RSS stays near the watermark however much is
sent, because the broker pages queues out and blocks the publisher (connection.blocked,
then no more reads) instead of buffering.

    python -m tools.robustness.flood --bytes 1GB --watermark 256MiB       # starts its own ackmq
    python -m tools.robustness.flood --url amqp://guest:guest@127.0.0.1:5672/ \\
        --pid $(/work/shared/tools/rabbitmq-local pid) --bytes 1GB  # a running broker

With --url the watermark is the broker's own (RabbitMQ: `rabbitmqctl
set_vm_memory_high_watermark absolute 256MiB`, and back to 0.4 after). One connection
(ackmq.client.lowlevel) writes pre-encoded non-persistent messages as fast as TCP takes
them (write, then drain while the transport is paused); connection.blocked/unblocked
are noted as they arrive (conn.on_blocked); a task samples /proc/PID/status every 0.1 s.
At the end a passive queue.declare on the same connection proves every message was
taken (its message_count), then the queue is deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pamqp import commands

from ackmq.client.errors import ClientError
from ackmq.client.lowlevel import open_connection

QUEUE = "ackmq-flood"
_URL_LINE = re.compile(r"listening on (amqp://\S+)")


def parse_size(text: str) -> int:
    """1GB, 64KiB, 1000 (RabbitMQ's units: KB/MB/GB x1000, KiB/MiB/GiB x1024)."""
    from ackmq.server.alarms import parse_bytes
    return parse_bytes(text)


def rss_of(pid: int) -> int:
    """VmRSS of a process, in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Sample:
    t: float
    sent: int
    rss: int
    blocked: bool


@dataclass
class Result:
    messages: int = 0
    sent: int = 0  # body bytes
    seconds: float = 0.0
    queued: int = -1  # message_count at the end (should equal messages)
    samples: list[Sample] = field(default_factory=list)
    blocked_events: list[tuple[float, str]] = field(default_factory=list)
    baseline_rss: int = 0

    @property
    def peak_rss(self) -> int:
        return max((s.rss for s in self.samples), default=0)

    @property
    def blocked_seconds(self) -> float:
        total, since = 0.0, None
        for t, what in self.blocked_events:
            if what != "unblocked" and since is None:
                since = t
            elif what == "unblocked" and since is not None:
                total, since = total + t - since, None
        if since is not None:
            total += self.seconds - since
        return total


def flood(url: str, pid: int, total: int, size: int = 64 * 1024, persistent: bool = False,
          progress: bool = True, batch: int = 1 << 20) -> Result:
    """Publish `total` body bytes in `size`-byte messages, unconfirmed, as fast as the
    broker reads them; sample the broker's RSS every 0.1 s."""
    return asyncio.run(_flood(url, pid, total, size, persistent, progress, batch))


async def _flood(url: str, pid: int, total: int, size: int, persistent: bool,
                 progress: bool, batch: int) -> Result:
    # RPCs wait behind everything sent (a blocked broker reads nothing): a long timeout
    conn = await open_connection(url, connection_name="ackmq-flood", send_timeout=600_000)
    res = Result(baseline_rss=rss_of(pid))
    t0 = time.monotonic()
    blocked = False

    def on_blocked(now_blocked: bool, reason: str) -> None:
        nonlocal blocked
        blocked = now_blocked
        res.blocked_events.append((time.monotonic() - t0,
                                   f"blocked: {reason}" if now_blocked else "unblocked"))

    conn.on_blocked = on_blocked
    try:
        ch = await conn.channel()
        await ch.declare_queue(QUEUE, durable=persistent)
        await ch.call(commands.Queue.Purge(queue=QUEUE))
        one = ch.publish_bytes("", QUEUE, b"\x00" * size, 2 if persistent else 1)
        per = max(1, batch // len(one))
        chunk = one * per

        async def sample() -> None:
            last_print = 0.0
            while True:
                now = time.monotonic() - t0
                s = Sample(now, res.sent, rss_of(pid), blocked)
                res.samples.append(s)
                if progress and now - last_print >= 1.0:
                    last_print = now
                    print(f"  {now:6.1f} s  sent {s.sent / 1e6:8.1f} MB  broker RSS "
                          f"{s.rss / 2**20:7.1f} MiB  peak {res.peak_rss / 2**20:7.1f} MiB"
                          f"{'  BLOCKED' if s.blocked else ''}", flush=True)
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample())
        try:
            while res.sent < total:
                n = min(per, -(-(total - res.sent) // size))
                conn.write(chunk if n == per else one * n)
                res.messages += n
                res.sent += n * size
                if conn.paused:  # TCP backpressure: the broker reads no faster
                    await conn.drain()
            # in order on one channel: the reply comes after every publish was handled
            # (ackmq); RabbitMQ's queue process may count the last ones a moment later
            res.seconds = time.monotonic() - t0
            deadline = time.monotonic() + 30
            while True:
                res.queued = await ch.queue_count(QUEUE)
                if res.queued >= res.messages or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        try:
            await ch.call(commands.Queue.Delete(queue=QUEUE))
        except ClientError:
            pass
    finally:
        if conn.is_open:
            await conn.close()
        else:
            conn.abort()
    return res


def start_ackmq(watermark: str, extra: list[str]) -> tuple[subprocess.Popen[str], str, Path]:
    """`ackmq serve` on a free port with its own data dir; returns (process, url, dir)."""
    data = Path(tempfile.mkdtemp(prefix="ackmq-flood-"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackmq", "serve", "--port", "0", "--no-stomp", "--http-port", "0", "--no-stream", "--no-mqtt",
         "--data-dir", str(data), "--memory-high-watermark", watermark, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = _URL_LINE.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout],  # type: ignore[union-attr]
                             daemon=True).start()
            return proc, m.group(1), data
    raise RuntimeError("ackmq serve did not start")


def plot(res: Result, path: Path, title: str, watermark: int | None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [s.sent / 1e6 for s in res.samples]
    ax.plot(xs, [s.rss / 2**20 for s in res.samples], label="broker RSS (MiB)")
    if watermark:
        ax.axhline(watermark / 2**20, color="red", linestyle="--", label="watermark")
    for s in res.samples:
        if s.blocked:
            ax.axvline(s.sent / 1e6, color="orange", alpha=0.05)
    ax.set_xlabel("MB sent (unconfirmed)")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def report(res: Result, watermark: int | None) -> str:
    rate = res.sent / res.seconds / 1e6 if res.seconds else 0.0
    lines = [
        f"sent {res.messages:,} messages, {res.sent / 1e6:,.0f} MB in {res.seconds:.1f} s "
        f"({rate:.1f} MB/s); in the queue at the end: {res.queued:,}"
        + (" (all)" if res.queued == res.messages else " (MISSING SOME)"),
        f"broker RSS: {res.baseline_rss / 2**20:.0f} MiB before, peak "
        f"{res.peak_rss / 2**20:.0f} MiB"
        + (f" (watermark {watermark / 2**20:.0f} MiB)" if watermark else ""),
        f"blocked {res.blocked_seconds:.1f} s; connection.blocked/unblocked: "
        f"{len(res.blocked_events)} ({', '.join(sorted({e for _, e in res.blocked_events}))})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.robustness.flood", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running broker (default: start an ackmq)")
    ap.add_argument("--pid", type=int, help="that broker's process id, for its RSS")
    ap.add_argument("--bytes", default="1GB", help="body bytes to send (default 1GB)")
    ap.add_argument("--size", default="64KiB", help="body size of one message")
    ap.add_argument("--watermark", default=None,
                    help="--memory-high-watermark of the ackmq started here (default "
                         "256MiB); with --url, the broker's, for the report and plot only")
    ap.add_argument("--persistent", action="store_true", help="delivery-mode 2")
    ap.add_argument("--plot", type=Path, help="write a PNG of RSS vs bytes sent")
    ap.add_argument("--title", default=None)
    ap.add_argument("--ackmq-arg", action="append", default=[],
                    help="extra `ackmq serve` argument (repeatable)")
    a = ap.parse_args(argv)
    total, size = parse_size(a.bytes), parse_size(a.size)
    proc = None
    watermark: int | None = None
    try:
        from ackmq.server.alarms import parse_watermark, total_memory
        if a.watermark or not a.url:
            watermark = parse_watermark(a.watermark or "256MiB").bytes(total_memory())
        if a.url:
            if not a.pid:
                ap.error("--url needs --pid (the broker's process, for its RSS)")
            url, pid = a.url, a.pid
        else:
            proc, url, _data = start_ackmq(a.watermark or "256MiB", a.ackmq_arg)
            pid = proc.pid
        print(f"flood: {total / 1e6:,.0f} MB in {size:,}-byte messages to {url.split('@')[-1]}"
              f" (pid {pid})", flush=True)
        res = flood(url, pid, total, size, a.persistent)
        print(report(res, watermark))
        if a.plot:
            plot(res, a.plot, a.title or f"{total / 1e6:,.0f} MB unconfirmed flood", watermark)
            print(f"plot: {a.plot}")
        return 0 if res.queued == res.messages else 1
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    raise SystemExit(main())
