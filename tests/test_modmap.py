"""The module map (`python -m tools.modmap`, docs/DESIGN.md "Seeing the structure") runs
and tells the structure the contracts promise."""

from __future__ import annotations

from tools import modmap


def test_module_map_shows_every_layer_and_no_import_of_tools_from_the_package() -> None:
    data = modmap.build()
    packages = data["packages"]
    for layer in ("ackmq.protocol", "ackmq.broker", "ackmq.store", "ackmq.server",
                  "ackmq.client", "ackmq.spark", "ackmq.bench", "ackmq.ctl", "ackmq.cli"):
        assert layer in packages, sorted(packages)
    imports = data["imports"]
    assert imports["ackmq.broker"] == ["ackmq.protocol"]  # the model sits on the codec only
    for pkg, targets in imports.items():
        if pkg.startswith("ackmq"):
            assert not [t for t in targets if t.startswith("tools")], (pkg, targets)
