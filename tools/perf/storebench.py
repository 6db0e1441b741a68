"""Figures for docs/storage.md, measured through the real store API.

    python -m tools.perf.storebench DIR publish [-n 50000] [--size 1024]
    python -m tools.perf.storebench DIR recover [-n 1000000] [--size 1024] [--read 300000]
    python -m tools.perf.storebench DIR fsync [-n 2000] [--size 150] [--gap-us 200]
    python -m tools.perf.storebench DIR cpu [-n 20000] [--size 100]

publish: persistent adds committed in batches of 1, 100, 1000, waiting for each batch's
callback (a publisher confirming one-by-one or per batch), then "pipelined": one commit
per message without waiting, as a busy broker commits once per event-loop turn while
the previous fsync runs (group commit merges them); then "turns": a broker-like thread
adding 20 messages per event-loop turn, one commit per turn, with confirm latencies.
fsync: one record written then fdatasynced, n times, into a file that grows with each
write (append), into one fallocated ahead (what the store does) and into one zero-filled
and flushed ahead; p10 / median / p90 / mean of the fdatasync, modes alternated twice.
--gap-us: sleep that long after each fdatasync, as a confirm-each round trip leaves the
disk idle between two (on a VM the next fdatasync then pays for waking it).
cpu: the broker thread's CPU time per add + commit (process time, best of 5 rounds: it
hardly moves with the load of other jobs, so two versions compare on a busy machine),
fsync off (the write alone) and fsync on with the inline fdatasync (DIR on tmpfs makes
that sync nearly free, leaving the code's own cost).
recover: writes N messages into one queue, closes, then in a fresh child process times
`open()` (warm page cache) with its peak RSS (VmHWM), iterates the recovered queue, and
times `read_message` in seq order for the first --read messages (what a broker pays per
message it brings back into memory).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from ackmq.store import QueueDef, open_store
from tools import python_env

PROPS = b"\x10\x00\x02"


def _publish(path: Path, n: int, size: int, batch: int | None) -> str:
    shutil.rmtree(path, ignore_errors=True)
    st = open_store(path, auto_compact=False)
    epoch = st.open().epoch
    st.save_queue(QueueDef("q"))
    body = b"x" * size
    done = threading.Event()
    left = [n if batch is None else (n + batch - 1) // batch]

    def cb(exc: BaseException | None) -> None:
        assert exc is None, exc
        left[0] -= 1
        if left[0] == 0:
            done.set()

    t0 = time.perf_counter()
    if batch is None:
        for i in range(n):
            st.add("q", (epoch << 40) | i, "amq.direct", "rk", PROPS, body)
            st.commit(cb)
        done.wait()
    else:
        for start in range(0, n, batch):
            ev = threading.Event()
            for i in range(start, min(n, start + batch)):
                st.add("q", (epoch << 40) | i, "amq.direct", "rk", PROPS, body)
            st.commit(lambda exc, ev=ev: (cb(exc), ev.set()))
            ev.wait()
    dt = time.perf_counter() - t0
    s = st.stats
    st.close()
    label = "pipelined" if batch is None else f"batch={batch}"
    return (f"publish n={n} size={size} {label:>10}: {dt * 1000:8.0f} ms  {n / dt:9,.0f} msg/s  "
            f"commits={s.commits} fsyncs={s.fsyncs} ({s.commits / max(1, s.fsyncs):.1f} "
            f"commits/fsync)")


def _turns(path: Path, seconds: float, size: int, per_turn: int = 20) -> str:
    """A broker-like thread: `per_turn` adds, one commit, a short wait for sockets."""
    shutil.rmtree(path, ignore_errors=True)
    st = open_store(path, auto_compact=False)
    epoch = st.open().epoch
    st.save_queue(QueueDef("q"))
    body = b"x" * size
    lat: list[float] = []
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(per_turn):
            st.add("q", (epoch << 40) | n, "amq.direct", "rk", PROPS, body)
            n += 1
        t0 = time.perf_counter()
        st.commit(lambda exc, t0=t0: lat.append(time.perf_counter() - t0))
        time.sleep(0.0002)
    st.close()
    lat.sort()
    s = st.stats
    return (f"turns of {per_turn} adds for {seconds:.0f} s: {n / seconds:9,.0f} msg/s  "
            f"commits={s.commits} fsyncs={s.fsyncs} ({s.commits / max(1, s.fsyncs):.1f} "
            f"commits/fsync); confirm latency median {lat[len(lat) // 2] * 1e3:.2f} ms, "
            f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms")


def _fill(path: Path, n: int, size: int) -> int:
    """N persistent messages in queue "q", no fsync (only the data matters); bytes on disk."""
    shutil.rmtree(path, ignore_errors=True)
    st = open_store(path, auto_compact=False, fsync=False)
    epoch = st.open().epoch
    st.save_queue(QueueDef("q"))
    body = b"x" * size
    for start in range(0, n, 10000):
        done = threading.Event()
        for i in range(start, min(n, start + 10000)):
            st.add("q", (epoch << 40) | i, "amq.direct", "rk", PROPS, body)
        st.commit(lambda exc, done=done: done.set())
        if start % 200000 == 0:
            done.wait()  # keep the unwritten backlog (memory) bounded
    st.close()
    return sum(p.stat().st_size for p in path.glob("*.seg"))


def _status() -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS), RssAnon, RssFile of this process in KiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0])
    return out


def _open_and_read(path: Path, nread: int) -> str:
    """Runs in a fresh process, so VmHWM is the peak of this open() (plus the interpreter)."""
    before = _status()
    st = open_store(path, auto_compact=False)
    t0 = time.perf_counter()
    c0 = time.process_time()
    rec = st.open()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = _status()
    q = rec.messages["q"]
    count = len(q)
    per = st.index_bytes() / max(1, count)
    t0 = time.perf_counter()
    k = sum(1 for _ in q)
    it_dt = time.perf_counter() - t0
    assert k == count
    t0 = time.perf_counter()
    got = 0
    for _, loc, _ in q:
        if got == nread:
            break
        st.read_message(loc)
        got += 1
    rd_dt = time.perf_counter() - t0
    end = _status()
    st.close()
    mib = 1024
    return (f"open() n={count}: {dt:.2f} s wall, {cpu:.2f} s cpu ({dt / count * 1e6:.2f} us/msg);"
            f" index {per:.1f} bytes/msg\n"
            f"  RSS before open {before['VmRSS'] / mib:.0f} MiB, peak {after['VmHWM'] / mib:.0f} "
            f"MiB, after {after['VmRSS'] / mib:.0f} MiB (anon {after['RssAnon'] / mib:.0f}, "
            f"file {after['RssFile'] / mib:.0f})\n"
            f"  iterate {count} (seq, location, count): {it_dt:.2f} s "
            f"({it_dt / count * 1e6:.2f} us/msg)\n"
            f"  read_message x {got} in seq order: {rd_dt:.2f} s "
            f"({rd_dt / max(1, got) * 1e6:.1f} us/msg); RSS after {end['VmRSS'] / mib:.0f} MiB")


def _recover(path: Path, n: int, size: int, nread: int) -> str:
    disk = _fill(path, n, size)
    out = subprocess.run([sys.executable, "-m", "tools.perf.storebench", str(path), "open",
                          "--read", str(nread)], capture_output=True, text=True, check=True,
                         env=python_env())
    return f"recover n={n} size={size}, on disk {disk / 2**20:.0f} MiB\n{out.stdout.rstrip()}"


def _fsync_modes(path: Path, n: int, size: int, gap: float = 0.0) -> str:
    import os
    rec = b"y" * size
    lines = []
    for _ in range(2):
        for mode in ("append", "fallocated", "zero-filled"):
            f = path / f"fsync-{mode}"
            fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                ahead = n * size + 4096
                if mode == "fallocated":
                    os.posix_fallocate(fd, 0, ahead)
                elif mode == "zero-filled":
                    os.write(fd, bytes(ahead))
                os.fsync(fd)
                ts = []
                for i in range(n):
                    os.pwrite(fd, rec, i * size)
                    t0 = time.perf_counter()
                    os.fdatasync(fd)
                    ts.append(time.perf_counter() - t0)
                    if gap:
                        time.sleep(gap)
            finally:
                os.close(fd)
                f.unlink()
            ts.sort()
            lines.append(f"{mode:12} fdatasync p10 {ts[n // 10] * 1e6:5.0f}  median "
                         f"{ts[n // 2] * 1e6:5.0f}  p90 {ts[n * 9 // 10] * 1e6:5.0f}  mean "
                         f"{sum(ts) / n * 1e6:5.0f} µs  ({n} x {size} B, gap {gap * 1e6:.0f} µs)")
    return "\n".join(lines)


def _cpu(path: Path, n: int, size: int) -> str:
    lines = []
    for fsync in (False, True):
        shutil.rmtree(path, ignore_errors=True)
        st = open_store(path, fsync=fsync, auto_compact=False)
        e = st.open().epoch << 40
        st.save_queue(QueueDef("q"))
        body = b"x" * size
        best = float("inf")
        seq = 0
        for _ in range(5):
            t = time.process_time()
            for _ in range(n):
                seq += 1
                st.add("q", e | seq, "", "q", PROPS, body)
                st.commit(lambda exc: None, inline=True)
            best = min(best, time.process_time() - t)
        st.close()
        what = "add + commit + inline fdatasync" if fsync else "add + commit (fsync off)"
        lines.append(f"{what:32} {best / n * 1e6:6.2f} µs CPU each (best of 5 x {n}, "
                     f"{size} B)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("what", choices=["publish", "recover", "open", "fsync", "cpu"])
    ap.add_argument("-n", type=int, default=0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--read", type=int, default=300000, help="read_message count (recover)")
    ap.add_argument("--gap-us", type=float, default=0.0, help="idle time after each fdatasync (fsync)")
    a = ap.parse_args()
    if a.what == "open":  # the child of `recover`: DIR is the store itself
        print(_open_and_read(a.dir, a.read), flush=True)
        return
    path = a.dir / "bench-store"
    if a.what == "fsync":
        path.mkdir(parents=True, exist_ok=True)
        try:
            print(_fsync_modes(path, a.n or 2000, a.size if a.size != 1024 else 150,
                               a.gap_us / 1e6))
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return
    if a.what == "cpu":
        try:
            print(_cpu(path, a.n or 20000, a.size if a.size != 1024 else 100))
        finally:
            shutil.rmtree(path, ignore_errors=True)
        return
    if a.what == "publish":
        n = a.n or 50000
        for batch in (1000, 100, 1, None):
            print(_publish(path, n, a.size, batch), flush=True)
        print(_turns(path, 3.0, a.size), flush=True)
    else:
        try:
            print(_recover(path, a.n or 1_000_000, a.size, a.read), flush=True)
        finally:
            shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
