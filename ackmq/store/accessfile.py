"""The access model's durable file (`access.json` in the data dir): users, vhosts,
permissions, limits. Written whole on every change (changes are rare): temp file,
fsync, rename, fsync of the directory (`fileio.atomic_write`), so a crash or a power
cut leaves either the old or the new file, never a torn or empty one. Always synced,
`--no-fsync` included: that flag gives up messages, never the broker's users."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import fileio

FILE_NAME = "access.json"


class AccessFile:
    def __init__(self, data_dir: str | Path, fsync: bool = True) -> None:
        """`fsync` is the broker's message setting; it does not apply here (see above)."""
        self.path = Path(data_dir) / FILE_NAME

    def load(self) -> dict[str, Any] | None:
        """The last saved snapshot, or None on first start."""
        try:
            text = self.path.read_text("utf-8")
        except FileNotFoundError:
            return None
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: not a JSON object")
        return data

    def save(self, snapshot: dict[str, Any]) -> None:
        data = json.dumps(snapshot, indent=1, sort_keys=True).encode("utf-8")
        fileio.atomic_write(self.path, data, 0o600)
