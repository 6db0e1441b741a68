"""The policies' durable file (`policies.json` in the data dir): every vhost's policies
and operator policies in RabbitMQ's definitions layout. Written as access.json is
(accessfile.py): whole, on every change, temp file + fsync + rename + directory fsync,
always synced, so a crash or a power cut leaves the old or the new set, never a torn one;
the change takes effect only once it is saved."""

from __future__ import annotations

from pathlib import Path

from .accessfile import AccessFile

FILE_NAME = "policies.json"


class PolicyFile(AccessFile):
    def __init__(self, data_dir: str | Path) -> None:
        super().__init__(data_dir)
        self.path = Path(data_dir) / FILE_NAME
