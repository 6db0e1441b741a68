"""Power loss on LazyFS: `kill -9` + LazyFS's clear-cache under confirmed load, N cycles.

    python -m tools.robustness.powerloss --cycles 100 [--no-fsync] [--torn] [--work DIR]
                                         [--delayed MAX_MS]

LazyFS (github dsrhaslab/lazyfs, the FUSE file system Jepsen uses) keeps every write in
its own cache until it is fsynced; `lazyfs::clear-cache` drops what was not. So
kill -9 of the broker followed by a clear-cache is a power cut for everything the
broker wrote. Each cycle: publishers confirm persistent messages into a durable queue
for a random while, the broker is killed, the cache cleared, the broker started again
(a refusal to start is a finding), the queue drained and compared with what was
confirmed. With --torn the cut is LazyFS's own torn-op fault instead: the next write
to the active segment is split in three, parts 1 and 3 reach the disk, LazyFS kills
itself (everything else unsynced is gone), the broker is killed, LazyFS mounted again.
With --delayed MAX_MS the publishers go through a durable `x-delayed-message` exchange
with an `x-delay` of 1..MAX_MS each (SPEC L2: the timer store on the same log); after the
restart the queue is drained until every due time has passed, and a message that
arrives before its due time, or twice, is a finding as a lost one is.
LazyFS passes create/rename/unlink straight to the disk below and has no
fallocate and no statfs (so --disk-free-limit 0); the in-process simulator
(tools/crashsim/crashsim.py) covers lost directory entries.

Needs root, /dev/fuse and a LazyFS build: `lazyfs-local install` (tests/lazyfs-local,
with LAZYFS_SRC pointing to a clone of dsrhaslab/lazyfs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika

from tools.harness.ownbroker import OwnBroker, log_trouble

TOOL = Path(__file__).resolve().parents[2] / "tests" / "lazyfs-local"
QUEUE = "powerloss"
DELAYED_X = "powerloss.delayed"  # --delayed: x-delayed-message (direct), QUEUE bound by name
EARLY_SLACK_MS = 5  # one clock on one host; ms truncation in the due time


def lazyfs_tool() -> str:
    """The lazyfs-local script: $ACKMQ_LAZYFS_TOOL, else the project's copy."""
    return os.environ.get("ACKMQ_LAZYFS_TOOL", str(TOOL))


