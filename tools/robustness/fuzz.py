"""SPEC B1 against a live broker: valid client sessions, frame by frame mutated, replayed
over many concurrent connections while a durable publisher publishes persistent
messages with confirms the whole time.

    python -m tools.robustness.fuzz --frames 1000000          # starts its own ackmq
    python -m tools.robustness.fuzz --url amqp://... --broker-pid PID --broker-log FILE

Criteria (exit 1 if one fails): the broker process stays alive with no traceback in its
log; every mutated connection ends with a connection.close, a protocol-header reply or
a dropped socket within a bound (a connection still open once its stream has been
sent is given frame-max bytes of 0xCE, which completes any partial frame, and must then
end); what the broker writes is well framed; every message the parallel publisher got
a confirm for is there afterwards, body intact (after a SIGKILL and restart when the
broker is our own); broker RSS is sampled throughout. Results in docs/robustness.md.

The seed sessions and the byte mutator are shared with tests/test_decoder_hostile.py
(its sans-IO property test), so the live run and the decoder test mutate alike.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import random
import re
import ssl
import struct
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from ackmq.protocol.amqp import encode_method, encode_publish
from tools.harness.ownbroker import OwnBroker, log_trouble
from tools.harness.rawpeer import (
    FRAME_MAX,
    PROTOCOL_HEADER,
    Peer,
    connect,
    host_port,
    open_peer,
    rss_of,
)

_U32 = struct.Struct(">I")
TAG = b"@@@@@@@@"  # replaced per connection by 8 hex digits (names stay the same length)
CONFIRMED_QUEUE = "robust.confirmed"
MAX_DEPTH = 100  # ackmq's MAX_TABLE_DEPTH: seeds nest right up to it


# ---- frames ---------------------------------------------------------------------------

def raw_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


def method(channel: int, m: object) -> bytes:
    return frame.marshal(m, channel)


def every_type_table() -> bytes:
    """A field table with one value of every type RabbitMQ's parser knows, nested ones
    included (raw: pamqp's encoder cannot produce u, B, f, L or an explicit D)."""
    entries = [
        b"t" + b"\x01", b"b" + struct.pack(">b", -5), b"B" + b"\xfa",
        b"s" + struct.pack(">h", -300), b"u" + struct.pack(">H", 60000),
        b"I" + struct.pack(">i", -70000), b"i" + struct.pack(">I", 4000000000),
        b"l" + struct.pack(">q", -(2**40)), b"L" + struct.pack(">q", 2**40),
        b"f" + struct.pack(">f", 1.5), b"d" + struct.pack(">d", -2.25),
        b"D" + struct.pack(">Bi", 2, 12345), b"S" + _U32.pack(5) + b"hello",
        b"x" + _U32.pack(3) + b"\x00\xff\x10",
        b"T" + struct.pack(">Q", 1_700_000_000), b"V",
        b"A" + _U32.pack(9) + b"t\x00" + b"S" + _U32.pack(2) + b"ab",
        b"F" + _U32.pack(5) + b"\x02inB\x07",
    ]
    body = b"".join(bytes((len(f"k{i}"),)) + f"k{i}".encode() + e
                    for i, e in enumerate(entries))
    return _U32.pack(len(body)) + body


def every_property() -> bytes:
    """Raw content-header properties with all 14 fields set, headers of every type."""
    table = every_type_table()
    short = [b"\x10application/json", b"\x04gzip"]
    tail = (b"\x02" + b"\x05" + b"\x04corr" + b"\x05reply" + b"\x0560000" + b"\x03mid"
            + struct.pack(">Q", 1_700_000_000) + b"\x04type" + b"\x05guest" + b"\x03app"
            + b"\x07cluster")
    return struct.pack(">H", 0xFFFC) + b"".join(short) + table + tail


def nested_tables(depth: int) -> bytes:
    """A field table `depth` levels deep: {"k": {"k": ... {"v": true}}}."""
    entry = b"\x01vt\x01"
    table = _U32.pack(len(entry)) + entry
    for _ in range(depth - 1):
        entry = b"\x01kF" + table
        table = _U32.pack(len(entry)) + entry
    return table


def _short(s: bytes) -> bytes:
    return bytes((len(s),)) + s


def _content(channel: int, properties: bytes, body: bytes, split: int = 0) -> list[bytes]:
    """A content header with raw properties + body frames (split in two at `split`)."""
    out = [raw_frame(2, channel, struct.pack(">HHQ", 60, 0, len(body)) + properties)]
    parts = [body[:split], body[split:]] if split else [body]
    return out + [raw_frame(3, channel, p) for p in parts]


def live_session() -> list[bytes]:
    """One client's frames for a whole session that runs cleanly on a live broker when
    unmutated (checked by tests/test_robustness_fuzz.py): handshake, exchange and queue
    declares with argument tables of every field type, a binding, qos, confirms,
    publishes with every property, a split body, a return, headers nested to the
    bound, get/ack/reject/nack, a transaction committed and one rolled back, a
    consumer with recover and cancel, heartbeats, unbind/purge/delete, closes. Names
    hold TAG (unique per connection); the queue is exclusive (gone with the
    connection) and the exchange auto-delete."""
    q, x = b"fz.q." + TAG, b"fz.x." + TAG
    qs, xs = q.decode(), x.decode()
    args, props = every_type_table(), every_property()
    deep = struct.pack(">H", 0x2000) + nested_tables(MAX_DEPTH)
    basic = commands.Basic
    f: list[bytes] = [PROTOCOL_HEADER]
    f.append(method(0, commands.Connection.StartOk(
        client_properties={"product": "ackmq-fuzz", "capabilities": {
            "publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True}},
        mechanism="PLAIN", response="\0guest\0guest")))
    f.append(method(0, commands.Connection.TuneOk(2047, FRAME_MAX, 60)))
    f.append(method(0, commands.Connection.Open("/")))
    f.append(method(1, commands.Channel.Open()))
    f.append(raw_frame(1, 1, struct.pack(">HHH", 40, 10, 0) + _short(x) + _short(b"direct")
                       + b"\x04" + args))
    f.append(raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + _short(q) + b"\x04" + args))
    f.append(method(1, commands.Queue.Bind(queue=qs, exchange=xs, routing_key="k",
                                           arguments={"a": 1, "b": [1, "x"]})))
    f.append(method(1, basic.Qos(0, 10, False)))
    f.append(method(1, commands.Confirm.Select()))
    f.append(method(1, basic.Publish(exchange="", routing_key=qs)))
    f += _content(1, props, b"hello")
    f.append(method(1, basic.Publish(exchange=xs, routing_key="k", mandatory=True)))
    f += _content(1, props, b"b" * 300, split=100)
    f.append(method(1, basic.Publish(exchange=xs, routing_key="nokey", mandatory=True)))
    f += _content(1, b"\x10\x00\x01", b"returned")
    f.append(method(1, basic.Publish(exchange="", routing_key=qs)))
    f += _content(1, deep, b"deep")
    f += [method(1, basic.Get(queue=qs)) for _ in range(3)]
    f.append(method(1, basic.Ack(1, False)))
    f.append(method(1, basic.Reject(2, False)))
    f.append(method(1, basic.Nack(3, False, True)))
    f.append(raw_frame(8, 0, b""))
    f.append(method(2, commands.Channel.Open()))
    f.append(method(2, commands.Tx.Select()))
    f.append(method(2, basic.Publish(routing_key=qs)))
    f.append(frame.marshal(ContentHeader(0, 3, basic.Properties(
        message_id="m", delivery_mode=2, headers={"h": {"n": [1, 2.5, None]}},
        timestamp=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))), 2))
    f.append(frame.marshal(ContentBody(b"abc"), 2))
    f.append(method(2, basic.Get(queue=qs)))
    f.append(method(2, basic.Ack(1, False)))
    f.append(method(2, commands.Tx.Commit()))
    f.append(method(2, basic.Publish(routing_key=qs)))
    f += _content(2, b"\x00\x00", b"rolled back")
    f.append(method(2, commands.Tx.Rollback()))
    f.append(method(3, commands.Channel.Open()))
    f.append(method(3, basic.Qos(0, 2, False)))
    f.append(method(3, basic.Consume(queue=qs, consumer_tag="c3",
                                     arguments={"x-priority": 5})))
    f.append(method(3, basic.Recover(True)))
    f.append(method(3, basic.Cancel("c3")))
    f.append(method(3, commands.Channel.Close(200, "bye", 0, 0)))
    f.append(method(1, commands.Queue.Unbind(queue=qs, exchange=xs, routing_key="k")))
    f.append(method(1, commands.Queue.Purge(queue=qs)))
    f.append(method(1, commands.Exchange.Delete(exchange=xs)))
    f.append(method(1, commands.Queue.Delete(queue=qs)))
    f.append(method(2, commands.Channel.Close(200, "bye", 0, 0)))
    f.append(method(1, commands.Channel.Close(200, "bye", 0, 0)))
    f.append(method(0, commands.Connection.Close(200, "bye", 0, 0)))
    return f


# ---- mutations ------------------------------------------------------------------------

# A mutation is (kind, where as a fraction of the data, a number, a blob).
KINDS = ("flip", "set", "insert", "delete", "len32", "dup", "truncate", "len8", "len16",
         "len64")
INTERESTING_32 = (0, 1, 2, 3, 4, 7, 0x7F, 0xFF, 0x100, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                  0xFFFFFFFF)
_INTERESTING_8 = (0, 1, 0x7F, 0x80, 0xFE, 0xFF)
_INTERESTING_16 = (0, 1, 0x7FFF, 0x8000, 0xFFFF, 10, 20, 40, 50, 60, 85, 90)  # + class ids
_INTERESTING_64 = (0, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 128 * 1024 * 1024 + 1)
# bytes that mean something on the wire: frame end, frame types, a header, a table type
SPECIAL = (b"\xce", b"\x00", b"\xff", b"\x01", b"\x02", b"\x03", b"\x08", PROTOCOL_HEADER,
           b"F\xff\xff\xff\xff", b"A\x00\x00\x00\x00", b"S\x7f\xff\xff\xff", b"V", b"\xce\x01")


def mutate(data: bytes, ops: list[tuple[str, float, int, bytes]]) -> bytes:
    """Apply byte-level mutations: what a fuzzer does to a valid stream."""
    buf = bytearray(data)
    for kind, where, number, blob in ops:
        if not buf:
            break
        i = min(int(where * len(buf)), len(buf) - 1)
        if kind == "flip":
            buf[i] ^= 1 << (number % 8)
        elif kind == "set":
            buf[i] = number & 0xFF
        elif kind == "insert":
            buf[i:i] = blob
        elif kind == "delete":
            del buf[i:i + 1 + number % 16]
        elif kind == "len32":  # rewrite what may be a length field
            buf[i:i + 4] = _U32.pack(INTERESTING_32[number % len(INTERESTING_32)]
                                     if number % 3 else number)
        elif kind == "dup":
            buf[i:i] = buf[i:i + 1 + number % 64]
        elif kind == "truncate":
            del buf[i:]
        elif kind == "len8":  # a short-string length, a bit field
            buf[i] = _INTERESTING_8[number % len(_INTERESTING_8)]
        elif kind == "len16":  # a class or method id, a channel, a reply code
            buf[i:i + 2] = struct.pack(">H", _INTERESTING_16[number % len(_INTERESTING_16)])
        elif kind == "len64":  # a body size, a delivery tag
            buf[i:i + 8] = struct.pack(">Q", _INTERESTING_64[number % len(_INTERESTING_64)])
    return bytes(buf)


def random_ops(rnd: random.Random) -> list[tuple[str, float, int, bytes]]:
    """1-3 byte mutations; inserted blobs are often bytes that mean something."""
    ops = []
    for _ in range(rnd.randint(1, 3)):
        blob = rnd.choice(SPECIAL) if rnd.random() < 0.6 else rnd.randbytes(rnd.randint(1, 8))
        ops.append((rnd.choice(KINDS), rnd.random(), rnd.getrandbits(32), blob))
    return ops


def mutate_session(frames: list[bytes], rnd: random.Random, mean: float = 4.0
                   ) -> tuple[bytes, int]:
    """The session with some frames mutated; returns (bytes, frames mutated). Most
    mutations change bytes inside a frame; some work on whole frames (drop, repeat,
    swap with the next, replace by random bytes)."""
    out = list(frames)
    count = min(len(out), max(1, int(rnd.expovariate(1 / mean)) + 1))
    picked = sorted(rnd.sample(range(len(out)), count), reverse=True)
    for i in picked:
        r = rnd.random()
        if r < 0.05:
            out[i] = b""  # dropped
        elif r < 0.10:
            out[i] = out[i] * rnd.randint(2, 4)
        elif r < 0.14 and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
        elif r < 0.16:
            out[i] = rnd.randbytes(rnd.randint(1, 64))
        else:
            out[i] = mutate(out[i], random_ops(rnd))
    return b"".join(out), count


# ---- one mutated connection -------------------------------------------------------------

@dataclass
class Stats:
    sessions: int = 0
    frames_mutated: int = 0
    bytes_sent: int = 0
    outcomes: Counter = field(default_factory=Counter)
    padded: int = 0
    connect_errors: int = 0
    hung: list[str] = field(default_factory=list)       # hex of the streams
    bad_output: list[str] = field(default_factory=list)
    longest_end_s: float = 0.0


async def send_until_end(peer: Any, data: bytes, pad: Callable[[], None], stats: Stats,
                         settle: float, bound: float) -> bool | None:
    """Write `data`; when the broker has not ended the connection after `settle` s, `pad`
    (bytes that must end any session) and wait `bound` s more. Returns whether it padded;
    None for a connection still open then (recorded in `stats` as hung)."""
    peer.write(data)
    stats.bytes_sent += len(data)
    try:
        await asyncio.wait_for(asyncio.shield(peer.closed), settle)
        return False
    except TimeoutError:
        stats.padded += 1
        pad()
    try:
        await asyncio.wait_for(asyncio.shield(peer.closed), bound)
    except TimeoutError:
        stats.hung.append(data.hex())
        stats.outcomes["HUNG"] += 1
        return None
    return True


async def run_mutated(host: str, port: int, data: bytes, stats: Stats,
                      settle: float = 1.0, bound: float = 15.0,
                      connector: Callable[[], Awaitable[Peer]] | None = None) -> None:
    """Send one mutated stream; wait for the end of the connection (see the module
    doc); record the outcome. `connector` opens the connection another way (TLS)."""
    try:
        peer = await (asyncio.wait_for(connector(), 30) if connector else connect(host, port, 30))
    except (OSError, TimeoutError, ssl.SSLError):
        stats.connect_errors += 1
        return
    try:
        start = time.monotonic()
        padded = await send_until_end(peer, data, lambda: peer.write(b"\xce" * (FRAME_MAX + 8)),
                                      stats, settle, bound)
        if padded is None:
            return
        stats.longest_end_s = max(stats.longest_end_s, time.monotonic() - start)
        if peer.bad_output:
            stats.bad_output.append(peer.bad_output)
        if peer.close_code is not None:
            what = f"connection.close {peer.close_code}"
        elif peer.close_ok:
            what = "connection.close-ok (ran to its end)"
        elif peer.protocol_header_reply:
            what = "protocol header, then closed"
        else:
            what = "socket closed without connection.close"
        stats.outcomes[what + (" (after padding)" if padded else "")] += 1
    finally:
        peer.abort()


# ---- the durable publisher beside it --------------------------------------------------------

def confirmed_body(seq: int) -> bytes:
    """A body that can be checked: the sequence number and 0-1,280 bytes derived from it."""
    digest = hashlib.sha256(str(seq).encode()).digest()
    return b"%010d:" % seq + digest * (seq % 41)


@dataclass
class Publisher:
    """Persistent messages with confirms, a bounded window in flight, all the time."""

    host: str
    port: int
    user: str
    password: str
    vhost: str
    rate: float = 500.0
    window: int = 50
    published: int = 0
    confirmed: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    error: str = ""
    _stop: bool = False

    async def run(self) -> None:
        try:
            await self._run()
        except Exception as exc:  # noqa: BLE001 - reported as a failed criterion
            self.error = f"{type(exc).__name__}: {exc}"

    async def _run(self) -> None:
        peer = await open_peer(self.host, self.port, self.user, self.password, self.vhost)
        self.peer = peer
        await peer.call(1, commands.Queue.Declare(queue=CONFIRMED_QUEUE, durable=True), (50, 11))
        await peer.call(1, commands.Confirm.Select(), (85, 11))
        unconfirmed: set[int] = set()
        room = asyncio.Event()
        room.set()

        def on_confirm(tag: int, multiple: bool, ack: bool) -> None:
            done = [t for t in unconfirmed if t <= tag] if multiple else [tag]
            for t in done:
                unconfirmed.discard(t)
                (self.confirmed if ack else self.nacked).add(t)
            if len(unconfirmed) < self.window:
                room.set()

        peer.on_confirm = on_confirm
        props = b"\x10\x00\x02"  # delivery-mode 2
        started = time.monotonic()
        while not self._stop:
            if peer.closed.done():
                raise ConnectionError(f"publisher connection lost: {peer.describe()}")
            if len(unconfirmed) >= self.window:
                room.clear()
                await asyncio.wait_for(room.wait(), 60)
                continue
            self.published += 1
            unconfirmed.add(self.published)
            peer.write(encode_publish(1, "", CONFIRMED_QUEUE, False, False, props,
                                      confirmed_body(self.published), FRAME_MAX))
            ahead = self.published / self.rate - (time.monotonic() - started)
            await asyncio.sleep(max(ahead, 0))
        deadline = time.monotonic() + 60
        while unconfirmed and time.monotonic() < deadline and not peer.closed.done():
            await asyncio.sleep(0.05)
        peer.write(encode_method(0, commands.Connection.Close(200, "bye", 0, 0)))
        await asyncio.wait_for(asyncio.shield(peer.closed), 10)

    def stop(self) -> None:
        self._stop = True


async def drain_confirmed(host: str, port: int, user: str, password: str, vhost: str,
                          expect: int, idle: float = 3.0) -> list[bytes]:
    """Every message of CONFIRMED_QUEUE (consumed with auto-ack, so the queue empties)."""
    peer = await open_peer(host, port, user, password, vhost)
    bodies: list[bytes] = []
    peer.on_body = lambda _ch, body: bodies.append(body)
    await peer.call(1, commands.Basic.Consume(queue=CONFIRMED_QUEUE, no_ack=True), (60, 21),
                    timeout=300)
    last, seen = time.monotonic(), 0
    while time.monotonic() - last < idle and not peer.closed.done():
        await asyncio.sleep(0.1)
        if len(bodies) != seen:
            seen, last = len(bodies), time.monotonic()
        if len(bodies) >= expect:
            idle = 0.5  # anything after the last one would be a duplicate: look briefly
    peer.abort()
    return bodies


def check_confirmed(bodies: list[bytes], confirmed: set[int]) -> dict[str, object]:
    seqs = Counter()
    corrupt = 0
    for body in bodies:
        m = re.match(rb"(\d{10}):", body)
        if not m or body != confirmed_body(int(m.group(1))):
            corrupt += 1
            continue
        seqs[int(m.group(1))] += 1
    missing = sorted(confirmed - set(seqs))
    return {"confirmed": len(confirmed), "drained": len(bodies), "missing": len(missing),
            "missing_first": missing[:20], "corrupt": corrupt,
            "duplicated": sum(1 for c in seqs.values() if c > 1)}


# ---- the run ------------------------------------------------------------------------------

@dataclass
class Options:
    frames: int = 1_000_000
    concurrency: int = 200
    seed: int = 1
    mean_mutations: float = 4.0
    publish_rate: float = 500.0
    settle: float = 1.0
    bound: float = 15.0
    restart: bool = True
    progress_every: float = 10.0


async def fuzz(url: str, opts: Options, broker_pid: int | None = None,
               quiet: bool = False) -> dict[str, object]:
    """Run the mutated sessions and the publisher; returns the figures (no verdict on
    the broker's process or log: the caller owns those)."""
    host, port, user, password, vhost = host_port(url)
    seed_frames = live_session()
    rnd = random.Random(opts.seed)
    stats = Stats()
    pub = Publisher(host, port, user, password, vhost, rate=opts.publish_rate)
    pub_task = asyncio.create_task(pub.run())
    rss: list[tuple[float, int, int]] = []  # (seconds, bytes, frames mutated so far)
    started = time.monotonic()
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            if broker_pid:
                rss.append((round(time.monotonic() - started, 1), rss_of(broker_pid),
                            stats.frames_mutated))
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass

    async def report() -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), opts.progress_every)
            except TimeoutError:
                pass
            if quiet:
                continue
            el = time.monotonic() - started
            mem = f", broker RSS {rss[-1][1] / 2**20:.0f} MiB" if rss else ""
            print(f"[fuzz {el:6.0f}s] {stats.frames_mutated:,}/{opts.frames:,} mutated frames"
                  f", {stats.sessions:,} connections ({stats.sessions / max(el, 1e-9):.0f}/s)"
                  f", padded {stats.padded:,}, hung {len(stats.hung)}"
                  f", confirmed {len(pub.confirmed):,}{mem}", file=sys.stderr, flush=True)

    async def worker(wid: int) -> None:
        wrnd = random.Random(rnd.getrandbits(64))
        while stats.frames_mutated < opts.frames and not pub.error:
            tag = b"%08x" % wrnd.getrandbits(32)
            data, count = mutate_session([f.replace(TAG, tag) for f in seed_frames], wrnd,
                                         opts.mean_mutations)
            stats.sessions += 1
            stats.frames_mutated += count
            await run_mutated(host, port, data, stats, opts.settle, opts.bound)

    helpers = [asyncio.create_task(sample()), asyncio.create_task(report())]
    await asyncio.sleep(0.5)  # the publisher first
    await asyncio.gather(*(worker(i) for i in range(opts.concurrency)))
    elapsed = time.monotonic() - started
    pub.stop()
    await pub_task
    stop.set()
    await asyncio.gather(*helpers)
    return {"stats": stats, "publisher": pub, "rss": rss, "elapsed_s": elapsed,
            "host": host, "port": port, "user": user, "password": password, "vhost": vhost}


