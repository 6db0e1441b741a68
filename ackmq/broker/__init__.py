"""The broker model: vhosts, exchanges, queues, consumers, delivery tags, confirms.

Plain Python: no asyncio, no sockets. AMQP (and later STOMP) front ends drive it, and
tests can drive it directly.
"""

from ackmq.broker.broker import Broker, Scheduler
from ackmq.broker.channel import Channel, ChannelOutput
from ackmq.broker.errors import AMQPError, ChannelError, ConnectionError_

__all__ = ["AMQPError", "Broker", "Channel", "ChannelError", "ChannelOutput",
           "ConnectionError_", "Scheduler"]
