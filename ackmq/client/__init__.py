"""ackmq.client: ActiveMQ-style sessions for Python over AMQP 0-9-1 (SPEC J1–J10), for
ackmq and RabbitMQ alike. See docs/client.md.

    from ackmq.client import connect, AckMode
    with connect("amqp://guest:guest@127.0.0.1:5672/") as conn:
        s = conn.session(ack_mode=AckMode.CLIENT)
        s.producer("orders").send(b"{}")
        m = s.consumer("orders").receive(timeout=1.0)
        m.acknowledge()
"""

from .errors import (
    ChannelClosed,
    ClientError,
    ConfirmTimeout,
    ConnectionLost,
    ConsumerCancelled,
    IllegalStateError,
    NackError,
    PublishError,
    ReturnedError,
    TransactionRolledBack,
)
from .message import Message, OutboundMessage
from .options import AckMode, Destination, Options, RedeliveryPolicy, parse_url
from .sync import ClientFuture, Connection, Consumer, Producer, Session, connect

__all__ = [
    "AckMode",
    "ChannelClosed",
    "ClientError",
    "ClientFuture",
    "ConfirmTimeout",
    "Connection",
    "ConnectionLost",
    "Consumer",
    "ConsumerCancelled",
    "Destination",
    "IllegalStateError",
    "Message",
    "NackError",
    "Options",
    "OutboundMessage",
    "Producer",
    "PublishError",
    "RedeliveryPolicy",
    "ReturnedError",
    "Session",
    "TransactionRolledBack",
    "connect",
    "connect_async",
    "parse_url",
]


def __getattr__(name: str):  # connect_async without importing asyncio for sync users
    if name == "connect_async":
        from .aio import connect_async
        return connect_async
    raise AttributeError(name)
