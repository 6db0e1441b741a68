"""CRC-32 (zlib's polynomial, zlib's values) computed by ISA-L when `isal` is installed:
its folding with carry-less multiplies takes a few instructions per 64 bytes where
zlib's tables take ~4 per byte, and the stream log and the stream protocol's chunks run
one over every body they write, read and send. zlib's is the fallback (the same
numbers: what one wrote, the other checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast
from zlib import crc32 as _zlib_crc32


def _fastest() -> Callable[..., int]:
    """ISA-L's where its wheel is installed. A function, so that the type checker (and
    mypyc's build, whose isolated environment lacks isal) sees one definition."""
    try:
        from isal.isal_zlib import crc32 as isal_crc32
    except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
        return _zlib_crc32
    return cast("Callable[..., int]", isal_crc32)  # Any where isal is absent


crc32: Callable[..., int] = _fastest()

__all__ = ["crc32"]
