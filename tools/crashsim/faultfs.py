"""A simulated disk under the store's file operations, for crash testing.

The models are SQLite's crash-test VFS and TigerBeetle's storage simulator. `FaultFS`
is installed with `fileio.install`. The real files in `root` keep showing what the
process wrote (they play the page cache, so every read works as usual). Alongside, the
simulator keeps what a disk would hold:

- per file (inode): the bytes made durable by its last fsync/fdatasync, plus the
  writes, truncates and size changes (fallocate) made since, in order;
- per directory: the entries made durable by the last fsync of the directory, plus the
  creates, renames and unlinks made since, in order.

`image(rng)` is what a power cut leaves: it keeps a random subset of the unsynced
operations of each file and of the directory (all, none, a prefix, or any subset:
later pages may reach the disk before earlier ones, a rename before the create),
tears the last write it keeps at a random byte, and applies that over the durable
state. `crash_at=K` cuts the power just before the K-th operation that changes
something (raising `SimulatedCrash` there and at every later one), so a run with a given
seed always crashes at the same point.

Only files directly in `root` are modelled (the store keeps its files there); anything
else passes through to the OS as durable.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

# ("w", offset, bytes) | ("t", size) | ("x", end): a write, a truncate, an extension
FileOp = tuple[Any, ...]
# ("c", name, ino) | ("r", src, dst, ino) | ("u", name, ino)
DirOp = tuple[Any, ...]


class SimulatedCrash(BaseException):
    """The power went out. A BaseException, so no `except Exception` in the store swallows
    it: the run stops where it was, as the machine did."""


class _Inode:
    __slots__ = ("durable", "ops")

    def __init__(self, durable: bytes = b"") -> None:
        self.durable = bytearray(durable)
        self.ops: list[FileOp] = []


def _apply(content: bytearray, ops: list[FileOp]) -> bytearray:
    buf = bytearray(content)
    for op in ops:
        if op[0] == "w":
            off, data = op[1], op[2]
            if len(buf) < off:
                buf += bytes(off - len(buf))
            buf[off:off + len(data)] = data
        elif op[0] == "t":
            if op[1] < len(buf):
                del buf[op[1]:]
            else:
                buf += bytes(op[1] - len(buf))
        elif len(buf) < op[1]:  # "x": fallocate extends the file with zeros
            buf += bytes(op[1] - len(buf))
    return buf


def _keep(rng: random.Random, ops: list[Any], how: float | None = None) -> list[Any]:
    """Which unsynced operations reach the disk before the power goes."""
    if not ops:
        return ops
    how = rng.random() if how is None else how
    if how < 0.2:
        return []
    if how < 0.4:
        return list(ops)
    if how < 0.6:
        return ops[:rng.randrange(len(ops) + 1)]
    p = rng.random()
    return [op for op in ops if rng.random() < p]


class FaultFS:
    """The primitives of `fileio`, recording durability (see the module docstring)."""

    def __init__(self, root: str | Path, crash_at: int | None = None,
                 fallocate: bool = True) -> None:
        self.root = os.path.realpath(root)
        self._dirs: dict[str, bool] = {}  # directory as spelled -> is it root
        self.crash_at = crash_at
        self.fallocate = fallocate  # False: refuse it, as LazyFS and some filesystems do
        self.ops = 0                # operations that changed something, so far
        self.crashed = False
        self.on_crash: Callable[[], None] | None = None  # the oracle's snapshot, at the cut
        self.skip_dir_fsync = False  # a planted bug: directory fsyncs do nothing
        self.inodes: dict[int, _Inode] = {}
        self.names: dict[str, int] = {}          # what the process sees
        self.durable_names: dict[str, int] = {}  # what the disk holds
        self.dir_ops: list[DirOp] = []
        self.fds: dict[int, tuple[int, bool]] = {}  # fd -> (inode or -1, O_APPEND)
        for entry in os.scandir(self.root):
            if entry.is_file(follow_symlinks=False):
                ino = len(self.inodes) + 1
                with open(entry.path, "rb") as f:
                    self.inodes[ino] = _Inode(f.read())
                self.names[entry.name] = self.durable_names[entry.name] = ino

    # -- bookkeeping ----------------------------------------------------------------------
    def _name(self, path: Any) -> str | None:
        d, n = os.path.split(os.fspath(path))
        inside = self._dirs.get(d)
        if inside is None:  # realpath once per directory spelling, not per call
            inside = self._dirs[d] = os.path.realpath(d or ".") == self.root
        return n if inside else None

    def _is_root(self, path: Any) -> bool:
        p = os.fspath(path)
        inside = self._dirs.get(p + "/")
        if inside is None:
            inside = self._dirs[p + "/"] = os.path.realpath(p) == self.root
        return inside

    def _tick(self) -> None:
        if self.crashed:
            raise SimulatedCrash("the power is off")
        self.ops += 1
        if self.crash_at is not None and self.ops >= self.crash_at:
            self.cut_power()

    def cut_power(self, raise_: bool = True) -> None:
        """Freeze the disk's state here; with `raise_`, stop the caller."""
        self.crashed = True
        if self.on_crash is not None:
            self.on_crash()
        if raise_:
            raise SimulatedCrash(f"power cut at operation {self.ops}")

    def _inode(self, fd: int) -> _Inode | None:
        ino = self.fds.get(fd, (-1, False))[0]
        return self.inodes[ino] if ino > 0 else None

    # -- the primitives ------------------------------------------------------------------
    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        name = self._name(path)
        if name is None:
            fd = os.open(path, flags, mode)
            self.fds[fd] = (-1, False)
            return fd
        ino = self.names.get(name)
        creates = ino is None and flags & os.O_CREAT
        if creates or (ino is not None and flags & os.O_TRUNC):
            self._tick()
        elif self.crashed:
            raise SimulatedCrash("the power is off")
        fd = os.open(path, flags, mode)
        if ino is None:
            ino = max(self.inodes, default=0) + 1
            self.inodes[ino] = _Inode()
            self.names[name] = ino
            self.dir_ops.append(("c", name, ino))
        elif flags & os.O_TRUNC:
            self.inodes[ino].ops.append(("t", 0))
        self.fds[fd] = (ino, bool(flags & os.O_APPEND))
        return fd

    def close(self, fd: int) -> None:
        self.fds.pop(fd, None)
        os.close(fd)  # also after the crash: the run's files must not leak

    def write(self, fd: int, data: Any) -> int:
        self._tick()
        ino, append = self.fds.get(fd, (-1, False))
        if ino < 0:
            return os.write(fd, data)
        off = os.fstat(fd).st_size if append else os.lseek(fd, 0, os.SEEK_CUR)
        n = os.write(fd, data)
        self.inodes[ino].ops.append(("w", off, bytes(data[:n])))
        return n

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._tick()
        n = os.pwrite(fd, data, offset)
        node = self._inode(fd)
        if node is not None:
            node.ops.append(("w", offset, bytes(data[:n])))
        return n

    def fsync(self, fd: int) -> None:
        self._tick()
        node = self._inode(fd)
        if node is not None and node.ops:
            node.durable = _apply(node.durable, node.ops)
            node.ops = []

    fdatasync = fsync  # the file's size is data here: both make the whole file durable

    def ftruncate(self, fd: int, size: int) -> None:
        self._tick()
        os.ftruncate(fd, size)
        node = self._inode(fd)
        if node is not None:
            node.ops.append(("t", size))

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        if not self.fallocate:
            raise OSError(errno.EOPNOTSUPP, "fallocate is not supported (simulated)")
        self._tick()
        os.posix_fallocate(fd, offset, length)
        node = self._inode(fd)
        if node is not None:
            node.ops.append(("x", offset + length))

    def replace(self, src: Any, dst: Any) -> None:
        self._tick()
        os.replace(src, dst)
        s, d = self._name(src), self._name(dst)
        if s is not None and d is not None:
            ino = self.names.pop(s)
            self.names[d] = ino
            self.dir_ops.append(("r", s, d, ino))

    def unlink(self, path: Any, missing_ok: bool = False) -> None:
        name = self._name(path)
        if name is not None and name not in self.names:
            if missing_ok:
                return
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        self._tick()
        os.unlink(path)
        if name is not None:
            ino = self.names.pop(name)
            self.dir_ops.append(("u", name, ino))

    def fsync_dir(self, path: Any) -> None:
        self._tick()
        if self._is_root(path) and not self.skip_dir_fsync:
            self.durable_names = self._apply_dir(self.durable_names, self.dir_ops)
            self.dir_ops = []

    @staticmethod
    def _apply_dir(names: dict[str, int], ops: list[DirOp]) -> dict[str, int]:
        out = dict(names)
        for op in ops:
            if op[0] == "c":
                out[op[1]] = op[2]
            elif op[0] == "r":
                if out.get(op[1]) == op[3]:
                    del out[op[1]]
                out[op[2]] = op[3]
            elif out.get(op[1]) == op[2]:
                del out[op[1]]
        return out

    # -- the crash ---------------------------------------------------------------------------
    def image(self, rng: random.Random, unsynced: str = "random") -> dict[str, bytes]:
        """What the disk holds after the power cut: {file name: content}. `unsynced`:
        "random" (see the module docstring), "none" (the disk lost every unsynced
        operation: the worst case of --no-fsync) or "all" (a process crash)."""
        how = {"random": None, "none": 0.0, "all": 0.3}[unsynced]
        names = self._apply_dir(self.durable_names, _keep(rng, self.dir_ops, how))
        out: dict[str, bytes] = {}
        for name, ino in sorted(names.items()):
            node = self.inodes[ino]
            kept = _keep(rng, node.ops, how)
            writes = [i for i, op in enumerate(kept) if op[0] == "w" and op[2]]
            if writes and how is None and rng.random() < 0.5:  # the last write kept is torn
                i = writes[-1]
                _, off, data = kept[i]
                kept = kept[:i] + [("w", off, data[:rng.randrange(len(data))])] + kept[i + 1:]
            out[name] = bytes(_apply(node.durable, kept))
        return out

    def unsynced(self) -> tuple[int, int]:
        """(file operations, directory operations) not yet durable: for reports."""
        return sum(len(n.ops) for n in self.inodes.values()), len(self.dir_ops)

    def close_all(self) -> None:
        """Close every file the run left open (after a crash nobody else will)."""
        for fd in list(self.fds):
            self.close(fd)


def materialize(image: dict[str, bytes], root: Path) -> None:
    """Write a crash image into the (new, empty) directory `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for name, data in image.items():
        (root / name).write_bytes(data)