def lazyfs_unavailable() -> str | None:
    """Why LazyFS cannot run here, or None (it is built, or can be)."""
    if os.geteuid() != 0:
        return "LazyFS needs root (FUSE mount with allow_other)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    tool = lazyfs_tool()
    if not os.path.exists(tool):
        return f"no lazyfs-local script at {tool}"
    r = subprocess.run([tool, "install"], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return "LazyFS cannot be built here: " + (r.stderr.strip() or r.stdout.strip())[-300:]
    return None


def free_port(avoid: int = 0) -> int:
    """A free port below the kernel's ephemeral range: the broker listens on it again
    after each restart, and a port the kernel hands out could meanwhile be the local
    end of someone's outgoing connection ("address already in use", seen once)."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port == avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def lazyfs_workdir(kind: str) -> Path:
    """A fresh work folder for a LazyFS run: "_"-joined, since mkdtemp's random part
    could start with "o" after a "-" (see LazyFS.__init__)."""
    return Path(tempfile.mkdtemp(prefix=f"ackmq_{kind}_", dir="/var/tmp"))


class LazyFS:
    """A LazyFS mount of `root` at `mount`, driven through its fifo."""

    def __init__(self, work: Path) -> None:
        # LazyFS (src/main.cpp) ignores a --config-path whose value contains "-o" in
        # any case (it takes it for a FUSE option) and aborts on config/default.toml;
        # the config file sits beside the fifo, so no such path may reach it
        if "-o" in str(work).lower():
            raise ValueError(f"LazyFS cannot take its config from {work}: the path "
                             "contains '-o' (use lazyfs_workdir())")
        self.root = work / "lazyfs-root"
        self.mount = work / "lazyfs-mnt"
        self.fifo = work / "lazyfs.fifo"

    def __enter__(self) -> LazyFS:
        # on a loaded machine LazyFS may mount after the tool's 10 s wait, leaving a
        # LazyFS behind that the next try collides with (three failures in a row seen in
        # a full-suite run): each retry first stops what the failed try left, and the
        # fifth failure is reported
        cmd = [lazyfs_tool(), "mount", str(self.root), str(self.mount), str(self.fifo)]
        why: list[str] = []
        for i in range(5):
            r = subprocess.run(cmd, timeout=60, capture_output=True, text=True)
            if r.returncode == 0:
                return self
            why.append((r.stderr or r.stdout).strip()[-200:])
            self._stop_leftover()
            time.sleep(0.5 * (i + 1))
        raise RuntimeError("LazyFS did not mount in 5 tries: " + " | ".join(why))

    def _stop_leftover(self) -> None:
        """Unmount and kill this mount's LazyFS (its pid file): at the end, and after a
        failed mount, whatever it left."""
        subprocess.run([lazyfs_tool(), "umount", str(self.mount)], timeout=60)
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(Path(str(self.fifo) + ".pid").read_text().strip()), signal.SIGKILL)

    def clear_cache(self) -> None:
        subprocess.run([lazyfs_tool(), "clear", str(self.fifo)], check=True, timeout=90)

    def tear_next_write(self, path: Path, timeout: float = 10.0) -> bool:
        """Ask LazyFS to tear the next write to `path` (parts 1 and 3 of 3 persisted) and
        crash; True once LazyFS is gone (the mount then answers ENOTCONN)."""
        real = os.path.realpath(self.root / path.relative_to(self.mount))
        done = os.open(self.fifo.with_name(self.fifo.name + ".done"),
                       os.O_RDONLY | os.O_NONBLOCK)  # LazyFS reads commands once it has a reader
        try:
            with open(self.fifo, "w") as f:
                # (the next write: an "::occurrence=" field makes it never fire)
                f.write(f"lazyfs::torn-op::file={real}::parts=3::persist=1,3\n")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    os.stat(self.mount)
                except OSError:  # ENOTCONN: LazyFS is gone
                    return True
                time.sleep(0.05)
            return False
        finally:
            os.close(done)

    def __exit__(self, *exc: object) -> None:
        self._stop_leftover()


@dataclass
class Report:
    cycles: int = 0
    confirmed: int = 0
    lost: int = 0
    refused: int = 0
    unconfirmed_back: int = 0  # published, no confirm seen, present after the cut
    tears: int = 0             # --torn: cycles where LazyFS's torn-op fault fired
    duplicates: int = 0        # a message drained more than once
    early: int = 0             # --delayed: drained before its due time
    tracebacks: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _publisher(url: str, tag: str, confirmed: list[str], stop: threading.Event,
               ready: threading.Semaphore, delayed_ms: int = 0) -> None:
    """Confirm-each persistent publishes until the broker goes away or `stop`; with
    `delayed_ms`, through DELAYED_X with x-delay 1..delayed_ms, the due time (ms since
    the epoch) last in the body."""
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        ready.release()
        props = pika.BasicProperties(delivery_mode=2)
        rnd = random.Random(tag)
        n = 0
        while not stop.is_set():
            if delayed_ms:
                delay = rnd.randint(1, delayed_ms)
                body = f"{tag}:{n}:{int(time.time() * 1000) + delay}"
                ch.basic_publish(DELAYED_X, QUEUE, body.encode(), pika.BasicProperties(
                    delivery_mode=2, headers={"x-delay": delay}))
            else:
                body = f"{tag}:{n}"
                ch.basic_publish("", QUEUE, body.encode(), props)  # raises on nack
            confirmed.append(body)
            n += 1
        conn.close()
    except Exception:  # noqa: BLE001 - the broker was killed under us: expected
        pass


def _drain(url: str, until: float = 0.0) -> list[tuple[str, int]]:
    """(body, ms since the epoch when it came) of every message in QUEUE; with `until`
    (a time.time()), go on draining until then (delayed messages falling due)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    got = []
    while True:
        m = ch.basic_get(QUEUE, auto_ack=True)
        if m[0] is None:
            if time.time() >= until:
                break
            conn.sleep(0.05)
            continue
        got.append((m[2].decode(), int(time.time() * 1000)))
    conn.close()
    return got


def run(cycles: int, fsync: bool = True, work: Path | None = None, seed: int = 1,
        publishers: int = 2, progress: bool = False, torn: bool = False,
        stop_untorn: bool = False, delayed_ms: int = 0) -> Report:
    """`stop_untorn` (with `torn`): end the run after a cycle whose fault did not fire
    (LazyFS then ignores its fifo for the rest of the mount's life, as far as seen; the
    cycles left would be plain remount cycles, which the clear-cache runs cover)."""
    rng = random.Random(seed)
    own = work is None
    work = work or lazyfs_workdir("powerloss")
    rep = Report()
    extra = ["--disk-free-limit", "0"] + ([] if fsync else ["--no-fsync"])
    try:
        with LazyFS(work) as fs:
            broker = OwnBroker(extra, work_dir=work / "broker")
            broker.port = free_port()  # kept across restarts, so not an ephemeral one
            broker.data_dir = fs.mount / "data"  # the log stays off LazyFS
            url = broker.start()
            conn = pika.BlockingConnection(pika.URLParameters(url))
            ch = conn.channel()
            ch.queue_declare(QUEUE, durable=True)
            if delayed_ms:
                ch.exchange_declare(DELAYED_X, "x-delayed-message", durable=True,
                                    arguments={"x-delayed-type": "direct"})
                ch.queue_bind(QUEUE, DELAYED_X, QUEUE)
            conn.close()
            for cycle in range(cycles):
                stop = threading.Event()
                ready = threading.Semaphore(0)
                confirmed: list[list[str]] = [[] for _ in range(publishers)]
                threads = [threading.Thread(target=_publisher, args=(
                    url, f"{cycle}.{i}", confirmed[i], stop, ready, delayed_ms))
                    for i in range(publishers)]
                for t in threads:
                    t.start()
                for _ in threads:  # connected: the cut comes while they publish
                    ready.acquire(timeout=30)
                time.sleep(rng.uniform(0.2, 1.5))
                if torn:  # LazyFS tears the next segment write and dies: the power cut
                    segs = sorted(broker.data_dir.glob("*.seg"))
                    if segs and fs.tear_next_write(segs[-1]):
                        rep.tears += 1
                    else:
                        rep.lines.append(f"cycle {cycle}: no write to tear within 10 s")
                        if progress:
                            print(rep.lines[-1], flush=True)
                broker.kill()  # mid-stream: publishers are inside publish/confirm
                stop.set()
                for t in threads:
                    t.join(30)
                if torn:
                    fs.__exit__()
                    fs.__enter__()  # a new LazyFS: its cache (all unsynced data) is gone
                else:
                    fs.clear_cache()  # the power cut: LazyFS drops everything not fsynced
                try:
                    url = broker.start()
                except RuntimeError:
                    rep.refused += 1
                    tail = broker.log_path.read_text(errors="replace").splitlines()[-3:]
                    rep.lines.append(f"cycle {cycle}: broker refused to start: {tail}")
                    if progress:
                        print(rep.lines[-1], flush=True)
                    break
                # every delayed message published so far is due by then (+ 1 s)
                drained = _drain(url, time.time() + (delayed_ms + 1000) / 1000
                                 if delayed_ms else 0.0)
                bodies = [b for b, _at in drained]
                got = set(bodies)
                want = {b for c in confirmed for b in c}
                lost = want - got
                dupes = len(bodies) - len(got)
                early = [b for b, at in drained
                         if delayed_ms and at < int(b.rsplit(":", 1)[1]) - EARLY_SLACK_MS]
                rep.cycles += 1
                rep.confirmed += len(want)
                rep.lost += len(lost)
                rep.duplicates += dupes
                rep.early += len(early)
                rep.unconfirmed_back += len(got - want)
                line = (f"cycle {cycle}: {len(want)} confirmed, {len(lost)} lost, "
                        f"{len(got - want)} unconfirmed present"
                        + (f", {dupes} twice" if dupes else "")
                        + (f", {len(early)} early" if delayed_ms else ""))
                rep.lines.append(line)
                if progress:
                    print(line, flush=True)
                if torn and stop_untorn and rep.tears <= cycle:
                    break
            broker.stop()
            rep.tracebacks = log_trouble(broker.log_path)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return rep


def cut_arguments(prog: str, doc: str | None, cycles: int) -> argparse.ArgumentParser:
    """The options every power-cut run takes (this one, powerloss_mqtt, powerloss_stream)."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}",
                                 description=(doc or "").split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=cycles)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", type=Path)
    return ap


def cannot_run() -> bool:
    """LazyFS missing: say why (the runs exit 2 then)."""
    why = lazyfs_unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
    return bool(why)


def main(argv: list[str] | None = None) -> int:
    ap = cut_arguments("tools.robustness.powerloss", __doc__, 100)
    ap.add_argument("--torn", action="store_true",
                    help="cut with LazyFS's torn-op fault instead of clear-cache")
    ap.add_argument("--delayed", type=int, default=0, metavar="MAX_MS",
                    help="publish through a durable delayed exchange, x-delay 1..MAX_MS")
    a = ap.parse_args(argv)
    if cannot_run():
        return 2
    t0 = time.monotonic()
    rep = run(a.cycles, fsync=not a.no_fsync, work=a.work, seed=a.seed, progress=True,
              torn=a.torn, delayed_ms=a.delayed)
    cut = "torn-op + LazyFS crash + kill -9" if a.torn else "kill -9 + clear-cache"
    print(f"{rep.cycles} cycles ({cut}), fsync "
          f"{'off' if a.no_fsync else 'on'}: {rep.confirmed:,} confirmed, {rep.lost:,} lost, "
          f"{rep.refused} refused starts, {rep.unconfirmed_back:,} unconfirmed present, "
          f"{rep.duplicates:,} twice, "
          + (f"{rep.early:,} before their time, " if a.delayed else "") +
          f"{len(rep.tracebacks)} tracebacks, {time.monotonic() - t0:.0f} s"
          + (f"; the torn-op fault fired in {rep.tears} cycles" if a.torn else ""))
    for line in rep.tracebacks[:5]:
        print("  " + line)
    bad = rep.refused or rep.tracebacks or rep.early or (
        (rep.lost or rep.duplicates) and not a.no_fsync)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
