"""The broker model: vhosts, exchanges, queues, consumers, delivery tags, confirms.

Plain Python: no asyncio, no sockets. AMQP (and later STOMP) front ends drive it, and
tests can drive it directly.
"""

from ackmq.broker.broker import BrokerModel, NullScheduler, Scheduler
from ackmq.broker.channel import ChannelModel, ChannelOutput
from ackmq.broker.errors import HardError, ReplyError, SoftError

__all__ = ["ReplyError", "BrokerModel", "NullScheduler", "ChannelModel", "SoftError", "ChannelOutput",
           "HardError", "Scheduler"]
