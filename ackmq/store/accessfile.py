"""The access model's durable file (`access.json` in the data dir): users, vhosts,
permissions, limits. Written whole on every change (changes are rare): temp file,
fsync, rename, fsync of the directory, so a crash leaves either the old or the new file,
never a torn one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "access.json"


class AccessFile:
    def __init__(self, data_dir: str | Path, fsync: bool = True) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self.fsync = fsync

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
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        data = json.dumps(snapshot, indent=1, sort_keys=True).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self.fsync:
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
