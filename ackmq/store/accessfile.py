"""The access model's durable file (`access.json` in the data dir): users, vhosts,
permissions, limits. Written whole (changes are rare, and a definitions import saves
once for the whole request): temp file, fsync, rename, fsync of the directory
(`fileio.atomic_write`), so a crash or a power cut leaves either the old or the new
file, never a torn or empty one. Always synced, `--no-fsync` included: that flag gives
up messages, never the broker's users.

`submit` hands a snapshot to a writer thread so the fsync never blocks the event loop;
the Future it returns resolves once that snapshot, or a later one (snapshots are whole,
so a later one holds the earlier change), is on disk. One writer writes the newest
snapshot submitted, in submission order: two changes never land out of order, and a
burst of them costs one write, not one each."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from . import fileio

FILE_NAME = "access.json"


class AccessFile:
    def __init__(self, data_dir: str | Path, fsync: bool = True) -> None:
        """`fsync` is the broker's message setting; it does not apply here (see above)."""
        self.path = Path(data_dir) / FILE_NAME
        # looked up at each write: a test harness may patch AccessFile.save
        self.writer: SnapshotWriter = SnapshotWriter(lambda snap: self.save(snap))

    def load(self) -> dict[str, Any] | None:
        """The last saved snapshot, or None on first start."""
        try:
            text = self.path.read_text("utf-8")
        except FileNotFoundError:
            return None
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: not a JSON object")
        return data

    def save(self, snapshot: dict[str, Any]) -> None:
        """Written and synced before returning (start-up, or a caller off the loop)."""
        data = json.dumps(snapshot, indent=1, sort_keys=True).encode("utf-8")
        fileio.atomic_write(self.path, data, 0o600)

    def submit(self, snapshot: dict[str, Any]) -> Future[None]:
        """Written by the writer thread; the Future says when it is durable."""
        return self.writer.submit(snapshot)


class SnapshotWriter:
    """One thread that writes the newest whole snapshot handed to it. The thread runs
    while there is work and then ends (not a daemon: a process exiting waits for the
    last write rather than dropping it)."""

    def __init__(self, write: Callable[[dict[str, Any]], None]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._latest: dict[str, Any] | None = None
        self._waiting: list[Future[None]] = []
        self._running = False

    def submit(self, snapshot: dict[str, Any]) -> Future[None]:
        done: Future[None] = Future()
        with self._cond:
            self._latest = snapshot  # an older one not yet written is superseded
            self._waiting.append(done)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="ackmq-snapshot-writer").start()
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                snap, waiting = self._latest, self._waiting
                self._latest, self._waiting = None, []
                if snap is None:
                    self._running = False
                    return
            try:
                self._write(snap)
            except BaseException as e:  # noqa: BLE001 - each waiter is told
                for f in waiting:
                    f.set_exception(e)
            else:
                for f in waiting:
                    f.set_result(None)
