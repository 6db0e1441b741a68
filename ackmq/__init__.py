"""ackmq: a message broker in Python that keeps RabbitMQ's data-safety promises."""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

from ackmq import _native

_native.install(_os.path.dirname(__file__))  # compiled or pure hot path (ackmq/_native.py)

__all__ = ["Broker", "EmbeddedBroker", "__version__"]

if TYPE_CHECKING:
    from ackmq.server.embedded import Broker, EmbeddedBroker


def __getattr__(name: str) -> Any:
    """`ackmq.Broker` / `ackmq.EmbeddedBroker` load the asyncio server on first use, so
    `import ackmq.protocol.amqp` (or ackmq.spark on an executor) loads none of it."""
    if name == "__version__":  # from the package metadata (ackmq/version.py)
        from ackmq.version import VERSION
        return VERSION
    if name in ("Broker", "EmbeddedBroker"):
        from ackmq.server import embedded
        return getattr(embedded, name)
    raise AttributeError(f"module 'ackmq' has no attribute {name!r}")
