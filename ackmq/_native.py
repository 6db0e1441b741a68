"""Which build of the hot path runs: compiled (mypyc, setup.py) or pure Python.

The compiled modules form one group whose native classes call each other directly, so
it is all or none: with ACKMQ_PURE=1, or when any compiled module is older than its
source — not the one compiled, by the SHA-1s the build wrote to `_native_stamp.json`
(an edit after the build: an editable install would otherwise run the old code) — every
module in `NATIVE` is loaded from its `.py`. `mode()` says which and why.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

from ackmq._native_modules import NATIVE

STAMP = "_native_stamp.json"
"""The build's record of the sources it compiled: {module: sha1 of its .py} (setup.py)."""

_MODE = "pure"
_WHY = "not compiled (no mypyc build installed)"


def mode() -> tuple[str, str]:
    """("compiled" | "pure", why): what this process runs."""
    return _MODE, _WHY


def _compiled_and_source(package_dir: str, name: str) -> tuple[str | None, str]:
    base = os.path.join(package_dir, *name.split(".")[1:])
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(base + suffix):
            return base + suffix, base + ".py"
    return None, base + ".py"


def decide(package_dir: str, names: Sequence[str], env: Mapping[str, str]
           ) -> tuple[str, str, dict[str, str]]:
    """(mode, why, the sources to load instead of compiled modules — empty if none)."""
    found = {name: _compiled_and_source(package_dir, name) for name in names}
    compiled = {name: so for name, (so, _) in found.items() if so is not None}
    if not compiled:
        return "pure", "not compiled (no mypyc build installed)", {}
    sources = {name: src for name, (_, src) in found.items()}
    if env.get("ACKMQ_PURE") == "1":
        return "pure", "ACKMQ_PURE=1", sources
    if len(compiled) < len(names):
        return "pure", f"only {len(compiled)} of {len(names)} modules compiled", sources
    stamp = _read_stamp(os.path.join(package_dir, STAMP))
    stale = [n for n in names if stamp.get(n) != source_sha1(sources[n])]
    if stale:
        return "pure", f"{stale[0]} changed after the build (rebuild: ./run, or pip install -e .)", sources
    return "compiled", f"mypyc, {len(names)} modules", {}


def source_sha1(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def _read_stamp(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


class SourceFinder:
    """A meta-path finder that loads the listed modules from their source."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(name)
        return None if source is None else importlib.util.spec_from_file_location(name, source)


def install(package_dir: str) -> None:
    """Decide once, at `import ackmq`, before any hot module is imported."""
    global _MODE, _WHY
    _MODE, _WHY, sources = decide(package_dir, NATIVE, os.environ)
    if sources:
        if "changed after the build" in _WHY or "only" in _WHY:
            print(f"ackmq: running pure Python: {_WHY}", file=sys.stderr)
        sys.meta_path.insert(0, SourceFinder(sources))
