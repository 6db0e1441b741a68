"""SPEC B2 and B3 against a live broker (ackmq or RabbitMQ), figures for docs/robustness.md.

    python -m tools.robustness.conns consumers [--url URL --pid PID] --connections 1000
    python -m tools.robustness.conns halfopen  [--url URL --pid PID] --per-kind 200

`consumers` (B2): N connections with one channel each (idle), then on each an exclusive
queue bound to one fanout exchange and a consumer; a publisher's messages must reach
every one. Broker RSS is read before, with the idle connections, with the consumers
and after closing them: memory per idle connection = RSS delta / N.

`halfopen` (B3): per kind, N connections that stop mid-handshake (TCP connect and
nothing; the protocol header and nothing; header + start-ok and no tune-ok) while a
normal client publishes and gets a message every 50 ms; each half-open connection
must be dropped by the broker (its handshake timeout), the normal client never fails.

Without --url an ackmq of our own is started (--serve-arg passes `ackmq serve`
options, e.g. --serve-arg=--handshake-timeout=2). For RabbitMQ give --pid of beam.smp
(`/work/shared/tools/rabbitmq-local pid`), or it is looked up by the listening port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from pamqp import commands

from ackmq.protocol.amqp import encode_method, encode_publish
from ackmq.protocol.amqp.constants import FRAME_MAX_DEFAULT
from tools.harness.ownbroker import OwnBroker, log_trouble
from tools.harness.rawpeer import (
    PROTOCOL_HEADER,
    Peer,
    connect,
    host_port,
    open_peer,
    rss_of,
)

MiB = 2**20


async def _settled_rss(pid: int | None, wait: float = 2.0) -> int:
    """RSS once the broker had a moment to settle (0 without a pid)."""
    await asyncio.sleep(wait)
    return rss_of(pid) if pid else 0


async def _open_many(n: int, host: str, port: int, user: str, password: str, vhost: str,
                     at_once: int = 50) -> list[Peer]:
    """n connections with channel 1 open, at most `at_once` handshakes in flight (a
    storm of SYNs beyond the listen backlog is not what B2 measures)."""
    gate = asyncio.Semaphore(at_once)

    async def one() -> Peer:
        async with gate:
            return await open_peer(host, port, user, password, vhost)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def consumers(url: str, n: int, pid: int | None, messages: int = 10,
                    timeout: float = 120.0, settle: float = 2.0) -> dict[str, object]:
    host, port, user, password, vhost = host_port(url)
    exchange = f"b2.fanout.{uuid.uuid4().hex[:8]}"
    pub = await open_peer(host, port, user, password, vhost)
    await pub.call(1, commands.Exchange.Declare(exchange=exchange, exchange_type="fanout",
                                                auto_delete=True), (40, 11))
    rss0 = await _settled_rss(pid, settle)
    t0 = time.monotonic()
    peers = await _open_many(n, host, port, user, password, vhost)
    connect_s = time.monotonic() - t0
    rss_idle = await _settled_rss(pid, settle)
    got = [0] * n
    bad = [0]
    for i, p in enumerate(peers):
        def on_body(_ch: int, body: bytes, i: int = i) -> None:
            if body.startswith(b"b2-"):
                got[i] += 1
            else:
                bad[0] += 1
        p.on_body = on_body
    t1 = time.monotonic()
    oks = []
    for p in peers:
        oks.append(p.expect(1, 60, 21))
        p.write(encode_method(1, commands.Queue.Declare(queue="", exclusive=True))
                + encode_method(1, commands.Queue.Bind(queue="", exchange=exchange))
                + encode_method(1, commands.Basic.Consume(queue="", no_ack=True)))
    await asyncio.wait_for(asyncio.gather(*oks), timeout)
    consume_s = time.monotonic() - t1
    rss_consumers = await _settled_rss(pid, settle)
    t2 = time.monotonic()
    for k in range(messages):
        pub.write(encode_publish(1, exchange, "", False, False, b"\x00\x00", b"b2-%d" % k,
                                 FRAME_MAX_DEFAULT))
    deadline = time.monotonic() + timeout
    while min(got) < messages and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    fanout_s = time.monotonic() - t2
    served = sum(1 for g in got if g == messages)
    lost = [p.describe() for p in peers if p.closed.done()]
    for p in peers:
        p.abort()
    rss_after = await _settled_rss(pid, settle * 1.5)
    pub.write(encode_method(1, commands.Exchange.Delete(exchange=exchange)))
    pub.abort()

    def per(a: int, b: int) -> float | None:
        return round((b - a) / n / 1024, 1) if pid else None

    return {
        "connections": n, "messages": messages,
        "served_all_messages": served, "extra_bodies": bad[0],
        "dropped_connections": len(lost), "dropped_first": lost[:5],
        "connect_s": round(connect_s, 2), "consume_setup_s": round(consume_s, 2),
        "fanout_delivered_s": round(fanout_s, 2),
        "rss_mib": {k: round(v / MiB, 1) for k, v in (
            ("before", rss0), ("idle_connections", rss_idle),
            ("with_consumers", rss_consumers), ("after_close", rss_after))} if pid else None,
        "kib_per_idle_connection": per(rss0, rss_idle),
        "kib_per_connection_with_consumer": per(rss0, rss_consumers),
    }


KINDS = ("tcp", "header", "startok")


async def _half_open(host: str, port: int, kind: str, user: str, password: str
                     ) -> tuple[Peer, float]:
    # the clock starts before connect: the broker's handshake timer starts at its accept,
    # which on a loaded machine can be well before this loop sees connect() return
    t0 = time.monotonic()
    peer = await connect(host, port)
    if kind == "header":
        peer.write(PROTOCOL_HEADER)
    elif kind == "startok":
        # the header and start-ok, never the tune-ok
        peer.write(PROTOCOL_HEADER + encode_method(0, commands.Connection.StartOk(
            client_properties={"product": "ackmq-robustness"}, mechanism="PLAIN",
            response=f"\0{user}\0{password}")))
    return peer, t0


async def halfopen(url: str, per_kind: int, pid: int | None, expect_timeout: float,
                   kinds: tuple[str, ...] = KINDS) -> dict[str, object]:
    host, port, user, password, vhost = host_port(url)
    normal = await open_peer(host, port, user, password, vhost)
    q = (await normal.call(1, commands.Queue.Declare(queue="", exclusive=True), (50, 11)))
    qname = q[5:5 + q[4]].decode()
    rtts: list[float] = []
    failures: list[str] = []
    stop = asyncio.Event()

    async def roundtrips() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            t = time.monotonic()
            body: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            normal.on_body = lambda _ch, b, f=body: f.done() or f.set_result(b)
            normal.write(encode_publish(1, "", qname, False, False, b"\x00\x00",
                                        b"n%d" % k, FRAME_MAX_DEFAULT))
            normal.write(encode_method(1, commands.Basic.Get(queue=qname, no_ack=True)))
            try:
                got = await asyncio.wait_for(body, 10)
                if got != b"n%d" % k:
                    failures.append(f"got {got!r} for n{k}")
                rtts.append(time.monotonic() - t)
            except (TimeoutError, ConnectionError) as exc:
                failures.append(f"round trip {k}: {exc!r}")
                return
            await asyncio.sleep(0.05)

    rt = asyncio.create_task(roundtrips())
    rss0 = rss_of(pid) if pid else 0
    results: dict[str, object] = {}
    opened = []
    for kind in kinds:
        opened += [(kind, await _half_open(host, port, kind, user, password))
                   for _ in range(per_kind)]
    rss_open = rss_of(pid) if pid else 0
    wait_until = time.monotonic() + expect_timeout + 30
    while time.monotonic() < wait_until and not all(p.closed.done() for _, (p, _) in opened):
        await asyncio.sleep(0.1)
    stop.set()
    await rt
    for kind in kinds:
        mine = [(p, t0) for k, (p, t0) in opened if k == kind]
        drops = sorted(p.eof_at - t0 for p, t0 in mine if p.eof_at is not None)
        closes = sorted({p.close_code for p, _ in mine if p.close_code is not None})
        results[kind] = {
            "connections": len(mine), "dropped": len(drops),
            "drop_s": {"min": round(drops[0], 2), "median": round(statistics.median(drops), 2),
                       "max": round(drops[-1], 2)} if drops else None,
            "connection_close_codes": closes,
        }
    for p, _ in (x[1] for x in opened):
        p.abort()
    normal.abort()
    return {
        "per_kind": per_kind, "expected_timeout_s": expect_timeout, "kinds": results,
        "normal_client": {"round_trips": len(rtts), "failures": failures[:5],
                          "rtt_ms": {"median": round(statistics.median(rtts) * 1000, 1),
                                     "max": round(max(rtts) * 1000, 1)} if rtts else None},
        "rss_mib": {"before": round(rss0 / MiB, 1), "half_open": round(rss_open / MiB, 1)}
        if pid else None,
    }


def _find_pid(port: int) -> int | None:
    from ackmq.bench.brokers import find_listener_pid
    return find_listener_pid(port)


async def _main_async(args: argparse.Namespace) -> int:
    own = None
    url, pid = args.url, args.pid
    if url is None:
        own = OwnBroker(args.serve_arg or [], Path(args.work_dir) if args.work_dir else None)
        url = own.start()
        pid = own.pid
    elif pid is None:
        pid = _find_pid(host_port(url)[1])
    out: dict[str, object] = {"ok": False}
    try:
        if args.what == "consumers":
            out = await consumers(url, args.connections, pid, args.messages)
            ok = out["served_all_messages"] == args.connections
        else:
            out = await halfopen(url, args.per_kind, pid, args.expect_timeout)
            kinds = out["kinds"]
            ok = (all(k["dropped"] == k["connections"] for k in kinds.values())  # type: ignore[union-attr]
                  and not out["normal_client"]["failures"])  # type: ignore[index]
        out["broker_pid"] = pid
        out["ok"] = ok
        if own is not None:
            out["log_trouble"] = log_trouble(own.log_path)[:10]
            out["ok"] = ok and not out["log_trouble"] and own.alive()
    finally:
        if own is not None:
            own.stop(keep_log=not out["ok"])
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if out["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.robustness.conns", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("consumers", "halfopen"))
    p.add_argument("--url", help="a running broker (default: start an ackmq of our own)")
    p.add_argument("--pid", type=int, help="the broker's pid (RSS); default: by port")
    p.add_argument("--serve-arg", action="append", help="extra `ackmq serve` argument")
    p.add_argument("--work-dir", help="data dir and log of our own broker")
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--messages", type=int, default=10)
    p.add_argument("--per-kind", type=int, default=200)
    p.add_argument("--expect-timeout", type=float, default=10.0,
                   help="the broker's handshake timeout (s): how long to wait for drops")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    raise_fd_limit(4 * max(args.connections, 3 * args.per_kind) + 256)
    return asyncio.run(_main_async(args))


def raise_fd_limit(want: int) -> None:
    """Many sockets in one process: lift the soft descriptor limit toward the hard one."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    except (ImportError, ValueError, OSError):
        pass


if __name__ == "__main__":
    sys.exit(main())
