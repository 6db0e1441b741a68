"""`python -m ackmq.bench.scaling ...`: the command issue 31 names, kept as a contract.

The scaling runner is a measurement harness, not product, so it lives in the source
checkout as `tools/perf/scaling.py` and is not in the wheel. Run from a checkout, this
runs `python -m tools.perf.scaling` with the same arguments; from an installed wheel it
says where the runner is and exits 2. It loads tools by name (runpy), never by import:
ackmq does not import tools (an import contract in pyproject.toml).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

TARGET = "tools.perf.scaling"


def checkout_root() -> Path | None:
    """The source checkout this ackmq was loaded from, if it has tools/perf/scaling.py."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tools" / "perf" / "scaling.py").is_file() else None


def main() -> int:
    root = checkout_root()
    if root is None:
        print("ackmq.bench.scaling: the scaling runner lives in the source checkout's tools/; "
              f"run `python -m {TARGET} ...` from the repository root", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    runpy.run_module(TARGET, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
