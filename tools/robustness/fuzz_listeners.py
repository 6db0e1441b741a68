"""SPEC B1 on every listener: the live mutation fuzzer of fuzz.py, extended from AMQP to
STOMP, AMQPS and STOMP over TLS (inside the TLS session, and against the TLS handshake
itself), the admin socket (<data dir>/ctl.sock, JSON lines) and the management HTTP
listener, plain and over TLS (`https`: the `http` sessions inside the TLS session), each with fuzz.py's confirmed durable publisher alongside.

    python -m tools.robustness.fuzz_listeners --listener stomp --frames 1000000
    python -m tools.robustness.fuzz_listeners --listener all --frames 3000

Per mutated connection: write the mutated session at once; if the broker has not
closed the connection after `settle` seconds, write the listener's padding (bytes that
complete any partial frame, then end the session: 0xCE for AMQP, NULs for STOMP, a blank
line for HTTP and JSON lines) and, where the transport can, half-close (EOF); the broker
must then close within `bound` seconds, else the connection counts as **hung**. What
the broker wrote is judged per protocol (no 5xx from HTTP, every admin reply a JSON
object and none an "internal error", every STOMP ERROR with a `message`). At the end:
no traceback in the broker log, the broker alive, and after a SIGKILL and restart every
confirmed message of the publisher there, intact (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.harness.ownbroker import OwnBroker, log_trouble
from tools.harness.rawpeer import Peer, host_port, rss_of
from tools.robustness import fuzz
from tools.robustness import fuzz_seeds as seeds

LISTENERS = ("amqp10", "stomp", "amqps", "amqps-handshake", "stomps", "stomps-handshake", "admin",
             "http", "https", "stream", "mqtt")
MAX_MESSAGE = 65536  # our broker's --max-message-size: STOMP padding completes any body
OUT_KEEP = 256 * 1024


class Stream(asyncio.Protocol):
    """Bytes in (the first OUT_KEEP kept), `closed` when the broker ends it."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.total = 0
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        if len(self.out) < OUT_KEEP:
            self.out += data[:OUT_KEEP - len(self.out)]

    def eof_received(self) -> bool:
        self._done()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def _done(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # end a TLS session with close_notify: asyncio's TLS transport cannot half-close,
    # and the HTTP listener, unlike STOMP, has no padding that ends every session (a
    # keep-alive connection waits for the next request; a body may be 64 MiB)
    close_tls = False

    def end(self) -> None:
        """Half-close where the transport can (TCP, Unix); over TLS, with `close_tls`,
        close_notify (what the broker writes after it is then not read)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if t.can_write_eof():
            try:
                t.write_eof()
            except OSError:  # the broker has already closed
                pass
        elif self.close_tls:
            t.close()  # flushes the padding, then close_notify; `closed` when the broker ends


# ---- judging what the broker wrote ------------------------------------------------------

Verdict = tuple[str, str]  # (outcome label, problem or "")


def judge_stomp(out: bytes) -> Verdict:
    """The last ERROR (its headers must hold a `message`), else the last frame."""
    errors = [m.end() for m in re.finditer(rb"(?:^|\x00)[\r\n]*ERROR\r?\n", out)]
    if errors:
        head = out[errors[-1]:].split(b"\n\n", 1)[0]
        m = re.search(rb"^message:(.*)$", head, re.M)
        if not m or not m.group(1).strip():
            return "ERROR", f"ERROR without message: {head[:200]!r}"
        text = re.sub(rb"\d+|fz\.[0-9a-f]{8}", b"N", m.group(1))[:60]
        return f"ERROR {text.decode(errors='replace')}", ""
    last = re.findall(rb"(?:^|\x00)[\r\n]*(CONNECTED|RECEIPT|MESSAGE)\r?\n", out)
    if last:
        return f"closed after {last[-1].decode()}", ""
    if out.strip(b"\r\n"):
        return "bad output", f"unexpected STOMP output {out[:200]!r}"
    return "closed, nothing written", ""


def judge_amqp10(out: bytes) -> Verdict:
    """The broker's output read with ackmq's own 1.0 decoder: the close's condition, or
    the last performative; output it cannot read is a problem (cut at OUT_KEEP is not)."""
    from ackmq.protocol.amqp10 import Decoder
    from ackmq.protocol.amqp10 import frames as F
    if out.startswith(b"AMQP\x00\x00\x09\x01"):  # not a 1.0 header: the port's 0-9-1
        return "answered as 0-9-1 (not a 1.0 header)", ""  # side answered it (A1)
    dec = Decoder(max_frame_size=1 << 30)
    try:
        events = dec.feed(out)
    except (F.FramingError, F.BadHeader) as e:
        return "bad output", f"undecodable AMQP 1.0 output ({e!r}): {out[:200]!r}"
    last = ""
    for ev in events:
        p = getattr(ev, "performative", None)
        if p is None:
            continue
        if p.kind == "close":
            cond = p.error.condition if p.error is not None else "ok"
            return f"close {cond}", ""
        if p.kind == "sasl_outcome" and p.code:
            return "sasl-outcome auth", ""
        last = p.kind
    return (f"closed after {last}" if last else "closed, nothing but headers"), ""


def judge_stream(out: bytes) -> Verdict:
    """RabbitMQ's stream protocol: the server's Close and its code, else the last
    command; output that is not a sequence of frames is a problem (cut at OUT_KEEP is
    not)."""
    pos, last = 0, ""
    while pos + 8 <= len(out):
        size, key = int.from_bytes(out[pos:pos + 4], "big"), int.from_bytes(
            out[pos + 4:pos + 6], "big")
        if size < 4:
            return "bad output", f"stream frame of size {size}: {out[pos:pos + 40]!r}"
        if pos + 4 + size > len(out):
            break  # cut
        if key == 0x0016 and size >= 10:  # the server's Close: its code after the corr id
            code = int.from_bytes(out[pos + 12:pos + 14], "big")
            return f"close 0x{code:02x}", ""
        last = f"0x{key:04x}"
        pos += 4 + size
    return (f"closed after {last}" if last else "closed, nothing written"), ""


def judge_mqtt(out: bytes) -> Verdict:
    """The broker's output read with ackmq's MQTT decoder (as a client, 5.0 then 3.1.1):
    the CONNACK refusal or DISCONNECT reason, else the last packet; output neither
    level reads is a problem (cut at OUT_KEEP is not)."""
    from ackmq.protocol.mqtt import ConnAck, Decoder, Disconnect, MQTTError
    if len(out) >= OUT_KEEP:
        return "long output (cut)", ""
    for level in (5, 4):
        try:
            packets = Decoder(level=level, server=False).feed(out)
        except MQTTError:
            continue
        for p in packets:
            if isinstance(p, ConnAck) and p.reason_code:
                return f"CONNACK {p.reason_code:#x}", ""
            if isinstance(p, Disconnect):
                return f"DISCONNECT {p.reason_code:#x}", ""
        if not packets:
            return "closed, nothing written", ""
        return f"closed after {type(packets[-1]).__name__}", ""
    return "bad output", f"undecodable MQTT output: {out[:200]!r}"


def judge_http(out: bytes) -> Verdict:
    codes = re.findall(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3}) ", out)
    bad = [c for c in codes if c.startswith(b"5")]
    if bad:
        return f"HTTP {bad[0].decode()}", f"5xx from the HTTP listener: {out[:300]!r}"
    if not codes:
        return "closed without a response", "" if not out else f"not HTTP: {out[:200]!r}"
    return f"last HTTP {codes[-1].decode()}", ""


def judge_admin(out: bytes) -> Verdict:
    lines = [x for x in out.split(b"\n") if x]
    if not lines:
        return "closed, no reply", ""
    if len(out) >= OUT_KEEP:  # the cut line cannot be judged
        lines = lines[:-1]
    for x in lines:
        try:
            reply = json.loads(x)
        except ValueError:
            return "bad output", f"admin reply not JSON: {x[:200]!r}"
        if not isinstance(reply, dict) or "ok" not in reply:
            return "bad output", f"admin reply without ok: {x[:200]!r}"
        if "internal error" in str(reply.get("error", "")):
            return "internal error", f"admin internal error: {x[:300]!r}"
    first_error = next((r for r in map(json.loads, lines) if not r.get("ok")), None)
    if first_error is None:
        return "every reply ok", ""
    return f"first error code {first_error.get('code')}", ""


# ---- one mutated connection ---------------------------------------------------------------

@dataclass
class Stats(fuzz.Stats):
    """fuzz.run_mutated's counters (AMQPS runs go through it) plus the other listeners'
    wrong answers."""

    problems: list[str] = field(default_factory=list)


Connector = Callable[[], Awaitable[Stream]]


async def run_stream(connect: Connector, data: bytes, pad: bytes, judge: Callable[[bytes], Verdict],
                     stats: Stats, settle: float, bound: float) -> None:
    try:
        s = await asyncio.wait_for(connect(), 30)
    except (OSError, TimeoutError, ssl.SSLError):
        stats.connect_errors += 1
        return
    try:
        start = time.monotonic()

        def pad_and_end() -> None:
            s.write(pad)
            s.end()

        padded = await fuzz.send_until_end(s, data, pad_and_end, stats, settle, bound)
        if padded is None:
            return
        stats.longest_end_s = max(stats.longest_end_s, time.monotonic() - start)
        label, problem = judge(bytes(s.out))
        if problem:
            stats.problems.append(problem)
        stats.outcomes[label + (" (after padding)" if padded else "")] += 1
    finally:
        if s.transport is not None:
            s.transport.abort()


@functools.cache
def client_tls() -> ssl.SSLContext:
    """One context for every connection: building one loads the system's CA store
    (~150 ms of the loop's CPU), which held a run to a few TLS connections a second."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def run_handshake(host: str, port: int, rnd: random.Random, after: bytes, stats: Stats,
                        settle: float, bound: float) -> int:
    """A real TLS client (ssl.MemoryBIO) whose ClientHello (70%) or second flight
    (its Finished, 30%) is mutated on the wire; if the handshake still completes,
    `after` (the protocol's first bytes) goes inside. Then EOF: the broker must close.
    Returns the frames (TLS flights) mutated."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
    except (OSError, TimeoutError):
        stats.connect_errors += 1
        return 0
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_tls().wrap_bio(incoming, outgoing)
    target = 0 if rnd.random() < 0.7 else 1
    flight, mutated, outcome, problem = 0, 0, "", ""
    start = time.monotonic()
    try:
        while True:
            try:
                tls.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            except ssl.SSLError as e:
                outcome = f"client TLS error {e.reason or type(e).__name__}"
                break
            data = outgoing.read()
            if data:
                if flight == target:
                    data, n = seeds.mutate_frames([data], rnd, seeds.TLS_SPECIAL, False, 1)
                    mutated += n
                writer.write(data)
                stats.bytes_sent += len(data)
                flight += 1
            if done:
                outcome = "handshake completed"
                try:
                    tls.write(after)
                    writer.write(outgoing.read())
                except ssl.SSLError:
                    pass
                break
            try:
                got = await asyncio.wait_for(reader.read(65536), settle)
            except TimeoutError:
                outcome = "broker waiting (after padding)"
                writer.write(b"\x00" * 16)
                break
            except OSError:
                got = b""
            if not got:
                outcome = "closed by the broker during the handshake"
                break
            incoming.write(got)
        if writer.can_write_eof():
            try:
                writer.write_eof()
            except OSError:  # the broker has already closed
                pass
        try:
            async with asyncio.timeout(bound):
                while await reader.read(65536):
                    pass
        except TimeoutError:
            stats.hung.append(f"tls handshake, flight {target} mutated")
            outcome = "HUNG"
        except OSError:
            pass
        if outcome != "HUNG":
            stats.longest_end_s = max(stats.longest_end_s, time.monotonic() - start)
    finally:
        writer.transport.abort()
    stats.outcomes[outcome] += 1
    if problem:
        stats.problems.append(problem)
    return mutated


# ---- the listeners ------------------------------------------------------------------------

@dataclass
class Target:
    """How to reach one listener and what to send there."""

    name: str
    host: str = "127.0.0.1"
    port: int = 0
    path: str = ""  # the admin socket
    tls: bool = False


def broker_targets(own: OwnBroker) -> dict[str, Target]:
    text = own.log_path.read_text(errors="replace")
    line = [x for x in text.splitlines() if "ackmq listening on" in x][-1]

    def port(pattern: str) -> int:
        m = re.search(pattern + r"://[^ ]*?:(\d+)", line)
        return int(m.group(1)) if m else 0

    stomp, stomps, amqps, http, https = (port("stomp"), port(r"stomp\+ssl"), port("amqps"),
                                         port("http"), port("https"))
    return {"amqp10": Target("amqp10", port=port("amqp")),
            "stream": Target("stream", port=port("rabbitmq-stream")),
            "stomp": Target("stomp", port=stomp),
            "stomps": Target("stomps", port=stomps, tls=True),
            "stomps-handshake": Target("stomps-handshake", port=stomps),
            "amqps": Target("amqps", port=amqps, tls=True),
            "amqps-handshake": Target("amqps-handshake", port=amqps),
            "admin": Target("admin", path=str(own.data_dir / "ctl.sock")),
            "http": Target("http", port=http),
            "https": Target("https", port=https, tls=True),
            "mqtt": Target("mqtt", port=port("mqtt"))}


# completes any body (NULs), then ends a session that is still CONNECTed: over TLS there
# is no half-close to end it with (asyncio), and a STOMP broker may take NULs between
# frames for heart-beats
STOMP_PAD = b"\x00" * (MAX_MESSAGE + 64) + b"\n\nDISCONNECT\n\n\x00"
# completes any AMQP 1.0 frame (at most max-frame-size, 131072), then zero-sized frames:
# a framing error that ends the session, whatever state it was in
AMQP10_PAD = b"\x00" * (131072 + 64)
# completes any MQTT packet (our --max-message-size plus the 64 KiB MQTT adds), then
# packet type 0, which is malformed: the broker closes, whatever state it was in
MQTT_PAD = b"\x00" * (MAX_MESSAGE + 65536 + 64)
STOMP_HELLO = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"


async def one_connection(t: Target, rnd: random.Random, stats: Stats, opts: Options) -> None:
    tag = f"{rnd.getrandbits(32):08x}"
    loop = asyncio.get_running_loop()
    if t.name.endswith("-handshake"):
        after = fuzz.PROTOCOL_HEADER if t.name.startswith("amqps") else STOMP_HELLO
        stats.sessions += 1
        n = await run_handshake(t.host, t.port, rnd, after, stats, opts.settle, opts.bound)
        stats.frames_mutated += n  # not `+= await`: that adds to a stale value
        return
    if t.name == "amqps":
        data, n = fuzz.mutate_session([f.replace(fuzz.TAG, tag.encode())
                                       for f in fuzz.live_session()], rnd, opts.mean_mutations)
        stats.sessions += 1
        stats.frames_mutated += n

        async def tls_peer() -> Peer:
            _, peer = await loop.create_connection(Peer, t.host, t.port, ssl=client_tls())
            return peer

        await fuzz.run_mutated(t.host, t.port, data, stats, opts.settle, opts.bound,  # type: ignore[arg-type]
                               connector=tls_peer)
        return
    if t.name in ("stomp", "stomps"):
        frames, special, pad, judge = (seeds.stomp_session(tag), seeds.STOMP_SPECIAL,
                                       STOMP_PAD, judge_stomp)
    elif t.name == "amqp10":
        frames, special, pad, judge = (seeds.amqp10_session(tag), seeds.AMQP10_SPECIAL,
                                       AMQP10_PAD, judge_amqp10)
    elif t.name == "stream":
        frames, special, pad, judge = (seeds.stream_session(tag), seeds.STREAM_SPECIAL,
                                       b"\x00" * 8, judge_stream)
    elif t.name == "mqtt":
        frames, special, pad, judge = (seeds.mqtt_session(tag), seeds.MQTT_SPECIAL,
                                       MQTT_PAD, judge_mqtt)
    elif t.name in ("http", "https"):
        frames, special, pad, judge = (seeds.http_session(tag), seeds.HTTP_SPECIAL,
                                       b"\r\n\r\n", judge_http)
    else:
        frames, special, pad, judge = (seeds.admin_session(tag), seeds.ADMIN_SPECIAL,
                                       b"\n", judge_admin)
    data, n = seeds.mutate_frames(frames, rnd, special, True, opts.mean_mutations)
    stats.sessions += 1
    stats.frames_mutated += n

    async def connect() -> Stream:
        if t.path:
            _, s = await loop.create_unix_connection(Stream, t.path)
        else:
            _, s = await loop.create_connection(Stream, t.host, t.port,
                                                ssl=client_tls() if t.tls else None)
            s.close_tls = t.name == "https"
        return s

    await run_stream(connect, data, pad, judge, stats, opts.settle, opts.bound)


# ---- the run ------------------------------------------------------------------------------

@dataclass
class Options:
    frames: int = 1_000_000
    concurrency: int = 100
    seed: int = 1
    mean_mutations: float = 4.0
    publish_rate: float = 300.0
    settle: float = 1.0
    bound: float = 15.0
    progress_every: float = 10.0
    max_seconds: float = 0.0  # 0: until `frames`


async def fuzz_listener(amqp_url: str, t: Target, opts: Options, broker_pid: int,
                        log_path: Path) -> dict[str, object]:
    host, port, user, password, vhost = host_port(amqp_url)
    rnd = random.Random(opts.seed)
    stats = Stats()
    pub = fuzz.Publisher(host, port, user, password, vhost, rate=opts.publish_rate)
    pub_task = asyncio.create_task(pub.run())
    rss: list[int] = []
    started = time.monotonic()
    stop = asyncio.Event()

    async def report() -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), min(1.0, opts.progress_every))
            except TimeoutError:
                pass
            rss.append(rss_of(broker_pid))
            el = time.monotonic() - started
            if len(rss) % max(1, int(opts.progress_every)) == 0:
                print(f"[fuzz {t.name} {el:6.0f}s] {stats.frames_mutated:,}/{opts.frames:,}"
                      f" mutated frames, {stats.sessions:,} connections, padded "
                      f"{stats.padded:,}, hung {len(stats.hung)}, problems "
                      f"{len(stats.problems)}, tracebacks {len(log_trouble(log_path))}, "
                      f"confirmed {len(pub.confirmed):,}, broker RSS "
                      f"{rss[-1] / 2**20:.0f} MiB", file=sys.stderr, flush=True)

    async def worker() -> None:
        wrnd = random.Random(rnd.getrandbits(64))
        while (stats.frames_mutated < opts.frames and not pub.error
               and not (opts.max_seconds and time.monotonic() - started > opts.max_seconds)):
            await one_connection(t, wrnd, stats, opts)

    helper = asyncio.create_task(report())
    await asyncio.sleep(0.5)
    await asyncio.gather(*(worker() for _ in range(opts.concurrency)))
    elapsed = time.monotonic() - started
    pub.stop()
    await pub_task
    stop.set()
    await helper
    values = [r for r in rss if r]
    return {"listener": t.name, "elapsed_s": round(elapsed, 1),
            "connections": stats.sessions, "frames_mutated": stats.frames_mutated,
            "bytes_sent": stats.bytes_sent, "connect_errors": stats.connect_errors,
            "padded": stats.padded, "hung": len(stats.hung), "hung_first": stats.hung[:3],
            "problems": (stats.problems + stats.bad_output)[:20],
            "problem_count": len(stats.problems) + len(stats.bad_output),
            "longest_end_s": round(stats.longest_end_s, 2),
            "outcomes": dict(stats.outcomes.most_common(40)),
            "publisher": {"published": pub.published, "confirmed": len(pub.confirmed),
                          "nacked": len(pub.nacked), "error": pub.error},
            "rss_mib": {"first": round(values[0] / 2**20, 1) if values else None,
                        "peak": round(max(values) / 2**20, 1) if values else None,
                        "last": round(values[-1] / 2**20, 1) if values else None},
            "_confirmed": pub.confirmed, "_nacked": len(pub.nacked)}


def make_cert(work: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl; the fuzzing client does not
    verify it)."""
    cert, key = work / "fuzz-cert.pem", work / "fuzz-key.pem"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "2",
                        "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    return cert, key


async def run(listeners: list[str], opts: Options, work_dir: Path | None,
              extra: list[str]) -> dict[str, object]:
    """One broker of our own for all the listeners asked for, fuzzed one after the
    other, a SIGKILL + restart + drain of the confirmed queue after each."""
    own = OwnBroker(extra, work_dir, stomp=True, mqtt=True)
    cert, key = make_cert(own.log_path.parent)
    own.extra = ["--stomp-port", "0", "--mqtt-port", "0", "--tls-port", "0",
                 "--stomp-tls-port", "0", "--https-port", "0", "--stream-port", "0",
                 "--tls-cert", str(cert), "--tls-key", str(key),
                 "--max-message-size", str(MAX_MESSAGE), *extra]
    results: list[dict[str, object]] = []
    failed = True
    try:
        url = own.start()
        print(f"[fuzz] ackmq pid {own.pid}, log {own.log_path}", file=sys.stderr)
        for name in listeners:
            t = broker_targets(own)[name]
            before = len(log_trouble(own.log_path))
            r = await fuzz_listener(url, t, opts, own.pid, own.log_path)
            alive = own.alive()
            confirmed = r.pop("_confirmed")
            nacked = r.pop("_nacked")
            if alive:
                own.kill()
            url = own.start()
            host, port, user, password, vhost = host_port(url)
            bodies = await fuzz.drain_confirmed(host, port, user, password, vhost,
                                                len(confirmed) + nacked)  # type: ignore[arg-type]
            check = fuzz.check_confirmed(bodies, confirmed)  # type: ignore[arg-type]
            trouble = log_trouble(own.log_path)[before:]
            r.update(broker_alive=alive, log_trouble=trouble[:20], tracebacks=len(trouble),
                     confirmed_check=check)
            verdict = []
            if not alive:
                verdict.append("the broker died")
            if trouble:
                verdict.append(f"{len(trouble)} traceback line(s) in the broker log")
            if r["hung"]:
                verdict.append(f"{r['hung']} hung connection(s)")
            if r["problem_count"]:
                verdict.append(f"{r['problem_count']} bad answer(s)")
            if r["publisher"]["error"]:  # type: ignore[index]
                verdict.append(f"publisher: {r['publisher']['error']}")  # type: ignore[index]
            if r["publisher"]["nacked"]:  # type: ignore[index]
                verdict.append(f"{r['publisher']['nacked']} publish(es) nacked")  # type: ignore[index]
            if check["missing"] or check["corrupt"]:
                verdict.append(f"confirmed messages: {check}")
            r["verdict"] = verdict
            results.append(r)
            print(f"[fuzz {name}] done: {json.dumps(r)[:600]}", file=sys.stderr, flush=True)
        failed = any(r["verdict"] for r in results)
    finally:
        own.stop(keep_log=failed)
    return {"options": asdict(opts), "listeners": results,
            "problems": [f"{r['listener']}: {v}" for r in results
                         for v in r["verdict"]]}  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.robustness.fuzz_listeners",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listener", action="append", required=True,
                   help=f"{', '.join(LISTENERS)} or all (repeatable)")
    p.add_argument("--frames", type=int, default=1_000_000,
                   help="mutated frames per listener (a TLS flight counts as one)")
    p.add_argument("--concurrency", type=int, default=100, help="connections at once")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mean-mutations", type=float, default=4.0)
    p.add_argument("--publish-rate", type=float, default=300.0,
                   help="persistent messages/s of the confirmed publisher alongside")
    p.add_argument("--bound", type=float, default=15.0,
                   help="seconds a padded connection has to end before it counts as hung")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="stop each listener's fuzzing after this long (0: run to --frames)")
    p.add_argument("--progress-every", type=float, default=10.0, help="seconds")
    p.add_argument("--work-dir", help="data dir and log (default: new under /var/tmp)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `ackmq serve` argument (repeatable)")
    p.add_argument("--json", help="write the summary here too")
    args = p.parse_args(argv)
    names = [n for x in args.listener for n in (LISTENERS if x == "all" else x.split(","))]
    unknown = [n for n in names if n not in LISTENERS]
    if unknown:
        p.error(f"unknown listener(s) {unknown}: choose from {', '.join(LISTENERS)}, all")
    opts = Options(frames=args.frames, concurrency=args.concurrency, seed=args.seed,
                   mean_mutations=args.mean_mutations, publish_rate=args.publish_rate,
                   bound=args.bound, progress_every=args.progress_every,
                   max_seconds=args.max_seconds)
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * args.concurrency + 256))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    summary = asyncio.run(run(names, opts, Path(args.work_dir) if args.work_dir else None,
                              args.serve_arg))
    text = json.dumps(summary, indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
