"""Every file operation of the store that changes what a crash leaves behind, in one place.

The store calls `fileio.pwrite(...)`, `fileio.fdatasync(...)`, ... and never `os.` for
these: by default the names below ARE the `os` functions (a module attribute lookup,
as `os.pwrite` is; no extra call per write), and the crash simulator (faultfs.py)
rebinds them with `install()` to record what was written and synced. Reads (pread,
mmap, read_bytes) are not here: the simulator lets them see the real files.

Helpers built on the primitives (`fsync_dir`, `atomic_write`, `create_durably`) say why
each fsync is there; metadata goes through them in every mode, `--no-fsync` included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

StrPath = str | Path

# -- the primitives (rebound by install) ------------------------------------------------
open = os.open  # noqa: A001  (the name the simulator replaces; it is os.open)
close = os.close
write = os.write
pwrite = os.pwrite
fsync = os.fsync


def fdatasync(fd: int) -> None:
    """os.fdatasync, looked up at each call: tests (and the STOMP receipt tests) hold or
    fail the store's fdatasync by patching `os.fdatasync`; one Python call (~0.1 µs)
    against a ~100 µs+ sync."""
    os.fdatasync(fd)


ftruncate = os.ftruncate
posix_fallocate = os.posix_fallocate
replace = os.replace


def unlink(path: StrPath, missing_ok: bool = False) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def fsync_dir(path: StrPath) -> None:
    """Make the directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


PRIMITIVES = ("open", "close", "write", "pwrite", "fsync", "fdatasync", "ftruncate",
              "posix_fallocate", "replace", "unlink", "fsync_dir")
_REAL = {name: globals()[name] for name in PRIMITIVES}


def install(fs: Any) -> None:
    """Route the primitives through `fs` (an object with the same names): the simulator."""
    g = globals()
    for name in PRIMITIVES:
        g[name] = getattr(fs, name)


def uninstall() -> None:
    """Back to the real OS."""
    globals().update(_REAL)


# -- helpers (not rebound: they call the primitives above) --------------------------------
def write_all(fd: int, data: bytes | bytearray | memoryview) -> int:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += write(fd, view[done:])
    return done


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` by a file holding `data`, durably and all or nothing: temp file,
    fsync, rename, fsync of the directory (else the rename may be lost at power loss and
    the old file come back, or on some filesystems an empty new one)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)
        fsync(fd)
    finally:
        close(fd)
    replace(tmp, path)
    fsync_dir(path.parent)


def create_durably(path: Path, head: bytes, mode: int = 0o644) -> int:
    """Create `path` (must not exist) holding `head`, synced, and its directory entry
    synced: a new segment whose later fdatasyncs would be worthless if the file itself
    could vanish. Returns the fd, open for writing."""
    fd = open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        if write(fd, head) != len(head):
            raise OSError(28, "short write of the file header")  # ENOSPC
        fdatasync(fd)
        fsync_dir(path.parent)
    except BaseException:
        close(fd)
        unlink(path, missing_ok=True)
        raise
    return fd
