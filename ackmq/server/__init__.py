"""asyncio front end: sockets + codec + broker model."""

from ackmq.server.config import Config
from ackmq.server.server import Server

__all__ = ["Config", "Server"]
