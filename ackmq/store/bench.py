"""Figures for docs/storage.md, measured through the real store API.

    python -m ackmq.store.bench DIR publish [-n 50000] [--size 1024]
    python -m ackmq.store.bench DIR recover [-n 1000000] [--size 1024]

publish: persistent adds committed in batches of 1, 100, 1000, waiting for each batch's
callback (a publisher confirming one-by-one or per batch), then "pipelined": one commit
per message without waiting, as a busy broker commits once per event-loop turn while
the previous fsync runs (group commit merges them); then "turns": a broker-like thread
adding 20 messages per event-loop turn, one commit per turn, with confirm latencies.
recover: writes N messages, closes, and times `open()` (cold process-level, warm page
cache), reporting the index's bytes per message.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import threading
import time
from pathlib import Path

from . import QueueDef, open_store

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


def _recover(path: Path, n: int, size: int) -> str:
    shutil.rmtree(path, ignore_errors=True)
    st = open_store(path, auto_compact=False, fsync=False)
    epoch = st.open().epoch
    st.save_queue(QueueDef("q"))
    body = b"x" * size
    done = threading.Event()
    for start in range(0, n, 10000):
        for i in range(start, min(n, start + 10000)):
            st.add("q", (epoch << 40) | i, "amq.direct", "rk", PROPS, body)
        st.commit(lambda exc: done.set())
    st.close()
    disk = sum(p.stat().st_size for p in path.glob("*.seg"))
    gc.collect()
    st = open_store(path, auto_compact=False)
    t0 = time.perf_counter()
    c0 = time.process_time()
    rec = st.open()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    count = sum(len(v) for v in rec.messages.values())
    per = st.index_bytes() / max(1, count)
    st.close()
    return (f"recover n={count} size={size}: {dt:.2f} s wall, {cpu:.2f} s cpu "
            f"({dt / count * 1e6:.1f} us/msg); on disk {disk / 2**20:.0f} MiB; "
            f"index {per:.1f} bytes/msg")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("what", choices=["publish", "recover"])
    ap.add_argument("-n", type=int, default=0)
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    path = a.dir / "bench-store"
    if a.what == "publish":
        n = a.n or 50000
        for batch in (1000, 100, 1, None):
            print(_publish(path, n, a.size, batch), flush=True)
        print(_turns(path, 3.0, a.size), flush=True)
    else:
        print(_recover(path, a.n or 1_000_000, a.size), flush=True)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
