"""The type check ./run test runs (`mypy ackmq`, configured in pyproject.toml's
[tool.mypy]: the whole package, strict flags on the hot path) also fails the suite, so a
type error is caught however the tests are started."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the checkout holding these tests and ackmq/
#: ./run test's check keeps its cache here (MYPY_CACHE_DIR), apart from the mypyc build's
#: in .mypy_cache: after the build, a check there found every module stale ("options
#: differ") and checked the whole package again
CACHE = ROOT / ".mypy_cache" / "check"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (pip install 'ackmq[test]')")
def test_mypy_clean_on_the_package() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(CACHE), "ackmq"],
                         cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
