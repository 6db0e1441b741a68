"""The wheel holds only the product (issue 26): `ackmq bench` and the broker, none of the
harnesses in tools/ (fuzzers, soak, crash simulator, power-loss and scaling runners).

The wheel is built from a copy of the checkout (ackmq/, tools/, pyproject.toml,
README.md) so a stale build/ of the working tree cannot leak into it, with the venv's pip
(an isolated build: pyproject.toml asks for a newer setuptools than a venv starts with).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import ROOT, python_env

# ackmq's subpackages (shovel/: the dynamic shovels, docs/shovels.md)
ALLOWED_SUBPACKAGES = {"bench", "broker", "client", "ctl", "protocol", "server", "shovel",
                       "spark", "store"}
# what must never ship again: the moved harnesses, by their old module names
DENIED = {
    "ackmq/bench/fuzz.py", "ackmq/bench/fuzz_listeners.py", "ackmq/bench/fuzz_seeds.py",
    "ackmq/bench/soak.py", "ackmq/bench/powerloss.py", "ackmq/bench/conns.py",
    "ackmq/bench/flood.py", "ackmq/bench/frame_probe.py", "ackmq/bench/rawpeer.py",
    "ackmq/bench/ownbroker.py", "ackmq/bench/cpu.py", "ackmq/bench/deep.py",
    "ackmq/bench/many_queues.py", "ackmq/bench/mgmt_listing.py", "ackmq/bench/streams.py",
    "ackmq/bench/stream_cold.py", "ackmq/bench/ui_scale.py", "ackmq/bench/codec.py",
    "ackmq/bench/access_cost.py", "ackmq/bench/stats_cost.py",
    "ackmq/store/crashsim.py", "ackmq/store/faultfs.py", "ackmq/store/crashplants.py",
    "ackmq/store/bench.py",
}
HARNESS_WORDS = ("fuzz", "soak", "crashsim", "crashplant", "faultfs", "powerloss", "rawpeer")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "_native_stamp.json")
    for d in ("ackmq", "tools"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy(ROOT / f, src / f)
    out = tmp / "dist"
    # pure Python: what the wheel holds is checked here, the compiled build by the suite
    # itself running on it (tests/test_native.py)
    env = {**os.environ, "ACKMQ_COMPILE": "0"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("ackmq-*.whl")
    return whl


def _modules(whl: Path) -> list[str]:
    return [n for n in zipfile.ZipFile(whl).namelist() if n.endswith(".py")]


def test_wheel_ships_no_harness(wheel: Path) -> None:
    mods = _modules(wheel)
    assert "ackmq/bench/cli.py" in mods and "ackmq/store/fileio.py" in mods
    assert not DENIED & set(mods)
    assert not [m for m in mods if not m.startswith("ackmq/")]  # no tools/, nothing else
    assert not [m for m in mods if any(w in m for w in HARNESS_WORDS)]
    # the scaling runner ships only as the shim that keeps issue 31's command
    shim = zipfile.ZipFile(wheel).read("ackmq/bench/scaling.py").decode()
    assert "runpy" in shim and "def table" not in shim


def test_wheel_holds_only_the_product_subpackages(wheel: Path) -> None:
    subs = {m.split("/")[1] for m in _modules(wheel) if m.count("/") >= 2}
    assert subs <= ALLOWED_SUBPACKAGES, subs - ALLOWED_SUBPACKAGES
    assert {"bench", "broker", "protocol", "server", "store"} <= subs


def test_scaling_command_from_an_installed_wheel_says_where_the_runner_is(
        wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=120)
    # -I: no checkout, no user site, no PYTHONPATH; only the installed wheel
    proc = subprocess.run([sys.executable, "-I", "-c",
                           f"import sys, runpy; sys.path.insert(0, {str(site)!r}); "
                           "sys.argv[1:] = ['size']; "
                           "runpy.run_module('ackmq.bench.scaling', run_name='__main__')"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "python -m tools.perf.scaling" in line and "tools/" in line


def test_scaling_command_from_the_checkout_runs_tools_perf_scaling(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ackmq.bench.scaling", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=python_env())
    assert proc.returncode == 0, proc.stderr
    assert "python -m tools.perf.scaling" in proc.stdout and "size" in proc.stdout
