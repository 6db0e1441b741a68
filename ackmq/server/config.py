"""Broker settings, one place for the CLI and the embedded API."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 5672
    stomp_port: int | None = 61613  # None: no STOMP listener; 0: a free port
    data_dir: Path | None = Path("./ackmq-data")  # None: nothing on disk (transient broker)
    fsync: bool = True
    heartbeat: int = 60
    consumer_timeout_ms: int | None = None
    max_message_size: int = 128 * 1024 * 1024
    handshake_timeout: float = 10.0
    spill: bool = True  # deep queues keep their tails on disk (bounded memory)
    queue_hot_messages: int = 65536  # ready messages a queue keeps in memory, at most
    queue_memory_mb: int = 256  # ready messages in memory, all queues; past it they spill
    users: dict[str, str] = field(default_factory=lambda: {"guest": "guest"})
    loopback_users: tuple[str, ...] = ("guest",)

    def authenticate(self, user: str, password: str, from_loopback: bool) -> bool:
        """guest/guest works from loopback only, as RabbitMQ's default."""
        if self.users.get(user) != password or not user:
            return False
        return from_loopback or user not in self.loopback_users
