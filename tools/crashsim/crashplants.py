"""Known bugs to put into the store, one at a time, to show the power-cut simulator
(crashsim.py) catches each: `python -m tools.crashsim.crashsim --plant NAME`."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ackmq.broker.delayed import TimerStore
from ackmq.store import fileio
from ackmq.store.accessfile import AccessFile
from ackmq.store.defs import DefsLog
from ackmq.store.segments import SegmentStore


@contextlib.contextmanager
def _plant_segment_dirsync() -> Iterator[None]:
    """A new segment's directory entry is not fsynced."""
    real = fileio.create_durably

    def create(path: Path, head: bytes, mode: int = 0o644) -> int:
        fd = fileio.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        fileio.write(fd, head)
        fileio.fdatasync(fd)  # the file's data, but not its name
        return fd

    fileio.create_durably = create
    try:
        yield
    finally:
        fileio.create_durably = real


@contextlib.contextmanager
def _patched(owner: Any, name: str, new: Any) -> Iterator[None]:
    """`owner.name` is `new` inside the block (the planted bug), the real one after."""
    real = getattr(owner, name)
    setattr(owner, name, new)
    try:
        yield
    finally:
        setattr(owner, name, real)


def _access_save(fsync: bool) -> Any:
    """AccessFile.save without the directory fsync (and without the file's, unless
    `fsync`)."""
    def save(self: AccessFile, snapshot: dict[str, Any]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = fileio.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o600)
        fileio.write_all(fd, json.dumps(snapshot).encode())
        if fsync:
            fileio.fsync(fd)
        fileio.close(fd)
        fileio.replace(tmp, self.path)
    return save


def _plant_access_dirsync() -> contextlib.AbstractContextManager[None]:
    """access.json is renamed into place without an fsync of the directory."""
    return _patched(AccessFile, "save", _access_save(fsync=True))


@contextlib.contextmanager
def _plant_early_confirm() -> Iterator[None]:
    """Commit callbacks (confirms) run before the fdatasync that covers them: each
    round syncs only what the previous round reported."""
    real = SegmentStore._sync_to

    def late(self: SegmentStore, need: int) -> Any:
        before = getattr(self, "_planted_need", 0)
        self._planted_need = need  # type: ignore[attr-defined]
        self._synced = max(self._synced, need)  # "durable" now, synced a round later
        return real(self, before) if before else None

    SegmentStore._sync_to = late  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        SegmentStore._sync_to = real  # type: ignore[method-assign]


def _plant_access_nofsync() -> contextlib.AbstractContextManager[None]:
    """The bug of issue 23: access.json written without fsync when fsync is off (run
    it with --no-fsync)."""
    return _patched(AccessFile, "save", _access_save(fsync=False))


@contextlib.contextmanager
def _plant_defs_nofsync() -> Iterator[None]:
    """The other half of issue 23's bug: definition records appended to defs.log without
    an fdatasync (run it with --no-fsync, as the old code did only then)."""
    real = DefsLog.append

    def append(self: DefsLog, op: dict[str, Any]) -> None:
        sync = fileio.fdatasync
        fileio.fdatasync = lambda fd: None
        try:
            real(self, op)
        finally:
            fileio.fdatasync = sync

    DefsLog.append = append  # type: ignore[method-assign]
    try:
        yield
    finally:
        DefsLog.append = real  # type: ignore[method-assign]


def _plant_delayed_remove_apart() -> contextlib.AbstractContextManager[None]:
    """A due delayed message's removal from its timer store is written (committed) on
    its own, before its adds to the target queues: a cut between the two loses it
    (SPEC L2 wants both in one turn's write)."""
    real = TimerStore._route

    def route(self: TimerStore, seq: int, due: int) -> None:
        store = self.persistent_store
        remove = store.remove if store is not None else None

        def remove_now(queue: str, s: int) -> None:
            assert remove is not None and store is not None
            remove(queue, s)
            store.commit(lambda exc: None)

        if store is not None:
            store.remove = remove_now  # type: ignore[method-assign,assignment]
        try:
            real(self, seq, due)
        finally:
            if store is not None:
                del store.remove  # the class's method again

    return _patched(TimerStore, "_route", route)


def _plant_delayed_early() -> contextlib.AbstractContextManager[None]:
    """Delayed messages are held for a second less than their x-delay (fire early)."""
    real = TimerStore._hold

    def hold(self: TimerStore, seq: int, due: int, message: Any, stored: bool) -> int:
        return real(self, seq, due - 1000, message, stored)

    return _patched(TimerStore, "_hold", hold)


PLANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "segment-dirsync": _plant_segment_dirsync,
    "access-dirsync": _plant_access_dirsync,
    "early-confirm": _plant_early_confirm,
    "access-nofsync": _plant_access_nofsync,
    "defs-nofsync": _plant_defs_nofsync,
    "delayed-remove-apart": _plant_delayed_remove_apart,
    "delayed-early": _plant_delayed_early,
}
