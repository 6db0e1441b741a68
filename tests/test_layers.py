"""The layering of docs/DESIGN.md holds where it matters at run time: the sans-IO codec
imports no I/O and no upper layer, so a Spark executor or a client that only needs the
codec does not pay for (or depend on) the server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


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
