"""Power cuts under MQTT's state beside the queues (server/mqtt/state.py over
store/kvlog.py: retained messages, QoS 2 packet ids in and out), one reproducible run
per seed, on the same simulated disk as crashsim.py (faultfs.py).

    python -m tools.crashsim.kvsim --seeds 1000 [--seed-start N] [--plant NAME]

Each seed drives a real `MQTTState` (fsync on, as a broker with a data dir runs it):
retained messages set and cleared, QoS 2 ids added and released, sessions forgotten,
and `sync()` where the connection syncs before its PUBACK / PUBREC / PUBCOMP: what was
in the state when a sync returned is acknowledged. Enough operations to make the logs
rewrite themselves (kvlog's compaction). At a random operation the power goes; the
image is opened (once more with a power cut inside that opening, which rewrites the
log) and checked: it opens, every key whose last change was synced has its synced
value (a retained message, its QoS, properties and payload; an id present or
released), and a key changed since holds one of the values it had since that sync —
nothing acknowledged is lost, nothing that never was appears."""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ackmq.server.mqtt.state import MQTTState
from ackmq.store import fileio
from ackmq.store.kvlog import KVLog
from tools.crashsim import faultfs

Key = tuple[str, ...]
Value = tuple[Any, ...] | None  # None: absent


def _open(root: Path) -> MQTTState:
    st = MQTTState(SimpleNamespace(config=SimpleNamespace(data_dir=root, fsync=True)))  # type: ignore[arg-type]
    st.open()
    return st


def _view(st: MQTTState) -> dict[Key, Value]:
    """The state as the oracle compares it."""
    out: dict[Key, Value] = {}
    for vhost, kept in st.retained.items():
        for topic, r in kept.items():
            out[("retained", vhost, topic)] = (r.qos, r.properties, r.payload)
    for (way, vhost, client), ids in st.qos2.items():
        for pid in ids:
            out[("qos2", way, vhost, client, str(pid))] = ()
    return out


class _Run:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ops = self.rng.randrange(50, 3000)
        self.acked: dict[Key, Value] = {}  # at the last sync that returned
        self.since: dict[Key, set[Value]] = {}  # values a key had since then

    def seen(self, before: dict[Key, Value], after: dict[Key, Value]) -> None:
        for k in before.keys() | after.keys():
            if before.get(k) != after.get(k):
                self.since.setdefault(k, {self.acked.get(k)}).add(after.get(k))

    def work(self, st: MQTTState) -> None:
        rng = self.rng
        vhosts, clients = ["/", "v2"], [f"c{i}" for i in range(4)]
        topics = [f"t/{i}" for i in range(12)] + ["$SYS/x", "a/b/c"]
        for _ in range(self.ops):
            before = _view(st)
            r = rng.random()
            vh = rng.choice(vhosts)
            try:  # the change is in memory before its record is written: a cut in the
                # write (or in the rewrite it sets off) may or may not have kept it
                if r < 0.35:
                    payload = b"" if rng.random() < 0.25 else \
                        rng.randbytes(rng.randrange(1, 300))
                    st.retain(vh, rng.choice(topics), rng.randrange(3),
                              rng.randbytes(rng.randrange(0, 8)), payload)
                elif r < 0.65:
                    st.qos2_add(vh, rng.choice(clients), rng.randrange(1, 40),
                                rng.random() < 0.5)
                elif r < 0.88:
                    st.qos2_remove(vh, rng.choice(clients), rng.randrange(1, 40),
                                   rng.random() < 0.5)
                elif r < 0.9:
                    st.forget_session(vh, rng.choice(clients))
            finally:
                self.seen(before, _view(st))
            if r >= 0.9:  # an acknowledgement: sync first
                st.sync()
                self.acked, self.since = _view(st), {}

    def check(self, got: dict[Key, Value]) -> str | None:
        for k in self.acked.keys() | self.since.keys() | got.keys():
            allowed = self.since.get(k, {self.acked.get(k)})
            if got.get(k) not in allowed:
                return f"{k}: recovered {got.get(k)!r:.80}, acknowledged {self.acked.get(k)!r:.80}"
        return None


def run_seed(seed: int, workdir: Path) -> tuple[str | None, dict[str, Any]]:
    """One seed: workload, power cut, opening (with a second cut), checks. Returns (the
    failure or None, facts about the run)."""
    root = workdir / f"kv{seed}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run = _Run(seed)
    fs = faultfs.FaultFS(root, crash_at=run.rng.randrange(1, 2 * run.ops))
    fileio.install(fs)
    try:
        with contextlib.suppress(faultfs.SimulatedCrash):
            run.work(_open(root))
            fs.cut_power(raise_=False)
    finally:
        fs.close_all()
        fileio.uninstall()
    facts = {"ops": fs.ops, "acked": len(run.acked)}
    image = workdir / f"kv{seed}-image"
    shutil.rmtree(image, ignore_errors=True)
    faultfs.materialize(fs.image(run.rng), image)
    shutil.rmtree(root, ignore_errors=True)
    try:
        fs = faultfs.FaultFS(image, crash_at=run.rng.randrange(1, 12))
        fileio.install(fs)
        try:
            with contextlib.suppress(faultfs.SimulatedCrash):
                _open(image)
        finally:
            fs.close_all()
            fileio.uninstall()
        if fs.crashed:  # a cut inside the opening's rewrite: open that image
            again = image.with_name(image.name + "-again")
            faultfs.materialize(fs.image(run.rng), again)
            shutil.rmtree(image)
            again.rename(image)
        try:
            st = _open(image)
        except Exception as e:  # noqa: BLE001 - every failure is a finding, with its seed
            return f"does not open: {e!r}", facts
        got = _view(st)
        st.close()
        return run.check(got), facts
    finally:
        shutil.rmtree(image, ignore_errors=True)


@contextlib.contextmanager
def _plant_no_fdatasync() -> Iterator[None]:
    """KVLog's sync does not reach the disk (acknowledged before it is durable)."""
    real = KVLog.fsync_now
    KVLog.fsync_now = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        KVLog.fsync_now = real  # type: ignore[method-assign]


PLANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "kvlog-nofsync": _plant_no_fdatasync,
}


def run_seeds(start: int, count: int, plant: str | None = None, stop_after: int = 0
              ) -> tuple[int, list[tuple[int, str]]]:
    """Seeds [start, start + count); returns (seeds run, failures as (seed, text))."""
    failures: list[tuple[int, str]] = []
    base = Path(tempfile.mkdtemp(prefix="ackmq-kvsim-",
                                 dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    ran = 0
    try:
        with PLANTS[plant]() if plant else contextlib.nullcontext():
            for seed in range(start, start + count):
                failure = run_seed(seed, base)[0]
                ran += 1
                if failure is not None:
                    failures.append((seed, failure))
                    if stop_after and len(failures) >= stop_after:
                        break
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return ran, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.crashsim.kvsim",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--plant", choices=sorted(PLANTS), help="put a known bug in")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    ran, failures = run_seeds(a.seed_start, a.seeds, a.plant)
    for seed, text in failures[:20]:
        print(f"FAIL seed {seed}: {text}")
    print(f"{ran} seeds from {a.seed_start}{' with ' + a.plant if a.plant else ''}: "
          f"{len(failures)} failed, {time.monotonic() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
