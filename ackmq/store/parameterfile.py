"""The runtime parameters' durable file (`parameters.json` in the data dir): every
parameter of a registered component (a dynamic shovel: server/parameters.py), written
as access.json is (accessfile.py): whole, temp file + fsync + rename, so a crash leaves
the old or the new set."""

from __future__ import annotations

from pathlib import Path

from .accessfile import AccessFile

FILE_NAME = "parameters.json"


class ParameterFile(AccessFile):
    def __init__(self, data_dir: str | Path) -> None:
        super().__init__(data_dir)
        self.path = Path(data_dir) / FILE_NAME