def summarize(result: dict[str, object], check: dict[str, object], trouble: list[str],
              alive: bool, opts: Options) -> dict[str, object]:
    stats: Stats = result["stats"]  # type: ignore[assignment]
    pub: Publisher = result["publisher"]  # type: ignore[assignment]
    rss: list[tuple[float, int, int]] = result["rss"]  # type: ignore[assignment]
    values = [r[1] for r in rss if r[1]]
    summary = {
        "options": asdict(opts),
        "elapsed_s": round(float(result["elapsed_s"]), 1),  # type: ignore[arg-type]
        "connections": stats.sessions, "frames_mutated": stats.frames_mutated,
        "bytes_sent": stats.bytes_sent, "connect_errors": stats.connect_errors,
        "padded": stats.padded, "hung": len(stats.hung),
        "longest_end_s": round(stats.longest_end_s, 2),
        "bad_output": stats.bad_output[:20], "outcomes": dict(stats.outcomes.most_common()),
        "publisher": {"published": pub.published, "confirmed": len(pub.confirmed),
                      "nacked": len(pub.nacked), "error": pub.error},
        "confirmed_check": check,
        "broker_alive": alive, "log_trouble": trouble[:20],
        "rss_mib": {"first": round(values[0] / 2**20, 1) if values else None,
                    "peak": round(max(values) / 2**20, 1) if values else None,
                    "last": round(values[-1] / 2**20, 1) if values else None,
                    "by_tenth": [round(values[min(len(values) - 1, len(values) * i // 10)]
                                       / 2**20, 1) for i in range(1, 11)] if values else []},
    }
    problems = []
    if not alive:
        problems.append("the broker died")
    if trouble:
        problems.append(f"{len(trouble)} traceback line(s) in the broker log")
    if stats.hung:
        problems.append(f"{len(stats.hung)} hung connection(s)")
    if stats.bad_output:
        problems.append(f"{len(stats.bad_output)} malformed frame(s) from the broker")
    if pub.error:
        problems.append(f"publisher: {pub.error}")
    if check.get("missing") or check.get("corrupt"):
        problems.append(f"confirmed messages: {check}")
    summary["problems"] = problems
    return summary


async def _main_async(args: argparse.Namespace) -> int:
    opts = Options(frames=args.frames, concurrency=args.concurrency, seed=args.seed,
                   mean_mutations=args.mean_mutations, publish_rate=args.publish_rate,
                   restart=not args.no_restart, progress_every=args.progress_every)
    own = None
    log_path: Path | None = Path(args.broker_log) if args.broker_log else None
    pid = args.broker_pid
    url = args.url
    if url is None:
        own = OwnBroker(args.serve_arg or [], Path(args.work_dir) if args.work_dir else None)
        url = own.start()
        pid, log_path = own.pid, own.log_path
        print(f"[fuzz] ackmq pid {pid}, log {log_path}", file=sys.stderr)
    passed = False
    try:
        result = await fuzz(url, opts, pid)
        alive = own.alive() if own else (pid is None or rss_of(pid) > 0)
        trouble = log_trouble(log_path)
        pub: Publisher = result["publisher"]  # type: ignore[assignment]
        if own is not None and opts.restart and alive:
            own.kill()  # the confirmed messages must survive a crash too
            url = own.start()
        host, port, user, password, vhost = host_port(url)
        bodies = await drain_confirmed(host, port, user, password, vhost,
                                       len(pub.confirmed) + len(pub.nacked))
        check = check_confirmed(bodies, pub.confirmed)
        check["after_sigkill_restart"] = own is not None and opts.restart and alive
        summary = summarize(result, check, trouble + log_trouble(log_path)[len(trouble):],
                            alive, opts)
        passed = not summary["problems"]
    finally:
        if own is not None:
            own.stop(keep_log=not passed)
    stats: Stats = result["stats"]  # type: ignore[assignment]
    if stats.hung and args.hung_file:
        Path(args.hung_file).write_text("\n".join(stats.hung) + "\n")
    text = json.dumps(summary, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 1 if summary["problems"] else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.robustness.fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running broker (default: start an ackmq of our own)")
    p.add_argument("--broker-pid", type=int, help="its pid (RSS samples, alive check)")
    p.add_argument("--broker-log", help="its log (scanned for tracebacks)")
    p.add_argument("--serve-arg", action="append",
                   help="extra `ackmq serve` argument for our own broker (repeatable)")
    p.add_argument("--work-dir", help="data dir and log of our own broker (default: a new "
                   "directory under /var/tmp, removed at the end but for the log of a failed run)")
    p.add_argument("--frames", type=int, default=1_000_000, help="mutated frames to send")
    p.add_argument("--concurrency", type=int, default=200, help="connections at once")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mean-mutations", type=float, default=4.0,
                   help=f"mean mutated frames per connection (of {len(live_session())})")
    p.add_argument("--publish-rate", type=float, default=500.0,
                   help="persistent messages/s of the confirmed publisher beside the fuzz")
    p.add_argument("--no-restart", action="store_true",
                   help="drain without the SIGKILL + restart of our own broker")
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds")
    p.add_argument("--json", help="write the summary here too")
    p.add_argument("--hung-file", help="write the streams of hung connections here (hex)")
    args = p.parse_args(argv)
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard, max(soft, 4 * args.concurrency + 256))
        if want > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass
    return asyncio.run(_main_async(args))


if __name__ == "__main__":
    sys.exit(main())
