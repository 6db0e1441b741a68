"""The module map: every package of `ackmq` (and `tools`), its modules and their lines,
and which packages import which — the structure as the code has it, to read beside
docs/DESIGN.md and `lint-imports` (which checks the rules; this shows the shape).

    python -m tools.modmap                # packages, modules, lines, imports between packages
    python -m tools.modmap --modules      # every module with its line count
    python -m tools.modmap --json FILE    # the same as data (for a before/after diff)
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _package(module: str, depth: int) -> str:
    parts = module.split(".")
    return ".".join(parts[:depth])


def modules(top: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package `top`."""
    out = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(path: Path, module: str) -> set[str]:
    """Modules `path` imports (absolute, resolved from relative imports)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
    return found


def build(depth: int = 2) -> dict[str, object]:
    mods = {**modules("ackmq"), **modules("tools")}
    lines = {m: len(p.read_text().splitlines()) for m, p in mods.items()}
    edges: dict[str, set[str]] = defaultdict(set)
    for m, p in mods.items():
        src = _package(m, depth)
        for target in imports(p, m):
            if not target.startswith(("ackmq", "tools")):
                continue
            dst = _package(target, depth)
            if dst != src:
                edges[src].add(dst)
    packages: dict[str, dict[str, int]] = defaultdict(dict)
    for m, n in lines.items():
        packages[_package(m, depth)][m] = n
    return {"packages": {k: dict(sorted(v.items())) for k, v in sorted(packages.items())},
            "imports": {k: sorted(v) for k, v in sorted(edges.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.modmap", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", action="store_true", help="list every module")
    ap.add_argument("--depth", type=int, default=2, help="package depth (2: ackmq.server)")
    ap.add_argument("--json", metavar="FILE", help="write the map as JSON")
    args = ap.parse_args()
    data = build(args.depth)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    packages: dict[str, dict[str, int]] = data["packages"]  # type: ignore[assignment]
    edges: dict[str, list[str]] = data["imports"]  # type: ignore[assignment]
    for pkg, mods in packages.items():
        print(f"{pkg:28} {len(mods):3} modules {sum(mods.values()):6} lines"
              f"   imports: {', '.join(d.split('.', 1)[-1] for d in edges.get(pkg, [])) or '-'}")
        if args.modules:
            for m, n in mods.items():
                print(f"    {m:48} {n:5}")
    total = sum(sum(m.values()) for p, m in packages.items() if p.startswith("ackmq"))
    print(f"ackmq (the wheel): {total} lines")


if __name__ == "__main__":
    main()
