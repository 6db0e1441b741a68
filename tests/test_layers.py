"""The layering of docs/DESIGN.md holds where it matters at run time: the sans-IO codec
imports no I/O and no upper layer, so a Spark executor or a client that only needs the
codec does not pay for (or depend on) the server."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ackmq


def loaded_after(statement: str) -> list[str]:
    code = (f"import sys; {statement}; import json; "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("statement", ["import ackmq.protocol.amqp",
                                       "from ackmq.protocol.amqp import Decoder",
                                       "import ackmq"])
def test_codec_imports_no_io_and_no_upper_layer(statement: str) -> None:
    mods = loaded_after(statement)
    assert "asyncio" not in mods
    assert not [m for m in mods if m.startswith(("ackmq.server", "ackmq.store",
                                                 "ackmq.broker"))]


def test_embedded_broker_still_one_attribute_away() -> None:
    mods = loaded_after("import ackmq; ackmq.EmbeddedBroker")
    assert "ackmq.server.embedded" in mods


def test_lint_imports_contracts_hold() -> None:
    """The same check ./run test runs first, so a broken layer also fails here."""
    lint = subprocess.run([sys.executable, "-c",
                           "import sys; from importlinter.cli import lint_imports_command;"
                           "sys.argv=['lint-imports','--no-cache'];lint_imports_command()"],
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 broken" in lint.stdout


def private_imports(root: Path) -> list[tuple[str, int, str]]:
    """(file, line, name) of every `from M import _name` / `import M._name` in the
    package: a leading underscore says "this module's own"."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [part for a in node.names for part in a.name.split(".")]
            for name in names:
                if name.startswith("_") and not name.endswith("__"):
                    found.append((rel, node.lineno, name))
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """Names with a leading underscore stay in their module: a second user means the
    name is shared, and then it gets a public name (and a docstring)."""
    assert private_imports(Path(ackmq.__file__).parent) == []


def test_tools_import_no_private_name() -> None:
    """The harnesses in tools/ (outside the wheel) use ackmq's public names too."""
    import tools
    assert private_imports(tools.ROOT / "tools") == []
