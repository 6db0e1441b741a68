"""Broker settings, one place for the CLI and the embedded API."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 5672
    data_dir: Path | None = Path("./ackmq-data")  # None: nothing on disk (transient broker)
    fsync: bool = True
    heartbeat: int = 60
    consumer_timeout_ms: int | None = None
    max_message_size: int = 128 * 1024 * 1024
    handshake_timeout: float = 10.0
    spill: bool = True  # deep queues keep their tails on disk (bounded memory)
    queue_hot_messages: int = 65536  # ready messages a queue keeps in memory, at most
    queue_memory_mb: int = 256  # ready messages in memory, all queues; past it they spill
    # first start only (no access.json in the data dir yet), as RabbitMQ's default_user:
    # these users become administrators with full permissions on vhost "/"
    users: dict[str, str] = field(default_factory=lambda: {"guest": "guest"})
    default_user: str | None = None  # --default-user: replaces guest in `users`
    default_pass: str | None = None
    loopback_users: tuple[str, ...] = ("guest",)
    admin_socket: bool = True  # `ackmq ctl` talks to <data dir>/ctl.sock

    def seed_users(self) -> dict[str, str]:
        if self.default_user:
            return {self.default_user: self.default_pass or ""}
        return dict(self.users)
