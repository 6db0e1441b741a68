"""The compiled hot path (docs/performance.md, "The compiled hot path").

The modules in `NATIVE` are compiled with mypyc when a build finds mypyc, a C compiler
and Python's headers; otherwise, or with ACKMQ_COMPILE=0, the package installs as pure
Python. At run time ACKMQ_PURE=1 selects the pure modules even where compiled ones are
installed, and a build whose sources have changed since is passed over (ackmq/native.py).
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ackmq.native import STAMP, source_sha1  # noqa: E402
from ackmq.native_modules import NATIVE  # noqa: E402 - the one list, read by the guard too


def _can_compile() -> str | None:
    """Why not, or None when mypyc, a compiler and the headers are all here."""
    if os.environ.get("ACKMQ_COMPILE", "1") == "0":
        return "ACKMQ_COMPILE=0"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers in {include} (Debian: apt-get install python3-dev)"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not any(os.access(os.path.join(d, cc), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
        return f"no C compiler ({cc})"
    return None


#: setuptools' metadata-only commands: pip runs setup.py for them before the build (PEP
#: 517's get_requires and prepare_metadata hooks); mypyc's type check and C generation
#: there would be thrown away (three runs instead of one)
METADATA_ONLY = {"egg_info", "dist_info"}


def _ext_modules() -> list:  # type: ignore[type-arg]
    if METADATA_ONLY.intersection(sys.argv[1:]) and not {
            "build_ext", "bdist_wheel", "editable_wheel"}.intersection(sys.argv[1:]):
        return []
    why = _can_compile()
    if why is not None:
        print(f"ackmq: installing pure Python ({why})", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    paths = [m.replace(".", "/") + ".py" for m in NATIVE]
    with open(os.path.join("ackmq", STAMP), "w", encoding="utf-8") as f:  # what is compiled
        json.dump({m: source_sha1(p) for m, p in zip(NATIVE, paths, strict=True)}, f, indent=1)
    print(f"ackmq: compiling {len(paths)} hot-path modules with mypyc", file=sys.stderr)
    # the build's isolated environment lacks the dependencies' types, so ignores that
    # matter for `mypy ackmq` may be unused there
    flags = ["--no-warn-unused-ignores"]
    try:
        # multi_file: one C file per module, compiled side by side (ParallelBuildExt);
        # one 11 MB file took gcc 80 s on one core of CI's two
        return mypycify(flags + paths, opt_level="3", group_name="ackmq_native",  # type: ignore[no-any-return]
                        multi_file=True)
    except (SystemExit, Exception) as e:  # mypyc stops on a type error: install pure, loudly
        print(f"ackmq: mypyc failed ({e}); installing pure Python", file=sys.stderr)
        return []


class ParallelBuildExt(build_ext):
    """An extension's C files compiled on every core, the largest first (distutils
    compiles them one after another; `-j` only runs whole extensions side by side)."""

    def build_extension(self, ext: Any) -> None:
        compiler = self.compiler
        one = compiler.compile

        def compile_all(sources: list[str], *args: Any, **kw: Any) -> list[str]:
            if len(sources) < 2:
                return one(sources, *args, **kw)  # type: ignore[no-any-return]
            order = sorted(sources, key=lambda s: -os.path.getsize(s))
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                objs = dict(zip(order, pool.map(lambda s: one([s], *args, **kw), order),
                                strict=True))
            return [o for s in sources for o in objs[s]]

        compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            del compiler.compile


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": ParallelBuildExt})
