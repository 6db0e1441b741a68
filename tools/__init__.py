"""ackmq's test and measurement harnesses: run from a source checkout, never shipped.

The wheel holds only the product (`[tool.setuptools.packages.find] include = ["ackmq*"]`,
checked by tests/test_wheel.py); what measures or attacks it lives here, one idea per
package (tools/README.md). Every runner is a module: `python -m tools.<package>.<module>`
from the repository root. `ackmq` never imports `tools` (an import contract in
pyproject.toml).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The source checkout that holds tools/ (the directory to put first on sys.path)."""


def python_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) with ROOT first on PYTHONPATH, so that a subprocess
    `python -m tools....` imports these tools whatever its working directory."""
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH")
    out["PYTHONPATH"] = str(ROOT) + (os.pathsep + rest if rest else "")
    return out
