"""ackmq: a message broker in Python that keeps RabbitMQ's data-safety promises."""

__version__ = "0.1.0"

from ackmq.server.embedded import Broker, EmbeddedBroker  # noqa: E402

__all__ = ["Broker", "EmbeddedBroker", "__version__"]
