"""The compiled hot path (issue 39; docs/performance.md, "The compiled hot path").

`./run` installs the package with the modules of `ackmq/native_modules.py` compiled by
mypyc where a C compiler and Python's headers are (setup.py); the suite then runs on
them. ACKMQ_PURE=1 selects the pure modules, which a smoke set runs here; a compiled
module not built from the source beside it is never run (ackmq/native.py).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ackmq import native
from ackmq.native_modules import NATIVE
from tools import ROOT, python_env

SMOKE = ["tests/test_model_confirms.py", "tests/test_model_readylist.py",
         "tests/test_protocol_fastpath.py", "tests/test_confirms.py", "tests/test_store.py",
         "tests/test_amqp10_lane.py"]


def _compiler_here() -> str | None:
    """Why this machine cannot build the compiled modules, or None if it can."""
    if os.environ.get("ACKMQ_COMPILE") == "0":
        return "ACKMQ_COMPILE=0"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "no Python headers"
    if shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is None:
        return "no C compiler"
    return None


def test_the_suite_runs_the_compiled_hot_path_where_it_can_be_built() -> None:
    why = _compiler_here()
    if why is not None or os.environ.get("ACKMQ_PURE") == "1":
        pytest.skip(f"pure Python by choice or necessity: {why or 'ACKMQ_PURE=1'}")
    mode, reason = native.mode()
    assert mode == "compiled", (
        f"a C compiler and headers are here but the hot path is pure ({reason}): "
        "./run test builds it (pip install -e . compiles with mypyc)")
    for name in NATIVE:
        module = importlib.import_module(name)
        assert not str(module.__file__).endswith(".py"), name


def test_pure_modules_selected_by_ackmq_pure_pass_the_smoke_set() -> None:
    env = python_env({**os.environ, "ACKMQ_PURE": "1"})
    probe = subprocess.run(
        [sys.executable, "-c", "import ackmq, sys; from ackmq import native; "
         "import ackmq.broker.channel as c; print(native.mode()[0], c.__file__)"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[0] == "pure" and probe.stdout.split()[1].endswith(".py")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def _package(tmp: Path, compiled: list[str], stale: str | None = None) -> Path:
    """A fake package dir: a .py for every hot module, a .so for `compiled`, and the
    build's stamp of the sources (`stale`'s edited after the build)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    stamp = {}
    for name in NATIVE:
        base = tmp.joinpath(*name.split(".")[1:])
        base.parent.mkdir(parents=True, exist_ok=True)
        src = base.with_name(base.name + ".py")
        src.write_text(f"NAME = {name!r}\n")
        stamp[name] = native.source_sha1(str(src))
        if name in compiled:
            base.with_name(base.name + suffix).write_bytes(b"")
        if name == stale:
            src.write_text("EDITED = True\n")
    (tmp / native.STAMP).write_text(json.dumps(stamp))
    return tmp


def test_a_compiled_build_of_these_sources_runs_compiled(tmp_path: Path) -> None:
    mode, why, sources = native.decide(str(_package(tmp_path, list(NATIVE))), NATIVE, {})
    assert (mode, sources) == ("compiled", {}), why


def test_a_source_edited_after_the_build_sends_every_module_to_its_source(tmp_path: Path) -> None:
    pkg = _package(tmp_path, list(NATIVE), stale="ackmq.broker.queue")
    mode, why, sources = native.decide(str(pkg), NATIVE, {})
    assert mode == "pure" and "ackmq.broker.queue changed after the build" in why
    assert set(sources) == set(NATIVE)  # all or none: the group's classes call each other
    assert all(p.endswith(".py") for p in sources.values())


def test_ackmq_pure_and_a_partial_build_run_pure(tmp_path: Path) -> None:
    pkg = str(_package(tmp_path, list(NATIVE)))
    assert native.decide(pkg, NATIVE, {"ACKMQ_PURE": "1"})[:2] == ("pure", "ACKMQ_PURE=1")
    partial = str(_package(tmp_path / "p", list(NATIVE)[:3]))
    mode, why, sources = native.decide(partial, NATIVE, {})
    assert mode == "pure" and why.startswith("only 3 of") and set(sources) == set(NATIVE)
    assert native.decide(str(_package(tmp_path / "n", [])), NATIVE, {})[:1] == ("pure",)


def test_the_source_finder_loads_a_listed_module_from_its_py(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("X = 42\n")
    spec = native.SourceFinder({"fake.m": str(src)}).find_spec("fake.m")
    assert spec is not None and spec.origin == str(src)
    assert native.SourceFinder({}).find_spec("fake.m") is None


def test_the_compiled_modules_type_check_as_the_isolated_build_sees_them(
        tmp_path: Path) -> None:
    """mypyc's build runs in pip's isolated environment, which holds only the build
    requirements (pyproject.toml: setuptools, mypy, pamqp): a module that type-checks
    here only because an optional dependency is installed (isal's stubs made
    protocol/crc.py check) stops the build there, and the package installs pure. CI
    found that; this checks the same way, with every other package hidden."""
    import pamqp

    shown = tmp_path / "build-env"  # mypy brings mypy_extensions' types itself
    shown.mkdir()
    (shown / "pamqp").symlink_to(Path(str(pamqp.__file__)).parent)
    paths = [name.replace(".", "/") + ".py" for name in NATIVE]
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-site-packages", "--no-warn-unused-ignores",
         "--cache-dir", str(tmp_path / "cache"), *paths],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "MYPYPATH": str(shown)})
    assert r.returncode == 0, (
        "mypyc's isolated build would stop on these (and install pure Python):\n"
        + r.stdout[-3000:])


def test_the_store_parts_derive_from_the_compiled_writer_not_its_base() -> None:
    """mypyc gives an object the native methods of the native class it is allocated by
    (its first bases' native ancestor): a part of `SegmentStore` deriving from
    `StoreState` alone made the compiled build crash on the first commit."""
    from ackmq.store.segments import SegmentStore
    from ackmq.store.writer import WriterMixin

    for base in SegmentStore.__bases__:
        assert issubclass(base, WriterMixin), (
            f"{base.__name__} derives from StoreState, not WriterMixin (docs/storage.md, "
            "'Code layout')")


def test_compiled_modules_give_each_except_name_one_type() -> None:
    """In a compiled function a variable has one type: `except A as e` then `except B as
    e` raised TypeError ("A object expected; got B") when B was caught (AMQP 0-9-1's
    _input on a bad frame, before 1.0's fix) — each except clause binds its own name."""
    import ast

    clashes = []
    for module in NATIVE:
        path = ROOT / (module.replace(".", "/") + ".py")
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            types: dict[str, set[str]] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type:
                    types.setdefault(node.name, set()).add(ast.unparse(node.type))
            clashes += [f"{module}.{fn.name}: {name} {sorted(t)}"
                        for name, t in types.items() if len(t) > 1]
    assert not clashes, clashes
