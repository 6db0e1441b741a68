"""A soak (issue 23): mixed load for a long time on one `ackmq serve` of our own, kill -9
of the broker every N seconds and a restart on the same data dir, RSS / open fds / disk
use sampled, their slopes reported, and at the end every confirmed message accounted for.

    python -m tools.robustness.soak --minutes 60 --kill-every 600 --plot docs/soak.png

The load, all at once and each part reconnecting after a kill:
- a confirm-each publisher and an async publisher (confirms pipelined, 100 in flight):
  persistent messages to a durable fanout bound to `soak.work` and `soak.auto`;
- on `soak.work` (durable, dead-lettering to `soak.dlx`): a consumer acking each, one
  nacking 10% with requeue (acks the redelivery), one rejecting 5% without requeue
  (dead-lettered into `soak.dead`, whose consumer acks);
- on `soak.auto` (x-message-ttl 2 s): a no-ack consumer that pauses now and then, so
  messages expire;
- 100 connections churned: each connects, declares a queue, binds it, publishes,
  gets, deletes the queue, closes, sleeps 0.5-3 s, again;
- STOMP: a publisher with a receipt per persistent SEND to /queue/soak.stomp and a
  client-individual subscriber acking each.

Checked: every confirmed (AMQP) or receipted (STOMP) id of `soak.work`/`soak.stomp` was
received by a consumer (acked, or dead-lettered and acked) or is still queued after a
last kill -9 and restart: `lost` must be 0. Redeliveries after a kill are counted as
duplicates (at-least-once: expected, reported). `soak.auto` is at-most-once (no-ack,
TTL) and only counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.harness.ownbroker import OwnBroker, log_trouble
from tools.harness.rawpeer import rss_of

CHURN = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fds_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def disk_of(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


@dataclass
class Tally:
    confirmed: set[str] = field(default_factory=set)    # AMQP ids confirmed
    receipted: set[str] = field(default_factory=set)    # STOMP ids receipted
    received: dict[str, int] = field(default_factory=dict)  # strict ids -> times
    auto_received: int = 0
    churn_cycles: int = 0
    reconnects: int = 0
    requeued: int = 0
    dead_lettered: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def got(self, body: bytes) -> None:
        key = body.decode(errors="replace")
        self.received[key] = self.received.get(key, 0) + 1

    def error(self, where: str, exc: BaseException) -> None:
        k = f"{where}: {type(exc).__name__}"
        self.errors[k] = self.errors.get(k, 0) + 1


class Soak:
    def __init__(self, own: OwnBroker, amqp_port: int, stomp_port: int) -> None:
        self.own = own
        self.amqp_url = f"amqp://guest:guest@127.0.0.1:{amqp_port}/"
        self.stomp_port = stomp_port
        self.t = Tally()
        self.stopping = False
        self.stop_publishing = False

    # -- AMQP parts ------------------------------------------------------------------------
    async def forever(self, name: str, body) -> None:  # noqa: ANN001 - a coroutine function
        """Run `body` again after any failure (a kill), until the soak stops."""
        while not self.stopping:
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a kill drops every connection
                self.t.error(name, e)
                self.t.reconnects += 1
                await asyncio.sleep(0.5 + random.random())

    async def declare(self) -> None:
        import aio_pika
        conn = await aio_pika.connect(self.amqp_url, timeout=30)
        async with conn:
            ch = await conn.channel()
            fan = await ch.declare_exchange("soak.fan", "fanout", durable=True)
            dlx = await ch.declare_exchange("soak.dlx", "fanout", durable=True)
            work = await ch.declare_queue("soak.work", durable=True, arguments={
                "x-dead-letter-exchange": "soak.dlx"})
            auto = await ch.declare_queue("soak.auto", durable=True, arguments={
                "x-message-ttl": 2000})
            dead = await ch.declare_queue("soak.dead", durable=True)
            await work.bind(fan)
            await auto.bind(fan)
            await dead.bind(dlx)
            await ch.declare_queue("soak.stomp", durable=True)

    async def publisher(self, prefix: str, pipelined: bool) -> None:
        import aio_pika
        conn = await aio_pika.connect(self.amqp_url, timeout=30)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            fan = await ch.get_exchange("soak.fan")
            n = 0
            while not self.stop_publishing:
                batch = []
                for _ in range(100 if pipelined else 1):
                    n += 1
                    key = f"{prefix}{os.getpid()}.{time.monotonic_ns()}.{n}"
                    batch.append((key, fan.publish(aio_pika.Message(
                        key.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key="", timeout=30)))
                results = await asyncio.gather(*(c for _, c in batch), return_exceptions=True)
                failed = None
                for (key, _), r in zip(batch, results, strict=True):
                    if isinstance(r, BaseException):
                        failed = r
                    else:
                        self.t.confirmed.add(key)
                if failed is not None:  # a nack, a timeout, the kill: reconnect
                    raise failed
                await asyncio.sleep(0.02 if pipelined else 0.005)

    async def consumer(self, mode: str) -> None:
        import aio_pika
        conn = await aio_pika.connect(self.amqp_url, timeout=30)
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=50)
            q = await ch.get_queue({"dead": "soak.dead", "auto": "soak.auto"}.get(
                mode, "soak.work"))
            # a callback and a watch on the connection: an aio-pika iterator can wait
            # forever on a connection the broker's kill -9 took away
            ch_ = ch

            async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
                if mode == "auto":
                    self.t.auto_received += 1
                    return
                if mode == "requeue" and not m.redelivered and random.random() < 0.1:
                    await m.nack(requeue=True)
                    self.t.requeued += 1
                    return
                if mode == "reject" and random.random() < 0.05:
                    await m.reject(requeue=False)
                    self.t.dead_lettered += 1
                    return
                self.t.got(m.body)  # before the ack: a lost ack is a redelivery
                await m.ack()

            tag = await q.consume(on_message, no_ack=mode == "auto")
            while not self.stopping:
                if conn.is_closed or ch_.is_closed:
                    raise ConnectionError("connection lost")
                await asyncio.sleep(1)
                if mode == "auto" and random.random() < 0.02:  # soak.auto's TTL expires
                    await q.cancel(tag)
                    await asyncio.sleep(5)
                    tag = await q.consume(on_message, no_ack=True)

    async def churner(self, i: int) -> None:
        import aio_pika
        while not self.stopping:
            conn = await aio_pika.connect(self.amqp_url, timeout=30)
            async with conn:
                ch = await conn.channel()
                q = await ch.declare_queue(f"soak.churn.{i}", durable=bool(i % 2))
                await q.bind("amq.topic", routing_key=f"churn.{i}")
                await ch.default_exchange.publish(aio_pika.Message(b"c"), routing_key=q.name)
                await q.get(no_ack=True, fail=False, timeout=10)
                await q.delete(if_unused=False, if_empty=False)
            self.t.churn_cycles += 1
            await asyncio.sleep(0.5 + 2.5 * random.random())

    # -- STOMP parts ------------------------------------------------------------------------
    async def stomp_open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.stomp_port), 30)
        w.write(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n"
                b"heart-beat:0,0\n\n\x00")
        frame = await asyncio.wait_for(r.readuntil(b"\x00"), 30)
        if not frame.lstrip(b"\n").startswith(b"CONNECTED"):
            raise ConnectionError(frame[:200])
        return r, w

    async def stomp_publisher(self) -> None:
        r, w = await self.stomp_open()
        try:
            n = 0
            while not self.stop_publishing:
                n += 1
                key = f"s{os.getpid()}.{time.monotonic_ns()}.{n}"
                w.write(f"SEND\ndestination:/queue/soak.stomp\npersistent:true\n"
                        f"receipt:{key}\ncontent-length:{len(key)}\n\n{key}\x00".encode())
                frame = await asyncio.wait_for(r.readuntil(b"\x00"), 30)
                if f"receipt-id:{key}\n".encode() in frame:
                    self.t.receipted.add(key)
                else:
                    raise ConnectionError(frame[:200])
                await asyncio.sleep(0.01)
        finally:
            w.close()

    async def stomp_subscriber(self) -> None:
        r, w = await self.stomp_open()
        try:
            w.write(b"SUBSCRIBE\ndestination:/queue/soak.stomp\nid:1\n"
                    b"ack:client-individual\nprefetch-count:50\n\n\x00")
            while not self.stopping:
                frame = (await r.readuntil(b"\x00")).lstrip(b"\r\n")
                head, _, body = frame[:-1].partition(b"\n\n")
                if not head.startswith(b"MESSAGE"):
                    raise ConnectionError(frame[:200])
                ack = [x[4:] for x in head.split(b"\n") if x.startswith(b"ack:")]
                self.t.got(body)
                w.write(b"ACK\nid:" + ack[0] + b"\n\n\x00")
        finally:
            w.close()

    def tasks(self) -> list[asyncio.Task[None]]:
        parts = [("confirm-each", lambda: self.publisher("p", False)),
                 ("async", lambda: self.publisher("a", True)),
                 ("ack", lambda: self.consumer("ack")),
                 ("requeue", lambda: self.consumer("requeue")),
                 ("reject", lambda: self.consumer("reject")),
                 ("dead", lambda: self.consumer("dead")),
                 ("auto", lambda: self.consumer("auto")),
                 ("stomp-pub", self.stomp_publisher),
                 ("stomp-sub", self.stomp_subscriber)]
        parts += [("churn", lambda i=i: self.churner(i)) for i in range(CHURN)]
        return [asyncio.create_task(self.forever(n, b)) for n, b in parts]

    # -- the end --------------------------------------------------------------------------
    async def drain(self) -> int:
        """Everything left in the strict queues (after the last kill and restart)."""
        import aio_pika
        left = 0
        conn = await aio_pika.connect(self.amqp_url, timeout=60)
        async with conn:
            ch = await conn.channel()
            for name in ("soak.work", "soak.dead", "soak.stomp"):
                q = await ch.get_queue(name)
                while (m := await q.get(no_ack=True, fail=False, timeout=30)) is not None:
                    self.t.got(m.body)
                    left += 1
        return left


async def soak(opts: argparse.Namespace) -> dict[str, object]:
    amqp_port, stomp_port = free_port(), free_port()
    own = OwnBroker(["--stomp-port", str(stomp_port), *opts.serve_arg],
                    Path(opts.work_dir) if opts.work_dir else None, stomp=True)
    own.port = amqp_port
    own.start()
    s = Soak(own, amqp_port, stomp_port)
    for attempt in range(10):  # the queues and exchanges, once
        try:
            await s.declare()
            break
        except Exception as e:  # noqa: BLE001 - retried, then the soak fails
            if attempt == 9:
                raise
            s.t.error("declare", e)
            await asyncio.sleep(1)
    tasks = s.tasks()
    started = time.monotonic()
    samples: list[tuple[float, int, int, int]] = []  # (s, rss, fds, disk)
    kills: list[float] = []
    next_kill = started + opts.kill_every if opts.kill_every else float("inf")
    end = started + opts.minutes * 60
    last_print = 0.0
    while time.monotonic() < end:
        await asyncio.sleep(opts.sample_every)
        now = time.monotonic()
        if own.alive():
            samples.append((now - started, rss_of(own.pid), fds_of(own.pid),
                            disk_of(own.data_dir)))
        if now >= next_kill:
            kills.append(now - started)
            own.kill()
            own.start()
            next_kill = now + opts.kill_every
            print(f"[soak {now - started:6.0f}s] kill -9 #{len(kills)}, restarted",
                  file=sys.stderr, flush=True)
        if now - last_print >= opts.progress_every and samples:
            last_print = now
            _, rss, fds, disk = samples[-1]
            print(f"[soak {now - started:6.0f}s] confirmed {len(s.t.confirmed):,} receipted "
                  f"{len(s.t.receipted):,} received {len(s.t.received):,} churn "
                  f"{s.t.churn_cycles:,} RSS {rss / 2**20:.0f} MiB fds {fds} disk "
                  f"{disk / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    s.stop_publishing = True
    await asyncio.sleep(min(30, 5 + opts.minutes))  # consumers catch up
    s.stopping = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    trouble = log_trouble(own.log_path)
    alive = own.alive()
    own.kill()  # one last crash: what is queued must survive it too
    own.start()
    left = await s.drain()
    own.stop(keep_log=True)
    strict = s.t.confirmed | s.t.receipted
    lost = sorted(strict - set(s.t.received))
    dups = sum(1 for k, c in s.t.received.items() if c > 1)
    return {"minutes": opts.minutes, "kill_every_s": opts.kill_every, "kills": len(kills),
            "confirmed_amqp": len(s.t.confirmed), "receipted_stomp": len(s.t.receipted),
            "received_distinct": len(s.t.received), "left_in_queues": left,
            "lost": len(lost), "lost_first": lost[:20], "redelivered_duplicates": dups,
            "requeued": s.t.requeued, "dead_lettered": s.t.dead_lettered,
            "auto_received": s.t.auto_received, "churn_cycles": s.t.churn_cycles,
            "reconnects": s.t.reconnects, "client_errors": s.t.errors,
            "broker_alive_at_end": alive, "log_trouble": trouble[:20],
            "slopes": slopes(samples, kills), "samples": samples, "kill_times": kills}


def slopes(samples: list[tuple[float, int, int, int]], kills: list[float]
           ) -> dict[str, object]:
    """Least-squares slopes per hour of RSS, fds, disk, over the samples after the
    first minute (the start-up ramp), and first/last/peak."""
    ss = [x for x in samples if x[0] >= 60] or samples
    if len(ss) < 3:
        return {}
    xs = [x[0] / 3600 for x in ss]
    out: dict[str, object] = {}
    for i, (name, scale) in enumerate((("rss_mib", 2**20), ("fds", 1), ("disk_mib", 2**20)),
                                      start=1):
        ys = [x[i] / scale for x in ss]
        fit = statistics.linear_regression(xs, ys)
        out[name] = {"per_hour": round(fit.slope, 2), "first": round(ys[0], 1),
                     "last": round(ys[-1], 1), "peak": round(max(ys), 1)}
    return out


def plot(result: dict[str, object], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    samples = result["samples"]
    xs = [x[0] / 60 for x in samples]  # type: ignore[union-attr]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for ax, i, label, scale in ((axes[0], 1, "broker RSS (MiB)", 2**20),
                                (axes[1], 2, "broker open fds", 1),
                                (axes[2], 3, "data dir on disk (MiB)", 2**20)):
        ax.plot(xs, [x[i] / scale for x in samples], lw=1)  # type: ignore[index]
        ax.set_ylabel(label)
        for k in result["kill_times"]:  # type: ignore[union-attr]
            ax.axvline(k / 60, color="red", lw=0.8, ls="--")
    axes[2].set_xlabel("minutes (red: kill -9 and restart)")
    kills = (f"kill -9 every {result['kill_every_s']} s" if result["kill_every_s"]
             else "no kill")
    fig.suptitle(f"ackmq soak: {result['minutes']} min, {kills}, "
                 f"{result['confirmed_amqp']:,} confirmed + "
                 f"{result['receipted_stomp']:,} receipted, lost {result['lost']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.robustness.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--kill-every", type=float, default=600.0,
                   help="seconds between kill -9 + restart (0: never)")
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds")
    p.add_argument("--progress-every", type=float, default=30.0, help="seconds")
    p.add_argument("--work-dir", help="data dir and log (default: new under /var/tmp)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `ackmq serve` argument (repeatable)")
    p.add_argument("--plot", help="write the RSS/fds/disk plot (PNG) here")
    p.add_argument("--json", help="write the summary (with the samples) here")
    args = p.parse_args(argv)
    result = asyncio.run(soak(args))
    if args.plot:
        plot(result, Path(args.plot))
    if args.json:
        Path(args.json).write_text(json.dumps(result) + "\n")
    short = {k: v for k, v in result.items() if k not in ("samples", "kill_times")}
    print(json.dumps(short, indent=2))
    ok = not result["lost"] and not result["log_trouble"] and result["broker_alive_at_end"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
